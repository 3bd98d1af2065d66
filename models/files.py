"""Reading a checkpoint's tensor files (``model.pt``, ``training.pt``) with errors of one line that
name the file: torch raises anything from ``OSError: [Errno 22]`` (a zip cut short, memory-mapped)
to a 500-character message of its zip reader or an unpickling error for a truncated or foreign file."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

#: the longest part of torch's own message a one-line error quotes
_REASON_CHARS = 120


def _reason(e: BaseException) -> str:
    """The first sentence of ``e``'s message, on one line and shortened."""
    text = " ".join(str(e).split()) or type(e).__name__
    first = text.split(". ", 1)[0]
    return first if len(first) <= _REASON_CHARS else first[: _REASON_CHARS - 3] + "..."


def load_tensors(path: str | os.PathLike, what: str, *, mmap: bool = False) -> Any:
    """``torch.load(path, weights_only=True)`` on the CPU (``mmap``: memory-mapped).

    Raises:
        ValueError: one line naming ``path``, ``what`` it holds and why it cannot be read
            (truncated or damaged, or not a file torch wrote).
    """
    path = Path(path)
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as e:  # noqa: BLE001 - whatever torch raises, the file cannot be used
        raise ValueError(
            f"{path}: cannot read {what} (truncated or damaged, or not saved by torch: {_reason(e)})"
        ) from None
