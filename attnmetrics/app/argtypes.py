"""Argument types of the command line (``argparse``'s ``type=``), shared by the parser and the
battery modules that declare a flag of their own."""

from __future__ import annotations

import argparse


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
