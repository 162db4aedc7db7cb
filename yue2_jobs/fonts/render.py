"""Text to SVG and PNG from real glyph outlines.

`layout` places each character's glyph (the style's font, else the first font of the fallback
chain with a non-empty outline for it) on lines wrapped at `wrap_width`: CJK characters break
anywhere, Latin words at spaces, closing punctuation never starts a line. `outline` turns the
placed glyphs into one path in pixels (fontTools pens: moves, lines, quadratic and cubic
curves); the SVG writes that path and the PNG rasterises the very same commands (matplotlib's
Agg renderer, anti-aliased), so the two agree.

The pen: every glyph is filled and stroked with round joins, `pen_pressure` in 0..1 scaling both
the stroke (`stroke_width` x (0.25 + 0.75 p) px) and the ink density (opacity 0.4 + 0.6 p).
"""

from __future__ import annotations

import io
import math
import unicodedata
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from fontTools.pens.basePen import BasePen
from fontTools.pens.boundsPen import ControlBoundsPen
from fontTools.pens.transformPen import TransformPen

from yue2_jobs.errors import GlyphsMissingError
from yue2_jobs.fonts.catalog import LoadedFont, chain, load
from yue2_jobs.fonts.params import RenderParams

CLOSING = set("，。、；：？！）》」』】〕〉”’,.;:?!)]}%")  # never starts a line
LINE_SPACING = 1.25


@dataclass
class Placed:
    font: LoadedFont
    glyph: str
    x: float  # pen position, px
    baseline: float  # px, y down


@dataclass
class Layout:
    glyphs: list[Placed]
    width: int
    height: int
    lines: int
    fallbacks: dict[str, str] = field(default_factory=dict)  # character -> the style whose font drew it


@dataclass
class Rendered:
    svg: str | None
    png: bytes | None
    width: int
    height: int
    lines: int
    glyphs: int
    fallbacks: dict[str, str]


class _Collector(BasePen):
    """Records a glyph's segments (curves of any length arrive split into single segments)."""

    def __init__(self, glyph_set: Any) -> None:
        super().__init__(glyphSet=glyph_set)  # composite glyphs draw their components through it
        self.ops: list[tuple[str, tuple[tuple[float, float], ...]]] = []

    def _moveTo(self, p: Any) -> None:
        self.ops.append(("M", (p,)))

    def _lineTo(self, p: Any) -> None:
        self.ops.append(("L", (p,)))

    def _qCurveToOne(self, p1: Any, p2: Any) -> None:
        self.ops.append(("Q", (p1, p2)))

    def _curveToOne(self, p1: Any, p2: Any, p3: Any) -> None:
        self.ops.append(("C", (p1, p2, p3)))

    def _closePath(self) -> None:
        self.ops.append(("Z", ()))

    def _endPath(self) -> None:  # an open contour: fonts have none worth drawing
        self.ops.append(("Z", ()))


@cache
def _has_outline(style: str, glyph: str) -> bool:
    glyph_set = load(style).glyph_set
    pen = ControlBoundsPen(glyph_set)
    glyph_set[glyph].draw(pen)
    return pen.bounds is not None


def pick_font(ch: str, fonts: list[LoadedFont]) -> tuple[LoadedFont, str] | None:
    """The first font with a real glyph for `ch` (whitespace may be empty: it only advances)."""
    space = ch.isspace()
    for font in fonts:
        glyph = font.cmap.get(ord(ch))
        if glyph is not None and (space or _has_outline(font.style, glyph)):
            return font, glyph
    return None


def _is_cjk(ch: str) -> bool:
    return unicodedata.east_asian_width(ch) in ("W", "F")


def _units(text: str) -> list[str]:
    """Break units: a CJK character, a Latin word, a space; closing punctuation joins the unit before."""
    units: list[str] = []
    for ch in text:
        if units and ch in CLOSING:
            units[-1] += ch
        elif ch.isspace() or _is_cjk(ch) or not units or units[-1].isspace() or _is_cjk(units[-1][-1]):
            units.append(ch)
        else:
            units[-1] += ch
    return units


def layout(p: RenderParams) -> Layout:
    """Place the glyphs; raises GlyphsMissingError listing every character no font can draw."""
    fonts = chain(p.style)
    primary = fonts[0]
    picks: dict[str, tuple[LoadedFont, str]] = {}
    missing: list[str] = []
    for ch in dict.fromkeys(p.text):
        if ch == "\n" or unicodedata.category(ch) in ("Cc", "Cf"):
            continue  # line breaks are handled below; controls and format characters draw nothing
        got = pick_font(ch, fonts)
        if got is None:
            missing.append(ch)
        else:
            picks[ch] = got
    if missing:
        raise GlyphsMissingError(missing)

    def advance(ch: str) -> float:
        if ch not in picks:
            return 0.0
        font, glyph = picks[ch]
        return font.advances.get(glyph, 0) * p.font_size / font.units_per_em

    line_h = (primary.ascender - primary.descender) / primary.units_per_em * p.font_size * LINE_SPACING
    ascent = primary.ascender / primary.units_per_em * p.font_size
    limit = max(p.wrap_width - 2 * p.padding, p.font_size)
    lines: list[list[str]] = []
    for paragraph in p.text.split("\n"):
        line: list[str] = []
        width = 0.0
        for unit in _units(paragraph):
            w = sum(advance(c) for c in unit)
            if line and width + w > limit and not unit.isspace():
                lines.append(line)
                line, width = [], 0.0
            if not line and unit.isspace():
                continue  # no space at the start of a wrapped line
            if w > limit:  # a word longer than a line: break it anywhere
                for c in unit:
                    if line and width + advance(c) > limit:
                        lines.append(line)
                        line, width = [], 0.0
                    line.append(c)
                    width += advance(c)
                continue
            line.append(unit)
            width += w
        lines.append(line)
    placed: list[Placed] = []
    widest = 0.0
    for i, line in enumerate(lines):
        x, baseline = p.padding, p.padding + ascent + i * line_h
        for ch in "".join(line).rstrip():
            if ch in picks:
                font, glyph = picks[ch]
                if not ch.isspace():
                    placed.append(Placed(font, glyph, x, baseline))
                x += advance(ch)
        widest = max(widest, x - p.padding)
    fallbacks = {ch: f.style for ch, (f, _) in picks.items() if f.style != p.style and not ch.isspace()}
    return Layout(glyphs=placed, width=math.ceil(widest + 2 * p.padding),
                  height=math.ceil(len(lines) * line_h + 2 * p.padding), lines=len(lines), fallbacks=fallbacks)


def outline(lay: Layout, font_size: float) -> list[tuple[str, tuple[tuple[float, float], ...]]]:
    """Every placed glyph's contours, in pixels (y down), as one list of path commands."""
    ops = []
    for g in lay.glyphs:
        scale = font_size / g.font.units_per_em
        pen = _Collector(g.font.glyph_set)
        g.font.glyph_set[g.glyph].draw(TransformPen(pen, (scale, 0, 0, -scale, g.x, g.baseline)))
        ops.extend(pen.ops)
    return ops


def pen_stroke(p: RenderParams) -> tuple[float, float]:
    """(stroke width px, ink opacity) for the pen pressure and nominal stroke width."""
    return p.stroke_width * (0.25 + 0.75 * p.pen_pressure), 0.4 + 0.6 * p.pen_pressure


def to_svg(ops: list[Any], lay: Layout, p: RenderParams) -> str:
    d = " ".join(op + " ".join(f"{x:.2f} {y:.2f}" for x, y in pts) for op, pts in ops)
    width, opacity = pen_stroke(p)
    bg = f'<rect width="100%" height="100%" fill="{p.background}"/>' if p.background else ""
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{lay.width}" height="{lay.height}" '
            f'viewBox="0 0 {lay.width} {lay.height}">{bg}<g opacity="{opacity:.3f}">'
            f'<path d="{d}" fill="{p.color}" fill-rule="nonzero" stroke="{p.color}" stroke-width="{width:.2f}" '
            f'stroke-linejoin="round" stroke-linecap="round"/></g></svg>')


def to_png(ops: list[Any], lay: Layout, p: RenderParams) -> bytes:
    import numpy as np
    from matplotlib.backends.backend_agg import RendererAgg
    from matplotlib.colors import to_rgba
    from matplotlib.path import Path as MplPath
    from matplotlib.transforms import Affine2D
    from PIL import Image

    codes_for = {"M": [int(MplPath.MOVETO)], "L": [int(MplPath.LINETO)], "Q": [int(MplPath.CURVE3)] * 2,
                 "C": [int(MplPath.CURVE4)] * 3}
    verts: list[tuple[float, float]] = []
    codes: list[int] = []
    start = (0.0, 0.0)
    for op, pts in ops:
        if op == "Z":
            verts.append(start)
            codes.append(int(MplPath.CLOSEPOLY))
            continue
        if op == "M":
            start = pts[0]
        verts.extend(pts)
        codes.extend(codes_for[op])
    width, opacity = pen_stroke(p)
    # Straight onto an Agg canvas (no figure or axes: their bookkeeping cost more than the drawing);
    # at 72 dpi a point is a pixel, and Agg's y axis points up.
    agg = RendererAgg(lay.width, lay.height, 72)
    if verts:
        gc = agg.new_gc()
        gc.set_foreground(p.color)
        gc.set_linewidth(width)
        gc.set_joinstyle("round")
        gc.set_capstyle("round")
        gc.set_antialiased(True)
        agg.draw_path(gc, MplPath(verts, codes), Affine2D().scale(1, -1).translate(0, lay.height),
                      to_rgba(p.color))
        gc.restore()
    ink = np.asarray(agg.buffer_rgba(), dtype=np.float32)[: lay.height, : lay.width] / 255.0  # (H, W, 4)
    alpha = ink[..., 3:4] * opacity  # group opacity, as the SVG's <g opacity>
    if p.background:
        bg = np.array(to_rgba(p.background), dtype=np.float32)
        rgb = ink[..., :3] * alpha + bg[:3] * (1 - alpha)
        out = np.concatenate([rgb, np.ones_like(alpha)], axis=-1)
    else:
        out = np.concatenate([ink[..., :3], alpha], axis=-1)
    buf = io.BytesIO()
    Image.fromarray((out * 255 + 0.5).astype(np.uint8), "RGBA").save(buf, format="PNG", optimize=False)
    return buf.getvalue()


def render(p: RenderParams) -> Rendered:
    """Lay out, outline once, write the SVG and/or the PNG from the same commands."""
    lay = layout(p)
    ops = outline(lay, p.font_size)
    svg = to_svg(ops, lay, p) if p.output in ("svg", "both") else None
    png = to_png(ops, lay, p) if p.output in ("png", "both") else None
    return Rendered(svg=svg, png=png, width=lay.width, height=lay.height, lines=lay.lines, glyphs=len(lay.glyphs),
                    fallbacks=lay.fallbacks)
