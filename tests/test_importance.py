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


@pytest.mark.parametrize("classes", [1, 2, 3])
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


def test_gradient_importance_clear_errors():
    # each of these used to return a silently wrong answer (or a crash deep in the model)
    model = ToyClassifier()
    tokens, lengths = toy_batch()
    width = tokens.shape[1]
    cases = [
        (dict(lengths=lengths.clone().fill_(width + 2)), r"lengths must lie in \[lead \+ trail, T\] = \[2, 9\]"),
        (dict(lengths=lengths - 20), r"lengths must lie in \[lead \+ trail, T\].*min"),
        (dict(lengths=lengths.float()), "lengths must be an integer tensor"),
        (dict(lengths=lengths[:2]), r"lengths must have shape \[B\] = \[4\]"),
        (dict(tokens=tokens.int()), "tokens must be int64"),
        (dict(tokens=tokens[0]), r"tokens must have shape \[B, T\]"),
        (dict(tokens=tokens[:0], lengths=lengths[:0]), "empty batch"),
        (dict(tokens=tokens - 40), "non-negative ids"),
    ]
    for kw, pattern in cases:
        a = dict(tokens=tokens, lengths=lengths) | kw
        with pytest.raises(ValueError, match=pattern):
            gradient_importance(model, a["tokens"], a["lengths"])
    with pytest.raises(TypeError, match="lengths must be a torch.Tensor"):
        gradient_importance(model, tokens, lengths.tolist())
    with pytest.raises(TypeError, match="model must implement"):
        gradient_importance(torch.nn.Linear(2, 2), tokens, lengths)
    bad = ToyClassifier()
    bad.lead = -1
    with pytest.raises(ValueError, match="model.lead must be an int >= 0"):
        gradient_importance(bad, tokens, lengths)


def test_gradient_importance_non_finite_model():
    tokens, lengths = toy_batch()
    nan_head = ToyClassifier()
    with torch.no_grad():
        nan_head.decoder.bias[0] = float("nan")
    with pytest.raises(ValueError, match="model returned NaN or infinite logits on the input rows"):
        gradient_importance(nan_head, tokens, lengths)
    unused = min(set(range(1, 30)) - set(tokens.flatten().tolist()))
    nan_embedding = ToyClassifier()
    with torch.no_grad():
        nan_embedding.embedding.weight[unused] = float("nan")
    rare = tokens.clone()
    rare[2, 1] = unused
    with pytest.raises(ValueError, match="model.embed returned NaN or infinite embeddings in row 2"):
        gradient_importance(nan_embedding, rare, lengths)

    class InfGradient(ToyClassifier):
        def encode(self, embedded, lengths):  # finite forward, infinite gradient at 0
            return super().encode(embedded, lengths) + (embedded[..., :1] - embedded[..., :1].detach()).abs().sqrt()

    with pytest.raises(ValueError, match="gradient importance is not finite in row 0"):
        gradient_importance(InfGradient(), tokens, lengths)


def integrated_gradients_loop(model, tokens, lengths, steps):
    """Integrated gradients from the definition (Sundararajan et al. 2017, eq. 1), one instance
    at a time: the path from the baseline (real tokens' embeddings zeroed) to the input, the
    integral by Gauss–Legendre on [0, 1] with ``steps`` nodes (numpy's), the gradient of the
    predicted class's probability at each node by autograd; |sum over the embedding| per token,
    L1-normalised over the real tokens."""
    import numpy as np

    nodes, weights = np.polynomial.legendre.leggauss(steps)
    out = []
    for b in range(tokens.shape[0]):
        L = int(lengths[b])
        lens = lengths[b : b + 1]
        x = model.embed(tokens[b : b + 1, :L]).detach()
        base = x.clone()
        base[:, model.lead : L - model.trail] = 0

        def probs(e):
            h = model.encode(e, lens)
            return output_distribution(model.decoder((model.attend(h, lens)[..., None] * h).sum(1)))[0]

        with torch.no_grad():
            target = int(probs(x).argmax())
        total = torch.zeros_like(x)
        for node, weight in zip(nodes, weights):
            point = (base + (node + 1) / 2 * (x - base)).requires_grad_(True)
            (grad,) = torch.autograd.grad(probs(point)[target], point)
            total += weight / 2 * grad
        score = ((x - base) * total).sum(-1)[0].abs()[model.lead : L - model.trail]
        out.append(score / score.sum())
    return out


@pytest.mark.parametrize("classes", [1, 3])
@pytest.mark.parametrize("steps", [1, 7, 50])
@pytest.mark.parametrize("positions", [None, 1, 12, 10**6], ids=["exact-lengths", "p1", "p12", "p1e6"])
def test_integrated_gradients_match_the_definition(classes, steps, positions, monkeypatch):
    """Both ways of grouping rows: the CPU's exact-length calls, and (``positions``) the GPU's
    padded groups of rows sorted by length, here on the CPU, at most that many positions a
    forward (1: one row a forward, 12: several groups and several rows a forward, 10**6: one
    group and one forward for all)."""
    pytest.importorskip("captum.attr", reason="integrated gradients come from Captum (optional)")
    import attnmetrics.importance
    import attnmetrics.loo
    from attnmetrics.importance import integrated_gradients

    if positions is not None:
        monkeypatch.setattr(attnmetrics.loo, "padded_calls", lambda device: True)
        monkeypatch.setattr(attnmetrics.importance, "IG_GPU_POSITIONS", positions)
    model = ToyClassifier(classes=classes)
    tokens, lengths = toy_batch()
    got = integrated_gradients(model, tokens, lengths, steps=steps)
    want = integrated_gradients_loop(model, tokens, lengths, steps)
    assert got.shape == (tokens.shape[0], tokens.shape[1] - 1) and got.dtype == torch.float64
    for b, w in enumerate(want):
        # Captum casts the quadrature weights to float32: 1e-8 apart, not 1e-15
        torch.testing.assert_close(got[b, : w.numel()], w, rtol=1e-6, atol=1e-9)
        assert (got[b, w.numel() :] == 0).all()


def input_x_gradient_loop(model, tokens, lengths):
    """Gradient x input from the definition, one instance at a time: the predicted class's
    probability differentiated by autograd through the whole model (attention included), times
    the embeddings, |sum over the embedding| per token, L1-normalised over the real tokens."""
    out = []
    for b in range(tokens.shape[0]):
        L = int(lengths[b])
        lens = lengths[b : b + 1]
        x = model.embed(tokens[b : b + 1, :L]).detach().requires_grad_(True)
        h = model.encode(x, lens)
        p = output_distribution(model.decoder((model.attend(h, lens)[..., None] * h).sum(1)))[0]
        (grad,) = torch.autograd.grad(p[int(p.argmax())], x)
        score = (x * grad).sum(-1)[0].abs()[model.lead : L - model.trail]
        out.append(score / score.sum())
    return out


@pytest.mark.parametrize("classes", [1, 3])
def test_input_x_gradient_matches_the_definition(classes):
    pytest.importorskip("captum.attr", reason="gradient x input comes from Captum (optional)")
    from attnmetrics.importance import gradient_importance, input_x_gradient

    model = ToyClassifier(classes=classes).train()
    tokens, lengths = toy_batch()
    got = input_x_gradient(model, tokens, lengths)
    assert model.training  # restored
    want = input_x_gradient_loop(model.eval(), tokens, lengths)
    assert got.shape == (tokens.shape[0], tokens.shape[1] - 1) and got.dtype == torch.float64
    for b, w in enumerate(want):
        torch.testing.assert_close(got[b, : w.numel()], w, rtol=1e-10, atol=1e-12)
        assert (got[b, w.numel() :] == 0).all()
    # not J&W's gradient importance: that holds the attention fixed and sums every class
    assert not torch.allclose(got, gradient_importance(model, tokens, lengths))


def test_input_x_gradient_without_captum(monkeypatch):
    from attnmetrics.importance import input_x_gradient

    monkeypatch.setitem(__import__("sys").modules, "captum.attr", None)
    with pytest.raises(ImportError, match="input_x_gradient needs Captum: pip install captum"):
        input_x_gradient(ToyClassifier(), *toy_batch())


def test_integrated_gradients_errors(monkeypatch):
    pytest.importorskip("captum.attr", reason="integrated gradients come from Captum (optional)")
    from attnmetrics.importance import integrated_gradients

    model = ToyClassifier().train()
    tokens, lengths = toy_batch()
    integrated_gradients(model, tokens, lengths, steps=2)
    assert model.training
    for steps in (0, 2.5, True):
        with pytest.raises(ValueError, match="steps must be an int >= 1"):
            integrated_gradients(model, tokens, lengths, steps=steps)
    with pytest.raises(ValueError, match="steps must be an int >= 1 and <= 1000, got 1001"):  # issue 31, item 8
        integrated_gradients(model, tokens, lengths, steps=1001)
    monkeypatch.setitem(__import__("sys").modules, "captum.attr", None)  # as if Captum were absent
    with pytest.raises(ImportError, match="pip install captum"):
        integrated_gradients(model, tokens, lengths)
