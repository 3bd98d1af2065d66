"""Random draws keyed by instance: row b of a call draws from a stream that is a pure function
of (seed, offset + b), so an instance's random orders, permutations, removed weight and
adversarial initialisation do not depend on the batch it is in, on the batch size, on the
device or on the process that runs it (``torchrun``: identical numbers for any number of
ranks). Pass ``KeyedRows(seed, first)`` as ``generator``, ``first`` the global index of the
batch's first instance.

The stream is splitmix64 from the state ``key_r = mix(mix(seed) ^ r)`` (the row key of the
permutation kernel, ``csrc/kernels/permutation.h``, whose permutations a ``KeyedRows`` keys the
same way), in 64-bit integer arithmetic (torch's int64 wraps like
uint64 under add, multiply and xor; right shifts are made logical with a mask).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_M1, _M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def _signed(c: int) -> int:
    """The int64 with the bits of the uint64 ``c``."""
    c &= _MASK
    return c - (1 << 64) if c >> 63 else c


def _shr(z: Tensor, k: int) -> Tensor:
    """Logical right shift of int64 bits (torch's ``>>`` is arithmetic)."""
    return (z >> k) & ((1 << (64 - k)) - 1)


def _finalise(z: Tensor) -> Tensor:
    z = (z ^ _shr(z, 30)) * _signed(_M1)
    z = (z ^ _shr(z, 27)) * _signed(_M2)
    return z ^ _shr(z, 31)


class KeyedRows(NamedTuple):
    """Per-instance random streams for the ops' ``generator`` argument.

    seed: any int64 (one per experiment, so experiments draw independently).
    offset: global index of the call's row 0; row b is instance ``offset + b``.
    """

    seed: int
    offset: int = 0

    def bits(self, batch: int, count: int, device: torch.device | str | None = None, start: int = 0) -> Tensor:
        """``[batch, count]`` int64: outputs ``start`` to ``start + count - 1`` of each row's stream."""
        mixed = _finalise(torch.tensor(_signed(self.seed), device=device) + _signed(_GOLDEN))  # mix(seed)
        rows = torch.arange(self.offset, self.offset + batch, dtype=torch.int64, device=device)
        key = _finalise((rows ^ mixed) + _signed(_GOLDEN))  # mix(mix(seed) ^ r)
        steps = torch.arange(start + 1, start + count + 1, dtype=torch.int64, device=device) * _signed(_GOLDEN)
        return _finalise(key[:, None] + steps)

    def uniform(self, batch: int, shape: tuple[int, ...], device=None, start: int = 0) -> Tensor:
        """``[batch, *shape]`` float64 uniform in [0, 1) (53 random bits each), from output
        ``start`` of each row's stream on."""
        n = math.prod(shape)
        return (_shr(self.bits(batch, n, device, start), 11).double() * 2.0**-53).view(batch, *shape)

    def normal(self, batch: int, shape: tuple[int, ...], dtype=torch.float64, device=None) -> Tensor:
        """``[batch, *shape]`` standard normal (Box-Muller on pairs of uniforms), in ``dtype``."""
        n = math.prod(shape)
        u = self.uniform(batch, (2, n), device)
        radius = torch.sqrt(-2.0 * torch.log1p(-u[:, 0]))  # 1 - u in (0, 1]: log is finite
        return (radius * torch.cos(2.0 * math.pi * u[:, 1])).view(batch, *shape).to(dtype)

    def integers(self, batch: int, device=None) -> Tensor:
        """``[batch]`` int64 uniform in [0, 2**62): one per row."""
        return _shr(self.bits(batch, 1, device)[:, 0], 2)


def check_keyed(generator) -> KeyedRows | None:
    """``generator`` if it is a valid :class:`KeyedRows`, None if it is anything else."""
    if not isinstance(generator, KeyedRows):
        return None
    for name, value, low in (("seed", generator.seed, -(2**63)), ("offset", generator.offset, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value < 2**63:
            raise ValueError(f"KeyedRows.{name} must be an int in [{low}, 2**63), got {value!r}")
    return generator


def normal(generator, shape: tuple[int, ...], dtype, device=None) -> Tensor:
    """``torch.randn(shape)`` in ``dtype``, or row-keyed (dim 0 = rows) from :class:`KeyedRows`."""
    if isinstance(generator, KeyedRows):
        return generator.normal(shape[0], shape[1:], dtype, device)
    return torch.randn(shape, generator=generator, dtype=dtype, device=device)
