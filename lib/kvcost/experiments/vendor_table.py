"""Notebook 05's tables: the post's vendor table as cited data, and the published numbers in it."""
from __future__ import annotations

from functools import cache

import pandas as pd

from kvcost.paths import data_path
from kvcost.provenance import checked

__all__ = ["MEASUREMENT_COLUMNS", "load_measurements", "published"]

MEASUREMENT_COLUMNS = ["source", "date", "setting", "measured", "citation", "note"]


def load_measurements() -> pd.DataFrame:
    """The post's vendor table as data, with a citation for every row."""
    df = pd.read_csv(checked(data_path("vendor_measurements.csv")), dtype=str, keep_default_na=False)
    missing = set(MEASUREMENT_COLUMNS) - set(df.columns)
    if missing:
        raise ValueError(f"data/vendor_measurements.csv lacks columns {sorted(missing)}")
    return df[MEASUREMENT_COLUMNS]


@cache
def _numbers() -> dict[str, float]:
    df = pd.read_csv(checked(data_path("vendor_numbers.csv")))
    return dict(zip(df.key, df.value.astype(float)))


def published(key: str) -> float:
    """A number the post or a vendor published (``data/vendor_numbers.csv``, quote and source per row)."""
    numbers = _numbers()
    if key not in numbers:
        raise ValueError(f"parameter 'key' must be one of {sorted(numbers)}, got {key!r}")
    return numbers[key]
