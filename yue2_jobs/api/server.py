"""The API on uvicorn, with the time limits uvicorn lacks.

uvicorn closes a keep-alive connection that stays idle, but a client that trickles a request's
headers a byte at a time (slowloris) keeps its connection forever: its data cancels the keep-alive
timer, and nothing else is armed while headers arrive. `HeaderDeadlineProtocol` gives each request
`header_timeout_s` to deliver its headers, counted from the connection or from the previous
response; past that the connection is closed. Every way this project serves the API
(`yue2 api`, the demo, the tests) builds its server with `config()`.
"""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from yue2_jobs.core.config import Settings


class HeaderDeadlineProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, closing a connection whose request headers come too slowly."""

    header_timeout_s = 15.0  # set per server by `config()`
    _deadline: asyncio.TimerHandle | None = None

    # uvicorn's protocol narrows asyncio's BaseTransport to Transport, which this override keeps.
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm()  # the next request's headers have the same time

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self.header_timeout_s, self._headers_too_slow)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _headers_too_slow(self) -> None:
        self._deadline = None
        # A request whose headers were all read has a cycle in progress; only one still reading is cut.
        reading_headers = self.cycle is None or self.cycle.response_complete
        if reading_headers and not self.transport.is_closing():
            self.transport.close()


def config(app: Any, settings: Settings, *, host: str | None = None, port: int | None = None,
           log_level: str = "warning") -> uvicorn.Config:
    """The uvicorn configuration of the API: header deadline and keep-alive from `settings`."""
    protocol = type("HeaderDeadline", (HeaderDeadlineProtocol,), {"header_timeout_s": settings.header_timeout_s})
    return uvicorn.Config(app, host=host or settings.api_host, port=settings.api_port if port is None else port,
                          log_level=log_level, http=protocol, timeout_keep_alive=settings.keep_alive_s)


def serve(app: Any, settings: Settings, *, host: str | None = None, port: int | None = None) -> None:
    uvicorn.Server(config(app, settings, host=host, port=port)).run()
