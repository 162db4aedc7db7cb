"""A stand-in API on 127.0.0.1 that answers the routes a test gives it and records every request."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class StandInApi:
    """Answers `routes[(method, path)]` (a status and a JSON value or raw bytes); 404 in the API's
    error shape for any other route. `requests` holds (method, path, body) of each request."""

    def __init__(self, routes: dict[tuple[str, str], tuple[int, Any]]) -> None:
        self.routes = routes
        self.requests: list[tuple[str, str, bytes]] = []
        self.keys: list[str] = []  # each request's Authorization header
        api = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                api.requests.append((self.command, self.path, body))
                api.keys.append(self.headers.get("Authorization", ""))
                status, value = api.routes.get((self.command, self.path), (404, {"error": {
                    "message": f"no route {self.path}", "type": "invalid_request_error"}}))
                data = value if isinstance(value, bytes) else json.dumps(value).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/octet-stream" if isinstance(value, bytes)
                                 else "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _answer

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def paths(self) -> list[str]:
        return [f"{method} {path}" for method, path, _ in self.requests]
