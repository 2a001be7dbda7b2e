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
from kvcost.runs import tables

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
    return tables.check_args(__doc__.splitlines()[0], "only check that the file is current", argv)


def main(argv: list[str] | None = None) -> int:
    status = tables.write_or_check(DOC, render, check=parse_args(argv).check, command="python scripts/gen_docs.py")
    text = DOC.read_text(encoding="utf-8")
    missing = [s for s in notebook_params.stems() if f"<!-- params:{s} -->" not in text]
    if missing:                        # render fills the sections there are; a new one is added by hand
        print(f"docs/notebooks.md lacks the sections of {missing}: add "
              "<!-- params:STEM --><!-- /params:STEM --> for each")
        return 1
    return status


if __name__ == "__main__":
    sys.exit(main())
