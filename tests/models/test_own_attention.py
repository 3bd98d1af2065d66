"""GPT-1's own attention decomposed (models/own_attention.py, docs/definitions.md §15): the
decomposition gives the model's logits, and an edit of the tested attention through the
decoder equals the model run with the same edit made inside its last attention layer."""

from __future__ import annotations

import pytest
import torch

import attnmetrics
from attnmetrics.models.gpt import GPTConfig
from attnmetrics.models.gpt import attention as gpt_attention
from attnmetrics.models.gpt_classifier import GPTClassifier
from attnmetrics.models.own_attention import extract_attention

F64 = torch.float64


def model_and_batch(classes=3, seed=0):
    torch.manual_seed(seed)
    config = GPTConfig(vocab_size=40, n_layer=2, d_model=24, n_head=4, context=16)
    model = GPTClassifier(config, num_classes=classes, attention="extract").to(F64).eval()
    for p in model.parameters():  # larger weights than GPT's N(0, 0.02): outputs that move
        p.data.normal_(0, 0.3)
    lengths = torch.tensor([9, 3, 2, 12, 6])
    tokens = torch.randint(4, 40, (5, 12))
    tokens[:, 0] = 1
    tokens[torch.arange(5), lengths - 1] = 3
    tokens[torch.arange(12) >= lengths[:, None]] = 0
    return model, tokens, lengths


def run_with_extract_row(model, tokens, lengths, alpha):
    """The model's logits with the last layer's <extract> row edited: each head's real tokens
    get ``alpha`` (over the real tokens) times their original mass, the specials keep theirs."""
    attn = model.gpt.blocks[-1].attn

    def patched(q, k, v, mask):
        _, probs = gpt_attention(q, k, v, mask)
        probs = probs.clone()
        for b, n in enumerate(lengths.tolist()):
            row = probs[b, :, n - 1]
            mass = row[:, 1 : n - 1].sum(-1, keepdim=True)
            row[:, 1 : n - 1] = mass * alpha[b, :, : n - 2]
        return probs @ v, probs

    attn.attention = patched
    try:
        with torch.no_grad():
            return model(tokens, lengths)[0]
    finally:
        del attn.attention


@pytest.mark.parametrize("classes", [1, 3])
def test_decomposition_gives_the_models_logits(classes):
    model, tokens, lengths = model_and_batch(classes)
    tested = extract_attention(model, tokens, lengths)
    with torch.no_grad():
        logits, _ = model(tokens, lengths)
    torch.testing.assert_close(tested.logits, logits, rtol=1e-12, atol=1e-12)
    assert tested.attention.shape == (5, 4, 11) and tested.values.shape == (5, 4, 11, 24)
    assert torch.equal(tested.lengths, lengths - 2)
    sums = tested.attention.sum(-1)
    torch.testing.assert_close(sums[tested.lengths > 0], torch.ones_like(sums[tested.lengths > 0]))
    # the decoder alone on the tested attention's context gives them too (rows with a real token)
    context = torch.einsum("bht,bhtd->bd", tested.attention, tested.values)
    some = tested.lengths > 0
    torch.testing.assert_close(tested.decoder(context)[some], logits[some], rtol=1e-12, atol=1e-12)


def test_an_edit_through_the_decoder_is_the_same_edit_inside_the_model():
    model, tokens, lengths = model_and_batch(seed=1)
    tested = extract_attention(model, tokens, lengths)
    g = torch.Generator().manual_seed(0)
    real = torch.arange(11) < tested.lengths[:, None]
    # an arbitrary distribution per head (as an adversary's), and a renormalised removal
    edited = torch.rand(5, 4, 11, generator=g, dtype=F64).masked_fill(~real[:, None], 0)
    edited = edited / edited.sum(-1, keepdim=True).clamp(min=1e-300)
    removed = tested.attention.clone()
    removed[:, :, 0] = 0  # the first real token, from every head
    removed = removed / removed.sum(-1, keepdim=True).clamp(min=1e-300)
    keep = tested.lengths >= 2  # rows with a real token left after the removal
    for alpha in (edited, removed):
        want = run_with_extract_row(model, tokens, lengths, alpha)
        got = tested.decoder(torch.einsum("bht,bhtd->bd", alpha, tested.values))
        torch.testing.assert_close(got[keep], want[keep], rtol=1e-10, atol=1e-10)
        # the same values factored (each head's vectors, then its slice of the output projection)
        fac = tested.factored
        mixed = torch.einsum("bht,bhte->bhe", alpha, fac.per_head)
        got = tested.decoder(torch.einsum("bhe,heo->bo", mixed, fac.projection) + fac.offset.sum(1))
        torch.testing.assert_close(got[keep], want[keep], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(tested.factored.dense(tested.lengths), tested.values, rtol=0, atol=1e-12)
    assert (run_with_extract_row(model, tokens, lengths, edited) - tested.logits)[keep].abs().max() > 1e-3


def test_a_padded_row_equals_the_row_alone():
    model, tokens, lengths = model_and_batch(seed=2)
    batch = extract_attention(model, tokens, lengths)
    for b in range(5):
        n = int(lengths[b])
        alone = extract_attention(model, tokens[b : b + 1, :n], lengths[b : b + 1])
        m = n - 2
        torch.testing.assert_close(alone.attention[0, :, :m], batch.attention[b, :, :m], rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(alone.values[0, :, :m], batch.values[b, :, :m], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(alone.logits[0], batch.logits[b], rtol=1e-12, atol=1e-12)


def test_the_procedures_run_on_it():
    """The multi-head ops take the decomposition as it is, and agree with their references."""
    from attnmetrics.testing.reference import flip_fraction_reference

    model, tokens, lengths = model_and_batch(seed=3)
    t = extract_attention(model, tokens, lengths)
    got = attnmetrics.flip_fraction(t.attention, t.values, t.decoder, t.lengths)
    want = flip_fraction_reference(t.attention, t.values, t.decoder, t.lengths)
    assert torch.equal(got.removed, want.removed)
    perm = attnmetrics.permutation_test(t.attention, t.values, t.decoder, t.lengths, permutations=8)
    assert perm.median_tvd.shape == (5,)


def test_only_for_the_extract_read_out():
    config = GPTConfig(vocab_size=40, n_layer=1, d_model=8, n_head=2, context=8)
    model = GPTClassifier(config, attention="tanh").eval()
    with pytest.raises(ValueError, match="extract read-out"):
        extract_attention(model, torch.tensor([[1, 5, 3]]), torch.tensor([3]))
