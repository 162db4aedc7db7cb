"""The batch console at /ui: one static page that reads the JSON API with the visitor's API key
(kept in the tab's session storage). The page itself holds no data, so serving it needs no key."""

from __future__ import annotations

from functools import lru_cache
from importlib.resources import files

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

router = APIRouter(tags=["console"])


@lru_cache
def _page() -> str:
    return (files("yue2_jobs.api") / "console" / "console.html").read_text(encoding="utf-8")


@router.get("/ui", response_class=HTMLResponse, include_in_schema=False)
def console() -> HTMLResponse:
    # No inline content from outside: a strict CSP keeps the page's own script the only script.
    return HTMLResponse(_page(), headers={"Content-Security-Policy": "default-src 'self'; script-src 'unsafe-inline'; "
                                          "style-src 'unsafe-inline'; img-src 'self' data: blob:; frame-src 'self'"})
