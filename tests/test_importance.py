"""Procedures against step-by-step references on a tiny protocol model."""

import pytest
import torch
from torch.autograd.functional import jacobian

from attnmetrics.importance import gradient_importance
from attnmetrics.outputs import output_distribution
from attnmetrics.protocol import forward, real_tokens
from tests.toy import ToyClassifier, toy_batch


def gradient_importance_loop(model, tokens, lengths):
    """J&W's gradient importance, one instance and one class at a time, via the full Jacobian."""
    out = []
    for b in range(tokens.shape[0]):
        L = int(lengths[b])
        e0 = model.embed(tokens[b : b + 1, :L]).detach()
        lens = lengths[b : b + 1]
        with torch.no_grad():
            alpha = model.attend(model.encode(e0, lens), lens)  # attention held fixed

        def probs(e):
            h = model.encode(e, lens)
            return output_distribution(model.decoder((alpha[..., None] * h).sum(1)))[0]

        jac = jacobian(probs, e0)[:, 0]  # [C, L, E]
        score = sum(((jac[c] * e0[0]).sum(-1)).abs() for c in range(jac.shape[0]))
        real = score[model.lead : L - model.trail]
        out.append(real / real.sum())
    return out


@pytest.mark.parametrize("classes", [1, 3])
def test_gradient_importance_matches_per_instance_jacobian(classes):
    model = ToyClassifier(classes=classes)
    tokens, lengths = toy_batch()
    got = gradient_importance(model, tokens, lengths)
    want = gradient_importance_loop(model, tokens, lengths)
    assert got.shape == (tokens.shape[0], tokens.shape[1] - 1)
    for b, w in enumerate(want):
        torch.testing.assert_close(got[b, : w.numel()], w)
        assert (got[b, w.numel() :] == 0).all()


def test_gradient_importance_restores_training_mode():
    model = ToyClassifier().train()
    gradient_importance(model, *toy_batch())
    assert model.training


def test_forward_slices_real_tokens():
    model = ToyClassifier()
    tokens, lengths = toy_batch()
    out = forward(model, tokens, lengths)
    assert torch.equal(out.lengths, lengths - 2)
    mask = torch.arange(out.attention.shape[1]) < out.lengths[:, None]
    torch.testing.assert_close(out.attention.sum(1), torch.ones(len(lengths), dtype=torch.float64))
    assert (out.attention[~mask] == 0).all()
    # the context from the sliced pieces gives the model's own logits
    ctx = torch.einsum("bt,bth->bh", out.attention, out.hidden)
    torch.testing.assert_close(model.decoder(ctx), out.logits)
    x, real = real_tokens(torch.arange(9).expand(2, 9), torch.tensor([9, 4]), model)
    assert x[0, 0] == 1 and real.tolist() == [7, 2]
