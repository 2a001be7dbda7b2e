"""What of a publishing sweep's grid its committed table already holds.

A run of a script sweep with ``publish`` writes rows whose key columns (``publish.key``) come from its
parameters: a key column named like a parameter takes that parameter's value (each value, where it is a
list), one named like a parameter's singular takes each of its values (``variant`` from ``variants``).
The keys are compared as the committed CSV writes them (text: ``8192``, ``store:q8_0``). A run is
*committed* when every row it would write is in the committed file already: ``sweep status`` counts a
run's committed rows, and ``sweep run --skip-committed`` leaves the committed runs out, so a grid whose
cells were filled by hand-run commands (``--variants ... --order variant``) is not run again.
"""
from __future__ import annotations

import itertools
from typing import Any

import pandas as pd

from kvcost import provenance
from kvcost.sweep.spec import Run, Sweep

__all__ = ["committed_keys", "run_cells", "run_coverage"]


def _values(value: Any) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


def run_cells(sweep: Sweep, run: Run) -> set[tuple[str, ...]]:
    """The publish-key tuples of the rows ``run`` writes. ValueError naming the key column when no
    parameter of the run gives it (then the grid cannot be read against the committed file)."""
    if sweep.publish is None:
        raise ValueError(f"sweep {sweep.name!r} publishes no committed file (its YAML has no 'publish')")
    columns = []
    for col in sweep.publish_key:
        name = col if col in run.params else f"{col}s" if f"{col}s" in run.params else None
        if name is None:
            raise ValueError(f"sweep {sweep.name!r}: publish key column {col!r} is not a parameter of its runs "
                             f"(nor is {col + 's'!r}); the parameters are {sorted(run.params)}")
        columns.append(_values(run.params[name]))
    return set(itertools.product(*columns))


def committed_keys(sweep: Sweep) -> set[tuple[str, ...]]:
    """The publish-key tuples the committed file holds (none where it does not exist yet); its sha256 is
    checked against the json beside it, as ``publish`` checks it."""
    if sweep.publish is None:
        raise ValueError(f"sweep {sweep.name!r} publishes no committed file (its YAML has no 'publish')")
    if not sweep.publish.is_file():
        return set()
    table = pd.read_csv(provenance.checked(sweep.publish), dtype=str, keep_default_na=False)
    missing = [c for c in sweep.publish_key if c not in table.columns]
    if missing:
        raise ValueError(f"{sweep.publish.name} has no column(s) {missing} (the sweep's publish 'key')")
    return set(map(tuple, table[sweep.publish_key].to_numpy()))


def run_coverage(sweep: Sweep) -> dict[str, tuple[int, int]]:
    """Per run key: (its rows the committed file holds, the rows it writes)."""
    have = committed_keys(sweep)
    out = {}
    for run in sweep.runs:
        cells = run_cells(sweep, run)
        out[run.key] = (len(cells & have), len(cells))
    return out
