"""attnmetrics::spliced_attention (leave-one-out's attention head over spliced features) against
its definition in plain torch: each position's features are the sum of two table rows, scored
v · tanh(f[:A]) (or v · f[:A]), softmax over the positions lead <= j < length - trail, the
scores' weights applied to f[A:]."""

from __future__ import annotations

import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnmetrics._ops import ops

F64 = torch.float64


def make_case(rows, width, dim, att, table_rows=11, dtype=F64, seed=0, lengths=None, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    table = (torch.randn(table_rows, dim, generator=g, dtype=F64) * scale).to(dtype)
    pairs = torch.randint(0, table_rows, (rows, width, 2), generator=g)
    if lengths is None:
        lengths = torch.randint(0, width + 1, (rows,), generator=g)
    v = torch.randn(att, generator=g, dtype=F64).to(dtype)
    return table, pairs, torch.as_tensor(lengths, dtype=torch.int64), v


def reference(table, pairs, lengths, v, lead, trail, tanh):
    """The definition, one sequence and position at a time, in float64."""
    table, v = table.double(), v.double()
    A, out = v.shape[0], torch.zeros(pairs.shape[0], table.shape[1] - v.shape[0], dtype=F64)
    for i in range(pairs.shape[0]):
        positions = range(lead, int(lengths[i]) - trail)
        if not positions:
            continue  # no position gets attention: the zero context
        f = torch.stack([table[pairs[i, j, 0]] + table[pairs[i, j, 1]] for j in positions])
        scores = (torch.tanh(f[:, :A]) if tanh else f[:, :A]) @ v
        out[i] = torch.softmax(scores, 0) @ f[:, A:]
    return out


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 6),
    width=st.integers(1, 12),
    dim=st.integers(2, 40),
    lead=st.integers(0, 2),
    trail=st.integers(0, 2),
    tanh=st.booleans(),
    dtype=st.sampled_from([F64, torch.float32]),
    seed=st.integers(0, 2**16),
    data=st.data(),
)
def test_matches_the_definition(rows, width, dim, lead, trail, tanh, dtype, seed, data):
    att = data.draw(st.integers(1, dim - 1))  # both sides of the eight-wide path's width
    table, pairs, lengths, v = make_case(rows, width, dim, att, dtype=dtype, seed=seed)
    got = ops.spliced_attention(table, pairs, lengths, v, lead, trail, tanh)
    assert got.dtype == dtype and got.shape == (rows, dim - att)
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == F64 else dict(rtol=2e-5, atol=2e-6)
    torch.testing.assert_close(got.double(), reference(table, pairs, lengths, v, lead, trail, tanh), **tol)


@pytest.mark.parametrize("dtype", [F64, torch.float32])
def test_the_model_sizes_ties_and_single_positions(dtype):
    # J&W's head (A = 128, C = 1), a length-1 sequence, one with no position, equal scores
    table, pairs, lengths, v = make_case(5, 30, 129, 128, table_rows=40, dtype=dtype, lengths=[30, 3, 2, 0, 17])
    pairs[4, :, :] = pairs[4, :1, :]  # one pair everywhere: all scores tie, uniform weights
    got = ops.spliced_attention(table, pairs, lengths, v, 1, 1, True)
    want = reference(table, pairs, lengths, v, 1, 1, True)
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == F64 else dict(rtol=2e-5, atol=2e-6)
    torch.testing.assert_close(got.double(), want, **tol)
    assert (got[2:4] == 0).all()  # no position between the special ones
    f = table[pairs[1, 1, 0]] + table[pairs[1, 1, 1]]
    torch.testing.assert_close(got[1], f[128:], rtol=0, atol=0)  # one position: weight exactly 1


@pytest.mark.parametrize("scale", [30.0, 300.0])
def test_saturated_scores(scale):
    # pre-activations and scores in the hundreds: tanh is ±1, the softmax one-hot, all finite
    table, pairs, lengths, v = make_case(8, 20, 24, 16, dtype=torch.float32, scale=scale, lengths=[20] * 8)
    v = v * scale
    for tanh in (True, False):
        got = ops.spliced_attention(table, pairs, lengths, v, 0, 0, tanh)
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got.double(), reference(table, pairs, lengths, v, 0, 0, tanh), rtol=1e-4, atol=1e-3)


def test_unread_pairs_and_strided_sources():
    table, pairs, lengths, v = make_case(4, 9, 12, 8, lengths=[9, 4, 1, 6])
    want = ops.spliced_attention(table, pairs, lengths, v, 1, 1, True)
    pairs[1, 3:] = -7  # past length - trail: never read, so never checked
    pairs[0, 0] = 10**9  # the lead position: never read
    torch.testing.assert_close(ops.spliced_attention(table, pairs, lengths, v, 1, 1, True), want, rtol=0, atol=0)
    # a caller's strided views, made contiguous as leave-one-out does, give the same
    wide = torch.cat([table, table], 1)[:, :12]
    assert not wide.is_contiguous()
    got = ops.spliced_attention(wide.contiguous(), pairs, lengths, v, 1, 1, True)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_opcheck():
    table, pairs, lengths, v = make_case(4, 9, 12, 8)
    torch.library.opcheck(ops.spliced_attention, (table, pairs, lengths, v, 1, 1, True))


def _bad(**change):
    table, pairs, lengths, v = make_case(3, 5, 6, 4, lengths=[5, 3, 4])
    args = dict(table=table, pairs=pairs, lengths=lengths, v=v, lead=1, trail=1, tanh=True)
    args.update(change)
    return args


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(table=torch.zeros(11, 6, dtype=torch.float16)), "table must be float32 or float64, got Half"),
        (dict(table=torch.zeros(11, 6, 1, dtype=F64)), "table must have shape [R, D], got [11, 6, 1]"),
        (dict(pairs=torch.zeros(3, 5, 2, dtype=torch.int32)), "pairs must be int64, got Int"),
        (dict(pairs=torch.zeros(3, 5, 3, dtype=torch.int64)), "pairs must have shape [N, W, 2], got [3, 5, 3]"),
        (dict(lengths=torch.tensor([5, 3])), "lengths must have shape [N] = [3], got [2]"),
        (dict(lengths=torch.tensor([5.0, 3.0, 4.0])), "lengths must be int64, got Float"),
        (dict(lengths=torch.tensor([5, 6, 4])), "lengths[1] = 6 is outside [0, T] = [0, 5]"),
        (dict(lengths=torch.tensor([5, -1, 4])), "lengths[1] = -1 is outside [0, T] = [0, 5]"),
        (dict(v=torch.zeros(4)), "v dtype Float must match table dtype Double"),
        (dict(v=torch.zeros(7, dtype=F64)), "v must have shape [A] with 1 <= A <= D = 6, got [7]"),
        (dict(v=torch.zeros(0, dtype=F64)), "v must have shape [A] with 1 <= A <= D = 6, got [0]"),
        (dict(lead=-1), "lead and trail must be >= 0, got lead = -1, trail = 1"),
        (dict(table=torch.zeros(6, 22, dtype=F64)[:, ::2]), "table must be contiguous"),
        (dict(pairs=torch.full((3, 5, 2), 11)), "pairs[0, 1, 0] = 11 is outside the table's rows [0, R) = [0, 11)"),
        (dict(pairs=torch.full((3, 5, 2), -1)), "pairs[0, 1, 0] = -1 is outside the table's rows [0, R) = [0, 11)"),
    ],
)
def test_rejects_bad_input(change, message):
    with pytest.raises(RuntimeError, match=re.escape(message)):
        ops.spliced_attention(**_bad(**change))
