"""Which URLs a webhook may target: http(s) only, and (unless the operator allows it) no private,
loopback, link-local or otherwise internal address, so an endpoint cannot make our workers probe
the network they sit in (SSRF). Checked at registration and again before every delivery, since
DNS may change between the two; a delivery then connects to an address this check approved, never
to whatever the name answers next (`approved_addresses`, `pinned_request`)."""

from __future__ import annotations

import ipaddress
import re
import socket
from urllib.parse import urlsplit, urlunsplit

import httpx

from yue2_jobs.errors import InvalidRequestError

MAX_URL_CHARS = 2048
# IPv6 ranges that carry an IPv4 address in their low 32 bits and reach it: NAT64 (RFC 6052) and the
# deprecated IPv4-compatible addresses. 6to4 and Teredo have their own unwrapping in `ipaddress`.
_LOW32_CARRIERS = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("::/96"))
_LOCAL_NAT64 = ipaddress.ip_network("64:ff9b:1::/48")  # RFC 8215: local use only, never a public target


def _bad(message: str) -> InvalidRequestError:
    return InvalidRequestError(f"url: {message}", field="url", status=400, code="invalid_webhook_url")


# What a webhook URL may be registered as, stated once: the API's document carries it, `check_url`
# applies it after the more specific checks of `check_url_shape`. http(s); a host of ASCII
# letters, digits and -._~!$&'()*+,;=% (an internationalised name in its xn-- form; no IPv6
# literal); a port up to 65535 without leading zeros; no spaces or control characters anywhere.
_PORT = "6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3}|0"
URL_PATTERN = rf"^[Hh][Tt][Tt][Pp][Ss]?://[A-Za-z0-9._~!$&'()*+,;=%-]+(:({_PORT})?)?([/?#][^\x00-\x20\x7f]*)?$"
_URL_RE = re.compile(URL_PATTERN)


def check_url_shape(url: str) -> tuple[str, int]:
    """(host, port) of a well-formed http(s) URL without credentials."""
    if len(url) > MAX_URL_CHARS:
        raise _bad(f"{len(url):,} characters, over the limit of {MAX_URL_CHARS:,}")
    # urlsplit quietly drops tabs and line breaks (WHATWG), so the URL it checks is not the one that
    # would be stored and sent; a client refuses such a URL at every delivery. Refuse it here.
    bad = sorted({f"U+{ord(ch):04X}" for ch in url if ord(ch) <= 0x20 or ord(ch) == 0x7F})
    if bad:
        raise _bad(f"control characters or spaces are not allowed in a URL ({', '.join(bad)}); "
                   f"percent-encode them")
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


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses an IPv6 address reaches through: IPv4-mapped, 6to4, Teredo (its server and
    client), NAT64 and IPv4-compatible."""
    found = [a for a in (ip.ipv4_mapped, ip.sixtofour) if a is not None]
    if ip.teredo is not None:
        found.extend(ip.teredo)
    if any(ip in net for net in _LOW32_CARRIERS):
        found.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    return found


def _not_global(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    return (ip.is_private or ip.is_loopback or ip.is_link_local or ip.is_multicast or ip.is_reserved
            or ip.is_unspecified or not ip.is_global)


def internal(address: str) -> bool:
    """Whether `address` (or an IPv4 address it wraps) is not a public one."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address):
        if ip in _LOCAL_NAT64:
            return True
        inner = _embedded_ipv4(ip)
        if ip.ipv4_mapped is not None:  # only the IPv4 address counts: ::ffff:0:0/96 itself is never global
            return _not_global(ip.ipv4_mapped)
        if any(_not_global(a) for a in inner):
            return True
    return _not_global(ip)


def check_url(url: str, *, allow_private: bool) -> str:
    """`url` when a webhook may be registered for it; otherwise a 400 naming `url` and the reason.
    `URL_PATTERN` applies here, at registration, not at each delivery: an endpoint registered
    before it (an internationalised host, an IPv6 literal) is still sent to."""
    check_url_shape(url)
    if _URL_RE.fullmatch(url) is None:
        raise _bad("the host must be ASCII letters, digits and -._~!$&'()*+,;=% (an internationalised name in "
                   "its xn-- form; IPv6 literals are not supported) and the port a number up to 65535 without "
                   "leading zeros")
    approved_addresses(url, allow_private=allow_private)
    return url


def approved_addresses(url: str, *, allow_private: bool) -> list[str]:
    """The addresses `url`'s host resolves to now, all of them allowed (else the 400 of `check_url`),
    in the resolver's order. A delivery connects to one of these and to nothing else
    (`pinned_request`): were the client to resolve the name again, a name that answers one address
    to this check and another to the connection (DNS rebinding) would reach an unchecked one."""
    host, port = check_url_shape(url)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise _bad(f"host {host!r} does not resolve ({exc})") from None
    addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
    if not allow_private:
        refused = sorted(a for a in addresses if internal(a))
        if refused:
            raise _bad(f"host {host!r} resolves to {', '.join(refused)}: private, loopback, link-local and "
                       f"other internal addresses are refused (an operator may allow them with "
                       f"YUE2_WEBHOOK_ALLOW_PRIVATE=true)")
    return addresses


def pinned_request(url: str, address: str) -> tuple[str, dict[str, str], dict[str, str]]:
    """(URL, headers, httpx extensions) that send to `url` through `address`: the URL's host
    replaced by the address, the original host in `Host`, and for https the original host as
    the TLS server name, so SNI and the certificate check still name it."""
    parts = urlsplit(url)
    ascii_url = httpx.URL(url)  # an internationalised name in its IDNA (xn--) form, as it goes on the wire
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    literal = f"[{ip}]" if ip.version == 6 else str(ip)
    netloc = literal if parts.port is None else f"{literal}:{parts.port}"
    host_header = ascii_url.netloc.decode("ascii")  # no credentials (refused at registration)
    extensions = {"sni_hostname": ascii_url.raw_host.decode("ascii")} if parts.scheme == "https" else {}
    return urlunsplit(parts._replace(netloc=netloc)), {"Host": host_header}, extensions
