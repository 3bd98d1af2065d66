"""Multi-head single-weight removal (docs/definitions.md §15) against the per-row reference."""

from __future__ import annotations

import pytest
import torch

from attnmetrics import single_removal
from attnmetrics.testing.reference import single_removal_reference
from tests.inputs import gen, heads_batch, make_decoder, wrapped

F64 = torch.float64


def assert_same(got, want, dtype=F64):
    assert torch.equal(got.removed_index, want.removed_index)
    assert torch.equal(got.flipped, want.flipped)
    tol = 1e-5 if dtype == torch.float32 else 1e-10
    torch.testing.assert_close(got.jsd, want.jsd, rtol=tol, atol=tol, equal_nan=True)
    torch.testing.assert_close(got.removed_weight, want.removed_weight, equal_nan=True)


@pytest.mark.parametrize("kind", ["linear", "mlp"])
@pytest.mark.parametrize("classes", [1, 3])
@pytest.mark.parametrize("which", ["top", "second", "lowest"])
@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_equals_reference(kind, classes, which, dtype):
    att, values, lengths = heads_batch(b=40, heads=3, t=8, h=5, seed=classes, dtype=dtype, first=(0, 1, 2))
    dec = make_decoder(kind, 5, classes, dtype)
    got = single_removal(att, values, dec, lengths, which=which)
    assert_same(got, single_removal_reference(att, values, dec, lengths, which=which), dtype)
    assert (got.removed_index[lengths <= 1] == -1).all() and got.jsd[lengths >= 2].isfinite().all()


def test_random_draw_and_general_path_and_chunks():
    att, values, lengths = heads_batch(b=30, heads=2, t=9, h=4, seed=8)
    dec = make_decoder("mlp", 4, 2)
    got = single_removal(att, values, dec, lengths, which="random", generator=gen(3))
    assert_same(got, single_removal_reference(att, values, dec, lengths, which=got.removed_index))
    top = single_removal(att, values, dec, lengths, which="top").removed_index  # by the head mean
    long = lengths >= 2
    assert long.sum() > 20 and (got.removed_index[long] != top[long]).all()  # S&S: a non-top token
    lin = make_decoder("linear", 4, 2)
    closed = single_removal(att, values, lin, lengths)
    assert_same(closed, single_removal(att, values, wrapped(lin), lengths))
    assert_same(closed, single_removal(att, values, lin, lengths, memory_budget=1))


def test_one_head_equals_the_single_head_call():
    att, values, lengths = heads_batch(b=30, heads=1, t=9, h=4, seed=9)
    for kind in ("linear", "mlp"):
        dec = make_decoder(kind, 4, 2)
        assert_same(single_removal(att, values, dec, lengths), single_removal(att[:, 0], values[:, 0], dec, lengths))
