"""ERASER's comprehensiveness and sufficiency (DeYoung et al. 2020), and ferret's variant, against a
plain loop that builds each perturbed row from the paper's definition and runs it alone."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attnmetrics.loo
from attnmetrics.eraser import ERASER_FRACTIONS, FERRET_FRACTIONS, comprehensiveness, rationale_sizes, sufficiency
from attnmetrics.outputs import decision, output_distribution
from tests.test_loo import MASK, ragged, real_model

F64 = torch.float64


def reference(
    model, tokens, lengths, scores, fractions, keep_rationale, variant="eraser", mask_token=None, rounding="ceil"
):
    """values [B][F] (None: not counted): each row and fraction built and run on its own.
    ``rounding="floor"``: ERASER's k = floor(f L) (jayded/eraserbenchmark encode_attend.py:425,
    ``int(k_fraction * len(doc))``); a fraction with k = 0 is not counted."""
    lead, trail = model.lead, model.trail
    out = []
    for b in range(tokens.shape[0]):
        row = tokens[b, : int(lengths[b])].tolist()
        real = row[lead : len(row) - trail]
        n = len(real)
        if n == 0:
            out.append([None] * len(fractions))
            continue
        with torch.no_grad():
            full = model_probabilities(model, row)
        y = int(decision(full[None].log())[0])  # the full row's decision
        by_score = sorted(range(n), key=lambda t: (-float(scores[b, t]), t))
        row_values, previous = [], None
        for f in fractions:
            exact = Fraction(str(f)) * n
            if variant == "eraser" and rounding == "floor":
                if math.floor(exact) == 0:  # the empty rationale: not counted
                    row_values.append(None)
                    continue
                rationale = set(by_score[: math.floor(exact)])
            elif variant == "eraser":
                rationale = set(by_score[: math.ceil(exact)])
            else:  # ferret: floor(f L) tokens by score, the positive ones; repeats and k = 0 skipped
                k = math.floor(exact)
                rationale = {t for t in by_score[:k] if float(scores[b, t]) > 0} if k else None
                rationale = rationale or None  # an empty rationale does not count (ferret 0.4.2)
                if rationale is None or rationale == previous:
                    row_values.append(None)
                    continue
                previous = rationale
            kept = [t for t in range(n) if (t in rationale) == keep_rationale]
            if mask_token is None:
                middle = [real[t] for t in kept]
            else:
                middle = [real[t] if t in kept else mask_token for t in range(n)]
            with torch.no_grad():
                p = model_probabilities(model, row[:lead] + middle + row[len(row) - trail :])
            row_values.append(float(full[y] - p[y]))
        out.append(row_values)
    return out


def model_probabilities(model, ids):
    tokens = torch.tensor([ids])
    hidden = model.encode(model.embed(tokens), torch.tensor([len(ids)]))
    attention = model.attend(hidden, torch.tensor([len(ids)]))
    return output_distribution(model.decoder(torch.einsum("bt,bth->bh", attention, hidden)))[0]


def check(result, expected, atol):
    for b, row in enumerate(expected):
        for j, want in enumerate(row):
            got = float(result.values[b, j])
            if want is None:
                assert math.isnan(got) and int(result.k[b, j]) == -1, (b, j)
            else:
                assert got == pytest.approx(want, abs=atol), (b, j)
        counted = [v for v in row if v is not None]
        aopc = float(result.aopc[b])
        assert math.isnan(aopc) if not counted else aopc == pytest.approx(sum(counted) / len(counted), abs=atol), b


@pytest.mark.parametrize("padded", [False, True], ids=["exact-length calls", "padded calls"])
@pytest.mark.parametrize("metric", ["comprehensiveness", "sufficiency"])
@pytest.mark.parametrize("variant", ["eraser", "ferret"])
@pytest.mark.parametrize("mode", ["delete", "mask"])
@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("classes", [1, 3])
def test_against_the_plain_loop(metric, variant, mode, dtype, classes, padded, monkeypatch):
    # padded: the GPU's few large padded calls (attnmetrics.loo.padded_calls), here on the CPU
    monkeypatch.setattr(attnmetrics.loo, "padded_calls", lambda device: padded)
    model = real_model(classes, dtype).eval()
    tokens, lengths = ragged(rows=12, width=14, seed=classes)
    lengths[2] = 2  # no real token
    lengths[3] = 4  # shorter than 1 / fraction for the small fractions
    g = torch.Generator().manual_seed(7)
    scores = torch.randn(12, 12, generator=g, dtype=dtype)
    scores[4] = scores[4].round()  # ties
    scores[5, :3] = 0.5
    if variant == "ferret":
        scores[6] = -scores[6].abs()  # no positive score at all
    fractions = ERASER_FRACTIONS if variant == "eraser" else FERRET_FRACTIONS
    mask = MASK if mode == "mask" else None
    fn = comprehensiveness if metric == "comprehensiveness" else sufficiency
    got = fn(model, tokens, lengths, scores, fractions, variant=variant, mode=mode, mask_token=mask)
    want = reference(model, tokens, lengths, scores, fractions, metric == "sufficiency", variant, mask)
    check(got, want, 1e-5 if dtype == torch.float32 else 1e-10)
    assert got.values.dtype == dtype and got.predicted[2] == -1


@pytest.mark.parametrize("metric", ["comprehensiveness", "sufficiency"])
@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_floor_rounding_against_the_plain_loop(metric, dtype):
    # ERASER's code's k = floor(f L): with L < 20 the 1 % and 5 % fractions hold no token and do not count
    model = real_model(2, dtype).eval()
    tokens, lengths = ragged(rows=12, width=14, seed=5)
    lengths[2] = 2  # no real token
    lengths[3] = 3  # one real token: floor(0.5) = 0, no fraction counts
    scores = torch.randn(12, 12, generator=torch.Generator().manual_seed(8), dtype=dtype)
    scores[4] = scores[4].round()  # ties
    fn = comprehensiveness if metric == "comprehensiveness" else sufficiency
    got = fn(model, tokens, lengths, scores, rounding="floor")
    want = reference(model, tokens, lengths, scores, ERASER_FRACTIONS, metric == "sufficiency", rounding="floor")
    check(got, want, 1e-5 if dtype == torch.float32 else 1e-10)
    real = lengths - 2
    assert (got.k[:, :2] == -1).all()  # every row here is shorter than 20 real tokens
    assert got.k[3].tolist() == [-1] * 5 and got.aopc[3].isnan() and got.predicted[3] >= 0
    floor = torch.floor(torch.tensor(ERASER_FRACTIONS, dtype=F64) * real[:, None]).long()
    assert torch.equal(got.k, torch.where(floor > 0, floor, -1))
    ceil = fn(model, tokens, lengths, scores)  # the default stays ceil: every fraction counts
    assert (ceil.k[real > 0] >= 1).all() and (ceil.k[real > 0] >= got.k[real > 0]).all()


def test_a_small_budget_and_non_contiguous_inputs_give_the_same_values():
    model = real_model(2, F64).eval()
    tokens, lengths = ragged(rows=20, width=16, seed=3)
    scores = torch.randn(14, 20, dtype=F64).T  # non-contiguous
    whole = comprehensiveness(model, tokens, lengths, scores)
    small = comprehensiveness(model, tokens.T.contiguous().T, lengths, scores, memory_budget=2_000)
    torch.testing.assert_close(whole.values, small.values, equal_nan=True, rtol=0, atol=1e-12)


def test_scores_past_the_rows_never_count():
    model = real_model(2, F64).eval()
    tokens, lengths = ragged(rows=6, width=10, seed=4)
    scores = torch.randn(6, 8, dtype=F64)
    padded = torch.cat([scores, torch.full((6, 4), 1e9, dtype=F64)], 1)
    real = lengths - 2
    padded[torch.arange(12) >= real[:, None]] = torch.nan  # NaN on padding is never read
    a, b = sufficiency(model, tokens, lengths, scores), sufficiency(model, tokens, lengths, padded)
    torch.testing.assert_close(a.values, b.values, equal_nan=True)


@settings(max_examples=60, deadline=None)
@given(
    length=st.integers(0, 40),
    fractions=st.lists(st.sampled_from([0.01, 0.05, 0.1, 0.2, 0.25, 0.3, 0.5, 0.7, 1.0]), min_size=1, max_size=6),
    positive=st.integers(0, 40),
)
def test_rationale_sizes_follow_the_definitions(length, fractions, positive):
    scores = torch.tensor([[1.0 if t < positive else -1.0 for t in range(max(length, 1))]])
    real = torch.tensor([length])
    eraser = rationale_sizes(scores, real, fractions, "eraser")[0].tolist()
    floor = rationale_sizes(scores, real, fractions, "eraser", rounding="floor")[0].tolist()
    ferret = rationale_sizes(scores, real, fractions, "ferret")[0].tolist()
    previous = None
    for j, f in enumerate(fractions):
        exact = Fraction(str(f)) * length
        assert eraser[j] == (math.ceil(exact) if length else -1)
        assert floor[j] == (math.floor(exact) if math.floor(exact) else -1)  # k = 0 does not count
        k = math.floor(exact)
        size = min(k, positive, length) if k and positive else None
        assert ferret[j] == (-1 if size is None or size == previous else size)
        previous = previous if size is None else size


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(scores=torch.zeros(3, 2)), r"scores must have shape \[B, S\] = \[3, >= 3\]"),
        (dict(scores=torch.zeros(3, 9, dtype=torch.int64)), "scores must be a floating-point tensor"),
        (dict(scores=torch.full((3, 9), torch.nan)), r"scores must be finite on the real tokens, got nan at row 0"),
        (dict(fractions=(0.0, 0.5)), r"fractions must be a non-empty sequence of numbers in \(0, 1\]"),
        (dict(fractions=(1.5,)), r"fractions must be a non-empty sequence"),
        (dict(fractions=()), r"fractions must be a non-empty sequence"),
        (dict(fractions="0.5"), r"fractions must be a sequence of numbers in \(0, 1\], got '0.5'"),
        (dict(fractions=[True]), r"fractions must be a sequence of numbers in \(0, 1\], got \[True\]"),
        (dict(fractions=["a"]), r"fractions must be a sequence of numbers"),
        (dict(fractions=0.5), r"fractions must be a sequence of numbers in \(0, 1\], got 0.5"),
        (dict(variant="captum"), r"variant must be one of \('eraser', 'ferret'\), got 'captum'"),
        (dict(rounding="round"), r"rounding must be one of \('ceil', 'floor', 'decompx'\), got 'round'"),
        (dict(rounding=None), r"rounding must be one of \('ceil', 'floor', 'decompx'\), got None"),
        (dict(rounding="floor", variant="ferret"), r"rounding applies to variant='eraser' only"),
        (dict(mode="zero"), r"mode must be one of \('delete', 'mask'\)"),
        (dict(mode="mask"), r"mode='mask' needs mask_token"),
    ],
)
def test_bad_arguments_are_named(kwargs, match):
    model = real_model(2)
    tokens = torch.tensor([[2, 7, 8, 9, 3], [2, 11, 12, 3, 0], [2, 3, 0, 0, 0]])
    args = dict(scores=torch.zeros(3, 3))
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        comprehensiveness(model, tokens, torch.tensor([5, 4, 2]), **args)


# ---- the rationale_batch kernel (kernels/loo.h) against the definition, row by row --------


def python_rationale_batch(tokens, lengths, rank, sizes, lead, trail, keep_rationale, mask_token, pad):
    """Each counted (row, fraction), row-major: the real tokens ranked below the size are the
    rationale, kept alone or removed; removed ones deleted or replaced by mask_token."""
    seqs, lens, rows, fractions = [], [], [], []
    for b in range(tokens.shape[0]):
        row = tokens[b, : int(lengths[b])].tolist()
        for f in range(sizes.shape[1]):
            k = int(sizes[b, f])
            if k < 0:
                continue
            seq = []
            for t, token in enumerate(row):
                removed = lead <= t < len(row) - trail and (int(rank[b, t - lead]) < k) != keep_rationale
                if not removed:
                    seq.append(token)
                elif mask_token is not None:
                    seq.append(mask_token)
            seqs.append(seq + [pad] * (tokens.shape[1] - len(seq)))
            lens.append(len(seq))
            rows.append(b)
            fractions.append(f)
    out = torch.tensor(seqs, dtype=torch.int64).reshape(len(seqs), tokens.shape[1])
    return out, *(torch.tensor(x, dtype=torch.int64) for x in (lens, rows, fractions))


@settings(max_examples=60, deadline=None)
@given(
    data=st.data(),
    lead=st.integers(0, 2),
    trail=st.integers(0, 2),
    keep_rationale=st.booleans(),
    mask_token=st.sampled_from([None, 99]),
)
def test_rationale_kernel_matches_the_definition(data, lead, trail, keep_rationale, mask_token):
    """Ragged rows (rows without real tokens, L = 1 real token, full width), ranks that are
    permutations or arbitrary (ties, out of range: only compared), sizes -1 .. beyond L."""
    from attnmetrics._ops import ops

    rows = data.draw(st.integers(0, 6))
    width = data.draw(st.integers(lead + trail, lead + trail + 7))
    lengths = torch.tensor(data.draw(st.lists(st.integers(lead + trail, width), min_size=rows, max_size=rows)))
    lengths = lengths.to(torch.int64).reshape(rows)
    tokens = torch.tensor(data.draw(st.lists(st.integers(1, 50), min_size=rows * width, max_size=rows * width)))
    tokens = tokens.to(torch.int64).reshape(rows, width)
    span = width - lead - trail + data.draw(st.integers(0, 2))
    if data.draw(st.booleans()):
        rank = torch.stack([torch.randperm(span) for _ in range(rows)]) if rows else torch.zeros(0, span)
    else:
        rank = torch.tensor(data.draw(st.lists(st.integers(-2, span + 2), min_size=rows * span, max_size=rows * span)))
    rank = rank.to(torch.int64).reshape(rows, span)
    fractions = data.draw(st.integers(0, 4))
    sizes = torch.tensor(
        data.draw(st.lists(st.integers(-1, width + 1), min_size=rows * fractions, max_size=rows * fractions))
    )
    sizes = sizes.to(torch.int64).reshape(rows, fractions)
    got = ops.rationale_batch(tokens, lengths, rank, sizes, lead, trail, keep_rationale, mask_token, -1)
    want = python_rationale_batch(tokens, lengths, rank, sizes, lead, trail, keep_rationale, mask_token, -1)
    for g, w, name in zip(got, want, ("sequences", "lengths", "rows", "fractions")):
        assert g.shape == w.shape and torch.equal(g, w), name


@pytest.mark.parametrize("mask_token", [None, 7])
@pytest.mark.parametrize("keep_rationale", [False, True])
def test_rationale_kernel_opcheck(mask_token, keep_rationale):
    from attnmetrics._ops import ops

    tokens, lengths = ragged(rows=6, width=8, seed=3)
    rank = torch.stack([torch.randperm(8) for _ in range(6)])
    sizes = torch.tensor([[1, 2, -1]] * 6)
    torch.library.opcheck(
        ops.rationale_batch.default, (tokens, lengths, rank, sizes, 1, 1, keep_rationale, mask_token, 0)
    )


def test_rationale_kernel_rejects_bad_input():
    from attnmetrics._ops import ops

    tokens, lengths = ragged(rows=4, width=6, seed=6)
    rank = torch.zeros(4, 4, dtype=torch.int64)
    sizes = torch.zeros(4, 2, dtype=torch.int64)
    cases = [
        ((tokens.int(), lengths, rank, sizes), "tokens must be int64"),
        ((tokens, lengths, rank.int(), sizes), "rank must be int64"),
        ((tokens, lengths, rank, sizes.double()), "sizes must be int64"),
        (
            (tokens, lengths, rank[:, :3].contiguous(), sizes),
            r"rank must have shape \[B, R\] = \[4, >= T - lead - trail = 4\]",
        ),
        ((tokens, lengths, rank[:3], sizes), r"rank must have shape \[B, R\]"),
        ((tokens, lengths, rank, sizes[0]), r"sizes must have shape \[B, F\] = \[4, F\]"),
        ((tokens, lengths, rank.t().contiguous().t(), sizes), "rank must be contiguous"),
        ((tokens, lengths, rank, sizes.t()), "sizes must be contiguous"),
        ((tokens, torch.full((4,), 7), rank, sizes), r"lengths\[0\] = 7 is outside"),
    ]
    for args, match in cases:
        with pytest.raises(RuntimeError, match=match):
            ops.rationale_batch(*args, 1, 1, False, None, 0)


# ---- shared full rows and repeated rationale sizes ------------------------------------------


def _rows_run(model):
    """Counts the rows every model call runs (embed is called once per call)."""
    seen = []
    original = model.embed

    def embed(tokens):
        seen.append(tokens.shape[0])
        return original(tokens)

    model.embed = embed
    return seen


@pytest.mark.parametrize("mode", ["delete", "mask"])
def test_full_rows_shared_give_the_same_values_and_run_the_rows_once(mode):
    from attnmetrics import full_rows

    model = real_model(3, F64).eval()
    tokens, lengths = ragged(rows=14, width=13, seed=5)
    lengths[2] = 2  # no real token
    mask = MASK if mode == "mask" else None
    g = torch.Generator().manual_seed(2)
    orderings = [torch.randn(14, 11, generator=g, dtype=F64) for _ in range(3)]
    alone = [
        fn(model, tokens, lengths, s, mode=mode, mask_token=mask)
        for s in orderings
        for fn in (comprehensiveness, sufficiency)
    ]
    seen = _rows_run(model)
    full = full_rows(model, tokens, lengths)
    assert sum(seen) == 13  # every row with a real token, once
    shared = [
        fn(model, tokens, lengths, s, mode=mode, mask_token=mask, full_rows=full)
        for s in orderings
        for fn in (comprehensiveness, sufficiency)
    ]
    for a, b in zip(alone, shared):
        for x, y in zip(a, b):
            torch.testing.assert_close(x, y, rtol=0, atol=0, equal_nan=True)
    with pytest.raises(ValueError, match=r"full_rows.probability must be \[5\]"):
        comprehensiveness(model, tokens[:5], lengths[:5], orderings[0][:5], full_rows=full)
    with pytest.raises(TypeError, match="full_rows must be an attnmetrics.eraser.FullRows"):
        comprehensiveness(model, tokens, lengths, orderings[0], full_rows=(full.probability, full.predicted))


def test_a_rationale_size_repeated_across_fractions_runs_once():
    """Short rows give several fractions the same k (e.g. 1 % and 5 % of 8 tokens: k = 1): the
    perturbed row is the same, so it runs once and the value is copied; the values stay the
    plain loop's."""
    model = real_model(2, F64).eval()
    tokens, lengths = ragged(rows=6, width=10, seed=8)
    scores = torch.randn(6, 8, dtype=F64)
    sizes = rationale_sizes(scores, lengths - 2, ERASER_FRACTIONS)
    distinct = sum(len({int(v) for v in row if v >= 0}) for row in sizes)
    assert distinct < int((sizes >= 0).sum())  # the case arises
    seen = _rows_run(model)
    from attnmetrics import full_rows

    full = full_rows(model, tokens, lengths)
    before = sum(seen)
    got = comprehensiveness(model, tokens, lengths, scores, full_rows=full)
    assert sum(seen) - before == distinct  # one perturbed row per distinct size of each row
    check(got, reference(model, tokens, lengths, scores, ERASER_FRACTIONS, False), 1e-10)


def test_deleting_a_whole_row_without_special_tokens_is_named():
    """GPT-2 has no special tokens: comprehensiveness of a one-token row would delete everything
    (transformers then fails on an empty sequence); mask mode and sufficiency still run."""
    pytest.importorskip("transformers", reason="transformers is optional")
    from tests.models import test_hf

    model = test_hf.tiny("gpt2")
    tokens, lengths = test_hf.ragged("gpt2", 9, 11, 4)  # row 1: one token
    scores = torch.randn(9, 11, generator=torch.Generator().manual_seed(0))
    match = r"would delete every token of row 1 \(fraction 0.01: k = 1 of 1\), leaving an empty sequence"
    with pytest.raises(ValueError, match=match):
        comprehensiveness(model, tokens, lengths, scores)
    assert comprehensiveness(model, tokens, lengths, scores, mode="mask", mask_token=3).values.isfinite().all()
    assert sufficiency(model, tokens, lengths, scores).values.isfinite().all()


def _distinct_edits(tokens, lengths, orderings, fractions, lead, trail):
    """The distinct (row, changed text positions) of every ordering's and metric's perturbed rows
    (ERASER's ceil rounding, ties to the lower index), built from the definition."""
    seen = set()
    for scores in orderings:
        for b in range(tokens.shape[0]):
            n = int(lengths[b]) - lead - trail
            if n <= 0:
                continue
            by_score = sorted(range(n), key=lambda t: (-float(scores[b, t]), t))
            for f in fractions:
                top = frozenset(by_score[: min(n, math.ceil(Fraction(str(f)) * n))])
                seen.add((b, top))  # comprehensiveness changes the rationale
                seen.add((b, frozenset(range(n)) - top))  # sufficiency everything else
    return len(seen)


@pytest.mark.parametrize("mode", ["delete", "mask"])
def test_both_metrics_of_several_orderings_at_once_equal_their_own_calls(mode):
    """comprehensiveness_and_sufficiency on a model without subset_logits (a BiLSTM) and on a causal
    decoder through a prompt (its rows prepared once for every ordering and metric, each distinct
    perturbed row run once, counted): the values of the separate calls (float64, 1e-12); an
    ordering given twice and ties included."""
    from attnmetrics import comprehensiveness_and_sufficiency
    from tests.models.test_causal_edits import prompted
    from tests.models.test_prompted import rows as prompted_rows

    mask = MASK if mode == "mask" else None
    lstm = real_model(3, F64).eval()
    lstm_rows = ragged(rows=9, width=11, seed=3)
    decoder = prompted(F64)
    decoder_rows = prompted_rows(decoder, lengths=(5, 2, 3, 7, 7, 2))  # one-token texts: test_prompted.py
    for model, (tokens, lengths) in ((lstm, lstm_rows), (decoder, decoder_rows)):
        g = torch.Generator().manual_seed(4)
        width = tokens.shape[1]
        first = torch.randn(len(lengths), width, generator=g, dtype=F64)
        tied = torch.randint(0, 2, (len(lengths), width), generator=g).to(F64)
        orderings = {"a": first, "tied": tied, "a again": first.clone()}
        prepared = []
        fed = []
        original = getattr(model, "subset_logits", None)
        if original is not None:

            def counting(embedded, lengths_, mask_token, original=original):
                edits = original(embedded, lengths_, mask_token)
                prepared.append(len(lengths_))

                def run(rows, changed):
                    fed.append(len(rows))
                    return edits(rows, changed)

                run.position_bytes, run.cost = edits.position_bytes, edits.cost
                return run

            model.subset_logits = counting
        together = comprehensiveness_and_sufficiency(model, tokens, lengths, orderings, mode=mode, mask_token=mask)
        if original is not None:
            assert sum(prepared) == int((lengths > 0).sum())  # every row prepared once, for all six requests
            assert sum(fed) == _distinct_edits(tokens, lengths, orderings.values(), ERASER_FRACTIONS, 0, 0)
            del model.subset_logits
        for name, scores in orderings.items():
            for metric, fn in (("comprehensiveness", comprehensiveness), ("sufficiency", sufficiency)):
                alone = fn(model, tokens, lengths, scores, mode=mode, mask_token=mask)
                for x, y in zip(together[name][metric], alone):
                    torch.testing.assert_close(x, y, rtol=0, atol=1e-12, equal_nan=True)
    with pytest.raises(ValueError, match="orderings must be a non-empty mapping"):
        comprehensiveness_and_sufficiency(lstm, *lstm_rows, {})
