"""Binary byte units, defined once for the whole package."""
from __future__ import annotations

__all__ = ["KIB", "MIB", "GIB", "GB"]

KIB = 1024
MIB = 1024 ** 2
GIB = 1024 ** 3
GB = 10 ** 9   # decimal gigabyte, as GPU vendors and some papers count
