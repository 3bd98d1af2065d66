"""Kendall tau-b over ragged batches (J&W 2019, sec. 4.1), on the C++ kernel
``attnmetrics::kendall_tau``: O(L log L) per row, rows in parallel."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from attnmetrics._ops import ops
from attnmetrics._validation import check_float, check_lengths, check_same_device
from attnmetrics.protocol import token_mask


class KendallTau(NamedTuple):
    tau: Tensor
    pvalue: Tensor


def kendall_tau(x: Tensor, y: Tensor, lengths: Tensor | None = None) -> KendallTau:
    """Per-row Kendall τ-b between ``x`` and ``y`` and its two-sided p-value (J&W 2019, sec. 4.1).

    Row ``b`` gives what ``scipy.stats.kendalltau(x[b, :L], y[b, :L])`` gives with its
    defaults, ``L = lengths[b]``: τ-b with ties handled in both inputs, and the p-value
    of the test of τ = 0 against τ ≠ 0 — exact (Kendall 1970) for tie-free rows with
    L ≤ 33 or at most one discordant (or concordant) pair, otherwise the normal
    approximation with the tie-corrected variance. τ and the exact p-value match scipy
    bit for bit in float64; the normal p-value to a few ulps (libm's erfc vs cephes').

    Args:
        x, y: ``[B, T]`` float32 or float64, same shape, dtype and device; B ≥ 1.
            Only each row's valid prefix is read, and it must not hold NaN (scipy
            would propagate it; this rejects it). Any strides.
        lengths: ``[B]`` integer valid-prefix lengths in ``[0, T]``; ``None`` means T.

    Returns:
        ``KendallTau(tau, pvalue)``, each ``[B]`` in x's dtype (computed in float64).
        Both are NaN where scipy gives NaN: rows with L < 2, and rows whose x (or y)
        prefix is constant.

    Raises:
        TypeError: ``x`` or ``y`` is not a tensor.
        ValueError: an input on the ``meta`` device, wrong dtype or shape, mismatched
            inputs, an empty batch, bad ``lengths``, NaN on a valid prefix, or an input that requires grad (τ is
            piecewise constant, so there is no autograd: detach the inputs).

    Example:
        >>> import torch
        >>> from attnmetrics import kendall_tau
        >>> x = torch.tensor([[1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 0.0]])
        >>> y = torch.tensor([[1.0, 3.0, 2.0, 4.0], [3.0, 2.0, 1.0, 9.0]])
        >>> kendall_tau(x, y, lengths=torch.tensor([4, 3]))
        KendallTau(tau=tensor([ 0.6667, -1.0000]), pvalue=tensor([0.3333, 0.3333]))
    """
    check_float("x", x)
    check_float("y", y)
    if x.dim() != 2:
        raise ValueError(f"x must have shape [B, T], got {list(x.shape)}")
    if y.shape != x.shape:
        raise ValueError(f"y must have x's shape {list(x.shape)}, got {list(y.shape)}")
    if y.dtype != x.dtype:
        raise ValueError(f"x and y must have one dtype, got x {x.dtype} and y {y.dtype}")
    check_same_device(x=x, y=y)
    for name, t in (("x", x), ("y", y)):
        if t.requires_grad and torch.is_grad_enabled():  # under no_grad nobody asks for one
            raise ValueError(
                f"{name} requires grad, but kendall_tau is piecewise constant in its inputs and has no "
                f"gradient (no autograd: detach the inputs, e.g. {name}.detach())"
            )
    batch, width = x.shape
    if batch == 0:
        raise ValueError(f"x is an empty batch (B = 0, shape {list(x.shape)}); expected B >= 1")
    lengths = check_lengths(lengths, batch, width, x.device)
    mask = token_mask(lengths, width)
    nan_x, nan_y = torch.stack([(torch.isnan(t) & mask).any() for t in (x, y)]).tolist()  # one read back
    for name, t, found in (("x", x, nan_x), ("y", y, nan_y)):
        if found:
            row = int((torch.isnan(t) & mask).any(1).nonzero()[0])
            raise ValueError(
                f"{name} contains NaN in the valid prefix of row {row} "
                f"(scipy.stats.kendalltau would return NaN; remove or mask it)"
            )
    tau, pvalue = ops.kendall_tau(x.contiguous(), y.contiguous(), lengths)
    return KendallTau(tau, pvalue)
