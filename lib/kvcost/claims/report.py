"""Verdicts computed from results: each claim of the post against the number kvcost computes.

Every claims module (``kvcost.claims.<notebook stem>``) has the same four entry points:
``printed(...)`` (published printed numbers against kvcost's), ``readings(...)`` (readings of
published claims), ``errata(...)`` (published claims checked by computation) and ``verdict(...)``,
which bundles them into one :class:`Verdict` for the notebook's **Verdict** cell. A
:class:`Check` carries its kind, and its kind fixes its word: a *printed* number is
reproduced / differs, a *reading* holds / does not hold (or is not shown, when the data
cannot tell), an *erratum* is correct / wrong. When a run's parameters are not the post's,
nothing is compared: the verdict says "not tested by the post" and shows what was computed.
All text is built from computed values, never typed in.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import pandas as pd

__all__ = [
    "ENTRY_POINTS",
    "ERRATUM",
    "KINDS",
    "NOT_SHOWN",
    "NOT_TESTED",
    "PRINTED",
    "READING",
    "WORDS",
    "Check",
    "Verdict",
    "as_kind",
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

#: The three kinds of check: a number the post (or a publication) printed, a reading of a published
#: claim, a published claim checked by computation.
PRINTED, READING, ERRATUM = "printed", "reading", "erratum"
KINDS = (PRINTED, READING, ERRATUM)
#: One word per meaning: each kind's word when the check agrees, and when it does not.
WORDS = {PRINTED: ("reproduced", "differs"), READING: ("holds", "does not hold"), ERRATUM: ("correct", "wrong")}
#: A reading the data cannot decide (``agrees`` is None): e.g. two rates whose intervals overlap.
NOT_SHOWN = "not shown"
#: What every claims module exposes, named the same everywhere.
ENTRY_POINTS = ("printed", "readings", "errata", "verdict")


@dataclass(frozen=True)
class Check:
    """One claim of a given ``kind``: what was published, what kvcost computed, whether they agree, and why not.

    ``agrees`` is None only for a reading the data cannot decide (its word is :data:`NOT_SHOWN`).
    """

    kind: str
    claim: str
    published: str
    computed: str
    agrees: bool | None
    note: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown kind {self.kind!r}: one of {KINDS}")
        if self.agrees is None and self.kind != READING:
            raise ValueError(f"only a reading can be undecided, not a {self.kind} check ({self.claim!r})")

    @property
    def word(self) -> str:
        """The word this check's kind gives it: reproduced / differs, holds / does not hold (/ not shown),
        correct / wrong."""
        if self.agrees is None:
            return NOT_SHOWN
        return WORDS[self.kind][0 if self.agrees else 1]


def as_kind(checks: Sequence[Check], kind: str) -> list[Check]:
    """``checks`` re-read as ``kind`` (e.g. another notebook's errata, read as readings here)."""
    return [replace(c, kind=kind) for c in checks]


def _kinded(checks: Sequence[Check], kind: str, field: str) -> tuple[Check, ...]:
    out = tuple(checks)
    for c in out:
        if not isinstance(c, Check) or c.kind != kind:
            raise ValueError(f"Verdict.{field} holds {kind} checks only, not {c!r}")
        if c.agrees is None:
            raise ValueError(f"Verdict.{field} holds decided checks only; {c.claim!r} is not shown")
    return out


@dataclass(frozen=True)
class Verdict:
    """What a notebook's Verdict cell renders (:func:`verdict_markdown`).

    ``printed``: printed numbers against kvcost's (each reproduced or differs), summed up as "``what``";
    ``untested``: computed rows or claims the post reported nothing for; ``readings``: readings of
    published claims (each holds or does not); ``errata``: published claims checked by computation
    (each correct or wrong); ``tested=False`` when the run's parameters ``changed`` are not the post's
    (nothing is compared; readings show what was computed); ``extra``: Markdown after the verdict.
    """

    printed: Sequence[Check] = ()
    readings: Sequence[Check] = ()
    errata: Sequence[Check] = ()
    untested: Sequence[str] = ()
    tested: bool = True
    changed: Sequence[str] = ()
    what: str = "printed numbers"
    extra: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "printed", _kinded(self.printed, PRINTED, "printed"))
        object.__setattr__(self, "readings", _kinded(self.readings, READING, "readings"))
        object.__setattr__(self, "errata", _kinded(self.errata, ERRATUM, "errata"))
        object.__setattr__(self, "untested", tuple(self.untested))
        object.__setattr__(self, "changed", tuple(self.changed))


def printed_check(claim: str, printed: str, value: object, fmt: str, note: str = "") -> Check:
    """A printed number, to the digits printed: ``format(value, fmt)`` must equal ``printed`` exactly."""
    computed = format(value, fmt).strip()
    return Check(PRINTED, claim, printed.strip(), computed, computed == printed.strip(), note)


def value_check(claim: str, published: float, computed: float, rel_tol: float = 0.0,
                abs_tol: float = 0.0, fmt: str = "g", note: str = "") -> Check:
    """A published number against kvcost's within a tolerance (exact when both tolerances are 0)."""
    diff = abs(float(computed) - float(published))
    agrees = diff <= max(abs_tol, rel_tol * abs(float(published)))
    return Check(PRINTED, claim, format(published, fmt), format(computed, fmt), bool(agrees), note)


def checks_frame(checks: Sequence[Check]) -> pd.DataFrame:
    """The checks as a table with columns claim, published, computed, agrees, note."""
    cols = ["claim", "published", "computed", "agrees", "note"]
    return pd.DataFrame([{k: getattr(c, k) for k in cols} for c in checks], columns=cols)


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


def verdict_markdown(verdict: Verdict) -> str:
    """Markdown for a :class:`Verdict`: the printed numbers, the rows the post did not print, the readings,
    the errata, then ``extra``. Each check's word is its kind's (:attr:`Check.word`)."""
    v = verdict
    lines = ["### Verdict"]
    if not v.tested:
        params = ", ".join(f"`{c}`" for c in v.changed) or "the parameters"
        lines += ["", f"**{NOT_TESTED.capitalize()}**: this run changes {params} from the setting the post "
                  "reported, so nothing here is compared with the post; the tables above are what kvcost computes "
                  "for these parameters."]
    elif v.printed:
        lines.append("")
        n_ok = sum(bool(c.agrees) for c in v.printed)
        if n_ok == len(v.printed):
            lines.append(f"**{WORDS[PRINTED][0].capitalize()}**: all {len(v.printed)} {v.what} agree with "
                         "kvcost's computation.")
        else:
            lines.append(f"**{WORDS[PRINTED][1].capitalize()}**: {n_ok} of {len(v.printed)} {v.what} agree; "
                         "these do not:")
            lines.append("")
            for c in v.printed:
                if not c.agrees:
                    why = f" — {c.note}" if c.note else ""
                    lines.append(f"- {c.claim}: published `{c.published}`, kvcost computes `{c.computed}`{why}")
    if v.tested and v.untested:
        lines += ["", f"**{NOT_TESTED.capitalize()}**: {'; '.join(v.untested)}."]
    if v.readings:
        if v.tested:
            n_hold = sum(bool(c.agrees) for c in v.readings)
            lines += ["", f"**The post's readings**: {n_hold} of {len(v.readings)} hold.", ""]
        else:
            lines += ["", f"**The post's readings, computed at these parameters** ({NOT_TESTED}):", ""]
        for c in v.readings:
            if v.tested:
                why = f" ({c.note})" if (c.note and not c.agrees) else ""
                lines.append(f"- *{c.claim}* — {c.word}: {c.computed}{why}.")
            else:
                lines.append(f"- *{c.claim}*: {c.computed}.")
    if v.errata:
        n_wrong = sum(not c.agrees for c in v.errata)
        lines += ["", f"**Errata**: {n_wrong} of {len(v.errata)} of the post's claims are {WORDS[ERRATUM][1]}.", ""]
        for c in v.errata:
            why = f" ({c.note})" if c.note else ""
            lines.append(f"- *{c.claim}* — {c.word}: published `{c.published}`; computed {c.computed}{why}.")
    text = "\n".join(lines)
    return text + ("\n\n" + v.extra if v.extra else "")


def show_verdict(verdict: Verdict) -> None:
    """Display :func:`verdict_markdown` as Markdown in a notebook (plain text elsewhere)."""
    text = verdict_markdown(verdict)
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
