"""`attnmetrics run --model hf:PATH --prompt ...` end to end on a slice of the real SST: a tiny random
LlamaForCausalLM saved as a checkpoint folder with a word-level tokenizer over SST's words, used
zero-shot (nothing trained), the whole battery and every importance on its text tokens; then
`evaluate` on the run folder reloads it from its source and gives the same numbers."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from attnmetrics.app.cli import main  # noqa: E402
from attnmetrics.data import load_dataset  # noqa: E402
from tests.inputs import FAST_BATTERY, SST_SAMPLE  # noqa: E402

FLAGS = ["--dataset", "sst", "--data-dir", str(SST_SAMPLE), "--limit", "12", "--threads", "1", "--no-progress"]
TEMPLATE = ["--prompt", "review : {text} sentiment :", "--label-words", "negative", "positive"]


def tiny_causal_lm(folder):
    """A tiny random LlamaForCausalLM (grouped-query attention) and a word-level tokenizer over SST's
    words and the template's, saved in ``folder``."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    folder.mkdir(exist_ok=True)
    splits = load_dataset("sst", data_dir=SST_SAMPLE)
    words = {w for text, _ in splits.train + splits.dev + splits.test for w in text.lower().split()}
    words = sorted(words | {"review", "sentiment", ":", "negative", "positive"})
    vocab = {w: i for i, w in enumerate(["<pad>", "<unk>", "<s>", "</s>", *words])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    tokenizer.save_pretrained(folder)
    config = transformers.LlamaConfig(
        vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, pad_token_id=0, bos_token_id=2, eos_token_id=3,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def test_run_tests_a_prompted_causal_lm_zero_shot_and_evaluate_reloads_it(tmp_path):
    lm = tiny_causal_lm(tmp_path / "lm")
    out = tmp_path / "run"
    args = [*FLAGS, *FAST_BATTERY, "--model", f"hf:{lm}", *TEMPLATE, "--importances", "all"]
    assert main(["run", *args, "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["model"]["encoder"] == "prompted" and results["training"] == {"zero_shot": True}
    assert results["prompt"]["label_words"] == {"negative": "negative", "positive": "positive"}
    assert results["prompt"]["prefix_tokens"] == 2 and results["prompt"]["suffix_tokens"] == 2
    assert "training" not in results["wall_time_s"]
    report = (out / "report.md").read_text()
    assert "LlamaForCausalLM zero-shot, prompt custom" in report and "nothing was trained" in report
    # the battery ran on the text tokens: the importances it could compute on this model are there
    assert "attention vs gradient" in results["kendall"] and "attention vs loo" in results["kendall"]
    assert "attention vs attention_flow" in results["kendall"]  # over the whole input's graph
    assert not list((out / "model").glob("*.safetensors"))  # the weights are the source's, not copied
    again = tmp_path / "again"
    assert (
        main(
            [
                "evaluate",
                str(out),
                *FAST_BATTERY,
                "--limit",
                "12",
                "--threads",
                "1",
                "--no-progress",
                "--out",
                str(again),
            ]
        )
        == 0
    )
    second = json.loads((again / "results.json").read_text())
    assert second["test"]["accuracy"] == results["test"]["accuracy"]
    assert second["kendall"]["attention vs gradient"] == results["kendall"]["attention vs gradient"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--prompt", "sentiment"], "--prompt needs --model hf:NAME or hf:PATH"),
        (["--label-words", "a", "b"], "--label-words applies to --prompt only"),
        (["--model", "hf:x", "--prompt", "sentiment", "--epochs", "2"], "--epochs: --prompt uses the model zero-shot"),
        (["--model", "hf:x", "--prompt", "sentiment", "--lr", "0.1"], "--lr: --prompt uses the model zero-shot"),
    ],
)
def test_prompt_flags_that_do_not_fit_are_refused_in_one_line(tmp_path, capsys, flags, message):
    assert main(["run", *FLAGS, *flags, "--out", str(tmp_path / "r")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_a_template_without_text_and_a_label_word_of_two_tokens_are_refused_before_any_run(tmp_path, capsys):
    lm = tiny_causal_lm(tmp_path / "lm")
    base = ["run", *FLAGS, "--model", f"hf:{lm}"]
    assert (
        main([*base, "--prompt", "review :", "--label-words", "negative", "positive", "--out", str(tmp_path / "a")])
        == 2
    )
    assert "neither a prompt's name" in capsys.readouterr().err
    words = ["--label-words", "negative", "very positive"]
    assert main([*base, "--prompt", "review : {text} sentiment :", *words, "--out", str(tmp_path / "b")]) == 2
    assert "label word 'very positive' (class 'positive') is 2 tokens" in capsys.readouterr().err


def test_a_stratified_limit_takes_the_first_of_each_class_in_the_splits_shares():
    from attnmetrics.app.factory import first_examples

    examples = [(f"p{i}", 1) for i in range(70)] + [(f"n{i}", 0) for i in range(30)]  # one class first, as SST
    assert first_examples(examples, 10) == examples[:10]
    kept = first_examples(examples, 10, stratify=True)
    assert [y for _, y in kept].count(1) == 7 and [y for _, y in kept].count(0) == 3
    assert kept == [e for e in examples if e in kept]  # file order kept
    assert [t for t, _ in kept] == [*(f"p{i}" for i in range(7)), *(f"n{i}" for i in range(3))]
    odd = first_examples(
        [("a", 0), ("b", 1), ("c", 2)] * 3, 4, stratify=True
    )  # largest remainders, ties in class order
    assert sorted(y for _, y in odd) == [0, 0, 1, 2]
    assert first_examples(examples, 500, stratify=True) == examples


def test_a_sweeps_prompts_axis_makes_the_prompts_a_groups_replicates(tmp_path):
    from attnmetrics.app.sweep.config import load_config

    config = tmp_path / "s.toml"
    config.write_text(
        '[sweep]\nout = "o"\n[defaults]\nmodel = "hf:smollm2"\n[[grid]]\nname = "g"\ndatasets = ["sst"]\n'
        'prompts = ["sentiment", "sentiment-plain"]\nseeds = [0, 1]\n'
    )
    cells = load_config(config, given_dirs={"sst": SST_SAMPLE}).cells
    assert len(cells) == 4 and len({c.name for c in cells}) == 4
    assert {c.group for c in cells} == {"g/sst-prompted-s0", "g/sst-prompted-s1"}
    assert {c.replicate for c in cells} == {"sentiment", "sentiment-plain"}
    assert all("--prompt" in c.flags for c in cells)
    plain = tmp_path / "p.toml"
    plain.write_text('[sweep]\nout = "o"\n[[grid]]\nname = "g"\ndatasets = ["sst"]\nseeds = [0, 1]\n')
    cells = load_config(plain, given_dirs={"sst": SST_SAMPLE}).cells
    assert all("--prompt" not in c.flags and c.replicate == c.axes["seed"] for c in cells)
    assert {c.name for c in cells} == {"sst-lstm-tanh-s0", "sst-lstm-tanh-s1"}


def test_the_sweep_report_says_where_the_replicates_are_prompts():
    from attnmetrics.app.sweep_report import _overview

    agg = {"cells": {}, "groups": {"g/sst-prompted-s0": {"replicates": "prompts"}, "h/sst-lstm-tanh": {}}}
    text = "\n".join(_overview(agg))
    assert "In g/sst-prompted-s0, a zero-shot prompted model's groups, the replicates are the prompts" in text
    assert "h/sst-lstm-tanh" not in text
    assert "replicates are the prompts" not in "\n".join(_overview({"cells": {}, "groups": {"h/x": {}}}))


def test_a_one_word_text_runs_through_the_whole_battery(tmp_path):
    """SST sentences of one word (one token for the word-level tokenizer): leave-one-out and ERASER's
    comprehensiveness delete the whole text, which leaves the template (lead = trail = 0, yet never an
    empty input); the battery runs them instead of refusing the data set."""
    import shutil

    data = tmp_path / "sst"
    shutil.copytree(SST_SAMPLE, data)
    test = data / "test.txt"
    test.write_text("(4 (4 good))\n(0 (0 awful))\n" + test.read_text())
    lm = tiny_causal_lm(tmp_path / "lm")
    out = tmp_path / "run"
    flags = [*FLAGS, *FAST_BATTERY, "--data-dir", str(data), "--limit", "6", "--importances", "all"]
    assert main(["run", *flags, "--model", f"hf:{lm}", *TEMPLATE, "--out", str(out)]) == 0
    instances = json.loads((out / "results.json").read_text())["instances"]
    assert instances["lengths"][:2] == [1, 1] and min(instances["lengths"][2:]) > 1
    # every ordering deletes the one token: one comprehensiveness a row, the same for all, finite
    for row in (0, 1):
        values = {name: m["comprehensiveness"]["aopc"][row] for name, m in instances["eraser"].items()}
        assert len(values) >= 10 and all(isinstance(v, float) for v in values.values()), values
        assert max(values.values()) - min(values.values()) < 1e-6, values
