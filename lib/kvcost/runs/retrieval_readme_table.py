"""Write Gemma 3 270M's retrieval verdicts into its data README from the committed grids.

    .venv/bin/python scripts/retrieval_readme_table.py            # rewrite the tables
    .venv/bin/python scripts/retrieval_readme_table.py --check    # exit 1 if they are stale
    python -m kvcost.runs.retrieval_readme_table --check          # the same tool

For each RULER task the decoder has a grid of (``passkey.csv`` for niah_single_1, ``niah_multikey_1.csv``), the
verdict of every (context, variant) cell against exact attention on the same trials
(:func:`kvcost.experiments.two_decoders.against_exact` at 20 trials, Holm–Tarone over the task's grid) and the
answer's margin shift, as :func:`~kvcost.experiments.two_decoders.verdict_grid` writes them, and what a trial of
each kind of variant cost (:func:`~kvcost.experiments.two_decoders.trial_cost`). They replace the
lines between ``<!-- retrieval-tables:start -->`` and ``<!-- retrieval-tables:end -->`` of
``data/real_model/gemma3_270m/README.md``, so the README's counts cannot lag the rows: each landing of rows is
followed by this script (``make test`` runs ``--check``).
"""
from __future__ import annotations

import sys

import pandas as pd

from kvcost.experiments import two_decoders as two
from kvcost.paths import repo_root
from kvcost.retrieval.ruler import results_name
from kvcost.runs import tables
from kvcost.sweep import coverage, spec

MODEL = "gemma3-270m"
README = repo_root() / "data" / "real_model" / "gemma3_270m" / "README.md"
START, END = "<!-- retrieval-tables:start -->", "<!-- retrieval-tables:end -->"
#: The tasks shown, each with its committed file's name and the sweep that plans its grid (sweeps/).
TASKS = (("niah_single_1", "passkey.csv", "gemma_passkey"),
         ("niah_multikey_1", results_name("niah_multikey_1"), "gemma_multikey"))
MIN_TRIALS = 20


def markdown(grid: pd.DataFrame) -> str:
    """``grid`` (:func:`~kvcost.experiments.two_decoders.verdict_grid`) as a Markdown table, its variants in code."""
    head = "| variant | " + " | ".join(grid.columns) + " |"
    rule = "| --- | " + " | ".join("---:" for _ in grid.columns) + " |"
    body = [f"| {v if ' ' in v else f'`{v}`'} | " + " | ".join(
        f"**{c}**" if c.endswith("loss detected") else c for c in row) + " |" for v, row in grid.iterrows()]
    return "\n".join([head, rule, *body])


def still_to_run(sweep_name: str) -> pd.DataFrame:
    """The trials sweep ``sweep_name`` plans that its committed file lacks: ``context``, ``trial``, ``variant``."""
    sweep = spec.load(sweep_name, check_scripts=False)
    planned = set().union(*(coverage.run_cells(sweep, run) for run in sweep.runs))
    key = sweep.publish_key
    left = pd.DataFrame(sorted(planned - coverage.committed_keys(sweep)), columns=key)
    return left.astype({"context": int, "trial": int}) if not left.empty else pd.DataFrame(columns=key)


def tables_text() -> str:
    """The block between the markers, computed from the committed grids."""
    parts = []
    timed = pd.concat([two.load_results(MODEL, name, required=False) for _, name, _ in TASKS], ignore_index=True)
    for task, name, sweep_name in TASKS:
        rows = two.load_results(MODEL, name, required=False)
        against = two.against_exact(rows, min_trials=MIN_TRIALS) if not rows.empty else rows
        if against.empty:
            continue
        cells = len(against)
        parts += [f"**RULER {task}** (`{name}`; {cells} cells of at least {MIN_TRIALS} trials, one Holm–Tarone "
                  "family): successes of 20, then the trials lost and gained against exact attention on the same "
                  "prompts; **bold** where the family detects a loss.", "",
                  markdown(two.verdict_grid(against)), "",
                  f"The answer's logit margin (its token's logit over the best other's), mean paired shift against "
                  f"exact with its 95% bootstrap interval, {task}:", "",
                  markdown(two.verdict_grid(against, "margin")), "",
                  f"What a trial cost, {task}: seconds per trial as each run timed it, median [min–max] over the "
                  "committed trials (on whichever machine ran it, beside its load: the JSON's commands name "
                  "them), the CPU time of all the context's committed cells, and what the plan of record (sweep "
                  f"`{sweep_name}`) still lacks, at the medians of both tasks' trials of each kind at that context:",
                  "", markdown(two.trial_cost(rows, still_to_run(sweep_name), timed)), ""]
    return "\n".join(parts).rstrip("\n")


def render(text: str) -> str:
    """``text`` (the README) with the block between the markers replaced by :func:`tables_text`."""
    return tables.replace_between(text, START, END, tables_text(), README.name)


def parse_args(argv: list[str] | None = None):
    """The checked command line."""
    return tables.check_args(__doc__.splitlines()[0], "exit 1 when the README's tables are not the grids'", argv)


def main(argv: list[str] | None = None) -> int:
    return tables.write_or_check(README, render, check=parse_args(argv).check,
                                 command=".venv/bin/python scripts/retrieval_readme_table.py")


if __name__ == "__main__":
    sys.exit(main())
