"""The attention-derived methods on a Llama-layout decoder (``attnmetrics.llm``, and AttnLRP) batched by
length against the same rows one call each (issue 46, item 6: a batch is never slower than its rows one
by one). Values checked equal first (each row alone against its row of the batch), the ratio in
``extra_info["ratio_vs_one_by_one"]``.

Run (one CPU thread, about 5 min):

    OMP_NUM_THREADS=1 python -m pytest benchmarks/test_bench_llm_methods.py --benchmark-only -q

Model: a random ``LlamaForSequenceClassification`` shaped like SmolLM2-135M (30 layers, width 576, 9
query heads sharing 3 key/value heads, MLP 1,536, vocabulary 49,152; offline, no download; 2 classes),
float32, eval mode, through ``HFClassifier``. Inputs: 24 rows of random ids, lengths 8-40 (SST-like), one
generator seeded 0. Under ``--benchmark-disable`` (CI's smoke run): a 2-layer width-32 model and 3 short
rows.
"""

from __future__ import annotations

import os

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="needs transformers (pip install -e .[hf])")

from attnmetrics.llm import METHODS as LLM_METHODS  # noqa: E402
from attnmetrics.llm.attnlrp import attnlrp  # noqa: E402

#: every method that runs on a Llama-layout decoder (GlobEnc's and DecompX's refuse)
METHODS = {name: f for name, f in LLM_METHODS.items() if name not in ("globenc", "decompx")} | {"attnlrp": attnlrp}
RTOL, ATOL = 2e-4, 1e-5

_models: dict = {}
_alone: dict = {}


def model(small: bool):
    if small not in _models:
        from attnmetrics.models.hf import HFClassifier

        torch.manual_seed(0)
        shape = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                     num_key_value_heads=3, vocab_size=49152)  # fmt: skip
        if small:
            shape = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=200)  # fmt: skip
        config = transformers.LlamaConfig(num_labels=2, pad_token_id=0, **shape)
        _models[small] = HFClassifier(transformers.LlamaForSequenceClassification(config)).eval()
    return _models[small]


def inputs(small: bool):
    """(tokens [B, T] int64 right-padded with 0, lengths [B])."""
    rows, low, high = (3, 2, 5) if small else (24, 8, 40)
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(low, high + 1, (rows,), generator=g)
    tokens = torch.randint(1, 200 if small else 49152, (rows, int(lengths.max())), generator=g)
    tokens[torch.arange(tokens.shape[1]) >= lengths[:, None]] = 0
    return tokens, lengths


def _record(benchmark, name, layout, tokens, lengths):
    benchmark.group = f"llm methods {name}"
    benchmark.extra_info.update(
        layout=layout, rows=int(tokens.shape[0]), tokens=int(lengths.sum()), threads=torch.get_num_threads(),
        load_average=os.getloadavg()[0],
    )  # fmt: skip


@pytest.mark.parametrize("name", METHODS)
def test_one_by_one(benchmark, name):
    small = benchmark.disabled
    m, (tokens, lengths) = model(small), inputs(small)
    _record(benchmark, name, "one by one", tokens, lengths)
    rows = [(tokens[b : b + 1, :n], lengths[b : b + 1]) for b, n in enumerate(lengths.tolist())]
    got = benchmark.pedantic(lambda: [METHODS[name](m, *row) for row in rows], rounds=1, iterations=1)
    _alone[name, small] = (got, None if small else benchmark.stats.stats.median)


@pytest.mark.parametrize("name", METHODS)
def test_batched(benchmark, name):
    small = benchmark.disabled
    m, (tokens, lengths) = model(small), inputs(small)
    _record(benchmark, name, "batched", tokens, lengths)
    got = benchmark.pedantic(lambda: METHODS[name](m, tokens, lengths), rounds=1, iterations=1)
    assert got.shape == tokens.shape and torch.isfinite(got).all()
    if (name, small) in _alone:
        rows, alone_s = _alone[name, small]
        for b, row in enumerate(rows):
            torch.testing.assert_close(got[b, : row.shape[1]], row[0], rtol=RTOL, atol=ATOL)
        if alone_s is not None:
            ours = benchmark.stats.stats.median
            benchmark.extra_info.update(one_by_one_s=alone_s, ours_s=ours, ratio_vs_one_by_one=alone_s / ours)
