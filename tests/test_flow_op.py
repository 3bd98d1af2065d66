"""The ``attention_flow`` op (csrc/cpu/flow.cpp: Dinic's max flow per row and token) against two
independent max flows: networkx's float max flow on the same graph (the authors' code's,
reference.networkx_max_flows) and scipy's Dinic on the same rounded capacities (the library's
earlier implementation, reference.scipy_max_flows); ragged batches with padding, ties, one- and
two-layer rows, length-0 and length-1 rows, lead/trail positions, non-finite rows, bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnmetrics._ops import ops
from attnmetrics.testing.reference import networkx_max_flows, scipy_max_flows

F64 = torch.float64


def graphs(rng, lengths, layers, width, kind="stochastic", causal=False):
    """[B, L, T, T] row-stochastic capacities on each row's n x n block (rollout's matrices: the
    identity mixed in), garbage (9.0, NaN) outside it, which the op must never read."""
    out = np.full((len(lengths), layers, width, width), 9.0)
    out[:, :, -1:, :] = np.nan
    for b, n in enumerate(lengths):
        m = rng.random((layers, n, n)) ** 3
        if kind == "ties":
            m = np.floor(m * 4) / 4
        elif kind == "tiny":
            m = np.where(rng.random((layers, n, n)) < 0.5, m * 1e-12, m)
        if causal:
            m = np.tril(m)
        m = m + 0.5 * np.eye(n)
        out[b, :, :n, :n] = m / m.sum(-1, keepdims=True)
    return torch.from_numpy(out)


def expected(g, lengths, pooled, lead, trail, reference):
    want = torch.zeros(g.shape[0], g.shape[2], dtype=F64)
    for b, n in enumerate(lengths):
        if n - trail > lead:
            m = g[b, :, :n, :n].numpy()
            want[b, lead : n - trail] = torch.as_tensor(
                np.asarray(reference(m, pooled[b], np.arange(lead, n - trail)), dtype=np.float64)
            )
    return want


@pytest.mark.parametrize("layers", [1, 2, 3, 6])
@pytest.mark.parametrize("kind", ["stochastic", "ties"])
def test_ragged_batch_equals_networkx_and_scipy(layers, kind):
    rng = np.random.default_rng(layers)
    lengths = [7, 1, 0, 4, 9, 2, 9]
    g = graphs(rng, lengths, layers, 10, kind)
    pooled = [0, 0, 0, 3, 8, 1, 4]
    for lead, trail in ((0, 0), (1, 1), (1, 0)):
        got = ops.attention_flow(g, torch.tensor(lengths), torch.tensor(pooled), lead, trail)
        assert got.dtype == F64 and got.shape == (7, 10)
        torch.testing.assert_close(
            got, expected(g, lengths, pooled, lead, trail, networkx_max_flows), rtol=1e-12, atol=1e-15
        )
        torch.testing.assert_close(
            got, expected(g, lengths, pooled, lead, trail, scipy_max_flows), rtol=1e-12, atol=1e-15
        )


def test_causal_rows_pooled_at_their_last_token():
    rng = np.random.default_rng(5)
    lengths = [6, 3, 8]
    g = graphs(rng, lengths, 4, 8, causal=True)
    pooled = [n - 1 for n in lengths]
    got = ops.attention_flow(g, torch.tensor(lengths), torch.tensor(pooled), 0, 0)
    torch.testing.assert_close(got, expected(g, lengths, pooled, 0, 0, networkx_max_flows), rtol=1e-12, atol=1e-15)


def test_capacities_below_the_rounding_cut_as_scipy_does():
    """Capacities far below 2^-30 floor to 0: the rounded graph's minimum cut may take some in, so
    the result may exceed networkx's max flow by their sum (the documented bound); it is the cut
    scipy's Dinic finds on the same rounded graph (the source side the residual graph reaches
    is the same for every maximum flow)."""
    rng = np.random.default_rng(2)
    lengths = [7, 5, 6]
    g = graphs(rng, lengths, 4, 7, "tiny")
    pooled = [1, 1, 1]
    got = ops.attention_flow(g, torch.tensor(lengths), torch.tensor(pooled), 0, 0)
    torch.testing.assert_close(got, expected(g, lengths, pooled, 0, 0, scipy_max_flows), rtol=1e-12, atol=1e-15)
    exact = expected(g, lengths, pooled, 0, 0, networkx_max_flows)
    assert (got >= exact - 1e-15).all() and (got <= exact + (2 * 49 + 14) / 2**30).all()


def test_a_row_that_is_not_finite_is_nan_on_its_tokens_alone():
    rng = np.random.default_rng(3)
    lengths = [5, 4]
    g = graphs(rng, lengths, 3, 6)
    g[1, 2, 3, 0] = np.nan
    got = ops.attention_flow(g, torch.tensor(lengths), torch.tensor([0, 0]), 1, 1)
    assert got[1, 1:3].isnan().all() and (got[1, [0, 3, 4, 5]] == 0).all()
    torch.testing.assert_close(
        got[0], expected(g, lengths, [0, 0], 1, 1, networkx_max_flows)[0], rtol=1e-12, atol=1e-15
    )


@settings(max_examples=40, deadline=None)
@given(
    layers=st.integers(1, 5),
    width=st.integers(1, 8),
    data=st.data(),
    seed=st.integers(0, 2**31 - 1),
    kind=st.sampled_from(["stochastic", "ties"]),
)
def test_hypothesis_equals_scipy(layers, width, data, seed, kind):
    lengths = data.draw(st.lists(st.integers(0, width), min_size=1, max_size=4))
    pooled = [data.draw(st.integers(0, max(n - 1, 0))) for n in lengths]
    lead, trail = data.draw(st.integers(0, 1)), data.draw(st.integers(0, 1))
    g = graphs(np.random.default_rng(seed), lengths, layers, width, kind)
    got = ops.attention_flow(g, torch.tensor(lengths), torch.tensor(pooled), lead, trail)
    torch.testing.assert_close(got, expected(g, lengths, pooled, lead, trail, scipy_max_flows), rtol=1e-12, atol=1e-15)


def test_bad_input_is_named():
    g = graphs(np.random.default_rng(0), [3, 2], 3, 4)
    lengths, pooled = torch.tensor([3, 2]), torch.tensor([0, 1])
    cases = [
        ((g.float(), lengths, pooled, 0, 0), "graphs must be float64, got Float"),
        (
            (g[:, :, :3].contiguous(), lengths, pooled, 0, 0),
            r"graphs must be \[B, L, T, T\] with L >= 1, got \[2, 3, 3, 4\]",
        ),
        ((g[:, :0].contiguous(), lengths, pooled, 0, 0), r"with L >= 1, got \[2, 0, 4, 4\]"),
        ((g.transpose(2, 3), lengths, pooled, 0, 0), "graphs must be contiguous"),
        ((g, lengths[:1], pooled, 0, 0), r"lengths must be \[B\] = \[2\], got \[1\]"),
        ((g, lengths.int(), pooled, 0, 0), "lengths must be int64, got Int"),
        ((g, torch.tensor([3, 5]), pooled, 0, 0), r"lengths\[1\] = 5 is outside \[0, T\] = \[0, 4\]"),
        ((g, lengths, torch.tensor([0, 2]), 0, 0), r"pooled\[1\] = 2 is outside \[0, lengths\[1\]\) = \[0, 2\)"),
        ((g, lengths, pooled, -1, 0), "lead and trail must be >= 0, got -1 and 0"),
    ]
    for args, match in cases:
        with pytest.raises(RuntimeError, match=match):
            ops.attention_flow(*args)
    negative = g.clone()
    negative[0, 1, 2, 0] = -0.25
    with pytest.raises(RuntimeError, match=r"graphs\[0, 1, 2, 0\] = -0.25 is not a capacity in \[0, 1\]"):
        ops.attention_flow(negative, lengths, pooled, 0, 0)


def test_rows_in_parallel_equal_one_thread():
    """Rows run in parallel over torch's intra-op threads; each row's flows are the same bits."""
    rng = np.random.default_rng(7)
    lengths = [int(n) for n in rng.integers(0, 12, 24)]
    g = graphs(rng, lengths, 4, 12)
    pooled = torch.zeros(24, dtype=torch.long)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = ops.attention_flow(g, torch.tensor(lengths), pooled, 1, 0)
        torch.set_num_threads(2)
        two = ops.attention_flow(g, torch.tensor(lengths), pooled, 1, 0)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, two)
