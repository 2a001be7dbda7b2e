"""Verdicts computed from results: each claim of the post against the number kvcost computes.

A notebook's **Verdict** cell renders lists of :class:`Check` rows in three kinds, each with
its own words: the post's *printed numbers* (reproduced / differs), its *readings* of them
(holds / does not hold) and its *errata* (correct / wrong). When a run's parameters are not
the post's, nothing is compared: the verdict says "not tested by the post" and shows what
was computed. All text is built from computed values, never typed in.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import pandas as pd

__all__ = [
    "NOT_TESTED",
    "Check",
    "checks_frame",
    "compare_table",
    "formatted",
    "printed_check",
    "show_verdict",
    "untested_rows",
    "value_check",
    "verdict_markdown",
]

NOT_TESTED = "not tested by the post"


@dataclass(frozen=True)
class Check:
    """One claim: what was published, what kvcost computed, whether they agree, and why not."""

    claim: str
    published: str
    computed: str
    agrees: bool
    note: str = ""


def printed_check(claim: str, printed: str, value: object, fmt: str, note: str = "") -> Check:
    """Agreement to the digits printed: ``format(value, fmt)`` must equal ``printed`` exactly."""
    computed = format(value, fmt).strip()
    return Check(claim, printed.strip(), computed, computed == printed.strip(), note)


def value_check(claim: str, published: float, computed: float, rel_tol: float = 0.0,
                abs_tol: float = 0.0, fmt: str = "g", note: str = "") -> Check:
    """Numeric agreement within a tolerance (exact when both tolerances are 0)."""
    diff = abs(float(computed) - float(published))
    agrees = diff <= max(abs_tol, rel_tol * abs(float(published)))
    return Check(claim, format(published, fmt), format(computed, fmt), bool(agrees), note)


def checks_frame(checks: Sequence[Check]) -> pd.DataFrame:
    """The checks as a table with columns claim, published, computed, agrees, note."""
    return pd.DataFrame([asdict(c) for c in checks], columns=["claim", "published", "computed", "agrees", "note"])


def _keys(df: pd.DataFrame, keys: Sequence[str]) -> list[tuple[str, ...]]:
    return [tuple(str(row[k]) for k in keys) for row in df.to_dict("records")]


def compare_table(printed: pd.DataFrame, computed: pd.DataFrame, keys: Sequence[str],
                  formats: dict[str, str], label: str = "", note: str = "") -> list[Check]:
    """Check every printed cell of a row kvcost computed too, to the digits printed.

    ``printed`` holds the post's strings (see :mod:`kvcost.inputs.post`); rows are matched on the
    ``keys`` columns (compared as strings), and each column in ``formats`` is formatted with
    its format spec before comparison. Rows only one side has are not compared: a printed
    row that was not computed was not asked for, a computed row the post did not print is
    :func:`untested_rows`.
    """
    checks = []
    # to_dict keeps each column's own type (iterrows would upcast ints to float).
    index = dict(zip(_keys(computed, keys), computed.to_dict("records")))
    for key, prow in zip(_keys(printed, keys), printed.to_dict("records")):
        crow = index.get(key)
        if crow is None:
            continue
        where = " ".join(f"{k}={v}" for k, v in zip(keys, key))
        for col, fmt in formats.items():
            checks.append(printed_check(f"{label} {where} {col}".strip(), str(prow[col]), crow[col], fmt, note))
    return checks


def untested_rows(printed: pd.DataFrame, computed: pd.DataFrame, keys: Sequence[str]) -> list[str]:
    """The computed rows the post did not print, as ``"k=v k2=v2"`` labels."""
    seen = set(_keys(printed, keys))
    return [" ".join(f"{k}={v}" for k, v in zip(keys, key)) for key in _keys(computed, keys) if key not in seen]


def verdict_markdown(checks: Sequence[Check] = (), what: str = "printed numbers", readings: Sequence[Check] = (),
                     *, errata: Sequence[Check] = (), untested: Sequence[str] = (), tested: bool = True,
                     changed: Sequence[str] = ()) -> str:
    """Markdown verdict: the printed numbers, the rows the post did not print, the readings, the errata.

    ``checks`` compare the post's printed numbers with kvcost's (reproduced, or which differ
    and why). ``untested`` names computed rows or claims the post reported nothing for. ``readings``
    are claims in the post's prose, each holding or not. ``errata`` are the post's claims
    checked by computation, each correct or wrong. ``tested=False`` (the run's parameters
    ``changed`` are not the post's): nothing is compared; readings show what was computed.
    """
    lines = ["### Verdict"]
    if not tested:
        params = ", ".join(f"`{c}`" for c in changed) or "the parameters"
        lines += ["", f"**{NOT_TESTED.capitalize()}**: this run changes {params} from the setting the post "
                  "reported, so nothing here is compared with the post; the tables above are what kvcost computes "
                  "for these parameters."]
    elif checks:
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
    if tested and untested:
        lines += ["", f"**{NOT_TESTED.capitalize()}**: {'; '.join(untested)}."]
    if readings:
        if tested:
            n_hold = sum(c.agrees for c in readings)
            lines += ["", f"**The post's readings**: {n_hold} of {len(readings)} hold.", ""]
        else:
            lines += ["", f"**The post's readings, computed at these parameters** ({NOT_TESTED}):", ""]
        for c in readings:
            if tested:
                mark = "holds" if c.agrees else "does not hold"
                why = f" ({c.note})" if (c.note and not c.agrees) else ""
                lines.append(f"- *{c.claim}* — {mark}: {c.computed}{why}.")
            else:
                lines.append(f"- *{c.claim}*: {c.computed}.")
    if errata:
        n_wrong = sum(not c.agrees for c in errata)
        lines += ["", f"**Errata**: {n_wrong} of {len(errata)} of the post's claims are wrong.", ""]
        for c in errata:
            mark = "correct" if c.agrees else "wrong"
            why = f" ({c.note})" if c.note else ""
            lines.append(f"- *{c.claim}* — {mark}: published `{c.published}`; computed {c.computed}{why}.")
    return "\n".join(lines)


def show_verdict(checks: Sequence[Check] = (), what: str = "printed numbers", extra: str = "",
                 readings: Sequence[Check] = (), **kw: object) -> None:
    """Display :func:`verdict_markdown` as Markdown in a notebook (plain text elsewhere)."""
    text = verdict_markdown(checks, what, readings, **kw) + (("\n\n" + extra) if extra else "")
    try:
        from IPython.display import Markdown, display
    except ImportError:  # pragma: no cover - outside Jupyter
        print(text)
    else:
        display(Markdown(text))


def formatted(df: pd.DataFrame, formats: dict[str, str]) -> pd.DataFrame:
    """A display copy of ``df`` with the given columns formatted like the post prints them."""
    out = df.copy()
    for col, fmt in formats.items():
        out[col] = [format(v, fmt) for v in df[col]]
    return out
