"""Leave-one-out against Captum's ``FeatureAblation``, the peer a user reaches for today.

Run: OMP_NUM_THREADS=1 python -m pytest benchmarks/test_bench_loo_captum.py --benchmark-only -q
(skipped without Captum: ``pip install captum``).

Same model and inputs as ``test_bench_loo.py`` (J&W's BiLSTM + additive attention, random
weights, H 128 per direction, one sigmoid output; SST-like B = 1,821 with 10–55 real tokens,
IMDB-like B = 100 with 20–400), at two embedding sizes: 50 (``test_bench_loo.py``'s) and J&W's
300 (our SST model's), where the input projection is most of an LSTM step's work and only the
re-encoding side pays it per perturbation. Captum ablates one feature per real token (token k of
every row is feature k; ``<SOS>``, ``<EOS>`` and padding share one more feature, whose
ablation is run and ignored), replacing it with the mask token, and reports
``p(x) − p(x with the token masked)`` for the sigmoid output, whose absolute value is the TVD
that ``leave_one_out(mode="mask")`` returns: the two are checked equal before timing.

Two Captum users:

- **stock**: one ``attribute`` call over the whole padded batch, at the best
  ``perturbations_per_eval`` of :data:`PER_EVAL` (each timed; the best is the one compared);
- **length-bucketed**: rows grouped by length, one call per length (no padding, and each
  call ablates only the features its rows have), ``perturbations_per_eval`` chosen so a
  forward holds about :data:`BUCKET_ROWS` rows.

Ours: ``leave_one_out`` with ``mode="mask"`` and with ``mode="delete"`` (J&W's; Captum cannot
delete, so that ratio compares the same question asked J&W's way), from a cold start.
``extra_info`` records every time, the ratios, threads and load.
"""

from __future__ import annotations

import os

import pytest
import torch

from attnmetrics import leave_one_out
from benchmarks.jw_inputs import CASES, make_batch, make_model
from benchmarks.measure import encoder_macs, floor_info, rounds_beside_rate, timed

captum_attr = pytest.importorskip("captum.attr", reason="Captum is optional: pip install captum")

MASK = 1  # the mask token (id 1 is <UNK> in our vocabularies; any id works)
#: perturbations_per_eval tried for the stock user (Captum's default is 1)
PER_EVAL = (1, 4, 16)
#: the length-bucketed user's forwards hold about this many rows
BUCKET_ROWS = 1024


def sigmoid_output(logits):
    """p of a one-logit (sigmoid) model's output: its TVD between two inputs is |Δp|."""
    return torch.sigmoid(logits[:, 0])


def second_class(logits):
    """p of class 1 of a two-class softmax model: its TVD between two inputs is |Δp_1|."""
    return torch.softmax(logits, -1)[:, 1]


def captum_loo(model, tokens, lengths, per_eval, output=sigmoid_output, mask=MASK):
    """TVD of masking each real token, the way a Captum user computes it: ``[B, T - 1]`` laid
    out as ``leave_one_out``'s (entry k is real token k + 1). ``output``: the probability whose
    change is the TVD (two outputs); ``mask``: the replacing token id."""
    batch, width = tokens.shape
    positions = torch.arange(width, device=tokens.device)
    real = (positions >= 1) & (positions < (lengths - 1)[:, None])
    # real token k -> feature k; <SOS>, <EOS> and padding -> feature width (ablated, ignored)
    feature_mask = torch.where(real, positions - 1, width).expand(batch, width)

    def probability(tokens, lengths):
        with torch.no_grad():
            return output(model(tokens, lengths)[0])

    ablation = captum_attr.FeatureAblation(probability)
    attribution = ablation.attribute(
        tokens,
        baselines=mask,
        additional_forward_args=(lengths,),
        feature_mask=feature_mask,
        perturbations_per_eval=per_eval,
    )
    out = torch.zeros(batch, width - 1, dtype=torch.float32, device=tokens.device)
    out[real[:, 1:]] = attribution[:, 1:][real[:, 1:]].abs().float()
    return out


def captum_loo_bucketed(model, tokens, lengths, output=sigmoid_output, mask=MASK):
    """:func:`captum_loo` per group of rows of one length, cut to that length."""
    out = torch.zeros(tokens.shape[0], tokens.shape[1] - 1, device=tokens.device)
    for n in lengths.unique().tolist():
        rows = torch.nonzero(lengths == n).squeeze(1)
        per_eval = max(1, BUCKET_ROWS // len(rows))
        out[rows, : n - 1] = captum_loo(model, tokens[rows, :n], lengths[rows], per_eval, output, mask)
    return out


def measure_against_captum(benchmark, model, tokens, lengths, per_evals, output=sigmoid_output, mask=MASK):
    """Ours (``leave_one_out(mode="mask")``, the benchmark's timing) and Captum stock at each of
    ``per_evals`` and length-bucketed, the values checked equal first (float32: batch composition
    moves the last bits); returns ours' values, ``extra_info``'s common entries and the machine's
    multiply-add rate read before each timed round (:func:`rounds_beside_rate`)."""
    load_before = os.getloadavg()[0]

    def ours():
        return leave_one_out(model, tokens, lengths, mode="mask", mask_token=mask)

    masked, mask_s, rates = rounds_beside_rate(benchmark, ours)  # warm, as the peers after it
    bucketed, bucketed_s = timed(lambda: captum_loo_bucketed(model, tokens, lengths, output, mask))
    torch.testing.assert_close(masked, bucketed, rtol=1e-3, atol=1e-5)
    stock_s = {}
    for per_eval in per_evals:
        stock, stock_s[per_eval] = timed(lambda: captum_loo(model, tokens, lengths, per_eval, output, mask))
        torch.testing.assert_close(masked, stock, rtol=1e-3, atol=1e-5)
    best = min(stock_s, key=stock_s.get)
    return (
        masked,
        dict(
            rows=int(lengths.shape[0]),
            mean_length=float(lengths.double().mean()),
            maskings=int((lengths - 2).sum()),
            threads=torch.get_num_threads(),
            load_average_before=load_before,
            leave_one_out_mask_s=mask_s,
            captum_bucketed_s=bucketed_s,
            captum_stock_s={str(k): v for k, v in stock_s.items()},
            captum_stock_best_per_eval=best,
            mask_speedup_vs_bucketed=bucketed_s / mask_s,
            mask_speedup_vs_stock=stock_s[best] / mask_s,
            max_abs_diff_vs_captum=float((masked - bucketed).abs().max()),
        ),
        rates,
    )


@pytest.mark.parametrize("embed_dim", [50, 300], ids=lambda e: f"E{e}")
@pytest.mark.parametrize("case", list(CASES))
def test_leave_one_out_vs_captum(benchmark, case, embed_dim):
    model = make_model(embed_dim=embed_dim)
    batch, lo, hi = CASES[case]
    per_evals = PER_EVAL
    if benchmark.disabled:  # CI's smoke run: the same code paths on a fraction of the work
        batch, hi, per_evals = min(batch, 16), min(hi, lo + 10), PER_EVAL[:1]
    tokens, lengths = make_batch(batch, lo, hi)
    benchmark.group = f"loo-captum-{case}-E{embed_dim}"
    _, info, rates = measure_against_captum(benchmark, model, tokens, lengths, per_evals)
    _, delete_s = timed(lambda: leave_one_out(model, tokens, lengths))
    stock_s = info["captum_stock_s"][str(info["captum_stock_best_per_eval"])]
    benchmark.extra_info.update(
        embed_dim=embed_dim,
        **info,
        leave_one_out_delete_s=delete_s,
        delete_speedup_vs_bucketed=info["captum_bucketed_s"] / delete_s,
        delete_speedup_vs_stock=stock_s / delete_s,
        machine_gmacs_by_round=rates,
        load_average_after=os.getloadavg()[0],
    )


#: BERT's [MASK] id, the replacing token of the transformer case
BERT_MASK = 103


def test_leave_one_out_vs_captum_on_a_transformer(benchmark):
    """The same comparison on a Hugging Face encoder through our adapter (issue: the peers on
    the transformer): a random BERT classifier of 4 layers, d = 256, 4 heads, two classes (CPU,
    float32, offline), 64 SST-like rows of random WordPiece ids between [CLS] and [SEP], each
    real token masked with [MASK]. Ours re-encodes every masked row as Captum does (a transformer
    has no state to reuse), in few large calls; Captum stock (best ``perturbations_per_eval``) and
    length-bucketed. Values checked equal first."""
    from benchmarks.measure import SMALL_BERT, random_bert
    from benchmarks.test_bench_attributions import inputs

    small = benchmark.disabled  # CI's smoke run: a 2-layer d = 32 model and two short rows
    model, config, description = random_bert(SMALL_BERT, small)
    per_evals = (1,) if small else PER_EVAL
    tokens, lengths = inputs("sst", small)
    benchmark.group = "loo-captum-transformer"
    _, info, rates = measure_against_captum(benchmark, model, tokens, lengths, per_evals, second_class, BERT_MASK)
    # the floor: every masking re-encodes its whole row (nothing is reusable: docs/speed.md), and
    # the rows themselves once, each at its own length
    macs = sum((n - 1) * encoder_macs(config, n) for n in lengths.tolist())
    benchmark.extra_info.update(
        model=description,
        **info,
        **floor_info(macs, info["leave_one_out_mask_s"], rates),
        load_average_after=os.getloadavg()[0],
    )
