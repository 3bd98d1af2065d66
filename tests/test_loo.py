"""Leave-one-out importance (J&W 2019, sec. 4.1): the procedure and its kernel against
per-sequence and J&W-loop references, on the toy model and on the real BiLSTM classifier."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

import attnmetrics
from attnmetrics import leave_one_out
from attnmetrics.models.classifier import EncoderAttentionClassifier, ModelConfig
from attnmetrics.models.deletions import delete_positions
from attnmetrics.outputs import output_distribution
from attnmetrics.testing.reference import leave_one_out_jw, leave_one_out_reference, tvd_reference
from tests.toy import ProtocolOnly, ToyClassifier

F64 = torch.float64
MODES = ("delete", "mask")
MASK = 4  # a token id the random batches never contain (they draw 5 .. vocab - 1)


def test_imports_this_checkout():
    assert Path(attnmetrics.__file__).resolve().is_relative_to(Path(__file__).resolve().parents[1])


# ---- models and inputs --------------------------------------------------------------------


class Toy(ToyClassifier):
    """The toy model with a zero context when a row has no real token (as J&W's classifier
    does), so that deleting a row's only real token is a valid input."""

    def attend(self, hidden, lengths):
        return super().attend(hidden, lengths).nan_to_num(0.0)


def real_model(classes: int, dtype=torch.float32, seed: int = 0) -> EncoderAttentionClassifier:
    torch.manual_seed(seed)
    return EncoderAttentionClassifier(ModelConfig(vocab_size=50, embed_dim=8, hidden_size=6, num_classes=classes)).to(
        dtype
    )


def ragged(rows=10, width=12, vocab=30, seed=0, min_len=3, lead=1, trail=1):
    """Ragged batch: <SOS>=2 ... <EOS>=3 around random ids, padding 0; the first row is
    full width, the second has a single real token."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_len, width + 1, (rows,), generator=g)
    lengths[0] = width
    if rows > 1:
        lengths[1] = min(lead + trail + 1, width)
    tokens = torch.randint(5, vocab, (rows, width), generator=g)
    pos = torch.arange(width)
    tokens[:, :lead] = 2
    tokens[(pos >= (lengths - trail)[:, None]) & (pos < lengths[:, None])] = 3
    tokens[pos >= lengths[:, None]] = 0
    return tokens, lengths


def real_counts(lengths, model):
    return lengths - model.lead - model.trail


def assert_zero_past_real(out, lengths, model):
    mask = torch.arange(out.shape[1]) < real_counts(lengths, model)[:, None]
    assert (out[~mask] == 0).all()


# ---- parity with the references -------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("classes", [1, 3])
def test_toy_float64_matches_references(mode, classes):
    model = Toy(classes=classes, seed=classes)
    tokens, lengths = ragged(seed=classes)
    mask_token = MASK if mode == "mask" else None
    got = leave_one_out(model, tokens, lengths, mode=mode, mask_token=mask_token)
    want = leave_one_out_reference(model, tokens, lengths, mode, mask_token)
    assert got.shape == (tokens.shape[0], tokens.shape[1] - 1) and got.dtype == F64
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    if mode == "delete":
        torch.testing.assert_close(leave_one_out_jw(model, tokens, lengths), want, rtol=0, atol=1e-12)
        torch.testing.assert_close(leave_one_out_jw(model, tokens, lengths, batch_size=3), want, rtol=0, atol=1e-12)
    assert_zero_past_real(got, lengths, model)
    # a meaningful comparison: deletions change the output, by different amounts
    real = torch.arange(got.shape[1]) < real_counts(lengths, model)[:, None]
    assert (got[real] > 1e-6).float().mean() > 0.9 and got[real].std() > 1e-3


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("classes", [1, 3])
def test_real_classifier_float32_matches_references(mode, classes):
    model = real_model(classes)
    tokens, lengths = ragged(rows=8, width=11, vocab=50, seed=10 + classes)
    mask_token = MASK if mode == "mask" else None
    got = leave_one_out(model, tokens, lengths, mode=mode, mask_token=mask_token)
    want = leave_one_out_reference(model, tokens, lengths, mode, mask_token)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    if mode == "delete":
        torch.testing.assert_close(leave_one_out_jw(model, tokens, lengths), want, rtol=1e-4, atol=1e-6)
    assert_zero_past_real(got, lengths, model)
    real = torch.arange(got.shape[1]) < real_counts(lengths, model)[:, None]
    assert (got[real] > 0).all()


def test_real_classifier_float64():
    model = real_model(2, F64, seed=3)
    tokens, lengths = ragged(rows=6, width=10, vocab=50, seed=21)
    got = leave_one_out(model, tokens, lengths)
    assert got.dtype == F64
    torch.testing.assert_close(got, leave_one_out_reference(model, tokens, lengths), rtol=1e-10, atol=1e-13)


def test_toy_float32_close_to_float64():
    model64 = Toy(classes=3, seed=5)
    model32 = Toy(classes=3, seed=5).float()
    tokens, lengths = ragged(rows=12, seed=5)
    got = leave_one_out(model32, tokens, lengths)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), leave_one_out_reference(model64, tokens, lengths), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("classes", [1, 3])
def test_single_real_token_leaves_only_specials(classes):
    # J&W's classifier attends to nothing there: zero context, the output is the decoder's bias
    model = real_model(classes, seed=7)
    tokens = torch.tensor([[2, 9, 3, 0, 0], [2, 17, 3, 0, 0], [2, 5, 6, 7, 3]])
    lengths = torch.tensor([3, 3, 5])
    got = leave_one_out(model, tokens, lengths)
    with torch.no_grad():
        bias = output_distribution(model.decoder.bias[None])[0]
        for b in range(2):
            y = output_distribution(model(tokens[b : b + 1, :3], lengths[b : b + 1])[0])[0]
            torch.testing.assert_close(got[b, 0], tvd_reference(y, bias))
    assert (got[:2, 1:] == 0).all() and (got[2, :3] > 0).all()
    # masking keeps the length: the input differs from the deletion's
    masked = leave_one_out(model, tokens, lengths, mode="mask", mask_token=MASK)
    torch.testing.assert_close(masked, leave_one_out_reference(model, tokens, lengths, "mask", MASK))
    assert not torch.allclose(masked[:2, 0], got[:2, 0])


def test_model_that_cannot_take_an_empty_row_is_a_clear_error():
    # the plain toy's softmax over no position is NaN
    tokens, lengths = ragged(rows=3, seed=1)
    with pytest.raises(ValueError, match="NaN or infinite logits on the deletion batch"):
        leave_one_out(ToyClassifier(), tokens, lengths)
    leave_one_out(ToyClassifier(), tokens, lengths, mode="mask", mask_token=MASK)  # no empty row


def test_rows_without_real_tokens_are_zero():
    model = Toy(classes=2)
    tokens, lengths = ragged(rows=5, seed=2)
    lengths[3] = 2  # <SOS> <EOS> only
    got = leave_one_out(model, tokens, lengths)
    assert (got[3] == 0).all()
    torch.testing.assert_close(got, leave_one_out_reference(model, tokens, lengths), rtol=0, atol=1e-12)
    only = leave_one_out(model, tokens[:2], torch.tensor([2, 2]))
    assert only.shape == (2, tokens.shape[1] - 1) and only.dtype == F64 and (only == 0).all()


def test_masking_a_token_with_itself_changes_nothing():
    model = Toy(classes=3)
    tokens, lengths = ragged(rows=6, seed=4)
    tokens[:, 1:] = torch.where(tokens[:, 1:] >= 5, MASK, tokens[:, 1:])  # every real token is MASK
    got = leave_one_out(model, tokens, lengths, mode="mask", mask_token=MASK)
    # The same rows, in a model call of another shape than the originals': zero up to the
    # rounding of the probabilities (torch 2.14's float64 matmul differs by an ulp across batch
    # shapes, 2.8e-17 here; 2.13's is exact). Masking with any other token moves them by ~1e-2.
    assert got.abs().max() <= 4 * torch.finfo(F64).eps


# ---- batching, chunking, layouts -------------------------------------------------------------


class Spy(Toy):
    """Records the [N, W] shape of every encoder call, and its shortest and longest sequence."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.calls, self.shortest, self.longest = [], [], []

    def encode(self, embedded, lengths):
        self.calls.append(tuple(embedded.shape[:2]))
        self.shortest.append(int(lengths.min()))
        self.longest.append(int(lengths.max()))
        return super().encode(embedded, lengths)

    def clear(self):
        for x in (self.calls, self.shortest, self.longest):
            x.clear()


def test_any_memory_budget_same_answer():
    model = Spy(classes=3, seed=8)
    tokens, lengths = ragged(rows=14, width=13, seed=8)
    want = leave_one_out_reference(model, tokens, lengths)
    sequences = int(real_counts(lengths, model).sum())
    distinct = len(set(lengths.tolist()))
    for budget in (1, 3000, 30_000, 10**9):
        model.clear()
        got = leave_one_out(model, tokens, lengths, memory_budget=budget)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
        assert sum(n for n, _ in model.calls) == sequences + tokens.shape[0]  # each row, each deletion
        # the rows' calls (their sum of sequences is the batch) may hold several lengths, padded
        # within CPU_PADDING; every deletion call holds sequences of one length, unpadded
        n_row_calls, seen = 0, 0
        while seen < tokens.shape[0]:
            seen += model.calls[n_row_calls][0]
            n_row_calls += 1
        assert seen == tokens.shape[0]
        deletion_calls = list(zip(model.calls, model.shortest, model.longest))[n_row_calls:]
        assert all(w == lo == hi for (_, w), lo, hi in deletion_calls)
        assert [w for _, w in model.calls] == model.longest
        if budget == 1:  # one row, then one deletion, per call
            assert all(n == 1 for n, _ in model.calls)
        if budget == 10**9:  # the (shortest) probe row, the other rows in calls of few positions, then
            # one call per length of deletions
            assert len(deletion_calls) == distinct
            assert n_row_calls < 1 + len(set(sorted(lengths.tolist())[1:]))  # fewer than one a length


def test_memory_budget_bounds_each_call():
    # the estimate: sequences * width * (E + 8 H) * itemsize per call, within the budget
    model = Spy(classes=2, seed=9)
    tokens, lengths = ragged(rows=20, width=15, seed=9)
    per_position = (6 + 8 * 5) * 8
    budget = 40 * 14 * per_position
    leave_one_out(model, tokens, lengths, memory_budget=budget)
    assert all(n * w * per_position <= budget for n, w in model.calls)
    assert len(model.calls) > 3


class DeletionSpy(Toy):
    """The toy with ``deletion_logits`` (each deletion re-encoded, as the protocol defines it)
    declaring ``position_bytes``; records the [N, W - 1] shape of every deletion call."""

    def __init__(self, position_bytes, **kw):
        super().__init__(**kw)
        self.position_bytes, self.deletion_calls = position_bytes, []

    def deletion_logits(self, embedded, lengths):
        def logits(rows, positions):
            n = lengths[rows]
            self.deletion_calls.append((rows.shape[0], int(n.max()) - 1))
            hidden = self.encode(delete_positions(embedded, lengths, rows, positions), n - 1)
            return self.decoder(torch.einsum("nt,nth->nh", self.attend(hidden, n - 1), hidden))

        logits.position_bytes = self.position_bytes
        return logits


def test_deletion_calls_sized_by_position_bytes():
    tokens, lengths = ragged(rows=20, width=15, seed=9)
    want = leave_one_out_reference(Toy(classes=2, seed=9), tokens, lengths)
    budget, calls = 3000, []
    for position_bytes in (1, 20, 100, 10**6):
        model = DeletionSpy(position_bytes, classes=2, seed=9)
        got = leave_one_out(model, tokens, lengths, memory_budget=budget)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
        assert sum(n for n, _ in model.deletion_calls) == int(real_counts(lengths, model).sum())
        # each call holds what the budget allows by the model's own estimate, one deletion at least
        assert all(n * w * position_bytes <= budget or n == 1 for n, w in model.deletion_calls)
        calls.append(len(model.deletion_calls))
    assert calls == sorted(calls) and calls[0] < calls[-1]
    assert calls[-1] == int(real_counts(lengths, model).sum())  # one deletion per call
    for bad in (0, -5, 2.5, True, "1"):
        with pytest.raises(ValueError, match=r"position_bytes must be a positive int .* got " + re.escape(repr(bad))):
            leave_one_out(DeletionSpy(bad, classes=2), tokens, lengths)


class UneditedSpy(DeletionSpy):
    """DeletionSpy whose prepared callable also gives the rows' own logits (``unedited_logits``,
    from ``unedited``: the model on the block's rows, or a stand-in); records every encode's
    batch size."""

    def __init__(self, unedited=None, **kw):
        super().__init__(64, **kw)
        self.unedited, self.encoded = unedited, []

    def encode(self, embedded, lengths):
        self.encoded.append(embedded.shape[0])
        return super().encode(embedded, lengths)

    def deletion_logits(self, embedded, lengths):
        logits = super().deletion_logits(embedded, lengths)

        def own():
            hidden = self.encode(embedded, lengths)
            return self.decoder(torch.einsum("nt,nth->nh", self.attend(hidden, lengths), hidden))

        logits.unedited_logits = own if self.unedited is None else self.unedited(own)
        return logits


def test_original_outputs_from_unedited_logits():
    tokens, lengths = ragged(rows=20, width=15, seed=4)
    want = leave_one_out_reference(Toy(classes=3, seed=4), tokens, lengths)
    model = UneditedSpy(classes=3, seed=4)
    got = leave_one_out(model, tokens, lengths, memory_budget=3000)  # several blocks
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    # the rows are encoded once each (besides a one-row call that sizes the blocks), by own():
    # no separate forward over the rows
    deletions = int(real_counts(lengths, model).sum())
    assert sum(model.encoded) == 1 + 20 + deletions
    # and the originals are the callable's: a stand-in that scales them changes every TVD
    scaled = leave_one_out(UneditedSpy(lambda own: lambda: own() * 2, classes=3, seed=4), tokens, lengths)
    real = torch.arange(got.shape[1]) < real_counts(lengths, model)[:, None]
    assert (scaled[real] != got[real]).all()


@pytest.mark.parametrize(
    "unedited, match",
    [
        (lambda own: 3, r"unedited_logits must be a callable \(\) -> \[G, C\] .* got int"),
        (lambda own: lambda: own()[:-1], r"the input rows"),
        (lambda own: lambda: own()[:, :2], r"the input rows"),
        (lambda own: lambda: own() * float("nan"), r"finite.*the input rows|the input rows.*finite"),
    ],
)
def test_unedited_logits_checked(unedited, match):
    tokens, lengths = ragged(rows=6, width=9, seed=5)
    with pytest.raises(ValueError, match=match):
        leave_one_out(UneditedSpy(unedited, classes=3, seed=5), tokens, lengths)


def test_row_alone_equals_row_in_batch():
    model = real_model(3, seed=11)
    tokens, lengths = ragged(rows=9, width=12, vocab=50, seed=11)
    whole = leave_one_out(model, tokens, lengths)
    for b in range(9):
        n = int(lengths[b])
        alone = leave_one_out(model, tokens[b : b + 1, :n], lengths[b : b + 1])
        torch.testing.assert_close(alone[0], whole[b, : n - 1], rtol=1e-4, atol=1e-6)
    # order of the rows does not matter either
    perm = torch.randperm(9, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(leave_one_out(model, tokens[perm], lengths[perm]), whole[perm], rtol=1e-4, atol=1e-6)


def test_non_contiguous_and_extra_padding():
    model = Toy(classes=3, seed=12)
    tokens, lengths = ragged(rows=7, width=10, seed=12)
    want = leave_one_out(model, tokens, lengths)
    strided = tokens.t().contiguous().t()
    assert not strided.is_contiguous()
    torch.testing.assert_close(leave_one_out(model, strided, lengths), want, rtol=0, atol=1e-12)
    padded = torch.cat([tokens, torch.zeros(7, 5, dtype=torch.int64)], 1)
    wide = leave_one_out(model, padded, lengths.int())
    assert wide.shape == (7, 14)
    torch.testing.assert_close(wide[:, :9], want, rtol=0, atol=1e-12)
    assert (wide[:, 9:] == 0).all()


def test_restores_training_mode():
    model = real_model(1).train()
    leave_one_out(model, *ragged(rows=3, vocab=50))
    assert model.training
    model.eval()
    leave_one_out(model, *ragged(rows=3, vocab=50))
    assert not model.training


@settings(max_examples=15, deadline=None)
@given(
    rows=st.integers(1, 5),
    width=st.integers(2, 8),
    classes=st.integers(1, 3),
    mode=st.sampled_from(MODES),
    seed=st.integers(0, 10**6),
    budget=st.sampled_from([1, 500, 10**8]),
)
def test_properties(rows, width, classes, mode, seed, budget):
    model = Toy(classes=classes, seed=seed % 7)
    tokens, lengths = ragged(rows, width, seed=seed, min_len=2)
    mask_token = MASK if mode == "mask" else None
    got = leave_one_out(model, tokens, lengths, mode=mode, mask_token=mask_token, memory_budget=budget)
    assert got.shape == (rows, width - 1)
    assert ((got >= 0) & (got <= 1)).all()
    torch.testing.assert_close(
        got, leave_one_out_reference(model, tokens, lengths, mode, mask_token), rtol=0, atol=1e-12
    )


# ---- the kernel op ----------------------------------------------------------------------------


def _ops():
    from attnmetrics._ops import ops

    return ops


def python_deletion_batch(tokens, lengths, lead, trail, mask_token=None, pad=0):
    """The deletion batch built by hand: lists of ids per sequence, padded at the end."""
    seqs, lens, source = [], [], []
    for b in range(tokens.shape[0]):
        row = tokens[b, : int(lengths[b])].tolist()
        for t in range(lead, len(row) - trail):
            seq = row[:t] + ([] if mask_token is None else [mask_token]) + row[t + 1 :]
            seqs.append(seq)
            lens.append(len(seq))
            source.append(b)
    width = max(lens, default=0)
    out = torch.tensor([s + [pad] * (width - len(s)) for s in seqs], dtype=torch.int64).reshape(len(seqs), width)
    return out, torch.tensor(lens, dtype=torch.int64), torch.tensor(source, dtype=torch.int64)


@pytest.mark.parametrize("lead,trail", [(1, 1), (0, 0), (2, 1), (0, 2)])
@pytest.mark.parametrize("mask_token", [None, 7])
def test_kernel_batch_matches_python_construction(lead, trail, mask_token):
    g = torch.Generator().manual_seed(lead * 10 + trail)
    width = 9
    lengths = torch.randint(lead + trail, width + 1, (40,), generator=g)
    lengths[:3] = torch.tensor([lead + trail, lead + trail + 1, width])
    tokens = torch.randint(1, 100, (40, width), generator=g)
    got = _ops().leave_one_out_batch(tokens, lengths, lead, trail, mask_token, 0)
    want = python_deletion_batch(tokens, lengths, lead, trail, mask_token)
    for a, b in zip(got, want):
        assert a.shape == b.shape and torch.equal(a, b)
    # the width is the chunk's longest sequence, not T
    short = lengths.clamp(max=lead + trail + 3)
    seqs = _ops().leave_one_out_batch(tokens, short, lead, trail, mask_token, -1)[0]
    assert seqs.shape[1] == lead + trail + 3 - (mask_token is None)
    assert torch.equal(seqs, python_deletion_batch(tokens, short, lead, trail, mask_token, pad=-1)[0])


def test_kernel_empty_results():
    tokens = torch.ones(3, 4, dtype=torch.int64)
    seqs, lens, src = _ops().leave_one_out_batch(tokens, torch.full((3,), 2), 1, 1, None, 0)
    assert seqs.shape == (0, 0) and lens.shape == (0,) and src.shape == (0,)
    seqs, _, _ = _ops().leave_one_out_batch(tokens[:0], torch.zeros(0, dtype=torch.int64), 1, 1, None, 0)
    assert seqs.shape == (0, 0)


@pytest.mark.parametrize("mask_token", [None, 7])
def test_kernel_opcheck(mask_token):
    tokens, lengths = ragged(rows=6, width=8, seed=3)
    torch.library.opcheck(_ops().leave_one_out_batch.default, (tokens, lengths, 1, 1, mask_token, 0))
    torch.library.opcheck(_ops().leave_one_out_batch.default, (tokens, lengths, 0, 2, mask_token, 5))


def test_kernel_rejects_bad_input():
    tokens, lengths = ragged(rows=4, width=6, seed=6)
    op = _ops().leave_one_out_batch
    cases = [
        ((tokens.int(), lengths, 1, 1), "tokens must be int64"),
        ((tokens.double(), lengths, 1, 1), "tokens must be int64"),
        ((tokens[0], lengths, 1, 1), r"tokens must have shape \[B, T\]"),
        ((tokens.t(), lengths, 1, 1), "tokens must be contiguous"),
        ((tokens, lengths.int(), 1, 1), "lengths must be int64"),
        ((tokens, lengths[:3], 1, 1), r"lengths must have shape \[B\]"),
        ((tokens, lengths[None], 1, 1), r"lengths must have shape \[B\]"),
        ((tokens, torch.full((4,), 7), 1, 1), r"lengths\[0\] = 7 is outside"),
        ((tokens, torch.tensor([6, 6, 1, 6]), 1, 1), r"lengths\[2\] = 1 is outside"),
        ((tokens, lengths, -1, 1), "lead and trail"),
        ((tokens, lengths, 1, 2**62), "lead and trail"),
        ((tokens, lengths, 1, 1, -3), "mask_token must be >= 0"),
    ]
    for args, pattern in cases:
        with pytest.raises(RuntimeError, match=pattern):
            op(*args)
    with pytest.raises(RuntimeError, match="lengths must be contiguous"):
        op(tokens, torch.stack([lengths, lengths], 1)[:, 0], 1, 1)


# ---- errors of the public API ------------------------------------------------------------------


def test_clear_errors():
    model = Toy()
    tokens, lengths = ragged(rows=4, width=6, seed=13)

    def call(**kw):
        a = dict(model=model, tokens=tokens, lengths=lengths) | kw
        return leave_one_out(a.pop("model"), a.pop("tokens"), a.pop("lengths"), **a)

    cases = [
        (dict(tokens=tokens.int()), "tokens must be int64"),
        (dict(tokens=tokens.double()), "tokens must be int64"),
        (dict(tokens=tokens[0]), r"tokens must have shape \[B, T\]"),
        (dict(tokens=tokens[:0], lengths=lengths[:0]), r"empty batch"),
        (dict(tokens=tokens - 10), "non-negative ids"),
        (dict(lengths=lengths.float()), "lengths must be an integer tensor"),
        (dict(lengths=lengths[:3]), r"lengths must have shape \[B\] = \[4\]"),
        (dict(lengths=torch.tensor([6, 6, 7, 6])), r"lengths must lie in \[lead \+ trail, T\] = \[2, 6\].*max 7"),
        (dict(lengths=torch.tensor([6, 1, 6, 6])), r"lengths must lie in \[lead \+ trail, T\] = \[2, 6\].*min 1"),
        (dict(mode="remove"), "mode must be one of"),
        (dict(mode="mask"), "mode='mask' needs mask_token"),
        (dict(mode="mask", mask_token=-1), "mask_token must be a non-negative"),
        (dict(mode="mask", mask_token=2.5), "mask_token must be a non-negative"),
        (dict(mode="mask", mask_token=True), "mode='mask' needs mask_token"),
        (dict(mask_token=4), "mask_token is only used with mode='mask'"),
        (dict(memory_budget=0), "memory_budget must be a positive int"),
        (dict(memory_budget=1.5), "memory_budget must be a positive int"),
    ]
    for kw, pattern in cases:
        with pytest.raises(ValueError, match=pattern):
            call(**kw)
    with pytest.raises(TypeError, match="tokens must be a torch.Tensor"):
        call(tokens=tokens.tolist())
    with pytest.raises(TypeError, match="lengths must be a torch.Tensor"):
        call(lengths=lengths.tolist())
    with pytest.raises(TypeError, match="model must implement"):
        call(model=torch.nn.Linear(2, 2))

    class BadHead(Toy):
        def __init__(self):
            super().__init__()
            del self.decoder  # a plain callable in place of the Linear
            self.decoder = lambda x: x.sum(1)

    bad = BadHead()
    with pytest.raises(ValueError, match=r"logits \[N, C\]"):
        call(model=bad)
    bad.lead = -1
    with pytest.raises(ValueError, match="model.lead must be an int >= 0"):
        call(model=bad)
    # a 0-d integer tensor is fine as a mask token
    torch.testing.assert_close(call(mode="mask", mask_token=torch.tensor(4)), call(mode="mask", mask_token=4))


# ---- a long row's deletions are built within the budget ---------------------------------------


class OpsSpy:
    """attnmetrics.loo's ``ops`` with the bytes of every leave_one_out_batch output recorded."""

    def __init__(self):
        self.built = []

    def __getattr__(self, name):
        return getattr(torch.ops.attnmetrics, name)

    def leave_one_out_batch(self, *args):
        seqs, seq_lengths, source = torch.ops.attnmetrics.leave_one_out_batch(*args)
        self.built.append(seqs.numel() * seqs.element_size())
        return seqs, seq_lengths, source


@pytest.mark.parametrize("mode", MODES)
def test_long_row_deletions_built_within_budget(mode, monkeypatch):
    # a row of L tokens has L·(L−1) deletion ids (a 6,000-token row: 276 MB); they used to be
    # built all at once whatever memory_budget said
    import sys

    spy = OpsSpy()
    monkeypatch.setattr(sys.modules["attnmetrics.loo"], "ops", spy)
    model = Toy(classes=2, seed=3)
    tokens, lengths = ragged(rows=3, width=402, seed=3)
    kw = dict(mode=mode, mask_token=4) if mode == "mask" else {}
    budget = 2**20
    got = leave_one_out(model, tokens, lengths, memory_budget=budget, **kw)
    assert max(spy.built) <= budget // 8, spy.built  # ids: 8 bytes of the (E + 8 H) * 8 per position
    assert len(spy.built) > 3
    spy.built.clear()
    monkeypatch.setattr(sys.modules["attnmetrics.loo"], "CPU_CALL_BYTES", 2**40)
    whole = leave_one_out(model, tokens, lengths, memory_budget=2**40, **kw)
    assert max(spy.built) >= 400 * 401 * 8  # one call: the long row's ids at once
    torch.testing.assert_close(got, whole, rtol=0, atol=1e-12)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", [0, 1])
def test_chunked_deletions_match_unchunked(mode, seed):
    model = Toy(classes=3, seed=seed)
    tokens, lengths = ragged(rows=8, width=11, seed=seed)
    kw = dict(mode=mode, mask_token=4) if mode == "mask" else {}
    want = leave_one_out(model, tokens, lengths, memory_budget=10**9, **kw)
    torch.testing.assert_close(want, leave_one_out_reference(model, tokens, lengths, **kw), rtol=0, atol=1e-12)
    per_position = (6 + 8 * 5) * 8
    for per_call in (1, 2, 3, 7):  # deletions per call of the longest row (width 10 or 11)
        got = leave_one_out(model, tokens, lengths, memory_budget=per_call * 11 * per_position, **kw)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


# ---- padded and exact-length model calls -----------------------------------------------------


def _models_for_padding():
    """One model of every kind the procedures call with padded rows: each encoder and attention
    of the zoo, our GPT, and tiny Hugging Face BERT and GPT-2 (when transformers is installed)."""
    for encoder in ("lstm", "gru", "cnn", "average"):
        for attention in ("tanh", "dot"):
            torch.manual_seed(0)
            config = ModelConfig(vocab_size=50, embed_dim=8, hidden_size=8, encoder=encoder, attention=attention)
            yield f"{encoder}-{attention}", lambda c=config: (EncoderAttentionClassifier(c).double().eval(), ragged)
    from tests.models.test_gpt_classifier import batch, model_

    yield "gpt", lambda: (model_("tanh", 2), lambda rows, width, seed: batch(seed))
    try:
        import transformers  # noqa: F401
    except ImportError:
        return
    from tests.models import test_hf

    for family in ("bert", "gpt2"):
        yield (
            f"hf-{family}",
            lambda f=family: (
                test_hf.tiny(f),
                lambda rows, width, seed, f=f: test_hf.ragged(f, rows, width, seed),
            ),
        )


@pytest.mark.parametrize("name, build", list(_models_for_padding()), ids=lambda x: x if isinstance(x, str) else "")
def test_padded_calls_give_the_exact_length_calls_logits(name, build):
    """_grouped_logits on a GPU pads rows of several lengths into one call; every model masks
    its padding, so the logits equal those of the CPU's calls (one length a call, small calls merged; float64)."""
    from attnmetrics.loo import _grouped_logits

    model, inputs = build()
    tokens, lengths = inputs(rows=9, width=11, seed=4)
    exact, per_position, _ = _grouped_logits(model, tokens, lengths, None, 10**9, "rows", padded=False)
    padded, _, _ = _grouped_logits(model, tokens, lengths, None, 10**9, "rows", padded=True)
    small, _, _ = _grouped_logits(model, tokens, lengths, per_position, 3 * 11 * per_position, "rows", padded=True)
    torch.testing.assert_close(padded, exact, rtol=0, atol=1e-12)
    torch.testing.assert_close(small, exact, rtol=0, atol=1e-12)  # three rows a call


def test_padded_calls_check_the_logits_once_and_name_the_rows():
    from attnmetrics.loo import _grouped_logits

    model = real_model(2, torch.float64).eval()
    tokens, lengths = ragged(rows=6, width=9, seed=1)
    with torch.no_grad():
        model.decoder.bias.fill_(float("nan"))
    with pytest.raises(ValueError, match="NaN or infinite logits on a perturbed row"):
        _grouped_logits(model, tokens, lengths, None, 10**9, "a perturbed row", padded=True)


@settings(max_examples=200, deadline=None)
@given(
    rows=st.lists(st.tuples(st.integers(1, 6), st.integers(1, 60)), min_size=1, max_size=30),
    padding=st.sampled_from([None, 0.0, 0.125, 0.5]),
    small=st.sampled_from([0, 40, 512]),
    budget=st.integers(1, 4000),
)
@example(rows=[(2, 10), (2, 10), (1, 11)], padding=0.5, small=40, budget=4000)  # exactly `small` real positions
def test_length_groups_follow_their_rule(rows, padding, small, budget):
    """Groups of rows sorted by width (``(count, width)``, a count of sequences of that width):
    consecutive, each within the budget unless one row; a group takes a wider row only while it
    holds fewer than ``small`` real positions and stays within ``padding`` (any width with
    None, none with 0); and each group is as long as the rule allows."""
    from attnmetrics.loo import _length_groups

    rows = sorted(rows, key=lambda r: r[1])
    counts, widths = [c for c, _ in rows], [w for _, w in rows]
    groups = _length_groups(counts, widths, 1, budget, padding, small)
    assert [s for s, _ in groups] == [0] + [e for _, e in groups[:-1]] and groups[-1][1] == len(rows)

    def may_take(s: int, i: int) -> bool:  # may the group [s, i) take row i?
        count, real = sum(counts[s:i]), sum(c * w for c, w in rows[s:i])
        c, w = rows[i]
        if (count + c) * w > budget:
            return False
        if w == widths[i - 1] or padding is None:
            return True
        return real < small and (count + c) * w <= (1 + padding) * (real + c * w)

    for s, e in groups:
        assert all(may_take(s, i) for i in range(s + 1, e))
        if e < len(rows):
            assert not may_take(s, e)


@pytest.mark.parametrize("mode", ["delete", "mask"])
@pytest.mark.parametrize("name, build", list(_models_for_padding()), ids=lambda x: x if isinstance(x, str) else "")
def test_leave_one_out_padded_calls_give_the_exact_length_calls_values(name, build, mode, monkeypatch):
    """Through the protocol alone (the ``leave_one_out_batch`` kernel and whole-model calls, as for
    a transformer), a GPU's plan puts rows of several lengths into one padded group and call; every
    model masks its padding, so the values equal the CPU's one-length calls' (float64)."""
    model, inputs = build()
    tokens, lengths = inputs(rows=9, width=11, seed=4)
    mask = 1 if mode == "mask" else None
    if mode == "delete" and model.lead + model.trail == 0:  # a one-token row has nothing left
        with pytest.raises(ValueError, match=r"deleting the only token of row 1 leaves an empty sequence"):
            leave_one_out(model, tokens, lengths)
        lengths = lengths.clamp(min=2)
    plain = ProtocolOnly(model)
    exact = leave_one_out(plain, tokens, lengths, mode=mode, mask_token=mask)
    exact_calls = plain.encode_calls
    monkeypatch.setattr(attnmetrics.loo, "padded_calls", lambda device: True)
    plain.encode_calls = 0
    padded = leave_one_out(plain, tokens, lengths, mode=mode, mask_token=mask)
    assert plain.encode_calls < exact_calls  # fewer, padded calls
    torch.testing.assert_close(padded, exact, rtol=0, atol=1e-12)
