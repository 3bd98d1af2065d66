"""integrated_gradients' and input_x_gradient's ``aggregation`` (issue 47): a token's score from its
attribution vector as ALTI (``ig_l2``, ``ig_abs_mean``, ``grad_input_l2``, ``grad_input_mean_abs_mean``:
mt-upc/transformer-contributions@4f890398 src/contributions.py) and DecompX (``IG_ALL_ZERO_NORM``,
``IXG_NORM``: mohsenfayyaz/DecompX@b6bddf0b experiments/notebooks/compute_*saliency.ipynb) compute it,
against Captum's raw attributions aggregated by hand."""

from __future__ import annotations

import pytest
import torch

from attnmetrics.importance import AGGREGATIONS, aggregate_attribution
from attnmetrics.outputs import output_distribution
from tests.test_importance import input_x_gradient_loop, integrated_gradients_loop
from tests.toy import ToyClassifier, toy_batch

captum_attr = pytest.importorskip("captum.attr", reason="integrated gradients come from Captum (optional)")


def by_hand(attribution: torch.Tensor, aggregation: str) -> torch.Tensor:
    """[L, E] -> [L]: the authors' expressions, written out."""
    if aggregation == "sum":
        return torch.abs(torch.sum(attribution, dim=-1))
    if aggregation == "l2":
        return torch.sqrt((attribution**2).sum(-1))  # torch.norm(attribution, dim=-1)
    return torch.mean(torch.abs(attribution), dim=-1)


def captum_loop(model, tokens, lengths, method, aggregation, steps=None):
    """Per row: Captum's attributions of the predicted class's probability w.r.t. the embeddings
    (integrated gradients from the real tokens zeroed, or gradient x input), aggregated by hand over
    the embedding, the real tokens' scores L1-normalised."""
    out = []
    for b in range(tokens.shape[0]):
        L = int(lengths[b])
        lens = lengths[b : b + 1]

        def probs(e):
            h = model.encode(e, lens.expand(e.shape[0]))
            return output_distribution(model.decoder((model.attend(h, lens.expand(e.shape[0]))[..., None] * h).sum(1)))

        x = model.embed(tokens[b : b + 1, :L]).detach()
        with torch.no_grad():
            target = int(probs(x)[0].argmax())
        if method == "ig":
            base = x.clone()
            base[:, model.lead : L - model.trail] = 0
            a = captum_attr.IntegratedGradients(probs).attribute(x, baselines=base, target=target, n_steps=steps)
        else:
            a = captum_attr.InputXGradient(probs).attribute(x.requires_grad_(True), target=target)
        score = by_hand(a[0].detach(), aggregation)[model.lead : L - model.trail]
        out.append(score / score.sum())
    return out


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("method", ["ig", "input_x_gradient"])
@pytest.mark.parametrize("classes", [1, 3])
def test_aggregations_against_captum_by_hand(method, aggregation, classes):
    from attnmetrics.importance import input_x_gradient, integrated_gradients

    model = ToyClassifier(classes=classes).eval()
    tokens, lengths = toy_batch()
    if method == "ig":
        got = integrated_gradients(model, tokens, lengths, steps=8, aggregation=aggregation)
    else:
        got = input_x_gradient(model, tokens, lengths, aggregation=aggregation)
    want = captum_loop(model, tokens, lengths, method, aggregation, steps=8)
    assert got.shape == (tokens.shape[0], tokens.shape[1] - model.lead)
    for b, w in enumerate(want):
        torch.testing.assert_close(got[b, : w.numel()], w, rtol=1e-6, atol=1e-9)
        assert (got[b, w.numel() :] == 0).all()


def test_the_default_is_the_sum_unchanged():
    """``aggregation="sum"`` is the default and today's |sum_e| (the definition loops of
    tests/test_importance.py), bit for bit the same as asking for it."""
    from attnmetrics.importance import input_x_gradient, integrated_gradients

    model = ToyClassifier(classes=3).eval()
    tokens, lengths = toy_batch()
    ig = integrated_gradients(model, tokens, lengths, steps=7)
    assert torch.equal(ig, integrated_gradients(model, tokens, lengths, steps=7, aggregation="sum"))
    for b, w in enumerate(integrated_gradients_loop(model, tokens, lengths, 7)):
        torch.testing.assert_close(ig[b, : w.numel()], w, rtol=1e-6, atol=1e-9)
    ixg = input_x_gradient(model, tokens, lengths)
    assert torch.equal(ixg, input_x_gradient(model, tokens, lengths, aggregation="sum"))
    for b, w in enumerate(input_x_gradient_loop(model, tokens, lengths)):
        torch.testing.assert_close(ixg[b, : w.numel()], w, rtol=1e-10, atol=1e-12)
    # the aggregations order the tokens differently (else the option would be moot)
    assert not torch.allclose(ixg, input_x_gradient(model, tokens, lengths, aggregation="l2"))


def test_aggregate_attribution_on_a_hand_example():
    a = torch.tensor([[3.0, -4.0], [0.0, 0.0], [-1.0, -1.0]])
    assert aggregate_attribution(a).tolist() == [1.0, 0.0, 2.0]
    assert aggregate_attribution(a, "l2").tolist() == [5.0, 0.0, pytest.approx(2**0.5)]
    assert aggregate_attribution(a, "mean_abs").tolist() == [3.5, 0.0, 1.0]


@pytest.mark.parametrize("bad", ["L2", "norm", "mean", None, 2])
def test_bad_aggregations_are_named(bad):
    from attnmetrics.importance import input_x_gradient, integrated_gradients

    model = ToyClassifier()
    tokens, lengths = toy_batch()
    match = r"aggregation must be one of \('sum', 'l2', 'mean_abs'\), got " + repr(bad).replace("(", r"\(")
    with pytest.raises(ValueError, match=match):
        integrated_gradients(model, tokens, lengths, steps=2, aggregation=bad)
    with pytest.raises(ValueError, match=match):
        input_x_gradient(model, tokens, lengths, aggregation=bad)
    with pytest.raises(ValueError, match=match):
        aggregate_attribution(torch.ones(2, 3), bad)


def test_the_battery_importances_take_the_flag(monkeypatch):
    """--attribution-aggregation reaches both importances through the run's Settings (absent: sum)."""
    import attnmetrics.app.battery.input_x_gradient as ixg_module
    import attnmetrics.app.battery.integrated_gradients as ig_module
    from attnmetrics.app.battery.registry import Settings

    seen = []
    monkeypatch.setattr(ig_module, "integrated_gradients", lambda *a, **k: seen.append(("ig", k)))
    monkeypatch.setattr(ixg_module, "input_x_gradient", lambda *a, **k: seen.append(("ixg", k)))
    settings = Settings((), {"integrated_gradients": 5, "input_x_gradient": True, "attribution_aggregation": "l2"})
    ig_module.IMPORTANCE.compute(None, None, None, settings)
    ixg_module.IMPORTANCE.compute(None, None, None, settings)
    ig_module.IMPORTANCE.compute(None, None, None, Settings((), {"integrated_gradients": 5}))
    assert seen == [
        ("ig", {"steps": 5, "aggregation": "l2"}),
        ("ixg", {"aggregation": "l2"}),
        ("ig", {"steps": 5, "aggregation": "sum"}),
    ]
