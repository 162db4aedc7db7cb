"""The renderer: golden images for every style, fallbacks, missing glyphs, wrapping, the pen, and
properties over arbitrary text. `YUE2_UPDATE_GOLDEN=1 pytest tests/fonts` rewrites the goldens
(look at them before committing)."""

from __future__ import annotations

import io
import os
import re
import unicodedata
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from yue2_jobs.errors import GlyphsMissingError
from yue2_jobs.fonts.build import charset
from yue2_jobs.fonts.catalog import STYLES, chain
from yue2_jobs.fonts.render import RenderParams, layout, pick_font, render

GOLDEN = Path(__file__).parent / "golden"
HELLO = "你好，世界 Hello"
CASES = {f"{style}-hello": RenderParams(text=HELLO, style=style) for style in STYLES} | {
    "handwritten-wrapped": RenderParams(text="床前明月光，疑是地上霜。Moonlight before my bed, frost on the ground.",
                                        style="handwritten", wrap_width=360, font_size=32),
    "calligraphy-light": RenderParams(text="永字八法", style="calligraphy", pen_pressure=0.0, stroke_width=1),
    "calligraphy-heavy": RenderParams(text="永字八法", style="calligraphy", pen_pressure=1.0, stroke_width=8,
                                      color="#8b0000", background=None),
}


def pixels(png: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGBA"), dtype=np.float32)


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_images(name: str) -> None:
    got = render(CASES[name]).png
    assert got is not None
    path = GOLDEN / f"{name}.png"
    if os.environ.get("YUE2_UPDATE_GOLDEN"):
        path.write_bytes(got)
    want = pixels(path.read_bytes())
    have = pixels(got)
    assert have.shape == want.shape, (have.shape, want.shape)
    diff = np.abs(have - want)
    # Anti-aliasing may move with the rasteriser's version: a tolerance, not an exact match.
    assert diff.mean() < 1.0 and (diff.max(axis=-1) > 48).mean() < 0.005, (diff.mean(), (diff.max(-1) > 48).mean())


def test_svg_is_paths_from_the_glyph_outlines_and_matches_the_png() -> None:
    r = render(RenderParams(text=HELLO, style="print", background=None))
    assert r.svg is not None and r.png is not None
    assert "<text" not in r.svg and r.svg.count("<path") == 1
    d = re.search(r' d="([^"]+)"', r.svg).group(1)  # type: ignore[union-attr]
    assert d.count("M") >= r.glyphs == 10  # at least one contour per visible glyph (the space has none)
    nums = np.array([float(v) for v in re.findall(r"-?\d+\.\d+", d)]).reshape(-1, 2)
    ink = pixels(r.png)[..., 3] > 0
    ys, xs = np.nonzero(ink)
    # The PNG's ink and the SVG's control points cover the same box (the stroke adds ~1 px).
    assert abs(xs.min() - nums[:, 0].min()) < 3 and abs(xs.max() - nums[:, 0].max()) < 3
    assert abs(ys.min() - nums[:, 1].min()) < 3 and abs(ys.max() - nums[:, 1].max()) < 3


def test_pen_pressure_and_stroke_width_add_ink() -> None:
    def ink(**kw: float) -> float:
        png = render(RenderParams(text="永", style="print", background=None, output="png", **kw)).png
        return float(pixels(png)[..., 3].sum())  # type: ignore[arg-type]

    assert ink(pen_pressure=0.0) < ink(pen_pressure=0.5) < ink(pen_pressure=1.0)
    assert ink(stroke_width=1) < ink(stroke_width=6) < ink(stroke_width=20)


def test_fallback_chain_and_missing_glyphs() -> None:
    sample = "✓"  # in no subset: fails, naming the character
    with pytest.raises(GlyphsMissingError, match=r"U\+2713 '✓'") as err:
        render(RenderParams(text=f"ok {sample} 好 😀"))
    assert err.value.characters == ["✓", "😀"]
    # A character the style's font maps to an empty outline, or lacks, comes from the next font.
    fonts = chain("rounded")
    lacking = [chr(c) for c in charset() if not chr(c).isspace() and c not in fonts[0].cmap
               and any(c in f.cmap for f in fonts[1:])]
    if lacking:
        lay = layout(RenderParams(text=lacking[0], style="rounded"))
        assert lay.fallbacks == {lacking[0]: next(f.style for f in fonts[1:] if ord(lacking[0]) in f.cmap)}


def test_wrapping_keeps_lines_inside_the_width_and_punctuation_off_line_starts() -> None:
    p = RenderParams(text="这是一个很长的句子，用来测试换行。" * 4 + " Supercalifragilistic words wrap at spaces.",
                     style="handwritten", wrap_width=300, font_size=24)
    lay = layout(p)
    assert lay.lines > 3 and lay.width <= 300
    for g in lay.glyphs:
        assert g.x + g.font.advances[g.glyph] * p.font_size / g.font.units_per_em <= 300 - p.padding + 0.01
    starts = {}
    for g in lay.glyphs:
        starts.setdefault(g.baseline, g)
    closing = {g.font.cmap[ord(c)] for c in "，。" for g in lay.glyphs[:1]}
    assert not any(g.glyph in closing for g in starts.values())


PRINTABLE = st.text(st.characters(exclude_categories=("Cs",)), max_size=40)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=PRINTABLE, style=st.sampled_from(STYLES))
def test_any_text_renders_or_fails_cleanly(text: str, style: str) -> None:
    try:
        r = render(RenderParams(text=text, style=style, output="both"))
    except GlyphsMissingError as exc:
        assert exc.characters and all(c in text for c in exc.characters)
        return
    assert r.width > 0 and r.height > 0 and r.svg is not None and r.png is not None
    assert Image.open(io.BytesIO(r.png)).size == (r.width, r.height)


# Characters of the subsets' charset that at least one shipped font draws (the charset asks for
# whole blocks; a font may lack a few of their code points).
SUPPORTED = [chr(c) for c in charset() if unicodedata.category(chr(c)) not in ("Cc", "Cf", "Zs", "Zl", "Zp")
             and pick_font(chr(c), chain("print")) is not None]


@settings(max_examples=60, deadline=None)
@given(text=st.text(st.sampled_from(SUPPORTED), min_size=1, max_size=30), style=st.sampled_from(STYLES))
def test_every_shipped_character_renders_in_every_style(text: str, style: str) -> None:
    r = render(RenderParams(text=text, style=style, output="svg"))
    assert r.glyphs == len(text)


@pytest.mark.slow  # long model work (make test runs it; make test-fast leaves it out)
def test_the_fonts_cover_gb2312_and_big5_level_1_in_every_style() -> None:
    hanzi = [c for c in charset() if 0x4E00 <= c <= 0x9FFF]
    assert len(hanzi) == 8836  # GB 2312 (6,763) and Big5 level 1 (5,401) share 3,328
    for style in STYLES:
        own = chain(style)[0]
        drawn = sum(pick_font(chr(c), [own]) is not None for c in hanzi)
        assert drawn / len(hanzi) > 0.99, (style, drawn, len(hanzi))  # the style's own font, not fallbacks
