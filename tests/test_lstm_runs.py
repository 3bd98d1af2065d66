"""attnmetrics::lstm_runs (leave-one-out's LSTM runs over a gate table) against torch's own
LSTM cell, run step by step as the op's definition says: run k reads input ``x[index[s, k]]``
at step s for ``counts[k]`` steps from (h0[k], c0[k]); the op gets those inputs' gates
``W_ih x + b_ih + b_hh`` as a table, and must give the features ``M h`` (and h, c) of every
step, zero past each run's count."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from attnmetrics._ops import ops

F64 = torch.float64


def make_case(runs, steps, hidden, features, rows=7, dtype=F64, seed=0, scale=1.0, counts=None):
    """An LSTM cell over one-hot inputs x [rows, rows], so that the gate table is exactly W_ih.T
    (+ biases), with every value a float32 one: the float32 op starts from the float64
    reference's own inputs. ``scale`` scales the input weights and biases."""
    g = torch.Generator().manual_seed(seed)
    cell = nn.LSTMCell(rows, hidden).to(dtype)
    with torch.no_grad():
        for name, p in cell.named_parameters():
            size = 1.0 if name == "weight_hh" else scale
            p.copy_((torch.randn(p.shape, generator=g, dtype=dtype) * size).float())
    x = torch.eye(rows, dtype=dtype)
    if counts is None:
        counts = torch.randint(0, steps + 1, (runs,), generator=g)
    counts = torch.sort(torch.as_tensor(counts, dtype=torch.int64), descending=True).values
    index = torch.randint(0, rows, (steps, runs), generator=g)
    h0, c0 = (torch.randn(runs, hidden, generator=g, dtype=dtype).float().to(dtype) for _ in range(2))
    feature_map = torch.randn(features, hidden, generator=g, dtype=dtype).float().to(dtype)
    return cell, x, index, counts, h0, c0, feature_map


def op_inputs(cell, x, feature_map):
    """The gate table and [W_hh.T | M.T], as leave-one-out builds them."""
    with torch.no_grad():
        gates = x @ cell.weight_ih.t() + cell.bias_ih + cell.bias_hh
        weight = torch.cat([cell.weight_hh.t(), feature_map.t()], 1).contiguous()
    return gates.contiguous(), weight


def reference(cell, x, index, counts, h0, c0, feature_map):
    """Each run through nn.LSTMCell, one step at a time."""
    steps, runs = index.shape
    out = torch.zeros(steps, runs, feature_map.shape[0], dtype=x.dtype)
    states = torch.zeros(2, steps, runs, h0.shape[1], dtype=x.dtype)
    with torch.no_grad():
        for k in range(runs):
            h, c = h0[k : k + 1], c0[k : k + 1]
            for s in range(int(counts[k])):
                h, c = cell(x[index[s, k]][None], (h, c))
                out[s, k] = feature_map @ h[0]
                states[0, s, k], states[1, s, k] = h[0], c[0]
    return out, states


def run_op(cell, x, index, counts, h0, c0, feature_map, dtype=None):
    gates, weight = op_inputs(cell, x, feature_map)
    cast = (lambda t: t.to(dtype)) if dtype is not None else (lambda t: t)
    out = torch.full((*index.shape, feature_map.shape[0]), float("nan"), dtype=dtype or x.dtype)
    states = torch.full((2, *index.shape, h0.shape[1]), float("nan"), dtype=dtype or x.dtype)
    ops.lstm_runs(cast(gates), index, counts, cast(h0), cast(c0), cast(weight), out, states)
    return out, states


@settings(max_examples=60, deadline=None)
@given(
    runs=st.integers(0, 6),
    steps=st.integers(0, 6),
    # 8 and 16: the CPU's eight-wide path alone; 1, 5, 13: its scalar tail, with or without it
    hidden=st.sampled_from([1, 5, 8, 13, 16]),
    features=st.integers(0, 4),
    seed=st.integers(0, 2**16),
)
def test_matches_lstm_cell_step_by_step(runs, steps, hidden, features, seed):
    case = make_case(runs, steps, hidden, features, seed=seed)
    want_out, want_states = reference(*case)
    out, states = run_op(*case)
    torch.testing.assert_close(out, want_out, rtol=0, atol=1e-12)
    torch.testing.assert_close(states, want_states, rtol=0, atol=1e-12)
    # float32 (the vector exp on CPUs with AVX2): against the float64 reference
    out32, states32 = run_op(*case, dtype=torch.float32)
    torch.testing.assert_close(out32.double(), want_out, rtol=0, atol=2e-5)
    torch.testing.assert_close(states32.double(), want_states, rtol=0, atol=2e-5)


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_saturated_gates(dtype):
    """Pre-activations in the hundreds: sigmoids at 0 and 1, tanh at -1 and 1, all finite."""
    case = make_case(9, 5, 24, 3, scale=200.0, seed=3)
    want_out, want_states = reference(*case)
    out, states = run_op(*case, dtype=dtype)
    assert torch.isfinite(out).all() and torch.isfinite(states).all()
    torch.testing.assert_close(states.double(), want_states, rtol=0, atol=2e-5)
    torch.testing.assert_close(out.double(), want_out, rtol=0, atol=1e-4)


def test_runs_longer_than_a_tile():
    """More runs than the CPU's tile (128), ragged counts including zero-step runs."""
    counts = torch.arange(300) % 7
    case = make_case(300, 6, 8, 2, seed=5, counts=counts)
    want_out, want_states = reference(*case)
    out, states = run_op(*case)
    torch.testing.assert_close(out, want_out, rtol=0, atol=1e-12)
    torch.testing.assert_close(states, want_states, rtol=0, atol=1e-12)


def test_leaves_inputs_unchanged_and_states_optional():
    cell, x, index, counts, h0, c0, feature_map = make_case(4, 3, 8, 2, seed=9, counts=[3, 3, 2, 1])
    gates, weight = op_inputs(cell, x, feature_map)
    before = [t.clone() for t in (gates, index, counts, h0, c0, weight)]
    out = torch.empty(3, 4, 2, dtype=F64)
    ops.lstm_runs(gates, index, counts, h0, c0, weight, out)
    for t, b in zip((gates, index, counts, h0, c0, weight), before):
        assert torch.equal(t, b)
    torch.testing.assert_close(out, reference(cell, x, index, counts, h0, c0, feature_map)[0], rtol=0, atol=1e-12)


def test_opcheck():
    cell, x, index, counts, h0, c0, feature_map = make_case(5, 4, 8, 3, seed=2, counts=[4, 4, 2, 1, 0])
    gates, weight = op_inputs(cell, x, feature_map)
    out = torch.empty(4, 5, 3, dtype=F64)
    states = torch.empty(2, 4, 5, 8, dtype=F64)
    torch.library.opcheck(ops.lstm_runs, (gates, index, counts, h0, c0, weight, out, states))
    torch.library.opcheck(ops.lstm_runs, (gates, index, counts, h0, c0, weight, out))


def _valid():
    cell, x, index, counts, h0, c0, feature_map = make_case(3, 4, 8, 2, seed=1, counts=[4, 2, 1])
    gates, weight = op_inputs(cell, x, feature_map)
    return dict(
        gates=gates,
        index=index,
        counts=counts,
        h0=h0,
        c0=c0,
        weight=weight,
        out=torch.empty(4, 3, 2, dtype=F64),
        states=torch.empty(2, 4, 3, 8, dtype=F64),
    )


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(counts=torch.tensor([2, 4, 1])), r"counts must be non-increasing .* counts\[0\] = 2 < counts\[1\] = 4"),
        (dict(counts=torch.tensor([5, 2, 1])), r"counts\[0\] = 5 is outside \[0, S\] = \[0, 4\]"),
        (dict(counts=torch.tensor([4, 2, -1])), r"counts\[2\] = -1 is outside"),
        (dict(counts=torch.tensor([4, 2])), r"counts must have shape \[N\] = \[3\]"),
        (dict(counts=torch.tensor([4.0, 2.0, 1.0])), "counts must be int64"),
        (dict(index=torch.full((4, 3), 7)), r"index\[0, 0\] = 7 is outside the gate table's rows \[0, R\) = \[0, 7\)"),
        (dict(index=torch.zeros(4, 3, dtype=torch.int32)), "index must be int64"),
        (dict(gates=torch.zeros(7, 30, dtype=F64)), r"gates must have shape \[R, 4 \* hidden\]"),
        (dict(gates=torch.zeros(7, 32, dtype=torch.int64)), "gates must be float32 or float64"),
        (dict(h0=torch.zeros(3, 7, dtype=F64)), r"h0 must have shape \[N, hidden\] = \[3, 8\]"),
        (dict(c0=torch.zeros(3, 8)), "c0 dtype Float must match gates dtype Double"),
        (dict(weight=torch.zeros(8, 31, dtype=F64)), r"weight must have shape \[hidden, 4 \* hidden \+ D\]"),
        (dict(out=torch.empty(4, 3, 5, dtype=F64)), r"out must have shape \[S, N, D\] = \[4, 3, 2\]"),
        (dict(states=torch.empty(2, 4, 3, 7, dtype=F64)), r"states must have shape \[2, S, N, hidden\]"),
        (dict(h0=torch.zeros(8, 3, dtype=F64).t()), "h0 must be contiguous"),
    ],
)
def test_rejects_bad_input(change, message):
    args = {**_valid(), **change}
    with pytest.raises(RuntimeError, match=message):
        ops.lstm_runs(**args)


def test_index_past_a_runs_count_is_not_read():
    """Only the steps a run takes read the table: the rest of index may hold anything."""
    args = _valid()
    args["index"][3, 1:] = 10**9  # runs 1 and 2 stop before step 3
    ops.lstm_runs(**args)
    assert torch.isfinite(args["out"]).all()
