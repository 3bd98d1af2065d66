"""`attnmetrics run` on J&W's pair tasks end to end: bAbI generated into the cache (the 1k set, a
slice), the pair model trained, the whole battery over the passage with the question held fixed,
the report and token view naming the question; `evaluate` reloads the pair model; SNLI read from a
user's folder written here; the combinations that cannot run refused in one line."""

from __future__ import annotations

import json

import pytest

from attnmetrics.app.cli import main
from attnmetrics.data import load_dataset
from attnmetrics.data.tokens import tokenize
from tests.inputs import FAST_BATTERY

QUICK = ["--epochs", "1", "--limit", "40", "--threads", "1", "--no-progress", *FAST_BATTERY]


@pytest.fixture
def data_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNMETRICS_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_run_babi_runs_the_battery_over_the_passage_and_evaluate_reloads(tmp_path, data_cache):
    out = tmp_path / "run"
    args = ["--dataset", "babi2-1k", "--encoder", "lstm", "--attention", "dot", *QUICK, "--examples", "2"]
    assert main(["run", *args, "--out", str(out)]) == 0
    assert list((data_cache / "babi").glob("qa2_*train.txt"))  # generated once into the cache
    results = json.loads((out / "results.json").read_text())
    model = results["model"]
    assert model["kind"] == "pair" and model["encoder"] == "lstm" and model["attention"] == "dot"
    assert (model["embed_dim"], model["hidden_size"]) == (50, 32)  # J&W's bAbI sizes
    assert results["config"]["batch_size"] == 50 and results["config"]["embeddings"] == "random"
    assert "the question held fixed" in results["conventions"]["pair_task"]
    assert "predicted class's probability only" in results["conventions"]["gradient_importance"]
    for experiment in ("flip", "kendall", "permutation", "adversarial", "single_removal", "eraser"):
        assert experiment in results, experiment
    # every per-token importance covers the passage's words, never the question's
    example = results["examples"][0]
    splits = load_dataset("babi2-1k")
    test_pair = splits.test[example["instance"]][0]
    assert example["tokens"] == tokenize(test_pair.passage)
    assert example["question"] == tokenize(test_pair.question)
    assert all(len(v) == len(example["tokens"]) for v in example["scores"].values())
    report = (out / "report.md").read_text()
    assert "attention over the passage, conditioned on the question (held fixed)" in report
    assert "question (held fixed, not scored)" in (out / "report.html").read_text()

    again = tmp_path / "again"
    assert main(["evaluate", str(out), "--limit", "40", *FAST_BATTERY, "--out", str(again), "--no-progress"]) == 0
    reloaded = json.loads((again / "results.json").read_text())
    assert reloaded["test"]["accuracy"] == results["test"]["accuracy"]
    assert reloaded["kendall"] == results["kendall"]


def _snli_line(label: str, premise: str, hypothesis: str) -> str:
    return json.dumps(
        {
            "annotator_labels": [label],
            "gold_label": label,
            "pairID": "x",
            "sentence1": premise,
            "sentence1_binary_parse": "( a b )",
            "sentence2": hypothesis,
        }
    )


def test_run_snli_reads_a_users_folder(tmp_path, data_cache):
    folder = tmp_path / "snli_1.0"
    folder.mkdir()
    premises = ["a man plays a guitar on stage", "two dogs run in a field", "a woman reads a book at home"]
    hypotheses = ["a person makes music", "the animals are asleep", "someone is reading"]
    labels = ["entailment", "contradiction", "neutral"]
    for split in ("train", "dev", "test"):
        lines = [_snli_line(labels[i % 3], premises[i % 3], hypotheses[i % 3]) for i in range(12)]
        lines.append(_snli_line("-", premises[0], hypotheses[1]))  # no consensus: skipped and counted
        (folder / f"snli_1.0_{split}.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "run"
    args = ["--dataset", "snli", "--data-dir", str(tmp_path), "--embeddings", "random", "--embed-dim", "8"]
    assert main(["run", *args, *QUICK, "--hidden-size", "8", "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["data"]["classes"] == ["contradiction", "entailment", "neutral"]
    assert results["data"]["info"]["no_consensus_skipped"] == {"train": 1, "dev": 1, "test": 1}
    assert results["model"]["kind"] == "pair" and results["model"]["question_width"] == 4


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--dataset", "snli"], "dataset 'snli' needs --data-dir"),
        (["--dataset", "cnn"], "dataset 'cnn' needs --data-dir"),
        (["--dataset", "babi1-1k", "--encoder", "gpt"], "babi1 is a pair task"),
        (["--dataset", "babi1-1k", "--attention", "uniform"], "the pair model's attention is one of"),
        (["--dataset", "babi1-1k", "--regulariser", "tying"], "--regulariser tying is not built for the pair model"),
        (["--dataset", "babi1-1k", "--diagnostic"], "take single-text data sets"),
    ],
)
def test_what_cannot_run_on_a_pair_task_is_refused(tmp_path, data_cache, capsys, flags, message):
    assert main(["run", *flags, *QUICK, "--out", str(tmp_path / "run")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
