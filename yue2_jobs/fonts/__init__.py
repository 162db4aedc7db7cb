"""Font-rendering jobs: text (CJK first) to SVG and PNG from real glyph outlines."""
