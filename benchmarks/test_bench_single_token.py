"""Tutek & Šnajder 2020's single-token test (sec. 4): ours against running every input, and a
forward per instance, same model, same inputs, one run.

Run: python -m pytest benchmarks/test_bench_single_token.py --benchmark-only -q
Model: J&W's BiLSTM + additive attention (embedding 300, hidden 128), random weights. Inputs: SST's
1,821 test sentences (``ATTNMETRICS_SST_DIR``, ids by the test set's own vocabulary), else as many
rows of a Zipf-distributed 16,000-word vocabulary (word r drawn with weight 1/r, 10–55 words: a
sentence corpus's repetition); CI's smoke run takes 20 rows.

Ours runs each distinct single-token input once (the same token between the same special tokens
is the same input) in calls of 8,192. "Every input" runs all of them in the same calls (this
library before the deduplication); "per instance" runs each sentence's tokens alone as one batch
(a loop over instances, as research code is written). The values are checked equal first;
``extra_info`` holds the inputs, the distinct ones and each ratio.
"""

from __future__ import annotations

import os

import torch

from attnmetrics import single_token_test
from attnmetrics.outputs import decision, output_distribution
from attnmetrics.protocol import forward
from attnmetrics.single_token import single_token_inputs
from benchmarks.measure import median_seconds, timed


def sst_rows(small: bool):
    """(tokens, lengths, vocabulary size): <SOS>=2 ... <EOS>=3 rows, padding 0, word ids from 4."""
    folder = os.environ.get("ATTNMETRICS_SST_DIR")
    if folder and not small:
        from attnmetrics.data.corpora import load_sst
        from attnmetrics.data.tokens import tokenize

        vocab: dict[str, int] = {}
        rows = [[vocab.setdefault(w, len(vocab) + 4) for w in tokenize(t)] for t, _ in load_sst(folder).test]
        size = len(vocab) + 4
    else:
        g = torch.Generator().manual_seed(0)
        words = 16_000
        weights = 1.0 / torch.arange(1, words + 1, dtype=torch.float64)
        count = 20 if small else 1821
        lengths = torch.randint(10, 56, (count,), generator=g).tolist()
        rows = [(torch.multinomial(weights, n, replacement=True, generator=g) + 4).tolist() for n in lengths]
        size = words + 4
    rows = [[2, *r, 3] for r in rows]
    lengths = torch.tensor([len(r) for r in rows])
    tokens = torch.zeros(len(rows), int(lengths.max()), dtype=torch.int64)
    for i, r in enumerate(rows):
        tokens[i, : len(r)] = torch.tensor(r)
    return tokens, lengths, size


@torch.no_grad()
def every_input(model, tokens, lengths, full, max_rows=8192):
    """Alone-probabilities [B, T] from every single-token input, in calls of max_rows."""
    predicted = decision(full.logits)
    inputs, rows, positions = single_token_inputs(tokens, lengths, model.lead, model.trail)
    alone = torch.zeros(len(lengths), full.attention.shape[1], dtype=full.attention.dtype)
    one = torch.full((max_rows,), inputs.shape[1], dtype=torch.int64)
    for start in range(0, len(rows), max_rows):
        chunk = slice(start, start + max_rows)
        logits = forward(model, inputs[chunk], one[: len(inputs[chunk])]).logits
        r = rows[chunk]
        alone[r, positions[chunk]] = output_distribution(logits).gather(1, predicted[r, None])[:, 0]
    return alone


@torch.no_grad()
def per_instance(model, tokens, lengths, full):
    """The same, one forward per sentence (its tokens alone, one batch)."""
    predicted = decision(full.logits)
    alone = torch.zeros(len(lengths), full.attention.shape[1], dtype=full.attention.dtype)
    for b in range(len(lengths)):
        n = int(lengths[b])
        ids = tokens[b, 1 : n - 1]
        inputs = torch.stack([torch.full_like(ids, 2), ids, torch.full_like(ids, 3)], 1)
        logits = forward(model, inputs, torch.full((len(ids),), 3)).logits
        alone[b, : len(ids)] = output_distribution(logits)[:, int(predicted[b])]
    return alone


def test_single_token_against_every_input_and_per_instance(benchmark):
    from attnmetrics.models.classifier import EncoderAttentionClassifier, ModelConfig

    small = benchmark.disabled  # CI's smoke run
    tokens, lengths, size = sst_rows(small)
    torch.manual_seed(0)
    model = EncoderAttentionClassifier(ModelConfig(size, embed_dim=300, hidden_size=128)).eval()
    with torch.no_grad():
        full = forward(model, tokens, lengths)

    def ours():
        return single_token_test(model, tokens, lengths, full=full).alone

    want, every_s = timed(lambda: every_input(model, tokens, lengths, full))
    loop, loop_s = timed(lambda: per_instance(model, tokens, lengths, full))
    got = ours()
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    torch.testing.assert_close(loop, want, rtol=0, atol=1e-6)
    benchmark.group = "single-token test"
    benchmark.pedantic(ours, rounds=1 if small else 3, iterations=1)
    ours_s = median_seconds(benchmark, ours)
    inputs, _, _ = single_token_inputs(tokens, lengths, 1, 1)
    benchmark.extra_info.update(
        rows=len(lengths),
        inputs=len(inputs),
        distinct_inputs=len(torch.unique(inputs, dim=0)),
        sst=bool(os.environ.get("ATTNMETRICS_SST_DIR")) and not small,
        ours_s=ours_s,
        every_input_s=every_s,
        per_instance_s=loop_s,
        vs_every_input=every_s / ours_s,
        vs_per_instance=loop_s / ours_s,
        threads=torch.get_num_threads(),
        load_average_after=os.getloadavg()[0],
    )
