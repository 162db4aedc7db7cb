"""The Python client (what the CLI uses) sends a request again after a 429's Retry-After, as
OpenAI's client does, and gives up with the 429 after RETRIES_429 tries. Against a stand-in
server on 127.0.0.1 that answers 429 a given number of times first."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from yue2_jobs.client import RETRIES_429, ApiError, Client


class _Busy:
    def __init__(self, refusals: int) -> None:
        self.bodies: list[bytes] = []
        state = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                state.bodies.append(self.rfile.read(int(self.headers["Content-Length"])))
                if len(state.bodies) <= refusals:
                    body, status = b'{"error":{"message":"busy","type":"rate_limit_error"}}', 429
                else:
                    body, status = json.dumps({"id": "job_1", "tries": len(state.bodies)}).encode(), 201
                self.send_response(status)
                if status == 429:
                    self.send_header("Retry-After", "0")
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def busy(request: pytest.FixtureRequest) -> Iterator[_Busy]:
    server = _Busy(request.param)
    yield server
    server.server.shutdown()


@pytest.mark.parametrize("busy", [3], indirect=True)
def test_a_429_is_sent_again_with_its_body(busy: _Busy) -> None:
    assert Client(busy.url, "k").submit_job({"input": "a text"}) == {"id": "job_1", "tries": 4}
    assert len(set(busy.bodies)) == 1 and json.loads(busy.bodies[0]) == {"input": "a text"}


@pytest.mark.parametrize("busy", [RETRIES_429 + 1], indirect=True)
def test_the_client_gives_up_with_the_429(busy: _Busy) -> None:
    with pytest.raises(ApiError, match="HTTP 429: busy"):
        Client(busy.url, "k").submit_job({"input": "a text"})
    assert len(busy.bodies) == RETRIES_429 + 1
