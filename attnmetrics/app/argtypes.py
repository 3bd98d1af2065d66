"""Argument types of the command line (``argparse``'s ``type=``), shared by the parser and the
battery modules that declare a flag of their own."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def positive_int(text: str) -> int:
    """An argparse type: an int >= 1 (0 or a negative count would silently train or test nothing)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def non_negative_int(text: str) -> int:
    """An argparse type: an int >= 0."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a non-negative integer, got {value}")
    return value


def int_between(low: int, high: int, why: str = "") -> Callable[[str], int]:
    """An argparse type: an int in ``[low, high]`` (``why``: what the bounds are, for the message;
    a count past ``high`` would stall or exhaust memory long after the command started)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be an integer in [{low}, {high}]{why}, got {text}")
        return value

    parse.__name__ = f"int in [{low}, {high}]"
    return parse


def non_negative_float(text: str) -> float:
    """An argparse type: a finite float >= 0 (a negative weight decay grows the weights)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def float_between(low: float, high: float, *, high_open: bool = False) -> Callable[[str], float]:
    """An argparse type: a float in ``[low, high]`` (``[low, high)`` with ``high_open``); NaN and
    the infinities are refused (a NaN weight or rate would surface only after training)."""
    bounds = f"[{low:g}, {high:g}{')' if high_open else ']'}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (low <= value < high if high_open else low <= value <= high):  # NaN compares False
            raise argparse.ArgumentTypeError(f"must be a number in {bounds}, got {text}")
        return value

    parse.__name__ = f"number in {bounds}"
    return parse
