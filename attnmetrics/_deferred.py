"""Checks whose device read waits for the end of a public call (issue 32: no device read inside a
procedure's per-chunk loops).

A check of values (are these logits finite? are these ids in the vocabulary?) needs their data on
the host: on a GPU, a wait for everything queued before it. Inside :func:`deferred`, :func:`defer`
records the check as a boolean tensor (True: it passed) beside a function that builds its error,
and the context reads every recorded flag in one copy when it closes, raising the first failed
check's error in the order the checks were recorded. Outside it, :func:`defer` reads and raises at
once, as a direct call of a model's method expects.

What runs after a deferred check must be safe when the check failed (an embedding clamps its ids,
see :func:`deferring`; NaN logits only make NaN results, which are never returned).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar

import torch
from torch import Tensor

_PENDING: ContextVar[list[tuple[Tensor, Callable[[], Exception]]] | None] = ContextVar(
    "attnmetrics_deferred_checks", default=None
)


def deferring() -> bool:
    """Whether checks are being deferred (inside :func:`deferred`)."""
    return _PENDING.get() is not None


def defer(passed: Tensor, error: Callable[[], Exception]) -> None:
    """Record a check: ``passed`` a one-element bool tensor (on any device), ``error`` builds the
    exception to raise when it is False (it may read small tensors it holds, such as a row's index,
    not the checked data). Outside :func:`deferred` the check reads and raises at once."""
    pending = _PENDING.get()
    if pending is None:
        if not bool(passed):
            raise error()
        return
    pending.append((passed.reshape(()), error))


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """The checks :func:`defer` records inside this context read the device once, when it closes,
    and the first that failed raises its error. Nested contexts leave the read to the outermost.
    When the body raises and an earlier recorded check failed, that check's error is raised (from
    the body's): it is the cause (a model fed NaN logits or clamped ids may fail later on them)."""
    if _PENDING.get() is not None:
        yield
        return
    pending: list[tuple[Tensor, Callable[[], Exception]]] = []
    token = _PENDING.set(pending)
    try:
        yield
    except Exception as raised:
        _PENDING.reset(token)
        failed = _first_failed(pending)
        if failed is not None:
            raise failed from raised
        raise
    _PENDING.reset(token)
    failed = _first_failed(pending)
    if failed is not None:
        raise failed


def _first_failed(pending: list[tuple[Tensor, Callable[[], Exception]]]) -> Exception | None:
    if not pending:
        return None
    device = pending[0][0].device
    passed = torch.stack([flag.to(device) for flag, _ in pending]).tolist()  # the one read
    for ok, (_, error) in zip(passed, pending):
        if not ok:
            return error()
    return None
