"""The attention-derived attributions (the package attnmetrics/attributions/: attention × value norm,
GlobEnc, ALTI, Value Zeroing, Chefer et al.'s gradient-weighted rollout, DecompX, attention flow) against the plain
per-sentence loops of their reference tests (attnmetrics/testing/reference.py: one sentence at a
time, per layer, head and token, every state from the weights; Value Zeroing recomputes the layer
once per zeroed token, as the authors' loop does; Chefer's loop runs one forward and one backward
per sentence, ours one of each per chunk of rows; DecompX's loop propagates every (query, input
token) vector one matrix-vector product at a time; attention flow's builds a networkx graph per
sentence and calls ``networkx.maximum_flow_value`` per token, as the authors' code, where ours runs
the ``attention_flow`` op, Dinic's algorithm in C++ on one graph a row; its max flows are also timed
against scipy's Dinic on the same graphs, as this library ran them before the op). Same model, same inputs, one run; values checked equal first, the ratio (the loop's median
over ours) in ``extra_info["ratio_vs_loop"]``.

    OMP_NUM_THREADS=1 python -m pytest benchmarks/test_bench_attributions.py --benchmark-only -k "not cuda"

Model: a random ``BertForSequenceClassification`` shaped like all-MiniLM-L6-v2 (6 layers, d = 384,
12 heads, FFN 1536, WordPiece vocabulary 30,522; offline, no download), float32, eval mode, through
the adapter ``HFClassifier``. Inputs, random WordPiece ids between ``[CLS]`` and ``[SEP]``:

- ``loop``: the rows the plain loops of all seven run on (on the CPU, also for the cuda cases' ratio):
  few and short (the Value Zeroing loop takes ~10 s per 8-10-id sentence on one CPU thread), so that
  each loop stays under ~30 s;
- ``sst``: SST-like, 64 rows of 10-50 real tokens: each method's own cost (no loop), and against
  the same rows one call each (``test_one_by_one``: the batched call, rows grouped by length by
  ``attributions.length_groups``, must not be slower than its rows one by one; values checked equal
  first, the ratio in ``extra_info["ratio_vs_one_by_one"]``).

The loops are Python loops over scalars and small vectors; the authors' code is vectorised within a
sentence, so these ratios are against the plain reference, not the authors' code. Under
``--benchmark-disable`` (CI's smoke run) everything is cut to a tiny model and two short rows.
"""

from __future__ import annotations

import os

import pytest
import torch

from attnmetrics.attributions import (
    METHODS,
)
from attnmetrics.testing.reference import ATTRIBUTION_REFERENCES, networkx_max_flows
from benchmarks.measure import median_seconds, skip_without, synchronised

transformers = pytest.importorskip("transformers", reason="needs transformers (pip install -e .[hf])")

#: case -> (rows, fewest ids, most ids), [CLS] and [SEP] included
CASES = {"loop": (3, 8, 10), "sst": (64, 12, 52)}
SMOKE = (2, 5, 7)
#: float32 against float32 (tests/test_attributions.py's float32 tolerance)
RTOL, ATOL = 2e-4, 1e-6

_models: dict = {}
_inputs: dict = {}
_loops: dict = {}
_one_by_one: dict = {}


def model(small=False):
    """The random MiniLM-shaped classifier (a 2-layer d = 32 one when ``small``), CPU, float32."""
    if small not in _models:
        from attnmetrics.models.hf import HFClassifier

        torch.manual_seed(0)
        shape = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
        if not small:
            shape = dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536)
        config = transformers.BertConfig(vocab_size=30522, num_labels=2, **shape)
        _models[small] = HFClassifier(transformers.BertForSequenceClassification(config)).eval()
    return _models[small]


def inputs(case, small=False):
    """(tokens [B, T] int64, lengths [B]): right-padded ``[CLS]=101 ... [SEP]=102`` rows of random
    WordPiece ids past the special ones."""
    key = (case, small)
    if key not in _inputs:
        rows, low, high = SMOKE if small else CASES[case]
        g = torch.Generator().manual_seed(0)
        lengths = torch.randint(low, high + 1, (rows,), generator=g)
        tokens = torch.randint(1000, 30522, (rows, int(lengths.max())), generator=g)
        tokens[:, 0] = 101
        tokens[torch.arange(rows), lengths - 1] = 102
        tokens[torch.arange(tokens.shape[1]) >= lengths[:, None]] = 0
        _inputs[key] = tokens, lengths
    return _inputs[key]


def _record(benchmark, name, case, tokens, lengths, device):
    benchmark.group = f"attributions {case} {name}"
    benchmark.extra_info.update(
        case=case,
        rows=int(tokens.shape[0]),
        tokens=int(lengths.sum()),
        width=int(tokens.shape[1]),
        device=device,
        threads=torch.get_num_threads(),
        load_average=os.getloadavg()[0],
    )


@pytest.mark.parametrize("name", ATTRIBUTION_REFERENCES)
def test_plain_loop(benchmark, name):
    small = benchmark.disabled
    m, (tokens, lengths) = model(small), inputs("loop", small)
    _record(benchmark, name, "loop", tokens, lengths, "cpu")
    got = benchmark.pedantic(ATTRIBUTION_REFERENCES[name], args=(m, tokens, lengths), rounds=1, iterations=1)
    _loops[name, small] = (got, None if small else benchmark.stats.stats.median)


@pytest.mark.parametrize("name", METHODS)
def test_one_by_one(benchmark, name):
    """Each ``sst`` row in a call of its own, at its own width: what the batched call must never be
    slower than (issue 46, item 6). ``test_ours``'s ``sst`` case records the ratio
    (``extra_info["ratio_vs_one_by_one"]``: this median over the batched call's)."""
    small = benchmark.disabled
    m, (tokens, lengths) = model(small), inputs("sst", small)
    _record(benchmark, name, "sst one by one", tokens, lengths, "cpu")
    rows = [(tokens[b : b + 1, :n], lengths[b : b + 1]) for b, n in enumerate(lengths.tolist())]

    def run():
        return [METHODS[name](m, *row) for row in rows]

    with torch.no_grad():
        got = benchmark.pedantic(run, rounds=1 if small else 3, iterations=1, warmup_rounds=0 if small else 1)
    _one_by_one[name, small] = (got, None if small else benchmark.stats.stats.median)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("name", METHODS)
def test_ours(benchmark, name, case, device):
    skip_without(device)
    small = benchmark.disabled
    m, (tokens, lengths) = model(small), inputs(case, small)
    _record(benchmark, name, case, tokens, lengths, device)
    m, args = m.to(device), (tokens.to(device), lengths.to(device))
    try:
        run = synchronised(lambda: METHODS[name](m, *args), device)
        with torch.no_grad():
            got = benchmark.pedantic(run, rounds=3, iterations=1, warmup_rounds=1).cpu()
            assert got.shape == (tokens.shape[0], tokens.shape[1] - 1) and torch.isfinite(got).all()
            if case == "sst" and (name, small) in _one_by_one:
                rows, alone_s = _one_by_one[name, small]
                for b, row in enumerate(rows):  # each row alone gives what it gives in the batch
                    torch.testing.assert_close(got[b, : row.shape[1]], row[0].cpu(), rtol=RTOL, atol=ATOL)
                if alone_s is not None and device == "cpu":
                    ours = median_seconds(benchmark, run)
                    benchmark.extra_info.update(one_by_one_s=alone_s, ours_s=ours, ratio_vs_one_by_one=alone_s / ours)
            if case == "loop" and (name, small) in _loops:
                want, loop_s = _loops[name, small]
                torch.testing.assert_close(got.double(), want, rtol=RTOL, atol=ATOL)
                if loop_s is not None:
                    ours = median_seconds(benchmark, run)
                    benchmark.extra_info.update(
                        loop_s=loop_s, loop_device="cpu", ours_s=ours, ratio_vs_loop=loop_s / ours
                    )
    finally:
        m.cpu()


def _flow_graphs(m, tokens, lengths):
    """Each row's rollout matrices ``[L, n, n]`` float64 (attention flow's capacities) from one
    forward of the model, as ``attention_flow`` builds them."""
    from attnmetrics.attributions.layers import _masked_rows, _row_normalised, _stack, _Trace
    from attnmetrics.protocol import token_mask

    stack = _stack(m, "attention_flow")
    with torch.no_grad():
        trace = _Trace(m, stack, tokens, lengths, "attention_flow")
    eye = torch.diag_embed(token_mask(lengths, tokens.shape[1]).double())
    mixed = torch.stack(
        [_row_normalised(0.5 * _masked_rows(p.double().mean(1), lengths) + 0.5 * eye) for p in trace.probs], 1
    )
    return [mixed[b, :, :n, :n].numpy() for b, n in enumerate(lengths.tolist())]


@pytest.mark.parametrize("side", ["networkx", "scipy", "ours"])
@pytest.mark.parametrize("rows", [3, 8, 64])
def test_flow_step(benchmark, rows, side):
    """The max flows alone (the forward left out): the first ``rows`` SST-like rows' graphs, every
    real token's flow to [CLS], by networkx per token (the authors' code; 3 and 8 rows), by scipy's
    Dinic on one reused graph a row (``reference.scipy_max_flows``: this library before its C++ op)
    or by ours (the ``attention_flow`` op); ours checked equal to the others (1e-12) first, the
    ratios in ``extra_info["ratio_vs_loop"]`` (networkx) and ``["ratio_vs_scipy"]``."""
    import numpy as np

    from attnmetrics.attributions.flow import _max_flows
    from attnmetrics.testing.reference import scipy_max_flows

    if side == "networkx" and rows > 8:
        pytest.skip("networkx takes minutes on 64 rows")
    small = benchmark.disabled
    tokens, lengths = inputs("sst", small)
    tokens, lengths = tokens[:rows], lengths[:rows]
    tokens = tokens[:, : int(lengths.max())]
    graphs = _flow_graphs(model(small), tokens, lengths)
    _record(benchmark, "flow step", f"sst[:{rows}]", tokens, lengths, "cpu")
    benchmark.group = f"attention flow's max flows, sst[:{rows}]"
    baselines = {
        "networkx": lambda: [networkx_max_flows(c, 0, range(1, c.shape[1] - 1)) for c in graphs],
        "scipy": lambda: [scipy_max_flows(c, 0, np.arange(1, c.shape[1] - 1)) for c in graphs],
    }

    def ours():
        return [_max_flows(c, 0, np.arange(1, c.shape[1] - 1)) for c in graphs]

    if side == "ours":
        got = ours()
        for name in baselines if rows <= 8 else ("scipy",):
            want = _loops.get((f"flow step {name}", rows, small), (None,))[0] or baselines[name]()
            for g, w in zip(got, want):
                np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-15)
        benchmark.pedantic(ours, rounds=3, iterations=1, warmup_rounds=1)
        for name, key in (("networkx", "ratio_vs_loop"), ("scipy", "ratio_vs_scipy")):
            seen = _loops.get((f"flow step {name}", rows, small))
            if seen is not None and seen[1] is not None:
                ours_s = benchmark.stats.stats.median
                benchmark.extra_info.update({f"{name}_s": seen[1], "ours_s": ours_s, key: seen[1] / ours_s})
    else:
        got = benchmark.pedantic(baselines[side], rounds=1 if side == "networkx" else 3, iterations=1)
        _loops[f"flow step {side}", rows, small] = (got, None if small else benchmark.stats.stats.median)
