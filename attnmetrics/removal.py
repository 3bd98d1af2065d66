"""Removal with renormalisation and the decision-flip search (S&S 2019). Stub: filled in by the kernels work."""

from typing import NamedTuple

from torch import Tensor


class FlipResult(NamedTuple):
    removed: Tensor
    fraction: Tensor
    flipped: Tensor
    mass: Tensor


def flip_fraction(attention, values, decoder, lengths=None, order="attention", **kwargs) -> FlipResult:
    raise NotImplementedError


def attention_gradient(attention, values, decoder, lengths=None):
    raise NotImplementedError
