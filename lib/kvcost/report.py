"""Verdicts computed from results: each claim of the post against the number kvcost computes.

A notebook's **Verdict** cell renders a list of :class:`Check` rows; its text is built from
the computed values, never typed in.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import pandas as pd

__all__ = ["Check", "check_printed", "check_value", "compare_table", "checks_frame", "formatted", "verdict_markdown",
           "show_verdict"]


@dataclass(frozen=True)
class Check:
    """One claim: what was published, what kvcost computed, whether they agree, and why not."""

    claim: str
    published: str
    computed: str
    agrees: bool
    note: str = ""


def check_printed(claim: str, printed: str, value: object, fmt: str, note: str = "") -> Check:
    """Agreement to the digits printed: ``format(value, fmt)`` must equal ``printed`` exactly."""
    computed = format(value, fmt).strip()
    return Check(claim, printed.strip(), computed, computed == printed.strip(), note)


def check_value(claim: str, published: float, computed: float, rel_tol: float = 0.0,
                abs_tol: float = 0.0, fmt: str = "g", note: str = "") -> Check:
    """Numeric agreement within a tolerance (exact when both tolerances are 0)."""
    diff = abs(float(computed) - float(published))
    agrees = diff <= max(abs_tol, rel_tol * abs(float(published)))
    return Check(claim, format(published, fmt), format(computed, fmt), bool(agrees), note)


def checks_frame(checks: Sequence[Check]) -> pd.DataFrame:
    """The checks as a table with columns claim, published, computed, agrees, note."""
    return pd.DataFrame([asdict(c) for c in checks], columns=["claim", "published", "computed", "agrees", "note"])


def verdict_markdown(checks: Sequence[Check], what: str = "printed numbers",
                     readings: Sequence[Check] = ()) -> str:
    """Markdown verdict: reproduction of the printed numbers, then the post's readings.

    The first part summarises ``checks`` (reproduced, or which numbers differ and why);
    the second lists each of ``readings`` (claims in the post's prose) as holding or not,
    with what was computed.
    """
    lines = ["### Verdict"]
    if checks:
        lines.append("")
        n_ok = sum(c.agrees for c in checks)
        if n_ok == len(checks):
            lines.append(f"**Reproduced**: all {len(checks)} {what} agree with kvcost's computation.")
        else:
            lines.append(f"**Differs**: {n_ok} of {len(checks)} {what} agree; these do not:")
            lines.append("")
            for c in checks:
                if not c.agrees:
                    why = f" — {c.note}" if c.note else ""
                    lines.append(f"- {c.claim}: published `{c.published}`, kvcost computes `{c.computed}`{why}")
    if readings:
        n_hold = sum(c.agrees for c in readings)
        lines += ["", f"**The post's readings**: {n_hold} of {len(readings)} hold.", ""]
        for c in readings:
            mark = "holds" if c.agrees else "does not hold"
            why = f" ({c.note})" if (c.note and not c.agrees) else ""
            lines.append(f"- *{c.claim}* — {mark}: {c.computed}{why}.")
    return "\n".join(lines)


def show_verdict(checks: Sequence[Check], what: str = "printed numbers", extra: str = "",
                 readings: Sequence[Check] = ()) -> None:
    """Display the verdict as Markdown in a notebook (plain text elsewhere)."""
    text = verdict_markdown(checks, what, readings) + (("\n\n" + extra) if extra else "")
    try:
        from IPython.display import Markdown, display
    except ImportError:  # pragma: no cover - outside Jupyter
        print(text)
    else:
        display(Markdown(text))


def compare_table(printed: pd.DataFrame, computed: pd.DataFrame, keys: Sequence[str],
                  formats: dict[str, str], label: str = "", note: str = "") -> list[Check]:
    """Check every printed cell against the computed table, to the digits printed.

    ``printed`` holds the post's strings (see :mod:`kvcost.post`); rows are matched on the
    ``keys`` columns (compared as strings), and each column in ``formats`` is formatted
    with its format spec before comparison. A printed row with no computed row fails.
    """
    checks = []
    # to_dict keeps each column's own type (iterrows would upcast ints to float).
    index = {tuple(str(row[k]) for k in keys): row for row in computed.to_dict("records")}
    for prow in printed.to_dict("records"):
        key = tuple(str(prow[k]) for k in keys)
        crow = index.get(key)
        where = " ".join(f"{k}={v}" for k, v in zip(keys, key))
        for col, fmt in formats.items():
            claim = f"{label} {where} {col}".strip()
            if crow is None:
                checks.append(Check(claim, str(prow[col]), "(not computed)", False, "row missing"))
            else:
                checks.append(check_printed(claim, str(prow[col]), crow[col], fmt, note))
    return checks


def formatted(df: pd.DataFrame, formats: dict[str, str]) -> pd.DataFrame:
    """A display copy of ``df`` with the given columns formatted like the post prints them."""
    out = df.copy()
    for col, fmt in formats.items():
        out[col] = [format(v, fmt) for v in df[col]]
    return out
