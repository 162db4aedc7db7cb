"""`make fonts`: rebuild the committed subset fonts from Debian's font packages.

Only maintainers run this (it needs `apt-get install fonts-noto-cjk fonts-lxgw-wenkai
fonts-arphic-ukai fonts-wqy-microhei`); the subsets it writes are committed, so rendering and
`make test` need no apt step. Each subset keeps printable ASCII, Latin-1, Latin Extended-A, Greek,
Cyrillic, general and CJK punctuation, full-width forms, all of GB 2312 (6,763 hanzi, kana,
symbols) and Big5 level 1 (5,401 common traditional characters), drops hinting and layout
tables (the renderer reads only cmap, hmtx, hhea and outlines), and keeps the name table and
the licence. `data/SOURCES.md` records each file's source, licence and sha256.
"""

from __future__ import annotations

import hashlib
import shutil
import sys
from pathlib import Path

from fontTools import subset
from fontTools.ttLib import TTFont

from yue2_jobs.fonts.catalog import DATA_DIR, FONTS

# Where Debian installs each face (collection index for .ttc files) and its package.
SOURCES = {
    "noto-serif-cjk-sc.otf": ("/usr/share/fonts/opentype/noto/NotoSerifCJK-Regular.ttc", 2, "fonts-noto-cjk"),
    "lxgw-wenkai.ttf": ("/usr/share/fonts/truetype/lxgw-wenkai/LXGWWenKai-Regular.ttf", None, "fonts-lxgw-wenkai"),
    "ar-pl-ukai-cn.ttf": ("/usr/share/fonts/truetype/arphic/ukai.ttc", 0, "fonts-arphic-ukai"),
    "wqy-microhei.ttf": ("/usr/share/fonts/truetype/wqy/wqy-microhei.ttc", 0, "fonts-wqy-microhei"),
}


def charset() -> list[int]:
    """The code points every subset keeps."""
    points = set(range(0x20, 0x7F)) | set(range(0xA0, 0x180)) | set(range(0x370, 0x500))
    points |= set(range(0x2000, 0x2070)) | set(range(0x3000, 0x3040)) | set(range(0xFF00, 0xFFF0))
    for hi in [*range(0xA1, 0xAA), *range(0xB0, 0xF8)]:  # GB 2312: symbols, Greek, Cyrillic, kana; hanzi
        for lo in range(0xA1, 0xFF):
            points |= _decoded(bytes([hi, lo]), "gb2312")
    for hi in range(0xA4, 0xC7):  # Big5 level 1: the 5,401 common traditional characters
        for lo in [*range(0x40, 0x7F), *range(0xA1, 0xFF)]:
            points |= _decoded(bytes([hi, lo]), "big5")
    return sorted(points)


def _decoded(raw: bytes, codec: str) -> set[int]:
    try:
        return {ord(raw.decode(codec))}
    except UnicodeDecodeError:
        return set()


def build(out: Path = DATA_DIR) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "licenses").mkdir(exist_ok=True)
    options = subset.Options()
    options.layout_features = []
    options.hinting = False
    options.name_IDs = ["*"]
    options.name_languages = ["*"]
    options.notdef_outline = True
    options.drop_tables += ["GSUB", "GPOS", "GDEF", "BASE", "VORG", "vhea", "vmtx", "DSIG"]
    rows = []
    for spec in FONTS.values():
        path, index, package = SOURCES[spec.file]
        font = TTFont(path, fontNumber=index or 0, lazy=False)
        sub = subset.Subsetter(options)
        sub.populate(unicodes=charset())
        sub.subset(font)
        font.save(out / spec.file)
        shutil.copyfile(f"/usr/share/doc/{package}/copyright", out / "licenses" / f"{package}.copyright")
        digest = hashlib.sha256((out / spec.file).read_bytes()).hexdigest()
        rows.append(f"| `{spec.file}` | {spec.family} | {spec.license} | Debian `{package}` (`{path}`"
                    f"{f', face {index}' if index is not None else ''}) | {(out / spec.file).stat().st_size:,} | "
                    f"`{digest[:16]}…` |")
        print(f"{spec.file}: {(out / spec.file).stat().st_size:,} bytes", file=sys.stderr)
    (out / "SOURCES.md").write_text(
        "# Fonts\n\nSubsets built by `make fonts` (`yue2_jobs/fonts/build.py`) from Debian's packages: printable "
        "ASCII, Latin-1, general and CJK punctuation, full-width forms and the 6,763 hanzi of GB 2312; no hinting, "
        "no layout tables. Each licence (the package's copyright file) is in `licenses/`; every licence here "
        "permits subsetting and redistribution with the licence kept.\n\n"
        "| file | family | licence | source | bytes | sha256 |\n| --- | --- | --- | --- | --- | --- |\n"
        + "\n".join(rows) + "\n")


if __name__ == "__main__":
    build()
