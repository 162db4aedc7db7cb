"""The styles a render job may ask for, each a real font shipped in `data/`, and the fallback chain.

A character the style's font lacks is taken from the next font of the chain that has a real
glyph for it (a non-empty outline, not only a cmap entry).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

DATA_DIR = Path(__file__).resolve().parent / "data"


@dataclass(frozen=True)
class FontSpec:
    file: str
    family: str
    license: str


FONTS = {
    "print": FontSpec("noto-serif-cjk-sc.otf", "Noto Serif CJK SC (Mingti/Song)", "SIL OFL 1.1"),
    "handwritten": FontSpec("lxgw-wenkai.ttf", "LXGW WenKai", "SIL OFL 1.1"),
    "calligraphy": FontSpec("ar-pl-ukai-cn.ttf", "AR PL UKai CN (Kaiti)", "Arphic Public License"),
    "rounded": FontSpec("wqy-microhei.ttf", "WenQuanYi Micro Hei (Hei)", "Apache 2.0 / GPLv3 with font exception"),
}
STYLES = tuple(FONTS)


@dataclass(frozen=True)
class LoadedFont:
    """One font, ready for layout: its glyph set, cmap, advance widths and vertical metrics."""

    style: str
    glyph_set: Any
    cmap: dict[int, str]
    advances: dict[str, int]
    units_per_em: int
    ascender: int
    descender: int


@cache
def load(style: str) -> LoadedFont:
    from fontTools.ttLib import TTFont

    font = TTFont(DATA_DIR / FONTS[style].file, lazy=True)
    hhea = font["hhea"]
    return LoadedFont(style=style, glyph_set=font.getGlyphSet(), cmap=font.getBestCmap(),
                      advances={name: adv for name, (adv, _) in font["hmtx"].metrics.items()},
                      units_per_em=font["head"].unitsPerEm, ascender=hhea.ascent, descender=hhea.descent)


def chain(style: str) -> list[LoadedFont]:
    """The style's font first, then the others in a fixed order."""
    return [load(style)] + [load(s) for s in STYLES if s != style]
