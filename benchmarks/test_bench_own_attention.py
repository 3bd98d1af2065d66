"""The flip search and the permutation test on a transformer's own attention (GPT-1's
``<extract>`` row, per head; models/own_attention.py) against the approach users take today:
one full model forward per removal step (per permutation) per instance, with the edit made
inside the last attention layer (as Inseq's value zeroing loops do). Same model, same inputs,
one run; the ratio in ``extra_info["ratio"]``.

Run: python -m pytest benchmarks/test_bench_own_attention.py --benchmark-only -q

Model: a random-weight ``small`` GPT classifier (4 blocks, d = 256, 4 heads) with GPT-1's
extract read-out, float32, eval mode; ``ROWS`` SST-like rows (10-55 real tokens). Ours: one
forward to decompose the attention (``extract_attention``), then ``flip_fraction`` /
``permutation_test`` on the multi-head attention through the rest of the last block (the
decoder). The loop: for each instance, for k = 1, 2, ... remove the top-k tokens (head-mean
attention order) from the ``<extract>`` row of every head, renormalise each head's real tokens
within their mass, re-run the whole model on that row, stop at the first flip; for the
permutation test, one forward per permutation. Both give the same answers (checked).
"""

from __future__ import annotations

import os

import torch

from attnmetrics import decision, flip_fraction, output_distribution, permutation_test
from attnmetrics.flip import removal_order
from attnmetrics.models.gpt import GPTConfig
from attnmetrics.models.gpt import attention as gpt_attention
from attnmetrics.models.gpt_classifier import GPTClassifier
from attnmetrics.models.own_attention import extract_attention
from attnmetrics.permutation import attention_permutations, draw_seed
from benchmarks.measure import median_seconds

ROWS = 32
PERMUTATIONS = 100  # J&W's


def make_inputs(rows):
    torch.manual_seed(0)
    model = GPTClassifier(GPTConfig(vocab_size=2048), num_classes=2, attention="extract").eval()
    for p in model.parameters():
        p.data.normal_(0, 0.3)
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(10, 56, (rows,), generator=g) + 2
    tokens = torch.randint(4, 2048, (rows, int(lengths.max())), generator=g)
    tokens[:, 0] = 1
    tokens[torch.arange(rows), lengths - 1] = 3
    tokens[torch.arange(tokens.shape[1]) >= lengths[:, None]] = 0
    with torch.no_grad():
        # a last layer whose attention is peakier and matters more than a random init's (max
        # weight 0.08 on average), and decisions split at the median margin, so that some rows
        # flip (26 of the first 64), as a trained model's do
        qkv, d = model.gpt.blocks[-1].attn.qkv.weight, model.gpt.config.d_model
        qkv[: 2 * d] *= 3
        qkv[2 * d :] *= 3
        logits = model(tokens, lengths)[0]
        model.decoder.bias[1] -= (logits[:, 1] - logits[:, 0]).median()
    return model, tokens, lengths


def forward_with_row(model, tokens, n, alpha):
    """One full forward of a row whose last-layer <extract> row gives its real tokens ``alpha``
    [heads, n - 2] within their mass (the specials keep theirs)."""
    attn = model.gpt.blocks[-1].attn

    def patched(q, k, v, mask):
        _, probs = gpt_attention(q, k, v, mask)
        row = probs[0, :, n - 1]
        row[:, 1 : n - 1] = row[:, 1 : n - 1].sum(-1, keepdim=True) * alpha
        return probs @ v, probs

    attn.attention = patched
    try:
        return model(tokens[None, :n], torch.tensor([n]))[0]
    finally:
        del attn.attention


@torch.no_grad()
def flip_loop(model, tokens, lengths):
    """Per instance, one full forward per removal step until the decision flips."""
    removed = []
    for b in range(len(lengths)):
        n = int(lengths[b])
        t = extract_attention(model, tokens[b : b + 1, :n], lengths[b : b + 1])
        alpha, m = t.attention[0, :, : n - 2], n - 2
        order = removal_order(alpha.mean(0, keepdim=True))[0]
        original = int(decision(model(tokens[b : b + 1, :n], lengths[b : b + 1])[0])[0])
        first = -1
        for k in range(1, m):
            kept = alpha.clone()
            kept[:, order[:k]] = 0
            kept = kept / kept.sum(-1, keepdim=True)
            if int(decision(forward_with_row(model, tokens[b], n, kept))[0]) != original:
                first = k
                break
        removed.append(first)
    return torch.tensor(removed)


@torch.no_grad()
def permutation_loop(model, tokens, lengths, seed):
    """Per instance, one full forward per permutation; returns the output TVDs [B, P]."""
    out = []
    perms = attention_permutations(lengths - 2, tokens.shape[1] - 1, PERMUTATIONS, seed)
    for b in range(len(lengths)):
        n = int(lengths[b])
        t = extract_attention(model, tokens[b : b + 1, :n], lengths[b : b + 1])
        alpha = t.attention[0, :, : n - 2]
        original = output_distribution(model(tokens[b : b + 1, :n], lengths[b : b + 1])[0])
        row = [forward_with_row(model, tokens[b], n, alpha[:, perms[b, p, : n - 2]]) for p in range(PERMUTATIONS)]
        out.append(0.5 * (output_distribution(torch.cat(row)) - original).abs().sum(-1))
    return torch.stack(out)


_loop: dict = {}


def _record(benchmark, name):
    benchmark.group = f"own attention {name}"
    benchmark.extra_info.update(rows=ROWS, threads=torch.get_num_threads(), load_average=os.getloadavg()[0])


def test_flip_loop(benchmark):
    rows = 8 if benchmark.disabled else ROWS
    model, tokens, lengths = make_inputs(rows)
    _record(benchmark, "flip")
    got = benchmark.pedantic(flip_loop, args=(model, tokens, lengths), rounds=1, iterations=1)
    _loop["flip"] = (got, None if benchmark.disabled else benchmark.stats.stats.median)


def test_flip_ours(benchmark):
    rows = 8 if benchmark.disabled else ROWS
    model, tokens, lengths = make_inputs(rows)
    _record(benchmark, "flip")

    def run():
        with torch.no_grad():
            t = extract_attention(model, tokens, lengths)
            return flip_fraction(t.attention, t.values, t.decoder, t.lengths).removed

    got = benchmark(run)
    if "flip" in _loop:
        want, loop_s = _loop["flip"]
        assert torch.equal(got, want)
        if loop_s is not None:
            assert (got > 0).any()
            benchmark.extra_info["ratio"] = loop_s / median_seconds(benchmark, run)


def test_permutation_loop(benchmark):
    rows = 8 if benchmark.disabled else ROWS
    model, tokens, lengths = make_inputs(rows)
    _record(benchmark, "permutation")
    seed = draw_seed(torch.Generator().manual_seed(0))
    got = benchmark.pedantic(permutation_loop, args=(model, tokens, lengths, seed), rounds=1, iterations=1)
    _loop["permutation"] = (got, None if benchmark.disabled else benchmark.stats.stats.median)


def test_permutation_ours(benchmark):
    rows = 8 if benchmark.disabled else ROWS
    model, tokens, lengths = make_inputs(rows)
    _record(benchmark, "permutation")

    def run():
        with torch.no_grad():
            t = extract_attention(model, tokens, lengths)
            return permutation_test(
                t.attention,
                t.values,
                t.decoder,
                t.lengths,
                permutations=PERMUTATIONS,
                generator=torch.Generator().manual_seed(0),
                return_all=True,
            )

    got = benchmark(run)
    if "permutation" in _loop:
        want, loop_s = _loop["permutation"]
        torch.testing.assert_close(got.tvd, want, rtol=1e-4, atol=1e-5)
        if loop_s is not None:
            benchmark.extra_info["ratio"] = loop_s / median_seconds(benchmark, run)
