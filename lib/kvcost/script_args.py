"""Argument types for the command-line scripts (``scripts/``): checks that fail with a message
argparse prints beside the flag's name, so a sweep names the run and the flag (``parse_args``)."""
from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

__all__ = ["checked", "int_at_least"]


def int_at_least(lo: int, even: bool = False) -> Callable[[str], int]:
    """An argparse ``type``: an integer >= ``lo`` (and even, when ``even``)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
        if value < lo or (even and value % 2):
            raise argparse.ArgumentTypeError(f"must be {'an even number' if even else 'an integer'} >= {lo}, "
                                             f"got {text}")
        return value
    return parse


def checked(check: Callable[[str], Any]) -> Callable[[str], str]:
    """An argparse ``type`` for a string that ``check`` accepts (it raises ValueError with the reason)."""
    def parse(text: str) -> str:
        try:
            check(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None
        return text
    return parse
