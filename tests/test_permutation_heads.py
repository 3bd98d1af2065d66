"""Multi-head permutation test (docs/definitions.md §15) against J&W's loop generalised per
head (``permutation_test_reference``): the same permutations, tokens moved alike in every
head, the heads' contexts summed."""

from __future__ import annotations

import pytest
import torch

from attnmetrics import permutation_test
from attnmetrics.permutation import draw_seed
from attnmetrics.testing.reference import permutation_test_reference
from tests.inputs import gen, heads_batch, make_decoder, wrapped

F64 = torch.float64


@pytest.mark.parametrize("kind", ["linear", "mlp"])
@pytest.mark.parametrize("classes", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_equals_reference(kind, classes, dtype):
    att, values, lengths = heads_batch(b=25, heads=3, t=9, h=4, seed=classes, dtype=dtype, first=(0, 1, 2))
    dec = make_decoder(kind, 4, classes, dtype)
    got = permutation_test(att, values, dec, lengths, permutations=16, generator=gen(4), return_all=True)
    median, tvds = permutation_test_reference(att, values, dec, lengths, 16, draw_seed(gen(4)))
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(got.tvd, tvds, **tol)
    torch.testing.assert_close(got.median_tvd, median, **tol)
    assert (got.tvd[lengths >= 2] > 0).any()
    top = torch.where(lengths > 0, att.mean(1).amax(1), torch.nan)  # padding holds zeros
    torch.testing.assert_close(got.max_attention, top, equal_nan=True)


def test_one_head_equals_single_head_call_and_paths_and_chunks_agree():
    att, values, lengths = heads_batch(b=30, heads=1, t=8, h=4, seed=5)
    lin = make_decoder("linear", 4, 2)
    kw = dict(permutations=10, return_all=True)
    single = permutation_test(att[:, 0], values[:, 0], lin, lengths, generator=gen(1), **kw)
    multi = permutation_test(att, values, lin, lengths, generator=gen(1), **kw)
    torch.testing.assert_close(multi.tvd, single.tvd, rtol=1e-10, atol=1e-12)
    att, values, lengths = heads_batch(b=30, heads=4, t=8, h=4, seed=6)
    closed = permutation_test(att, values, lin, lengths, generator=gen(2), **kw)
    general = permutation_test(att, values, wrapped(lin), lengths, generator=gen(2), **kw)
    chunked = permutation_test(att, values, lin, lengths, generator=gen(2), memory_budget=1, **kw)
    torch.testing.assert_close(closed.tvd, general.tvd, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(closed.tvd, chunked.tvd, rtol=1e-10, atol=1e-12)
