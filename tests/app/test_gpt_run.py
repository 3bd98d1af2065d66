"""``attnmetrics run --encoder gpt``: GPT-1 fine-tuned on a slice of the real SST (from scratch and
from a tiny pre-trained checkpoint), the battery on its attention head and on its own attention
(the extract read-out), and ``evaluate`` on it."""

from __future__ import annotations

import json

import pytest

from attnmetrics.app.cli import main
from attnmetrics.data import load_sst
from attnmetrics.models.gpt import GPTConfig
from attnmetrics.models.pretraining import PretrainConfig, pretrain
from tests.inputs import FAST_BATTERY, QUICK_SST, SST_SAMPLE

QUICK_GPT = [*QUICK_SST, "--encoder", "gpt", *FAST_BATTERY, "--skip", "single_token", "adversarial"]


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """A two-block GPT pre-trained for a few steps on SST training sentences (no network)."""
    texts = [text for text, _ in load_sst(SST_SAMPLE).train[:400]]
    out = tmp_path_factory.mktemp("gpt-pre")
    config = PretrainConfig(steps=3, batch_size=4, warmup=1, vocab_size=400, eval_every=3, progress=False)
    model = GPTConfig(vocab_size=1, n_layer=2, d_model=16, n_head=2, context=64)  # vocab_size: the tokenizer's
    from attnmetrics.models.bpe import BPETokenizer

    tokenizer = BPETokenizer.train(texts, config.vocab_size)
    pretrain(
        out,
        model.replace(vocab_size=tokenizer.vocab_size),
        config,
        train_texts=texts,
        valid_text=texts[0] * 20,
        tokenizer=tokenizer,
    )
    return out


def test_fine_tunes_a_pretrained_gpt_and_runs_the_battery(pretrained, tmp_path):
    out = tmp_path / "run"
    argv = ["run", *QUICK_GPT, "--pretrained", str(pretrained), "--transfer-layers", "1", "--out", str(out)]
    assert main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["model"]["encoder"] == "gpt" and results["model"]["gpt"]["n_layer"] == 2
    assert results["pretrained"]["transfer_layers"] == 1 and results["pretrained"]["step"] == 3
    # GPT-1's fine-tuning recipe unless overridden (--epochs 1 is)
    training = results["training"]["config"]
    assert (training["lr"], training["schedule"], training["warmup"]) == (6.25e-5, "linear", 0.002)
    assert training["grad_clip"] == 1.0 and results["config"]["grad_clip"] == 1.0  # GPT-1's code clips at 1
    assert training["epochs"] == 1 and training["decoupled_weight_decay"] and not training["amsgrad"]
    assert "attention vs loo" in results["kendall"] and "permutation" in results
    assert (out / "model" / "tokenizer.json").is_file() and (out / "report.md").is_file()

    again = tmp_path / "eval"
    skip = ["--skip", "single_token", "adversarial"]
    assert (
        main(["evaluate", str(out), "--out", str(again), "--limit", "160", *FAST_BATTERY, *skip, "--no-progress"]) == 0
    )
    evaluated = json.loads((again / "results.json").read_text())
    assert evaluated["test"] == results["test"]  # the same model on the same test split


def test_trains_from_scratch_without_pretrained(tmp_path):
    out = tmp_path / "scratch"
    assert main(["run", *QUICK_GPT, "--lm-weight", "0", "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["pretrained"] is None and results["model"]["lm_weight"] == 0
    assert results["model"]["gpt"]["n_layer"] == 4  # the small config
    assert 0 <= results["test"]["accuracy"] <= 1


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--transfer-layers", "1"], "--transfer-layers needs --pretrained"),
        (["--pretrained", "no/such/folder"], "is not a GPT checkpoint"),
        (["--diagnostic"], "train BiLSTM-family models, not gpt"),
    ],
)
def test_bad_gpt_flags_fail_in_one_line(tmp_path, capsys, flags, message):
    assert main(["run", *QUICK_GPT, *flags, "--out", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "bad").exists()


def test_extract_readout_runs_the_battery_on_the_models_own_attention(pretrained, tmp_path):
    out = tmp_path / "extract"
    argv = ["run", *QUICK_GPT[:-1], "--pretrained", str(pretrained), "--attention", "extract", "--out", str(out)]
    assert main(argv) == 0  # the whole battery but the single-token test
    results = json.loads((out / "results.json").read_text())
    assert results["battery"].startswith("GPT-1's own attention")
    for experiment in ("flip", "kendall", "permutation", "adversarial", "single_removal"):
        assert experiment in results, experiment
    assert "attention vs gradient" in results["kendall"]
    n = len(results["instances"]["predicted"])
    assert len(results["instances"]["permutation"]["median_tvd"]) == n
    max_attention = results["instances"]["max_attention"]  # the head mean's largest weight, a distribution's
    assert all(0 < m <= 1 for m, length in zip(max_attention, results["instances"]["lengths"]) if length)
    report = (out / "report.md").read_text()
    assert "GPT-1's own attention" in report and "Permuted attention" in report
    # per head: two heads, each with its largest weight, JSD from the head mean and tau with gradient / LOO
    per_head = results["heads"]
    assert set(per_head) == {"max attention", "JSD from the head mean", "tau vs gradient", "tau vs loo"}
    assert all(len(v) == 2 for v in per_head.values()) and all(0 < m <= 1 for m in per_head["max attention"])
    assert len(results["instances"]["heads"]["h1"]["tau vs loo"]) == n
    assert "Per head" in report and (out / "heads.png").is_file()


def test_extract_readout_runs_the_attention_derived_attributions(pretrained, tmp_path):
    """GPT-1's read-out classifies the <extract> state, which the decompositions explain (issue 28):
    ``--importances all`` runs them on it; with the tanh head only attention flow applies."""
    skip = ["--skip", "permutation", "adversarial", "single_removal", "single_token"]
    decompositions = ("value_norm", "globenc", "alti", "value_zeroing", "chefer", "decompx")
    for attention in ("extract", "tanh"):
        out = tmp_path / attention
        argv = ["run", *QUICK_GPT[:-3], *skip, "--pretrained", str(pretrained), "--attention", attention]
        assert main([*argv, "--importances", "all", "--out", str(out)]) == 0
        results = json.loads((out / "results.json").read_text())
        for name in decompositions:
            assert (f"attention vs {name}" in results["kendall"]) == (attention == "extract"), (attention, name)
            assert (name in results["eraser"]) == (attention == "extract"), (attention, name)
        assert "attention vs attention_flow" in results["kendall"]


def test_a_truncated_model_pt_is_named_in_one_line(pretrained, tmp_path, capsys):
    # issue 31, unclear errors: a half-truncated GPT model.pt gave "OSError: [Errno 22] Invalid argument"
    import shutil

    model = tmp_path / "m"
    assert main(["train", *QUICK_SST, "--encoder", "gpt", "--out", str(model)]) == 0
    copy = tmp_path / "pre"
    shutil.copytree(pretrained, copy)
    latest = copy / (copy / "latest").read_text().strip()
    capsys.readouterr()
    for weights, argv in (
        (model / "model" / "model.pt", ["evaluate", str(model), *FAST_BATTERY, "--out", str(tmp_path / "e")]),
        (
            latest / "model.pt",
            ["train", *QUICK_SST, "--encoder", "gpt", "--pretrained", str(copy), "--out", str(tmp_path / "t")],
        ),
    ):
        whole = weights.read_bytes()
        weights.write_bytes(whole[: len(whole) // 2])
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith(f"attnmetrics: {weights}: cannot read the weights") and len(err[-1]) < 300, err
        assert "truncated or damaged" in err[-1] and "Traceback" not in "".join(err), err
        assert not (tmp_path / "e").exists() and not (tmp_path / "t").exists()
