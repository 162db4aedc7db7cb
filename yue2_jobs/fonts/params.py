"""What a `render_font` job may ask for, each limit explicit (a 422 names the field and the limit)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from yue2_jobs.core.safe import SafeStr
from yue2_jobs.fonts.catalog import STYLES

FONTS_VARIANT = "fonts"  # the queue (`yue2.fonts`) and worker variant of render jobs: CPU workers, no model
HEX_COLOR = r"^#(?:[0-9a-fA-F]{3}|[0-9a-fA-F]{6})$"


class RenderParams(BaseModel):
    """What a render job asks for, with its limits: the renderer's input (`render.render`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)  # frozen: hashable, as the renderer's caches need

    text: str
    # A Literal built from the catalog's style names, so the schema lists them; mypy wants literals.
    style: Literal[STYLES] = "print"  # type: ignore[valid-type]
    pen_pressure: float = Field(0.5, ge=0, le=1, description="0..1: stroke weight and ink density")
    stroke_width: float = Field(2.0, ge=1, le=20, description="nominal pen width, px")
    font_size: float = Field(48.0, ge=8, le=256, description="em size, px")
    wrap_width: float = Field(1024.0, ge=64, le=4096, description="line width including padding, px")
    padding: float = Field(16.0, ge=0, le=256)
    color: str = Field("#111111", pattern=HEX_COLOR)
    background: str | None = Field("#ffffff", pattern=HEX_COLOR, description="null: transparent")
    output: Literal["svg", "png", "both"] = "both"


class RenderBody(RenderParams):
    """The body of a render job (POST /v1/jobs with kind `render_font`, or a line for /v1/render_font)."""

    kind: Literal["render_font"] | None = None
    custom_id: SafeStr | None = Field(None, max_length=512)
    text: SafeStr
