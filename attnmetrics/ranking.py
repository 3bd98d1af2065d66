"""Kendall tau-b over ragged batches (J&W 2019, sec. 4.1). Stub: filled in by the kernels work."""

from typing import NamedTuple

from torch import Tensor


class KendallTau(NamedTuple):
    tau: Tensor
    pvalue: Tensor


def kendall_tau(x, y, lengths=None) -> KendallTau:
    raise NotImplementedError
