#!/usr/bin/env python3
"""Write the long English text the real-decoder runs read: data/text/pride_and_prejudice.txt.

    apt-get download r-cran-janeaustenr && dpkg-deb -x r-cran-janeaustenr_1.0.0-1_all.deb deb
    python scripts/real_model_text.py deb/usr/lib/R/site-library/janeaustenr/data/Rdata

Jane Austen, *Pride and Prejudice* (1813, public domain), title to mid chapter 11: the first
``LINES`` lines of the ``prideprejudice`` character vector in the Debian package
``r-cran-janeaustenr`` 1.0.0-1 (the CRAN package janeaustenr, MIT; texts from Project
Gutenberg), joined with newlines. R's lazy-load data base is read without R, by the reader in
``scripts/extract_real_kv.py``. The script stops when the digest differs from the recorded one.
"""
from __future__ import annotations

import gzip
import hashlib
import importlib.util
import sys
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "data" / "text" / "pride_and_prejudice.txt"
NOVEL = "prideprejudice"
LINES = 2000
TEXT_SHA256 = "af15c200f75ddd6a19305791a3eb816cd52e2f70b7318f33d72cd8d9f74eaa7c"


def _reader():
    spec = importlib.util.spec_from_file_location("extract_real_kv", ROOT / "scripts" / "extract_real_kv.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod._RReader


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        sys.exit("usage: real_model_text.py PATH/TO/janeaustenr/data/Rdata")
    rdata = argv[0]
    reader = _reader()
    index = reader(gzip.decompress(Path(f"{rdata}.rdx").read_bytes())).item()
    names = ["emma", "mansfieldpark", "northangerabbey", "persuasion", "prideprejudice", "sensesensibility"]
    off, length = dict(zip(names, index[0]))[NOVEL]
    blob = Path(f"{rdata}.rdb").read_bytes()[off:off + length]
    lines = reader(zlib.decompress(blob[4:])).item()
    text = "\n".join(lines[:LINES]).rstrip("\n") + "\n"
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text, encoding="utf-8")
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    print(f"wrote {OUT.relative_to(ROOT)}: {LINES} lines, {len(text)} characters, sha256 {digest}")
    if TEXT_SHA256 and digest != TEXT_SHA256:
        sys.exit(f"text digest differs from the recorded {TEXT_SHA256}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
