"""Slow clients on the API over real HTTP (uvicorn on 127.0.0.1): connections that trickle their
headers (slowloris) are closed after `header_timeout_s`, idle keep-alive connections after
`keep_alive_s`, bodies still arriving `request_body_timeout_s` / `file_body_timeout_s` after their
headers get a 408 and a closed connection, and ordinary requests are answered meanwhile."""

from __future__ import annotations

import select
import socket
import time
from typing import Any

import httpx
import pytest

from tests.pipeline.conftest import ApiServer, make_settings, new_key

SLOW = 60  # connections trickling their headers at once
HEADER_TIMEOUT_S = 1.0
BODY_TIMEOUT_S = 1.0


@pytest.fixture(scope="module")
def strict_api(pipeline_env: dict[str, str]) -> Any:
    settings = make_settings(pipeline_env, header_timeout_s=HEADER_TIMEOUT_S, keep_alive_s=1,
                             request_body_timeout_s=BODY_TIMEOUT_S, file_body_timeout_s=BODY_TIMEOUT_S)
    server = ApiServer(settings)
    server.settings = settings
    yield server
    server.stop()


def _closed_by_server(sock: socket.socket) -> bool:
    """Whether the server has closed `sock` (a read gives EOF or a reset), without blocking."""
    sock.setblocking(False)
    try:
        return sock.recv(4096) == b""
    except BlockingIOError:
        return False
    except ConnectionError:
        return True
    finally:
        sock.setblocking(True)


def _trickle(socks: list[socket.socket], line: bytes) -> None:
    for s in socks:
        try:
            s.sendall(line)
        except OSError:  # closed by the server already
            pass


def test_connections_trickling_headers_are_closed_and_others_are_served(strict_api: Any) -> None:
    socks = [socket.create_connection(("127.0.0.1", strict_api.port), timeout=5) for _ in range(SLOW)]
    try:
        _trickle(socks, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        t0 = time.monotonic()
        answered = 0
        open_ = socks
        while open_ and time.monotonic() - t0 < 10 * HEADER_TIMEOUT_S:  # bounded: 10 deadlines at most
            _trickle(open_, b"X-Slow: 1\r\n")  # a header line at a time, never the blank line
            with httpx.Client(base_url=strict_api.url, timeout=5) as http:
                answered += http.get("/healthz").status_code in (200, 503)
            # Wait for the server to close one of them, at most the trickle's pace (the client's own rate).
            select.select(open_, [], [], 0.2)
            open_ = [s for s in open_ if not _closed_by_server(s)]
        took = time.monotonic() - t0
        print(f"{SLOW} slowloris connections: all closed {took:.1f} s after their first bytes "
              f"(header timeout {HEADER_TIMEOUT_S} s); {answered} ordinary requests answered meanwhile")
        assert not open_, f"{len(open_)} of {SLOW} trickling connections still open after {took:.1f} s"
        assert took >= HEADER_TIMEOUT_S * 0.9 and answered >= 3
    finally:
        for s in socks:
            s.close()


def test_an_idle_keep_alive_connection_is_closed_and_so_is_a_slow_second_request(strict_api: Any) -> None:
    for trickle_second in (False, True):
        sock = socket.create_connection(("127.0.0.1", strict_api.port), timeout=5)
        try:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert sock.recv(65536).startswith(b"HTTP/1.1 ")  # the first request is answered
            t0 = time.monotonic()
            closed = False
            while not closed and time.monotonic() - t0 < 10:
                if trickle_second:
                    _trickle([sock], b"GET /healthz HTTP/1.1\r\n" if time.monotonic() - t0 < 0.1 else b"X: y\r\n")
                select.select([sock], [], [], 0.2)  # readable once the server closes it; else the next trickle
                closed = _closed_by_server(sock)
            assert closed, "the connection was kept open"
            assert time.monotonic() - t0 < 5
        finally:
            sock.close()


@pytest.mark.parametrize(("path", "framing"), [("/v1/jobs", "length"), ("/v1/jobs", "chunked"),
                                               ("/v1/files", "length")])
def test_a_body_trickled_past_its_deadline_gets_408_and_a_closed_connection(strict_api: Any, path: str,
                                                                            framing: str) -> None:
    key = new_key(strict_api.settings, "slow-body")
    frame = b"Content-Length: 100000\r\n" if framing == "length" else b"Transfer-Encoding: chunked\r\n"
    kind = b"multipart/form-data; boundary=b0undary" if path == "/v1/files" else b"application/json"
    start = (b'--b0undary\r\nContent-Disposition: form-data; name="file"; filename="a.jsonl"\r\n\r\n'
             if path == "/v1/files" else b"")
    sock = socket.create_connection(("127.0.0.1", strict_api.port), timeout=5)
    try:
        sock.sendall(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "
                     + key.encode() + b"\r\nContent-Type: " + kind + b"\r\n" + frame + b"\r\n"
                     + (start if framing == "length" else b"%x\r\n%s\r\n" % (len(start), start) if start else b""))
        t0 = time.monotonic()
        reply = b""
        while b"\r\n\r\n" not in reply and time.monotonic() - t0 < 10 * BODY_TIMEOUT_S:
            _trickle([sock], b"1\r\n{\r\n" if framing == "chunked" else b"{")  # a byte at a time
            if select.select([sock], [], [], 0.2)[0]:  # the answer, or the next trickle
                reply += sock.recv(65536)
        took = time.monotonic() - t0
        assert reply.startswith(b"HTTP/1.1 408 "), reply[:200]
        assert BODY_TIMEOUT_S * 0.9 <= took < BODY_TIMEOUT_S + 3
        assert b'"param":"body"' in reply and b'"code":"timeout"' in reply
        deadline = time.monotonic() + 5
        while not _closed_by_server(sock):  # the rest of the body is never read: the connection ends
            assert time.monotonic() < deadline, "the connection was kept open"
            select.select([sock], [], [], 0.2)
    finally:
        sock.close()
    with httpx.Client(base_url=strict_api.url, timeout=5) as http:  # a body sent at once is unaffected
        response = http.post("/v1/jobs", json={"input": "a text in time"}, headers={"Authorization": f"Bearer {key}"})
    assert response.status_code in (201, 202), response.text
