"""Write the parameter tables of docs/notebooks.md from the schemas in kvcost.notebook_params.

    python scripts/gen_docs.py          # rewrite the generated blocks in place
    python scripts/gen_docs.py --check  # exit 1 if docs/notebooks.md is out of date (tests use it)
    python -m kvcost.runs.gen_docs      # the same tool

Each notebook's section holds a block between ``<!-- params:STEM -->`` and
``<!-- /params:STEM -->``; only those blocks are generated, the prose around them is not.
"""
from __future__ import annotations

import argparse
import re
import sys

from kvcost import notebook_params
from kvcost.paths import repo_root

DOC = repo_root() / "docs" / "notebooks.md"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def params_block(stem: str) -> str:
    rows = ["| parameter | default | the post's value | allowed | meaning |", "| --- | --- | --- | --- | --- |"]
    for r in notebook_params.get(stem).table():
        post = f"`{_cell(r['post'])}`" if r["post"] else ""
        rows.append(f"| `{r['name']}` | `{_cell(r['default'])}` | {post} | {_cell(r['allowed'])} | {_cell(r['doc'])} |")
    return "\n".join(rows)


def render(text: str) -> str:
    def sub(m: re.Match) -> str:
        return f"<!-- params:{m.group(1)} -->\n{params_block(m.group(1))}\n<!-- /params:{m.group(1)} -->"
    return re.sub(r"<!-- params:(\S+) -->.*?<!-- /params:\1 -->", sub, text, flags=re.S)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The checked command line."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only check that the file is current")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    text = DOC.read_text()
    new = render(text)
    missing = [s for s in notebook_params.stems() if f"<!-- params:{s} -->" not in text]
    if args.check:
        if new != text or missing:
            print(f"docs/notebooks.md is out of date (missing sections: {missing}); run python scripts/gen_docs.py")
            return 1
        return 0
    DOC.write_text(new)
    if missing:
        print(f"add a section with <!-- params:STEM --><!-- /params:STEM --> for: {missing}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
