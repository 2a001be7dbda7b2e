"""Write the long English texts the real-decoder runs read: data/text/pride_and_prejudice{,_full}.txt.

    apt-get download r-cran-janeaustenr && dpkg-deb -x r-cran-janeaustenr_1.0.0-1_all.deb deb
    python scripts/real_model_text.py deb/usr/lib/R/site-library/janeaustenr/data/Rdata
    python -m kvcost.runs.real_model_text deb/usr/lib/R/site-library/janeaustenr/data/Rdata   # the same job

Jane Austen, *Pride and Prejudice* (1813, public domain): ``pride_and_prejudice.txt`` is title to mid
chapter 11, the first 2,000 lines, and ``pride_and_prejudice_full.txt`` the whole novel (for windows of
8k and 32k tokens), of the ``prideprejudice`` character vector in the Debian package
``r-cran-janeaustenr`` 1.0.0-1 (the CRAN package janeaustenr, MIT; texts from Project
Gutenberg), joined with newlines. R's lazy-load data base is read without R, by the reader in
:mod:`kvcost.runs.extract_real_kv` (:func:`~kvcost.runs.extract_real_kv.read_novel`). The job stops
when a file's digest differs from the recorded one.
"""
from __future__ import annotations

import argparse
import sys

from kvcost.models.decoders import TEXTS
from kvcost.paths import repo_root
from kvcost.provenance import sha256
from kvcost.runs.extract_real_kv import read_novel

ROOT = repo_root()
NOVEL = "prideprejudice"
#: Each text (:data:`kvcost.models.decoders.TEXTS`): its first lines of the novel (None: all) and its sha256.
WRITTEN = {"pride_and_prejudice": (2000, "af15c200f75ddd6a19305791a3eb816cd52e2f70b7318f33d72cd8d9f74eaa7c"),
           "pride_and_prejudice_full": (None, "dfc684d4f857fa938268f9ab9c5567b64bd0691251eca959644adeabe6287a4d")}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The checked command line: one positional, the data base's path without ``.rdb`` / ``.rdx``."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 usage="real_model_text.py PATH/TO/janeaustenr/data/Rdata")
    ap.add_argument("rdata", metavar="PATH/TO/janeaustenr/data/Rdata",
                    help="janeaustenr's lazy-load data base (the path of Rdata.rdb and Rdata.rdx, without suffix)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    rdata = parse_args(argv).rdata
    novel = read_novel(rdata, NOVEL)
    for name, (lines, recorded) in WRITTEN.items():
        out = TEXTS[name]
        text = "\n".join(novel[:lines]).rstrip("\n") + "\n"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")
        digest = sha256(out)
        print(f"wrote {out.relative_to(ROOT)}: {len(novel[:lines])} lines, {len(text)} characters, sha256 {digest}")
        if digest != recorded:
            sys.exit(f"{out.name}: digest differs from the recorded {recorded}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
