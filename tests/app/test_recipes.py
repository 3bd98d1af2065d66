"""``--protocol jain-wallace``: J&W's SST length filter, positive-class weight, length-sorted
batches and adversarial weighting, recorded in results.json; the default changes nothing."""

import json

import pytest
import torch
import torch.nn.functional as F

import attnmetrics
from attnmetrics.app.battery import EXPERIMENTS
from attnmetrics.app.cli import main
from attnmetrics.app.recipes import PRESETS, jain_wallace_length_filter
from attnmetrics.data import load_sst
from attnmetrics.data.tokens import tokenize
from attnmetrics.models.text import EncodedSplit
from attnmetrics.models.training import balanced_pos_weight, loss_fn
from tests.inputs import SST_DIR

needs_sst = pytest.mark.sst


@needs_sst
def test_length_filter_gives_jain_and_wallace_sst_sizes():
    splits = jain_wallace_length_filter(load_sst(SST_DIR))
    assert (len(splits.train), len(splits.test)) == (6355, 1725)  # J&W 2019, Table 1
    assert min(len(tokenize(t)) for t, _ in splits.test) == 6


def test_length_filter_drops_short_rows_and_each_splits_longest():
    from attnmetrics.data import Splits

    rows = [("a b c d e", 0), ("a b c d e f", 1), ("a b c d e f g h", 0), ("a b c d e f g", 1), ("x " * 8, 1)]
    out = jain_wallace_length_filter(Splits("t", ("n", "p"), rows, rows, rows))
    # <= 5 tokens dropped; the longest two tie at 8 tokens: the last of them goes
    assert out.train == [("a b c d e f", 1), ("a b c d e f g h", 0), ("a b c d e f g", 1)]


def test_positive_class_weight_is_a_per_example_weight():
    logits = torch.randn(10, 1, dtype=torch.float64)
    labels = torch.tensor([1, 0, 0, 1, 0, 0, 0, 1, 0, 0])
    w = balanced_pos_weight(labels.tolist())
    assert w == pytest.approx(10 / 3 - 1)
    per_example = F.binary_cross_entropy_with_logits(logits[:, 0], labels.double(), reduction="none")
    expected = (per_example * torch.where(labels == 1, w, 1.0)).mean()  # J&W: positives weighted, mean
    assert torch.allclose(loss_fn(logits, labels, w), expected)
    with pytest.raises(ValueError, match="binary"):
        loss_fn(torch.randn(4, 3), torch.tensor([0, 1, 2, 0]), 2.0)


def test_length_sorted_batches_cover_every_row_once_in_a_seeded_order():
    ids = [[2, *range(4, 4 + n), 3] for n in (5, 1, 9, 3, 7, 2, 8, 4)]
    split = EncodedSplit(ids, [0, 1] * 4)
    runs = [
        [
            b.index.tolist()
            for b in split.batches(3, shuffle=True, generator=torch.Generator().manual_seed(s), by_length=True)
        ]
        for s in (0, 0, 1)
    ]
    assert runs[0] == runs[1] and sorted(map(tuple, runs[0])) == sorted(map(tuple, runs[2]))
    assert sorted(i for b in runs[0] for i in b) == list(range(8))
    by_length = sorted(range(8), key=lambda i: len(ids[i]))
    assert sorted(map(tuple, runs[0])) == sorted(tuple(by_length[s : s + 3]) for s in range(0, 8, 3))


@needs_sst
def test_cli_records_and_applies_the_preset(tmp_path, monkeypatch):
    common = [
        "--dataset",
        "sst",
        "--data-dir",
        str(SST_DIR),
        "--epochs",
        "1",
        "--embeddings",
        "random",
        "--embed-dim",
        "16",
        "--hidden-size",
        "8",
        "--no-progress",
    ]
    assert main(["train", *common, "--protocol", "jain-wallace", "--out", str(tmp_path / "jw")]) == 0
    results = json.loads((tmp_path / "jw" / "results.json").read_text())
    assert results["protocol"] == PRESETS["jain-wallace"].to_dict()
    assert results["data"]["sizes"]["test"] == 1725
    others = [e for e in EXPERIMENTS if e != "adversarial"]
    args = ["evaluate", str(tmp_path / "jw"), "--skip", *others, "--adversarial-steps", "3", "--limit", "20"]
    assert main([*args, "--no-progress", "--out", str(tmp_path / "e")]) == 0  # the preset comes with the model
    evaluated = json.loads((tmp_path / "e" / "results.json").read_text())
    assert evaluated["protocol"]["name"] == "jain-wallace"
    assert evaluated["adversarial"]["diversity_weight"] == pytest.approx(1 / 6.25)
    # J&W's adversary optimises with AMSGrad (model/Binary_Classification.py:38): the preset's default,
    # which --adversarial-optimiser overrides; the flag reaches adversarial_attention itself
    assert evaluated["adversarial"]["amsgrad"] is True
    assert "AMSGrad steps" in evaluated["conventions"]["adversarial"]
    seen = []
    real = attnmetrics.adversarial_attention

    def spy(*a, **kw):
        seen.append(kw["amsgrad"])
        return real(*a, **kw)

    monkeypatch.setattr(attnmetrics, "adversarial_attention", spy)
    assert main([*args, "--no-progress", "--out", str(tmp_path / "e2")]) == 0
    assert main([*args, "--adversarial-optimiser", "adam", "--no-progress", "--out", str(tmp_path / "e3")]) == 0
    assert seen and set(seen[: len(seen) // 2]) == {True} and set(seen[len(seen) // 2 :]) == {False}
    assert json.loads((tmp_path / "e3" / "results.json").read_text())["adversarial"]["amsgrad"] is False
    assert main(["train", *common, "--limit", "50", "--out", str(tmp_path / "default")]) == 0
    assert json.loads((tmp_path / "default" / "results.json").read_text())["protocol"]["name"] == "attnmetrics"
