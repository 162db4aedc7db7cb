"""A delivery connects to an address the SSRF check approved, never to what the name answers
next (DNS rebinding, issue 38): two listeners on loopback, 127.0.0.1 and 127.0.0.2, behind one
name that answers the first to the check and the second to any later lookup."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from yue2_jobs.core.config import Settings
from yue2_jobs.core.net import free_port
from yue2_jobs.webhooks.delivery import post_pinned
from yue2_jobs.webhooks.targets import pinned_request

NAME = "hooks.rebind.test"


class _Listener:
    def __init__(self, address: str, port: int) -> None:
        self.seen: list[dict[str, str]] = []
        seen = self.seen

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                seen.append(dict(self.headers))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer((address, port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def rebinding(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[int, _Listener, _Listener]]:
    monkeypatch.setenv("YUE2_WEBHOOK_ALLOW_PRIVATE", "true")  # loopback targets, on purpose
    port = free_port()
    checked, rebound = _Listener("127.0.0.1", port), _Listener("127.0.0.2", port)
    real = socket.getaddrinfo
    answers = iter(["127.0.0.1"])

    def resolver(host, *args, **kwargs):  # type: ignore[no-untyped-def]
        if host == NAME:  # the first answer, then the other address for good
            return real(next(answers, "127.0.0.2"), *args, **kwargs)
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolver)
    yield port, checked, rebound
    checked.server.shutdown()
    rebound.server.shutdown()


def test_a_delivery_goes_to_the_checked_address_with_the_names_host(rebinding) -> None:
    port, checked, rebound = rebinding
    with httpx.Client(timeout=5) as client:
        response = post_pinned(client, f"http://{NAME}:{port}/hook", body=b"{}", headers={"x-test": "1"},
                                allow_private=Settings().webhook_allow_private)
    assert response.status_code == 204
    assert len(checked.seen) == 1 and rebound.seen == []
    assert checked.seen[0]["Host"] == f"{NAME}:{port}" and checked.seen[0]["x-test"] == "1"
    # Unpinned, the client's own lookup would have reached the other address.
    with httpx.Client(timeout=5) as client:
        client.post(f"http://{NAME}:{port}/hook", content=b"{}")
    assert len(rebound.seen) == 1


def test_the_next_approved_address_is_tried_when_one_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()
    listener = _Listener("127.0.0.1", port)
    real = socket.getaddrinfo
    monkeypatch.setattr(socket, "getaddrinfo", lambda host, *a, **k: (
        real("127.0.0.3", *a, **k) + real("127.0.0.1", *a, **k) if host == NAME else real(host, *a, **k)))
    with httpx.Client(timeout=5) as client:  # nothing listens on 127.0.0.3
        assert post_pinned(client, f"http://{NAME}:{port}/h", body=b"{}", headers={},
                            allow_private=True).status_code == 204
    assert len(listener.seen) == 1
    listener.server.shutdown()


def test_https_keeps_the_name_for_sni_and_the_certificate() -> None:
    assert pinned_request("https://hooks.example.com/a?b=1", "2001:db8::7") == (
        "https://[2001:db8::7]/a?b=1", {"Host": "hooks.example.com"}, {"sni_hostname": "hooks.example.com"})
    assert pinned_request("http://hooks.example.com:8080/a", "192.0.2.9") == (
        "http://192.0.2.9:8080/a", {"Host": "hooks.example.com:8080"}, {})
    # An internationalised name goes on the wire, in Host and in SNI, in its IDNA form.
    assert pinned_request("https://bücher.example/h", "192.0.2.9")[1:] == (
        {"Host": "xn--bcher-kva.example"}, {"sni_hostname": "xn--bcher-kva.example"})
