"""Plain ASGI middleware of the API (BaseHTTPMiddleware adds a task per request, a real share of a
fast GET): the header and body size limits, request metrics, and the OpenAI-shaped error response
they and the app share."""

from __future__ import annotations

import asyncio
import time

from fastapi.responses import JSONResponse
from prometheus_client import Counter, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send


def _printable(text: str) -> str:
    # A message may quote what the caller sent; a lone surrogate in it cannot be encoded as UTF-8.
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def error_response(status: int, message: str, *, type_: str, param: str | None = None,
                   code: str | None = None) -> JSONResponse:
    """OpenAI's error shape, which its client turns into exceptions."""
    return JSONResponse({"error": {"message": _printable(message), "type": type_,
                                   "param": _printable(param) if param is not None else None, "code": code}},
                        status)


class _HttpMiddleware:
    """Passes everything but HTTP requests straight through; subclasses handle `http`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.http(scope, receive, send)

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        raise NotImplementedError


class HeaderLimitMiddleware(_HttpMiddleware):
    """431 when a request's headers (names and values together) are over the limit."""

    def __init__(self, app: ASGIApp, *, limit: int) -> None:
        super().__init__(app)
        self.limit = limit

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        size = sum(len(k) + len(v) for k, v in scope["headers"])
        if size > self.limit:
            await error_response(431, f"request headers are {size:,} bytes, over the limit of {self.limit:,} "
                                 "bytes", type_="invalid_request_error", param="headers",
                                 code="limit_exceeded")(scope, receive, send)
            return
        await self.app(scope, receive, send)


class BodyLimitMiddleware(_HttpMiddleware):
    """413 for a body over the limit, whether it declares a Content-Length or streams chunks; 408
    (and the connection closed) for a body not complete `json_timeout_s` / `file_timeout_s` after
    its headers, so a client trickling a body cannot hold a connection, a buffer and a request
    slot for as long as it likes."""

    def __init__(self, app: ASGIApp, *, json_limit: int, file_limit: int, json_timeout_s: float = 30.0,
                 file_timeout_s: float = 600.0) -> None:
        super().__init__(app)
        self.json_limit, self.file_limit = json_limit, file_limit
        self.json_timeout_s, self.file_timeout_s = json_timeout_s, file_timeout_s

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        is_file = scope["path"] == "/v1/files"
        limit, field = (self.file_limit, "file") if is_file else (self.json_limit, "request body")
        declared = dict(scope["headers"]).get(b"content-length")
        too_big = error_response(413, f"{field} is over the limit of {limit:,} bytes",
                                 type_="invalid_request_error", param=field, code="limit_exceeded")
        if declared is not None and not declared.isdigit():
            await error_response(400, "Content-Length must be a whole number", type_="invalid_request_error",
                                 param="Content-Length")(scope, receive, send)
            return
        if declared is not None and int(declared) > limit + (64 * 1024 if is_file else 0):
            await too_big(scope, receive, send)
            return
        seen = 0
        timeout_s = self.file_timeout_s if is_file else self.json_timeout_s
        deadline = time.monotonic() + timeout_s
        body_done = False
        # Set once the body is refused (over the limit: 413; late: 408): whatever the app makes of the
        # body it was cut off from (a body parser answers a 400 "not valid JSON" on its own), the
        # answer is the refusal.
        refusal: JSONResponse | None = None
        answered = False

        async def counting_receive() -> Message:
            nonlocal seen, body_done, refusal
            if body_done:  # what follows the body (a disconnect) may take as long as it takes
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), max(deadline - time.monotonic(), 0.0))
            except TimeoutError:
                refusal = _too_slow(timeout_s)
                raise _Refused from None
            body_done = message["type"] != "http.request" or not message.get("more_body", False)
            seen += len(message.get("body", b""))
            if seen > limit + (64 * 1024 if is_file else 0):  # multipart framing around the file
                refusal = too_big
                raise _Refused
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal answered
            if refusal is not None:
                if not answered:
                    answered = True
                    await refusal(scope, receive, send)
                return
            answered = answered or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counting_receive, guarded_send)
        except Exception:
            if refusal is None:
                raise
        if refusal is not None and not answered:  # uvicorn closes a connection whose body was not read
            await refusal(scope, receive, send)


def _too_slow(timeout_s: float) -> JSONResponse:
    response = error_response(408, f"the request body did not arrive within {timeout_s:g} s of its headers",
                              type_="invalid_request_error", param="body", code="timeout")
    response.headers["Connection"] = "close"
    return response


class _Refused(Exception):
    pass


class MetricsMiddleware(_HttpMiddleware):
    """Request counts and latency by route template."""

    def __init__(self, app: ASGIApp, *, requests: Counter, latency: Histogram) -> None:
        super().__init__(app)
        self.requests, self.latency = requests, latency

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        t0 = time.perf_counter()
        status = 500

        async def send_and_note(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")
            self.latency.labels(scope["method"], route).observe(time.perf_counter() - t0)
            self.requests.labels(scope["method"], route, str(status)).inc()


