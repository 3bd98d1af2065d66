"""The battery's importance registry: an importance declared in one module reaches every place the
battery uses importances (Kendall pairs, flip orders, ERASER, timings, per-head τ)."""

import re
import types
from pathlib import Path

import torch

from attnmetrics.app.battery import BatteryConfig, collect, registry, run_conventions
from attnmetrics.app.parser import build_parser
from attnmetrics.models.classifier import EncoderAttentionClassifier, ModelConfig
from tests.inputs import ROOT
from tests.toy import toy_batch


def docs_toy_module():
    """The toy importance module of docs/architecture.md ("Adding an importance or an experiment
    to the battery"), loaded as the battery module it would be."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    source = re.search(r"```python\n# attnmetrics/app/battery/embedding_norm.py\n(.*?)```", text, re.S).group(1)
    module = types.ModuleType("attnmetrics.app.battery.embedding_norm")
    exec(compile(source, "embedding_norm.py", "exec"), module.__dict__)
    return module


def test_the_documented_toy_importance_joins_the_whole_battery_from_its_module(monkeypatch):
    toy = docs_toy_module().IMPORTANCE
    declared = registry._declared()
    monkeypatch.setattr(registry, "_declared", lambda: (declared[0], (*declared[1], toy)))
    # its flag reaches the command line, off by default
    args = build_parser().parse_args(["run", "--dataset", "sst", "--embedding-norm"])
    assert args.embedding_norm is True
    assert build_parser().parse_args(["run", "--dataset", "sst"]).embedding_norm is False
    torch.manual_seed(0)
    model = EncoderAttentionClassifier(ModelConfig(30, embed_dim=8, hidden_size=6)).eval()
    tokens, lengths = toy_batch(rows=4)
    chosen = dict(experiments=["flip", "kendall", "eraser"], orders=["attention"], progress=False)
    values, seconds = collect(model, [(0, tokens, lengths)], options={"embedding_norm": True}, **chosen)
    for partner in ("attention", "gradient"):
        assert values[f"kendall/{partner} vs embedding_norm/tau"].shape == (4,)
    assert values["flip/embedding_norm/removed"].shape[0] == 4
    assert values["eraser/embedding_norm/comprehensiveness/aopc"].shape == (4,)
    assert "embedding_norm" in seconds
    assert "kendall/attention vs loo/tau" not in values  # leave-one-out only with its experiment
    assert "embedding_norm" in run_conventions(BatteryConfig())
    off, _ = collect(model, [(0, tokens, lengths)], **chosen)  # not asked for: not computed
    assert not any("embedding_norm" in k for k in off)


def test_every_module_of_the_battery_declares_or_runs_it():
    """A module dropped into the battery's folder is found: each declares an experiment or an
    importance, except the registry, the runner and the block they share."""
    folder = Path(registry.__file__).parent
    names = {p.stem for p in folder.glob("*.py")} - {"__init__", "registry", "runner", "block"}
    declared = {e.name for e in registry.experiments()} | {i.name for i in registry.importances()}
    modules = {"integrated_gradients": "ig"}  # its results key is the short name
    assert {modules.get(n, n) for n in names} <= declared


def test_optional_importances_follow_their_settings_and_name_missing_packages(monkeypatch):
    off = registry.Settings()
    on = registry.Settings(("loo",), {"integrated_gradients": 4, "input_x_gradient": True})
    assert [i.name for i in registry.chosen(object(), off)] == ["gradient"]
    assert [i.name for i in registry.chosen(object(), on)] == ["gradient", "loo", "ig", "input_x_gradient"]
    assert [i.name for i in registry.importances()] == [
        "gradient", "loo", "rollout", "value_norm", "globenc", "alti", "value_zeroing", "chefer", "decompx",
        "attention_flow", "ig", "alti_logit", "attnlrp", "input_x_gradient",
    ]  # fmt: skip
    monkeypatch.setattr(registry.importlib.util, "find_spec", lambda name, *a: None)
    assert registry.missing_package(off) is None
    assert registry.missing_package(on) == "--integrated-gradients needs Captum: pip install captum"
