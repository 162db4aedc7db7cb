"""The shipped fonts: one per style, as recorded in data/SOURCES.md, each with its licence."""

from __future__ import annotations

import hashlib
import re

from yue2_jobs.fonts.catalog import DATA_DIR, FONTS, STYLES, chain


def test_every_style_has_its_recorded_font_and_licence() -> None:
    sources = (DATA_DIR / "SOURCES.md").read_text()
    assert set(STYLES) == {"print", "handwritten", "calligraphy", "rounded"}
    for spec in FONTS.values():
        row = next(line for line in sources.splitlines() if line.startswith(f"| `{spec.file}`"))
        recorded = re.search(r"`([0-9a-f]{16})…`", row).group(1)  # type: ignore[union-attr]
        assert hashlib.sha256((DATA_DIR / spec.file).read_bytes()).hexdigest().startswith(recorded), spec.file
        package = re.search(r"Debian `([^`]+)`", row).group(1)  # type: ignore[union-attr]
        assert (DATA_DIR / "licenses" / f"{package}.copyright").stat().st_size > 1000
    for style in STYLES:
        fonts = chain(style)
        assert fonts[0].style == style and sorted(f.style for f in fonts) == sorted(STYLES)
