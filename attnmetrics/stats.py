"""Paired significance tests on per-instance outcomes (S&S 2019, sec. 3)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch


class McNemar(NamedTuple):
    """McNemar's exact test: discordant counts and the two-sided p-value.

    b01: instances where ``a`` is False and ``b`` True.
    b10: instances where ``a`` is True and ``b`` False.
    pvalue: two-sided exact binomial p-value of b01 among the b01 + b10 discordant
        pairs under p = ½; 1.0 when there are none.
    """

    b01: int
    b10: int
    pvalue: float


def _as_bool(name: str, x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    arr = np.asarray(x)
    if arr.size == 0 and arr.ndim == 1:  # [] has no dtype to check
        arr = arr.astype(np.bool_)
    if arr.dtype != np.bool_:
        raise ValueError(f"{name} must hold booleans, got dtype {arr.dtype}")
    if arr.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional [N], got shape {list(arr.shape)}")
    return arr


def mcnemar(a, b) -> McNemar:
    """McNemar's exact test on paired boolean outcomes (as S&S 2019, sec. 3, use it to
    compare decision flips after removing the top weight vs a random weight on the same
    instances).

    Only the discordant pairs count: under the null hypothesis that both outcomes are
    equally likely to be the one that is True, b01 ~ Binomial(b01 + b10, ½); the p-value
    is ``scipy.stats.binomtest(b01, b01 + b10, 0.5)`` (two-sided).

    Args:
        a, b: ``[N]`` booleans (torch tensors, numpy arrays or sequences), paired by index.

    Returns:
        :class:`McNemar` ``(b01, b10, pvalue)``.

    Raises:
        ValueError: inputs that are not one-dimensional booleans or differ in length.

    Example:
        >>> mcnemar([True, True, True, False], [False, False, False, False])
        McNemar(b01=0, b10=3, pvalue=0.25)
    """
    x, y = _as_bool("a", a), _as_bool("b", b)
    if x.shape != y.shape:
        raise ValueError(f"a and b must have one length, got {x.shape[0]} and {y.shape[0]}")
    b01 = int(np.count_nonzero(~x & y))
    b10 = int(np.count_nonzero(x & ~y))
    if b01 + b10 == 0:
        return McNemar(b01, b10, 1.0)
    from scipy.stats import binomtest

    return McNemar(b01, b10, float(binomtest(b01, b01 + b10, 0.5).pvalue))
