"""Input checks shared by the public API: clear ValueErrors before any kernel runs.

Checks of values read the device once per check (one small tensor copied back), so CUDA
inputs wait for their stream once rather than once per condition.
"""

from __future__ import annotations

import torch
from torch import Tensor

FLOAT_DTYPES = (torch.float32, torch.float64)


def check_float(name: str, x: Tensor) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{name} must be float32 or float64, got {x.dtype}")


def check_finite(name: str, x: Tensor) -> None:
    if not torch.isfinite(x).all():
        raise ValueError(f"{name} contains NaN or infinite values")


def check_same_device(**tensors: Tensor) -> None:
    devices = {n: t.device for n, t in tensors.items()}
    if len(set(devices.values())) > 1:
        raise ValueError(f"inputs must be on one device, got {devices}")


def check_lengths(lengths: Tensor | None, batch: int, width: int, device: torch.device) -> Tensor:
    """Valid-prefix lengths [B] int64 in [0, T]; ``None`` means every row is full."""
    if lengths is None:
        return torch.full((batch,), width, dtype=torch.int64, device=device)
    if not isinstance(lengths, Tensor):
        lengths = torch.as_tensor(lengths, device=device)  # a list goes where the inputs are
    if lengths.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"lengths must be an integer tensor, got {lengths.dtype}")
    if lengths.shape != (batch,):
        raise ValueError(f"lengths must have shape [B] = [{batch}], got {list(lengths.shape)}")
    if lengths.device != device:
        raise ValueError(f"lengths is on {lengths.device}, expected {device} like the other inputs")
    if batch:
        low, high = torch.stack(torch.aminmax(lengths)).tolist()
        if low < 0 or high > width:
            raise ValueError(f"lengths must lie in [0, T] = [0, {width}], got min {low}, max {high}")
    return lengths.to(torch.int64).contiguous()


def valid_mask(lengths: Tensor, width: int) -> Tensor:
    """[B, T] bool, True on each row's valid prefix."""
    return torch.arange(width, device=lengths.device) < lengths[:, None]


def check_attention(attention: Tensor, lengths: Tensor, atol: float = 1e-4) -> None:
    """Attention [B, T]: finite, non-negative, each non-empty row summing to 1 over its prefix.

    Rows that do not sum to 1 are rejected, not renormalised: a silently rescaled
    distribution would change the very quantity being measured.
    """
    check_float("attention", attention)
    if attention.dim() != 2:
        raise ValueError(f"attention must have shape [B, T], got {list(attention.shape)}")
    if attention.shape[0] == 0:
        raise ValueError("attention is an empty batch (B = 0)")
    mask = valid_mask(lengths, attention.shape[1])
    real = attention.masked_fill(~mask, 0)
    sums = real.sum(1, dtype=torch.float64)
    bad = (lengths > 0) & ((sums - 1).abs() > atol)
    not_finite, negative, unnormalised = torch.stack(
        [~torch.isfinite(real).all(), (real < 0).any(), bad.any()]
    ).tolist()
    if not_finite:
        raise ValueError("attention contains NaN or infinite values")
    if negative:
        raise ValueError(f"attention must be non-negative, got min {float(real.min()):.4g}")
    if unnormalised:
        i = int(bad.nonzero()[0])
        raise ValueError(
            f"attention rows must sum to 1 over their first lengths[b] items "
            f"(rejected, not renormalised): row {i} sums to {float(sums[i]):.6g}"
        )
