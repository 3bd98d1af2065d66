"""The battery's importance registry: an importance added as one entry reaches every place the
battery uses importances (Kendall pairs, flip orders, ERASER, timings, per-head τ)."""

import torch

from attnmetrics.app import importances
from attnmetrics.app.battery import collect
from attnmetrics.models.classifier import EncoderAttentionClassifier, ModelConfig
from tests.toy import toy_batch


def embedding_norm(model, tokens, lengths, settings):
    """A toy importance: each real token's embedding norm, L1-normalised (not a method of note)."""
    norms = model.embed(tokens).detach().norm(dim=-1)[:, model.lead :]
    real = torch.arange(norms.shape[1]) < (lengths - model.lead - model.trail)[:, None]
    norms = norms * real
    return norms / norms.sum(1, keepdim=True)


def test_an_importance_added_as_one_entry_joins_the_whole_battery(monkeypatch):
    toy = importances.Importance("embedding_norm", embedding_norm, lambda model, s: True)
    monkeypatch.setattr(importances, "IMPORTANCES", (*importances.IMPORTANCES, toy))
    torch.manual_seed(0)
    model = EncoderAttentionClassifier(ModelConfig(30, embed_dim=8, hidden_size=6)).eval()
    tokens, lengths = toy_batch(rows=4)
    values, seconds = collect(
        model, [(0, tokens, lengths)], experiments=["flip", "kendall", "eraser"], orders=["attention"], progress=False
    )
    for partner in ("attention", "gradient"):
        assert values[f"kendall/{partner} vs embedding_norm/tau"].shape == (4,)
    assert values["flip/embedding_norm/removed"].shape[0] == 4
    assert values["eraser/embedding_norm/comprehensiveness/aopc"].shape == (4,)
    assert "embedding_norm" in seconds
    assert "kendall/attention vs loo/tau" not in values  # leave-one-out only with its experiment


def test_optional_importances_follow_their_settings_and_name_missing_packages(monkeypatch):
    off, on = importances.Settings(), importances.Settings(("loo",), ig_steps=4, input_x_gradient=True)
    assert [i.name for i in importances.chosen(object(), off)] == ["gradient"]
    assert [i.name for i in importances.chosen(object(), on)] == ["gradient", "loo", "ig", "input_x_gradient"]
    assert importances.NAMES == ("gradient", "loo", "rollout", "ig", "input_x_gradient")
    monkeypatch.setattr(importances.importlib.util, "find_spec", lambda name, *a: None)
    assert importances.missing_package(off) is None
    assert importances.missing_package(on) == "--integrated-gradients needs Captum: pip install captum"
