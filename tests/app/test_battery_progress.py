"""The battery's progress bar: one step per experiment per instance block, naming the running one."""

import torch

from attnmetrics.app.battery import EXPERIMENTS, battery_parts, collect
from attnmetrics.models.classifier import EncoderAttentionClassifier, ModelConfig
from tests.toy import toy_batch


def test_parts_follow_the_chosen_experiments_in_the_battery_order():
    assert battery_parts(EXPERIMENTS) == ["forward", *EXPERIMENTS]
    assert battery_parts(["eraser", "flip"]) == ["forward", "flip", "eraser"]
    assert battery_parts(["loo"]) == ["forward"]  # leave-one-out runs only as a Kendall partner


def test_the_bar_names_each_experiment_of_each_block(capsys):
    torch.manual_seed(0)
    model = EncoderAttentionClassifier(ModelConfig(30, embed_dim=8, hidden_size=6)).eval()
    tokens, lengths = toy_batch(rows=4)
    blocks = [(0, tokens[:2], lengths[:2]), (2, tokens[2:], lengths[2:])]
    values, _ = collect(model, blocks, experiments=["flip", "kendall", "loo", "eraser"], progress=True)
    assert values["instance"].tolist() == [0, 1, 2, 3]
    err = capsys.readouterr().err
    shown = [f"block {b}/2: {part}" for b in (1, 2) for part in ("forward", "flip", "kendall", "loo", "eraser")]
    assert [err.index(label) for label in shown] == sorted(err.index(label) for label in shown)
    _, _ = collect(model, blocks, experiments=["flip"], progress=False)
    assert "block" not in capsys.readouterr().err
