"""The flip search and the permutation test on a transformer's own attention (GPT-1's
``<extract>`` row, per head, models/own_attention.py; all-MiniLM-L6-v2's ``[CLS]`` row,
models/hf.py) against the approach users take today: one full model forward per removal step
(per permutation) per instance, with the edit made inside the last attention layer (as Inseq's
value zeroing loops do). Same model, same inputs, one run; the ratio in ``extra_info["ratio"]``.

Run: python -m pytest benchmarks/test_bench_own_attention.py --benchmark-only -q

Models (float32, eval mode), each on ``ROWS`` SST-like rows (10-55 real tokens):

- ``gpt``: a random-weight ``small`` GPT classifier (4 blocks, d = 256, 4 heads) with GPT-1's
  extract read-out;
- ``minilm``: the pretrained all-MiniLM-L6-v2 (6 layers, d = 384, 12 heads; fetched like the
  data, skipped when it cannot be) with a new two-class head, random WordPiece ids.

Both models' decisions are split at the median margin, so some rows flip, as a trained model's
do. Ours: one forward to decompose the attention (``tested_attention``), then ``flip_fraction`` /
``permutation_test`` on the multi-head attention through the rest of the network (the decoder).
The loop: for each instance, for k = 1, 2, ... remove the top-k tokens (head-mean attention
order) from the pooled row of every head, renormalise each head's real tokens within their mass,
re-run the whole model on that row, stop at the first flip; for the permutation test, one
forward per permutation. Both give the same answers (checked).
"""

from __future__ import annotations

import os

import pytest
import torch

from attnmetrics import decision, flip_fraction, output_distribution, permutation_test
from attnmetrics.flip import removal_order
from attnmetrics.models.gpt import GPTConfig
from attnmetrics.models.gpt import attention as gpt_attention
from attnmetrics.models.gpt_classifier import GPTClassifier
from attnmetrics.permutation import attention_permutations, draw_seed
from benchmarks.measure import median_seconds

ROWS = 32
PERMUTATIONS = 100  # J&W's


def make_gpt(rows):
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
        split_at_the_median(model.decoder.bias, model(tokens, lengths)[0])
    return model, tokens, lengths


def split_at_the_median(bias, logits):
    """Shift the output layer's class-1 ``bias`` so that the decisions split at the median margin:
    between the two middle rows, never on one (a margin of exactly 0 is a tie that rounding decides)."""
    margin = (logits[:, 1] - logits[:, 0]).sort().values
    rows = len(margin)
    bias.data[1] -= (margin[rows // 2 - 1] + margin[rows // 2]) / 2


def make_minilm(rows):
    pytest.importorskip("transformers", reason="the MiniLM case needs transformers (pip install -e .[hf])")
    from attnmetrics.data import ArtifactError, load_minilm
    from attnmetrics.models.hf import HFClassifier

    try:
        folder = load_minilm()
    except ArtifactError as e:
        pytest.skip(f"all-MiniLM-L6-v2 not available: {e}")
    torch.manual_seed(0)
    model = HFClassifier.from_pretrained(folder, num_labels=2)[0].eval()
    vocab = model.hf.config.vocab_size
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(10, 56, (rows,), generator=g) + 2
    tokens = torch.randint(1000, vocab, (rows, int(lengths.max())), generator=g)  # past the special ids
    tokens[:, 0] = 101  # [CLS]
    tokens[torch.arange(rows), lengths - 1] = 102  # [SEP]
    tokens[torch.arange(tokens.shape[1]) >= lengths[:, None]] = 0
    with torch.no_grad():
        split_at_the_median(model.hf.classifier.bias, model(tokens, lengths)[0])
    return model, tokens, lengths


MODELS = {"gpt": make_gpt, "minilm": make_minilm}


def decompose(model, tokens, lengths):
    """The decomposition of the model's own attention (``TestedAttention``)."""
    return model.tested_attention(tokens, lengths)


def forward_with_row(model, tokens, n, alpha):
    """One full forward of a row whose last-layer pooled row (GPT-1's <extract>, MiniLM's [CLS])
    gives its real tokens ``alpha`` [heads, n - 2] within their mass (the specials keep theirs)."""
    if isinstance(model, GPTClassifier):
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

    def hook(query, key, value, probs, scaling):  # the [CLS] row of the last layer (models/hf.py)
        probs = probs.clone()
        row = probs[0, :, 0]
        row[:, 1 : n - 1] = row[:, 1 : n - 1].sum(-1, keepdim=True) * alpha
        return probs

    model.last_attention._attnmetrics_hook = hook
    try:
        return model(tokens[None, :n], torch.tensor([n]))[0]
    finally:
        del model.last_attention._attnmetrics_hook


@torch.no_grad()
def flip_loop(model, tokens, lengths):
    """Per instance, one full forward per removal step until the decision flips."""
    removed = []
    for b in range(len(lengths)):
        n = int(lengths[b])
        t = decompose(model, tokens[b : b + 1, :n], lengths[b : b + 1])
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
def permutation_loop(model, tokens, lengths):
    """Per instance, one full forward per permutation (those of a test seeded as ours); returns
    the output TVDs [B, P]."""
    out = []
    seed = draw_seed(torch.Generator().manual_seed(0))
    perms = attention_permutations(lengths - 2, tokens.shape[1] - 1, PERMUTATIONS, seed)
    for b in range(len(lengths)):
        n = int(lengths[b])
        t = decompose(model, tokens[b : b + 1, :n], lengths[b : b + 1])
        alpha = t.attention[0, :, : n - 2]
        original = output_distribution(model(tokens[b : b + 1, :n], lengths[b : b + 1])[0])
        row = [forward_with_row(model, tokens[b], n, alpha[:, perms[b, p, : n - 2]]) for p in range(PERMUTATIONS)]
        out.append(0.5 * (output_distribution(torch.cat(row)) - original).abs().sum(-1))
    return torch.stack(out)


def flip_ours(t):
    return flip_fraction(t.attention, t.values, t.decoder, t.lengths).removed


def permutation_ours(t):
    generator = torch.Generator().manual_seed(0)
    return permutation_test(
        t.attention, t.values, t.decoder, t.lengths, permutations=PERMUTATIONS, generator=generator, return_all=True
    ).tvd


def same_flips(got, want):
    assert torch.equal(got, want)


def same_tvds(got, want):
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


#: procedure -> (the users' loop, ours on the decomposition, the check that both answer alike)
PROCEDURES = {
    "flip": (flip_loop, flip_ours, same_flips),
    "permutation": (permutation_loop, permutation_ours, same_tvds),
}


_loop: dict = {}


def _record(benchmark, name, kind):
    benchmark.group = f"own attention {kind} {name}"
    benchmark.extra_info.update(model=kind, rows=ROWS, threads=torch.get_num_threads(), load_average=os.getloadavg()[0])


@pytest.mark.parametrize("kind", MODELS)
@pytest.mark.parametrize("name", PROCEDURES)
def test_loop(benchmark, name, kind):
    model, tokens, lengths = MODELS[kind](8 if benchmark.disabled else ROWS)
    _record(benchmark, name, kind)
    got = benchmark.pedantic(PROCEDURES[name][0], args=(model, tokens, lengths), rounds=1, iterations=1)
    _loop[name, kind] = (got, None if benchmark.disabled else benchmark.stats.stats.median)


@pytest.mark.parametrize("kind", MODELS)
@pytest.mark.parametrize("name", PROCEDURES)
def test_ours(benchmark, name, kind):
    model, tokens, lengths = MODELS[kind](8 if benchmark.disabled else ROWS)
    _record(benchmark, name, kind)
    _, ours, check = PROCEDURES[name]

    def run():
        with torch.no_grad():
            return ours(decompose(model, tokens, lengths))

    got = benchmark(run)
    if (name, kind) in _loop:
        want, loop_s = _loop[name, kind]
        check(got, want)
        if loop_s is not None:
            benchmark.extra_info["ratio"] = loop_s / median_seconds(benchmark, run)
