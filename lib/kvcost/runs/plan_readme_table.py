"""Write the README's "Which KV dtype for which context" table from the planner.

    .venv/bin/python scripts/plan_readme_table.py            # rewrite the table in README.md
    .venv/bin/python scripts/plan_readme_table.py --check    # exit 1 if README.md's table is stale
    python -m kvcost.runs.plan_readme_table --check          # the same tool

The table is :func:`kvcost.experiments.plan.readme_table`: one H100 SXM, each format counted by the engine
that runs it (vLLM for bf16/fp8, llama.cpp for f16 and its block types). It replaces the lines between
``<!-- plan-table:start -->`` and ``<!-- plan-table:end -->``.
"""
from __future__ import annotations

import argparse
import sys

from kvcost.experiments import plan as plan_exp
from kvcost.paths import repo_root
from kvcost.runs import tables

README = repo_root() / "README.md"
START, END = "<!-- plan-table:start -->", "<!-- plan-table:end -->"


def render(text: str) -> str:
    """``text`` (the README) with the table between the markers replaced by the planner's."""
    return tables.replace_between(text, START, END, plan_exp.readme_table(), "README.md")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The checked command line."""
    return tables.check_args(__doc__.splitlines()[0], "exit 1 when README.md's table is not the planner's", argv)


def main(argv: list[str] | None = None) -> int:
    return tables.write_or_check(README, render, check=parse_args(argv).check,
                                 command=".venv/bin/python scripts/plan_readme_table.py")


if __name__ == "__main__":
    sys.exit(main())
