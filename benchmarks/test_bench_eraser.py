"""ERASER's comprehensiveness and sufficiency (DeYoung et al. 2020): ours against ferret's approach,
same model, same inputs, one run.

Run: python -m pytest benchmarks/test_bench_eraser.py --benchmark-only -q
Model and inputs: J&W's BiLSTM + additive attention with random weights (as in
``jw_inputs.py``; embedding 50, and J&W's 300) on SST-like rows (SST's 1,821 test sentences,
10–55 real tokens), one random score per token, ERASER's five fractions, both metrics.

ferret's approach (``ferret/evaluators/faithfulness_measures.py``): per instance and metric, build
each fraction's perturbed sequence in Python (``np.delete`` / fancy indexing on the id list), then
run the instance's sequences through the model 8 at a time, padded (its
``_get_class_predicted_probabilities_texts`` batches), after one call on the full instance. ferret
also decodes the ids to text and re-tokenises it; that is left out here, in its favour. Ours:
every perturbation of a block of rows built at once (``rationale_batch``), the sequences run
through the whole model grouped by length.
The values are checked equal first; ``extra_info["speedup"]`` is ferret's time over ours.
"""

from __future__ import annotations

import math
import os
import time

import numpy as np
import pytest
import torch

from attnmetrics import comprehensiveness, sufficiency
from attnmetrics.eraser import ERASER_FRACTIONS
from attnmetrics.outputs import decision, output_distribution
from benchmarks.jw_inputs import make_batch, make_model

FERRET_BATCH = 8
TIMES: dict[tuple[str, int], float] = {}


def probabilities(model, sequences: list[list[int]]) -> torch.Tensor:
    """Output distributions of id lists, run together padded (ferret's batches)."""
    lengths = torch.tensor([len(s) for s in sequences])
    tokens = torch.zeros(len(sequences), int(lengths.max()), dtype=torch.int64)
    for i, s in enumerate(sequences):
        tokens[i, : len(s)] = torch.tensor(s)
    hidden = model.encode(model.embed(tokens), lengths)
    attention = model.attend(hidden, lengths)
    return output_distribution(model.decoder(torch.einsum("bt,bth->bh", attention, hidden)))


@torch.no_grad()
def ferret_loop(model, tokens, lengths, scores):
    """{metric: [B, F] values}: each instance on its own, its perturbations 8 at a time."""
    out = {m: np.full((len(lengths), len(ERASER_FRACTIONS)), np.nan) for m in ("comprehensiveness", "sufficiency")}
    for b in range(len(lengths)):
        ids = tokens[b, : int(lengths[b])].tolist()
        real = np.array(ids[1:-1])
        full = probabilities(model, [ids])[0]
        y = int(decision(full[None].log())[0])
        ranked = np.argsort(-scores[b, : len(real)].numpy(), kind="stable")
        for metric in out:
            texts = []
            for f in ERASER_FRACTIONS:
                top = ranked[: math.ceil(round(f * len(real), 9))]
                kept = np.delete(real, top) if metric == "comprehensiveness" else real[np.sort(top)]
                texts.append([ids[0], *kept.tolist(), ids[-1]])
            p = torch.cat(
                [probabilities(model, texts[i : i + FERRET_BATCH]) for i in range(0, len(texts), FERRET_BATCH)]
            )
            out[metric][b] = (full[y] - p[:, y]).numpy()
    return out


def ours(model, tokens, lengths, scores):
    return {
        "comprehensiveness": comprehensiveness(model, tokens, lengths, scores).values,
        "sufficiency": sufficiency(model, tokens, lengths, scores).values,
    }


@pytest.mark.parametrize("embed_dim", [50, 300], ids=lambda e: f"E{e}")
@pytest.mark.parametrize("approach", ["ferret", "ours"])
def test_eraser_sst(benchmark, embed_dim, approach):
    model = make_model(embed_dim=embed_dim)
    tokens, lengths = make_batch(1821, 10, 55)
    scores = torch.rand(len(lengths), int(lengths.max()) - 2, generator=torch.Generator().manual_seed(1))
    fn = ferret_loop if approach == "ferret" else ours
    if approach == "ours":  # the same numbers first
        reference = ferret_loop(model, tokens[:200], lengths[:200], scores[:200])
        got = ours(model, tokens[:200], lengths[:200], scores[:200])
        for metric, values in reference.items():
            np.testing.assert_allclose(got[metric].numpy(), values, atol=2e-6)
    start = time.perf_counter()  # one round each (seconds), timed here so the smoke run times it too
    benchmark.pedantic(fn, args=(model, tokens, lengths, scores), rounds=1, iterations=1)
    seconds = time.perf_counter() - start
    TIMES[approach, embed_dim] = seconds
    benchmark.extra_info.update(
        embed_dim=embed_dim, seconds=round(seconds, 3), threads=torch.get_num_threads(), load=os.getloadavg()[0]
    )
    if approach == "ours" and ("ferret", embed_dim) in TIMES:
        benchmark.extra_info["speedup"] = round(TIMES["ferret", embed_dim] / seconds, 1)


def test_eraser_on_a_transformer(benchmark):
    """ERASER's five fractions, both metrics, on a Hugging Face encoder through our adapter: a
    random BERT classifier of 4 layers, d = 256, 4 heads, two classes (CPU, float32, offline; the
    leave-one-out benchmark's model), 64 SST-like rows of random WordPiece ids, one random score
    per token. Ours against ferret's approach (each instance's perturbations 8 at a time, padded),
    values checked equal first, and ours beside its multiply-add floor: each row once (the
    predicted class), then per row and distinct rationale size k one re-encoding without the
    rationale (L - k tokens, comprehensiveness) and one of the rationale alone (k + 2, sufficiency),
    each at its own length."""
    from attnmetrics import full_rows
    from attnmetrics.eraser import rationale_sizes
    from benchmarks.measure import SMALL_BERT, encoder_macs, floor_info, random_bert, rounds_beside_rate, timed
    from benchmarks.test_bench_attributions import inputs

    small = benchmark.disabled  # CI's smoke run: a 2-layer d = 32 model and two short rows
    model, config, description = random_bert(SMALL_BERT, small)
    tokens, lengths = inputs("sst", small)
    real = lengths - 2
    scores = torch.rand(len(lengths), int(real.max()), generator=torch.Generator().manual_seed(1))
    benchmark.group = "eraser-transformer"

    def both():
        full = full_rows(model, tokens, lengths)  # the rows once, for both metrics
        return {
            "comprehensiveness": comprehensiveness(model, tokens, lengths, scores, full_rows=full).values,
            "sufficiency": sufficiency(model, tokens, lengths, scores, full_rows=full).values,
        }

    with torch.no_grad():
        reference, ferret_s = timed(lambda: ferret_loop(model, tokens, lengths, scores))
    got, ours_s, rates = rounds_beside_rate(benchmark, both)
    for metric, values in reference.items():  # float32: batch composition moves the last bits
        np.testing.assert_allclose(got[metric].numpy(), values, atol=2e-5)
    k = rationale_sizes(scores, real, ERASER_FRACTIONS)
    macs = 0
    for n, sizes in zip(lengths.tolist(), k.tolist()):
        macs += encoder_macs(config, n)
        for size in {s for s in sizes if s > 0}:
            macs += encoder_macs(config, n - size) + encoder_macs(config, size + 2)
    benchmark.extra_info.update(
        model=description,
        rows=int(lengths.shape[0]),
        mean_length=float(lengths.double().mean()),
        threads=torch.get_num_threads(),
        eraser_s=ours_s,
        ferret_approach_s=ferret_s,
        speedup_vs_ferret_approach=ferret_s / ours_s,
        **floor_info(macs, ours_s, rates),
        load_average_after=os.getloadavg()[0],
    )
