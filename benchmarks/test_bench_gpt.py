"""GPT-1 (models/gpt.py, models/pretraining.py, models/gpt_classifier.py): pre-training
throughput against a plain PyTorch loop, and leave-one-out with the causal prefix reused against
re-running every shortened row; same inputs, one run, the ratio in ``extra_info``.

Run: python -m pytest benchmarks/test_bench_gpt.py --benchmark-only -q

Pre-training: the ``small`` config (4 blocks, d = 256, 4 heads, context 128) for ``STEPS`` steps
(after a two-step warm-up of the plain loop, which builds oneDNN's primitives for both) of 16 windows on SST's training sentences (local; the Gutenberg books need a download), a BPE of
2,048 ids learnt on them. Ours is :func:`~attnmetrics.models.pretraining.pretrain` end to end
(the token file, one validation pass, one checkpoint written atomically); the plain loop is the
textbook one: sample windows, forward, cross-entropy, backward, AdamW step, nothing else.

Leave-one-out: a random-weight :class:`GPTClassifier` (small config; context 512 for the
IMDB-like rows) in float32. Ours is ``attnmetrics.leave_one_out``, which asks the model for
``deletion_logits``: the keys and values before a deleted token are cached, so a deletion
recomputes its suffix alone (on average half a row). The reference is the same call on the
same model with ``deletion_logits`` hidden, so it re-runs every shortened row whole (in
batches within the same memory budget).
"""

from __future__ import annotations

import os
import time

import pytest
import torch
import torch.nn.functional as F

from attnmetrics import leave_one_out
from attnmetrics.data import load_sst
from attnmetrics.models.bpe import BPETokenizer
from attnmetrics.models.gpt import GPT, GPTConfig
from attnmetrics.models.gpt_classifier import EXTRACT, START, GPTClassifier
from attnmetrics.models.pretraining import PretrainConfig, pretrain, sample_windows
from benchmarks.measure import median_seconds
from tests.inputs import SST_DIR

STEPS = 100  # ours' one-time work (token file, one validation pass, one checkpoint) is ~2 s of ~100
VOCAB = 2048


@pytest.fixture(scope="module")
def corpus():
    texts = [text for text, _ in load_sst(SST_DIR).train]
    return texts, BPETokenizer.train(texts, VOCAB)


def _plain_loop(model: GPT, tokens, steps: int, batch_size: int, lr: float) -> float:
    """The textbook loop; returns its seconds."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    generator = torch.Generator().manual_seed(0)
    start = time.perf_counter()
    for _ in range(steps):
        w = sample_windows(tokens, batch_size, model.config.context, generator)
        logits = model(w[:, :-1]).logits
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return time.perf_counter() - start


@pytest.mark.sst
def test_pretraining_throughput_vs_plain_loop(benchmark, corpus, tmp_path):
    texts, tokenizer = corpus
    steps = 2 if benchmark.disabled else STEPS
    config = PretrainConfig(
        steps=steps, warmup=1, vocab_size=VOCAB, eval_every=steps, checkpoint_every=steps, eval_windows=16,
        progress=False,
    )  # fmt: skip
    model_config = GPTConfig.named("small", tokenizer.vocab_size)
    per_step = config.batch_size * model_config.context
    runs = iter(range(10**6))

    def ours():
        return pretrain(
            tmp_path / f"run{next(runs)}", model_config, config, train_texts=texts[1:], valid_text=" ".join(texts[:400]),
            tokenizer=tokenizer,
        )  # fmt: skip

    stream = torch.tensor(tokenizer.encode("\n".join(texts[1:])), dtype=torch.int64).numpy()
    _plain_loop(GPT(model_config).train(), stream, 2, config.batch_size, config.lr)  # warm-up (oneDNN primitives)
    load_before = os.getloadavg()[0]
    benchmark.group = "gpt-pretraining"
    result = benchmark.pedantic(ours, rounds=1, iterations=1)
    ours_s = median_seconds(benchmark, ours)
    torch.manual_seed(config.seed)
    plain_model = GPT(model_config).train()
    plain_s = _plain_loop(plain_model, stream, steps, config.batch_size, config.lr)
    benchmark.extra_info.update(
        steps=steps,
        tokens_per_step=per_step,
        threads=torch.get_num_threads(),
        load_average_before=load_before,
        load_average_after=os.getloadavg()[0],
        pretrain_s=ours_s,
        plain_loop_s=plain_s,
        pretrain_tokens_per_s=steps * per_step / ours_s,
        plain_loop_tokens_per_s=steps * per_step / plain_s,
        speedup=plain_s / ours_s,
    )
    assert result.step == steps


# (rows, min real tokens, max real tokens, context)
LOO_CASES = {
    "sst": (300, 10, 55, 128),  # SST-like sentences (BPE ids)
    "imdb": (6, 100, 300, 512),  # IMDB-like reviews
}


class FullRecompute(GPTClassifier):
    """The same model with ``deletion_logits`` hidden: leave_one_out re-runs every shortened row."""

    deletion_logits = None


def _loo_batch(rows, lo, hi, vocab, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(lo, hi + 1, (rows,), generator=g) + 2
    width = int(lengths.max())
    pos = torch.arange(width)
    tokens = torch.randint(4, vocab, (rows, width), generator=g)
    tokens[:, 0] = START
    tokens[pos == (lengths - 1)[:, None]] = EXTRACT
    tokens[pos >= lengths[:, None]] = 0
    return tokens, lengths


@pytest.mark.parametrize("case", list(LOO_CASES))
def test_gpt_leave_one_out_prefix_reuse_vs_full_recompute(benchmark, case):
    rows, lo, hi, context = LOO_CASES[case]
    if benchmark.disabled:  # CI's smoke run: the same code paths on a fraction of the work
        rows, lo, hi = min(rows, 4), min(lo, 10), min(hi, 20)
    config = GPTConfig.named("small", VOCAB, context=context)
    torch.manual_seed(0)
    model = GPTClassifier(config).eval()
    full = FullRecompute(config).eval()
    full.load_state_dict(model.state_dict())
    tokens, lengths = _loo_batch(rows, lo, hi, VOCAB)
    load_before = os.getloadavg()[0]
    benchmark.group = f"gpt-loo-{case}"
    result = benchmark.pedantic(leave_one_out, args=(model, tokens, lengths), rounds=1, iterations=1)
    ours_s = median_seconds(benchmark, lambda: leave_one_out(model, tokens, lengths))
    start = time.perf_counter()
    reference = leave_one_out(full, tokens, lengths)
    full_s = time.perf_counter() - start
    benchmark.extra_info.update(
        rows=rows,
        mean_length=float(lengths.double().mean()),
        deletions=int((lengths - 2).sum()),
        threads=torch.get_num_threads(),
        load_average_before=load_before,
        load_average_after=os.getloadavg()[0],
        prefix_reuse_s=ours_s,
        full_recompute_s=full_s,
        speedup=full_s / ours_s,
        max_abs_diff=float((result - reference).abs().max()),
    )
    torch.testing.assert_close(result, reference, rtol=1e-4, atol=1e-5)  # float32: batch shapes move the last bits
