"""Plain ASGI middleware of the API (BaseHTTPMiddleware adds a task per request, a real share of a
fast GET): the header and body size limits, request metrics, and the OpenAI-shaped error response
they and the app share."""

from __future__ import annotations

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
    """413 for a body over the limit, whether it declares a Content-Length or streams chunks."""

    def __init__(self, app: ASGIApp, *, json_limit: int, file_limit: int) -> None:
        super().__init__(app)
        self.json_limit, self.file_limit = json_limit, file_limit

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
        over = False  # the body passed the limit: whatever the app makes of it, the answer is the 413
        answered = False

        async def counting_receive() -> Message:
            nonlocal seen, over
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > limit + (64 * 1024 if is_file else 0):  # multipart framing around the file
                over = True
                raise _TooLarge
            return message

        async def guarded_send(message: Message) -> None:
            # The body parser may catch _TooLarge and answer on its own (a 400 "not valid JSON" for a
            # chunked body): once over the limit, the app's response is replaced by the 413.
            nonlocal answered
            if over:
                if not answered:
                    answered = True
                    await too_big(scope, receive, send)
                return
            answered = answered or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counting_receive, guarded_send)
        except Exception:
            if not over:
                raise
        if over and not answered:
            await too_big(scope, receive, send)


class _TooLarge(Exception):
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


