"""Causal prefix reuse for many-token edits (models/causal_subsets.py): a decoder's (Llama with
grouped-query attention, Qwen2 with q/k/v biases, Mistral with a sliding window shorter than its
rows, GPT-2) and a prompted model's sets of deleted or masked tokens equal the edited inputs run
whole, and ERASER's comprehensiveness and sufficiency with the capability equal them without it."""

from __future__ import annotations

import math

import pytest
import torch

transformers = pytest.importorskip("transformers")

import attnmetrics  # noqa: E402
from attnmetrics.eraser import ERASER_FRACTIONS, FERRET_FRACTIONS  # noqa: E402
from attnmetrics.models.causal_edits import EditCounts  # noqa: E402
from attnmetrics.models.causal_subsets import subset_counts  # noqa: E402
from attnmetrics.protocol import capability, token_mask  # noqa: E402
from tests.models.test_causal_edits import (  # noqa: E402
    ATOL,
    F32,
    F64,
    FAMILIES,
    MASK,
    Plain,
    decoder,
    prompted,
    ragged,
    whole_logits,
)
from tests.models.test_hf import tiny  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

MODELS = [*FAMILIES, "prompted"]


def model_of(name: str, dtype):
    return prompted(dtype) if name == "prompted" else decoder(name, dtype)


def subsets(lengths, delete_all: bool):
    """Edits of every row, shuffled: the first token, the last one, the first and last, a random set
    of each size 1..L (sizes L only where ``delete_all``: a whole text deleted), nothing."""
    g = torch.Generator().manual_seed(2)
    rows, sets = [], []
    for r, n in enumerate(lengths.tolist()):
        row_sets = [[0], [n - 1], sorted({0, n - 1}), []]
        for size in range(1, n + (1 if delete_all else 0)):
            row_sets.append(sorted(torch.randperm(n, generator=g)[:size].tolist()))
        row_sets = [s for s in row_sets if delete_all or len(s) < n]
        rows += [r] * len(row_sets)
        sets += row_sets
    order = torch.randperm(len(rows), generator=g).tolist()
    return [rows[i] for i in order], [sets[i] for i in order]


def as_mask(sets, width: int) -> torch.Tensor:
    changed = torch.zeros(len(sets), width, dtype=torch.bool)
    for i, s in enumerate(sets):
        changed[i, s] = True
    return changed


def edited(row: list[int], changed: list[int], masked: bool) -> list[int]:
    if masked:
        return [MASK if t in changed else x for t, x in enumerate(row)]
    return [x for t, x in enumerate(row) if t not in changed]


@pytest.mark.parametrize("masked", [False, True], ids=["delete", "mask"])
@pytest.mark.parametrize("dtype", [F64, F32], ids=["float64", "float32"])
@pytest.mark.parametrize("name", MODELS)
def test_a_decoders_subset_edits_equal_the_edited_inputs_run_whole(name, dtype, masked):
    model = model_of(name, dtype)
    is_prompted = name == "prompted"
    tokens, lengths = ragged(low=1)  # a one-token text
    # a decoder classifier's deletion of every token leaves nothing to read out; a prompt's leaves its template
    rows, sets = subsets(lengths, delete_all=masked or is_prompted)
    changed = as_mask(sets, tokens.shape[1])
    prefix, suffix = (len(model.prefix_ids), len(model.suffix_ids)) if is_prompted else (0, 0)
    per_row = [(int(n), [s for r, s in zip(rows, sets) if r == row]) for row, n in enumerate(lengths)]
    counts = subset_counts(per_row, prefix, suffix, "mask" if masked else "delete")
    with torch.no_grad():
        prepared = model.subset_logits(model.embed(tokens), lengths, MASK if masked else None)
        # counted before anything runs: the recomputed positions and the rows' own forward (a prompt's
        # template prefix not among them: it ran once, with the model)
        own = counts.rows - len(lengths) * prefix
        assert prepared.cost(torch.tensor(rows), changed) == (counts.recomputed + own, counts.full)
        got = torch.cat([prepared(torch.tensor(rows[c : c + 7]), changed[c : c + 7]) for c in range(0, len(rows), 7)])
        torch.testing.assert_close(prepared.unedited_logits(), model(tokens, lengths)[0], rtol=0, atol=ATOL[dtype])
        for i, (r, s) in enumerate(zip(rows, sets)):
            seq = edited(tokens[r, : lengths[r]].tolist(), s, masked)
            if is_prompted:
                want = whole_logits(model, seq)
            else:
                want = model(torch.tensor([seq]), torch.tensor([len(seq)]))[0][0]
            torch.testing.assert_close(got[i], want, rtol=0, atol=ATOL[dtype], msg=lambda m: f"{r} {s}: {m}")
    assert prepared.recomputed == counts.recomputed < counts.full
    assert prepared.cost(torch.tensor(rows), changed) == (counts.recomputed, counts.full)  # the rows ran
    assert isinstance(prepared.position_bytes, int) and prepared.position_bytes > 0


@pytest.mark.parametrize("mode", ["delete", "mask"])
@pytest.mark.parametrize("dtype", [F64, F32], ids=["float64", "float32"])
@pytest.mark.parametrize("name", MODELS)
def test_eraser_with_the_reuse_equals_it_without(name, dtype, mode, monkeypatch):
    model = model_of(name, dtype)
    assert capability(model, "subset_logits") and capability(Plain(model), "subset_logits") is None
    kw = {"mode": mode, "mask_token": MASK} if mode == "mask" else {}
    scores = torch.randn(7, 10, generator=torch.Generator().manual_seed(3), dtype=dtype)
    # comprehensiveness' deletion may not delete a whole text (lead = trail = 0): texts of 2 or more,
    # at most half of them; otherwise a one-token text and every fraction up to all of it
    for metric, low, fractions in (
        (attnmetrics.comprehensiveness, 2 if mode == "delete" else 1, ERASER_FRACTIONS if mode == "delete" else FERRET_FRACTIONS),
        (attnmetrics.sufficiency, 1, FERRET_FRACTIONS),
    ):  # fmt: skip
        tokens, lengths = ragged(rows=7, width=10, low=low)
        want = metric(Plain(model), tokens, lengths, scores, fractions, **kw)
        assert torch.isfinite(want.values[:, 0]).all()
        for share in (1.0, math.inf):  # the reuse where it saves; everywhere
            monkeypatch.setattr(attnmetrics.eraser, "SUBSET_REUSE_SHARE", share)
            got = metric(model, tokens, lengths, scores, fractions, **kw)
            torch.testing.assert_close(got.values, want.values, rtol=0, atol=ATOL[dtype], equal_nan=True)
            torch.testing.assert_close(got.aopc, want.aopc, rtol=0, atol=ATOL[dtype])


def test_eraser_splits_the_reuses_calls_to_a_small_budget(monkeypatch):
    model = decoder("llama")
    tokens, lengths = ragged(rows=7, width=10, low=2)
    scores = torch.randn(7, 10, generator=torch.Generator().manual_seed(3), dtype=F64)
    want = attnmetrics.sufficiency(Plain(model), tokens, lengths, scores, FERRET_FRACTIONS)
    calls, blocks = [], []
    prepare = type(model)._prefix_subsets

    def spy(self, embedded, lengths, mask_token):
        blocks.append(len(lengths))
        edits = prepare(self, embedded, lengths, mask_token)

        def counted(rows, changed):
            calls.append(len(rows))
            return edits(rows, changed)

        counted.position_bytes, counted.cost = edits.position_bytes, edits.cost
        return counted

    monkeypatch.setattr(type(model), "_prefix_subsets", spy)
    monkeypatch.setattr(attnmetrics.eraser, "SUBSET_REUSE_SHARE", math.inf)  # every block reuses
    budget = 2 * 10 * prepare(model, model.embed(tokens), lengths, None).position_bytes
    got = attnmetrics.sufficiency(model, tokens, lengths, scores, FERRET_FRACTIONS, memory_budget=budget)
    torch.testing.assert_close(got.values, want.values, rtol=0, atol=1e-10, equal_nan=True)
    real = (lengths - model.lead - model.trail).tolist()
    # a repeated k runs once; keeping every token (k = L: the row itself, a drop of 0) does not run
    run = sum(len(set(row) - {-1, n}) for row, n in zip(got.k.tolist(), real))
    assert run < sum(len(set(row) - {-1}) for row in got.k.tolist())  # some row keeps all its tokens
    assert sum(blocks) == 7 and len(blocks) > 1 and max(calls) <= 2 and sum(calls) == run


@pytest.mark.parametrize("metric", ["sufficiency", "comprehensiveness"])
def test_eraser_reuses_a_block_where_its_cost_is_below_a_full_recomputations(metric):
    """On a decoder classifier (no template before the text), sufficiency with random scores changes
    tokens near the text's start: the rows' own forward costs more than the reuse saves, and the
    blocks run whole; comprehensiveness of the last tokens (scores rising along the text) recomputes
    one position per perturbed row, and the blocks reuse."""
    model = decoder("llama")
    tokens, lengths = ragged(rows=7, width=10, low=2)
    if metric == "sufficiency":
        scores = torch.randn(7, 10, generator=torch.Generator().manual_seed(3), dtype=F64)
    else:
        scores = torch.arange(10, dtype=F64).expand(7, 10)
    blocks = []

    def spy(embedded, lengths, mask_token):
        edits = model.subset_logits(embedded, lengths, mask_token)
        block = {"calls": 0}

        def counted(rows, changed):
            block["calls"] += 1
            return edits(rows, changed)

        def cost(rows, changed):
            block["cost"] = edits.cost(rows, changed)
            return block["cost"]

        blocks.append(block)
        counted.position_bytes, counted.cost = edits.position_bytes, cost
        return counted

    spied = Plain(model)
    spied.subset_logits = spy
    want = getattr(attnmetrics, metric)(Plain(model), tokens, lengths, scores)
    got = getattr(attnmetrics, metric)(spied, tokens, lengths, scores)
    torch.testing.assert_close(got.values, want.values, rtol=0, atol=1e-10, equal_nan=True)
    assert blocks and all((b["calls"] > 0) == (b["cost"][0] < b["cost"][1]) for b in blocks)
    assert all((b["calls"] > 0) == (metric == "comprehensiveness") for b in blocks), blocks


def test_bad_changed_masks_are_named_and_encoders_have_no_subset_capability():
    assert capability(tiny("bert"), "subset_logits") is None
    model = decoder("llama")
    tokens, lengths = ragged()
    with torch.no_grad():
        prepared = model.subset_logits(model.embed(tokens), lengths, None)
        rows = torch.tensor([0, 1])
        with pytest.raises(ValueError, match="changed must be an \\[N, T\\] bool"):
            prepared(rows, torch.zeros(2, 9))
        with pytest.raises(ValueError, match="changed must be \\[2, T\\]"):
            prepared(rows, torch.zeros(3, 9, dtype=torch.bool))
        stray = torch.zeros(2, 9, dtype=torch.bool)
        stray[1, int(lengths[1])] = True  # row 1 is one token long
        with pytest.raises(ValueError, match="changed marks text position 1 of edit 1"):
            prepared(rows, stray)
        with pytest.raises(ValueError, match="changed deletes every position of edit 0"):
            prepared(rows, token_mask(lengths[rows], 9))
    with pytest.raises(ValueError, match="mask_token"):
        model.subset_logits(model.embed(tokens), lengths, 60)


def test_subset_counts_give_the_reuses_share_of_the_work():
    # a text of 4 between 2 and 1 template tokens (whole 7): deleting {1, 3} recomputes from position
    # 3 of the 5 left (2), {0} from 2 of 6 (4); masking {1, 3} from 3 of 7 (4); nothing: the last one
    assert subset_counts([(4, [[1, 3], [0], []])], 2, 1) == EditCounts(2 + 4 + 1, 5 + 6 + 7, 7)
    assert subset_counts([(4, [[3, 1]])], 2, 1, "mask") == EditCounts(4, 7, 7)
    # a decoder classifier deleting its last tokens recomputes its new last position
    assert subset_counts([(4, [[2, 3]])]) == EditCounts(1, 2, 4)
    # SmolLM2's chat template (41 + 6) around a text of 23: comprehensiveness of ERASER's fractions
    # (k = 1, 2, 3, 5, 12) deleting the first k tokens (the worst case: from the text's start on)
    counts = subset_counts([(23, [range(k) for k in (1, 2, 3, 5, 12)])], 41, 6)
    assert counts == EditCounts(sum(23 - k + 6 for k in (1, 2, 3, 5, 12)), sum(70 - k for k in (1, 2, 3, 5, 12)), 70)
    with pytest.raises(ValueError, match="mode"):
        subset_counts([(3, [[0]])], mode="swap")
    with pytest.raises(ValueError, match="outside a text of 3"):
        subset_counts([(3, [[3]])])
    with pytest.raises(ValueError, match="leaves nothing"):
        subset_counts([(2, [[0, 1]])])
