"""`make font-sheet`: every style at three pen pressures, as one PNG and one SVG under docs/."""

from __future__ import annotations

import io
import re
from pathlib import Path

from yue2_jobs.fonts.catalog import FONTS, STYLES
from yue2_jobs.fonts.render import Rendered, RenderParams, render

TEXT = "你好，世界 Hello"
PRESSURES = (0.0, 0.5, 1.0)
STROKE = 3.0


def cells() -> list[list[tuple[str, RenderParams]]]:
    rows = []
    for style in STYLES:
        label = RenderParams(text=f"{style} · {FONTS[style].family}", style="print", font_size=18, padding=8,
                             pen_pressure=1.0, stroke_width=1)
        rows.append([("label", label)] + [(f"p={p}", RenderParams(text=TEXT, style=style, pen_pressure=p,
                                                                   stroke_width=STROKE)) for p in PRESSURES])
    return rows


def build(out_dir: Path) -> tuple[Path, Path]:
    from PIL import Image

    grid = [[render(p) for _, p in row] for row in cells()]
    header = [render(RenderParams(text=f"pen_pressure {p}, stroke_width {STROKE:g}", style="print", font_size=18,
                                  padding=8, pen_pressure=1.0, stroke_width=1)) for p in PRESSURES]
    col_w = [max(r.width for r in col) for col in zip(*grid, strict=True)]
    row_h = [max(r.height for r in row) for row in grid]
    head_h = max(h.height for h in header)
    width, height = sum(col_w), head_h + sum(row_h)
    sheet = Image.new("RGBA", (width, height), "white")
    svg_parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
                 f'viewBox="0 0 {width} {height}"><rect width="100%" height="100%" fill="#ffffff"/>']

    def place(r: Rendered, x: int, y: int) -> None:
        assert r.png is not None and r.svg is not None  # the sheet renders both
        sheet.paste(Image.open(io.BytesIO(r.png)).convert("RGBA"), (x, y))
        inner = re.sub(r"^<svg ", f'<svg x="{x}" y="{y}" ', r.svg)
        svg_parts.append(inner)

    x = col_w[0]
    for title, w in zip(header, col_w[1:], strict=True):
        place(title, x, 0)
        x += w
    y = head_h
    for line, h in zip(grid, row_h, strict=True):
        x = 0
        for cell, w in zip(line, col_w, strict=True):
            place(cell, x, y)
            x += w
        y += h
    out_dir.mkdir(parents=True, exist_ok=True)
    png, svg = out_dir / "font_styles.png", out_dir / "font_styles.svg"
    sheet.convert("RGB").save(png)
    svg.write_text("".join(svg_parts) + "</svg>")
    return png, svg


if __name__ == "__main__":
    for path in build(Path(__file__).resolve().parents[2] / "docs"):
        print(f"wrote {path}")
