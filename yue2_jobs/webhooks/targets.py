"""Which URLs a webhook may target: http(s) only, and (unless the operator allows it) no private,
loopback, link-local or otherwise internal address, so an endpoint cannot make our workers probe
the network they sit in (SSRF). Checked at registration and again before every delivery, since
DNS may change between the two."""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

from yue2_jobs.errors import InvalidRequestError

MAX_URL_CHARS = 2048


def _bad(message: str) -> InvalidRequestError:
    return InvalidRequestError(f"url: {message}", field="url", status=400, code="invalid_webhook_url")


def check_url_shape(url: str) -> tuple[str, int]:
    """(host, port) of a well-formed http(s) URL without credentials."""
    if len(url) > MAX_URL_CHARS:
        raise _bad(f"{len(url):,} characters, over the limit of {MAX_URL_CHARS:,}")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise _bad(f"not a URL ({exc})") from None
    if parts.scheme not in ("http", "https"):
        raise _bad(f"scheme {parts.scheme!r} is not allowed; use http or https")
    if not parts.hostname:
        raise _bad("no host")
    if parts.username is not None or parts.password is not None:
        raise _bad("credentials in the URL are not allowed; authenticate the webhook by its signature")
    return parts.hostname, port or (443 if parts.scheme == "https" else 80)


def internal(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return (ip.is_private or ip.is_loopback or ip.is_link_local or ip.is_multicast or ip.is_reserved
            or ip.is_unspecified or not ip.is_global)


def check_url(url: str, *, allow_private: bool) -> str:
    """`url` when a webhook may be sent to it; otherwise a 400 naming `url` and the reason."""
    host, port = check_url_shape(url)
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)}
    except (socket.gaierror, UnicodeError) as exc:
        raise _bad(f"host {host!r} does not resolve ({exc})") from None
    if not allow_private:
        refused = sorted(a for a in addresses if internal(a))
        if refused:
            raise _bad(f"host {host!r} resolves to {', '.join(refused)}: private, loopback, link-local and "
                       f"other internal addresses are refused (an operator may allow them with "
                       f"YUE2_WEBHOOK_ALLOW_PRIVATE=true)")
    return url
