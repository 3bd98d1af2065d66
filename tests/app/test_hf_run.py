"""`attnmetrics run --model hf:PATH` end to end on a slice of the real SST: a tiny randomly initialised
BERT saved as a Hugging Face checkpoint folder (with a WordPiece tokenizer over SST's words), fine-tuned,
the battery on its own attention, then `evaluate` on the saved checkpoint gives the same numbers."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch

transformers = pytest.importorskip("transformers")

from attnmetrics.app.cli import main  # noqa: E402
from attnmetrics.attributions import METHODS as ATTRIBUTIONS  # noqa: E402
from attnmetrics.data import load_dataset  # noqa: E402
from tests.inputs import FAST_BATTERY, SST_SAMPLE  # noqa: E402

FLAGS = ["--dataset", "sst", "--data-dir", str(SST_SAMPLE), "--limit", "120", "--threads", "1", "--no-progress"]


def tiny_bert(folder, **overrides):
    """A tiny random BERT classifier and a WordPiece tokenizer over SST's words, saved in ``folder``
    (``overrides``: BertConfig's fields beside the tiny sizes)."""
    folder.mkdir(exist_ok=True)
    splits = load_dataset("sst", data_dir=SST_SAMPLE)
    words = sorted({w for text, _ in splits.train[:400] for w in text.lower().split()})
    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words])}
    # transformers 5 ignores vocab_file= here (a tokenizer of the 5 special tokens: every word [UNK])
    tokenizer = transformers.BertTokenizerFast(vocab=vocab, do_lower_case=True)
    assert tokenizer(words[0])["input_ids"][1] == vocab[words[0]]
    tokenizer.save_pretrained(folder)
    config = transformers.BertConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=128, **overrides,
    )  # fmt: skip
    torch.manual_seed(0)  # the same weights whichever tests ran before
    transformers.BertForSequenceClassification(config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


def test_run_fine_tunes_a_local_checkpoint_and_tests_its_own_attention(checkpoint, tmp_path):
    out = tmp_path / "run"
    assert main(["run", *FLAGS, *FAST_BATTERY, "--model", f"hf:{checkpoint}", "--epochs", "1", "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert "own attention" in results["battery"] and results["model"]["encoder"] == "hf"
    assert results["training"]["config"]["lr"] == 5e-5 and results["training"]["config"]["warmup"] == 0.1
    assert len(results["heads"]["max attention"]) == 4  # per head
    assert {"flip", "kendall", "permutation", "adversarial", "single_removal", "eraser"} <= set(results)
    assert "rollout" in results["flip"] and "attention vs rollout" in results["kendall"]  # a transformer's extra
    assert "rollout" in results["eraser"] and "rollout" in results["examples"][0]["scores"]
    tokens = [t for e in results["examples"] for t in e["tokens"]]
    assert "[CLS]" not in tokens and "[SEP]" not in tokens  # only the real tokens are shown and tested
    again = tmp_path / "again"
    assert (
        main(
            [
                "evaluate",
                str(out),
                *FAST_BATTERY,
                "--limit",
                "120",
                "--threads",
                "1",
                "--no-progress",
                "--out",
                str(again),
            ]
        )
        == 0
    )
    reloaded = json.loads((again / "results.json").read_text())
    assert reloaded["test"] == results["test"]
    assert reloaded["flip"] == results["flip"] and reloaded["eraser"] == results["eraser"]


def test_a_folder_without_a_checkpoint_is_named(tmp_path, capsys):
    assert main(["run", *FLAGS, "--model", f"hf:{tmp_path}", "--out", str(tmp_path / "r")]) == 2
    assert "is not a Hugging Face checkpoint folder (no config.json)" in capsys.readouterr().err


def test_a_max_length_past_the_position_limit_is_refused_before_training(checkpoint, tmp_path, capsys):
    # issue 31, item 8: a transformers traceback at the first long batch, or none at all
    out = tmp_path / "r"
    args = ["run", *FLAGS, "--model", f"hf:{checkpoint}", "--max-length", "129", "--out", str(out)]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--max-length 129" in err and "position limit 128" in err, err
    assert not out.exists()


def test_the_least_max_length_leaves_two_real_tokens_to_test(checkpoint):
    # issue 31, item 11: why --max-length starts at 4 (not 3, [CLS] x [SEP]): a row of one real
    # token has no Kendall tau and no flip (the battery needs two, attnmetrics/app/battery/flip.py
    # lengths > 1), so at 3 every statistic had n = 0. GPT-2-like models add no specials; 4 is the
    # one bound at parse time that holds for both families without loading the tokenizer
    from attnmetrics.app.parser import MIN_HF_LENGTH
    from attnmetrics.models.hf import HFInputs

    tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint)
    specials = tokenizer.num_special_tokens_to_add(pair=False)
    text = "the film is good and the cast is fine"
    assert specials == 2 and MIN_HF_LENGTH == specials + 2
    assert [len(ids) - specials for ids in HFInputs(tokenizer, MIN_HF_LENGTH).encode([text])] == [2]
    assert [len(ids) - specials for ids in HFInputs(tokenizer, MIN_HF_LENGTH - 1).encode([text])] == [1]


def test_importances_all_puts_the_attributions_in_the_methods_table(tmp_path):
    # issue 28: --importances all on a BERT-like model computes the seven attention-derived
    # attributions beside attention, gradient, leave-one-out and rollout (integrated gradients
    # and gradient x input too where Captum is installed), and the report's table has them all
    from tests.app.test_methods import check_against, plain_table

    # weights drawn wider than BERT's 0.02, so that this briefly trained model's output depends on
    # its input enough for leave-one-out, ERASER and the flip search to tell the orderings apart
    checkpoint = tiny_bert(tmp_path / "bert", initializer_range=0.1)
    out = tmp_path / "run"
    skip = ["--skip", "permutation", "adversarial", "single_removal", "single_token", "--examples", "0"]
    args = [*FLAGS, *skip, "--model", f"hf:{checkpoint}", "--epochs", "1", "--integrated-gradients", "2"]
    assert main(["run", *args, "--importances", "all", "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    rows = [r["method"] for r in results["methods"]["methods"]]
    assert {"attention", "gradient", "loo", "rollout", *ATTRIBUTIONS} <= set(rows)
    inst = results["instances"]
    kendall = {k: v["tau"] for k, v in inst["kendall"].items()}
    eraser = {k: {m: w["aopc"] for m, w in v.items()} for k, v in inst["eraser"].items()}
    check_against(results["methods"], plain_table(kendall, eraser, inst["flip"], inst["lengths"]))
    # the model reads its tokens: τ is defined and the orderings' AOPCs differ (an all-[UNK] input would tie them)
    assert results["methods"]["rows"]["tau_loo"] > 0
    assert len({round(r["comprehensiveness"]["mean"], 9) for r in results["methods"]["methods"]}) > 3
    report = (out / "report.md").read_text()
    assert "## The explanation methods side by side" in report and (out / "methods.png").stat().st_size > 0
    table = report.split("## The explanation methods side by side")[1]
    for name in ("value_norm", "globenc", "alti", "value_zeroing", "chefer", "decompx", "attention_flow"):
        assert f"| {name} " in table


#: the battery's cheapest run: what the tests of loading need is that it runs at all
SKIP = ["--skip", "permutation", "adversarial", "single_removal", "single_token", "--examples", "0"]


def test_a_half_precision_checkpoint_is_upcast_to_float32_and_said_so(checkpoint, tmp_path, capsys):
    # transformers loads a checkpoint in its own dtype: a float16 one was fine-tuned in float16, to
    # NaN logits, and run stopped after training on scikit-learn's "Input contains NaN."
    half = tmp_path / "half"
    shutil.copytree(checkpoint, half)
    transformers.BertForSequenceClassification.from_pretrained(half).to(torch.float16).save_pretrained(half)
    out = tmp_path / "run"
    args = ["run", *FLAGS, *FAST_BATTERY, *SKIP, "--model", f"hf:{half}", "--epochs", "1", "--out", str(out)]
    assert main(args) == 0
    assert f"attnmetrics: {half}: its weights are float16; upcast to float32 to train and test it" in (
        capsys.readouterr().err
    )
    results = json.loads((out / "results.json").read_text())
    assert results["pretrained"]["upcast_from"] == "float16" and results["model"]["hf_config"]["dtype"] == "float32"
    assert math.isfinite(results["training"]["history"][0]["dev_loss"])
    # evaluate's loader, on a run folder saved in float16 (its model.json and weights)
    saved = out / "model"
    meta = json.loads((saved / "model.json").read_text())
    meta["model"]["hf_config"]["dtype"] = "float16"
    (saved / "model.json").write_text(json.dumps(meta))
    weights = torch.load(saved / "model.pt", weights_only=True)
    torch.save({k: v.half() if v.is_floating_point() else v for k, v in weights.items()}, saved / "model.pt")
    again = ["evaluate", str(out), *FAST_BATTERY, *SKIP, "--limit", "120", "--threads", "1", "--no-progress"]
    assert main([*again, "--out", str(tmp_path / "again")]) == 0
    assert f"attnmetrics: {saved}: its weights are float16; upcast to float32" in capsys.readouterr().err
    reloaded = json.loads((tmp_path / "again" / "results.json").read_text())
    assert reloaded["model"]["hf_config"]["dtype"] == "float32" and math.isfinite(reloaded["test"]["loss"])


def test_a_folder_without_tokenizer_files_is_refused_before_training(checkpoint, tmp_path, capsys):
    # transformers built a tokenizer of the 5 special tokens: the model trained and was tested on [UNK] alone
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(checkpoint / name, bare)
    out = tmp_path / "r"
    assert main(["run", *FLAGS, "--model", f"hf:{bare}", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"attnmetrics: {bare} has no tokenizer files (expected tokenizer.json or vocab.txt)")
    assert not out.exists()


def tiny_llama(folder, family: str = "llama"):
    """A tiny random Llama-layout decoder (grouped-query attention) and a word-level tokenizer over
    SST's words (a Llama tokenizer's files, tokenizer.json), saved in ``folder``."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from tests.models.test_hf import DECODERS

    folder.mkdir(exist_ok=True)
    splits = load_dataset("sst", data_dir=SST_SAMPLE)
    words = sorted({w for text, _ in splits.train[:400] for w in text.lower().split()})
    vocab = {w: i for i, w in enumerate(["<pad>", "<unk>", "<s>", "</s>", *words])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    tokenizer.save_pretrained(folder)
    config_class, model_class, extra = DECODERS[family]
    config = getattr(transformers, config_class)(
        vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=128, pad_token_id=0, bos_token_id=2, eos_token_id=3, **extra,
    )  # fmt: skip
    torch.manual_seed(0)
    getattr(transformers, model_class)(config).save_pretrained(folder)
    return folder


def test_run_tests_a_llama_layout_decoders_own_attention(tmp_path):
    # issue 46, item 1: a Llama-layout decoder (grouped-query attention) fine-tuned with a head on
    # its last real token, the battery on its last layer's attention there, rollout and attention
    # flow beside it; the attention-derived attributions of attnmetrics.llm (ALTI-Logit among them),
    # GlobEnc and DecompX left out (no norm on a pre-norm layer's sum; no rule for the gated MLP)
    checkpoint = tiny_llama(tmp_path / "llama")
    out = tmp_path / "run"
    args = [*FLAGS, *FAST_BATTERY, "--model", f"hf:{checkpoint}", "--epochs", "1", "--importances", "all"]
    assert main(["run", *args, "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["model"]["architecture"] == "LlamaForSequenceClassification"
    assert len(results["heads"]["max attention"]) == 4  # per query head
    assert {"flip", "kendall", "permutation", "adversarial", "single_removal", "eraser"} <= set(results)
    assert "rollout" in results["flip"] and "attention_flow" in results["eraser"]
    for name in ("value_norm", "alti", "alti_logit", "value_zeroing", "chefer"):
        assert name in results["eraser"] and f"attention vs {name}" in results["kendall"], name
    assert "decompx" not in results["eraser"] and "globenc" not in results["eraser"]
    tokens = [t for e in results["examples"] for t in e["tokens"]]
    assert tokens and "<s>" not in tokens  # the text's own ids: no special token tested as a word
    assert (out / "report.md").read_text().startswith("# attnmetrics report: sst / LlamaForSequenceClassification")


def test_texts_cut_to_max_length_are_counted_and_said(checkpoint, tmp_path, capsys):
    # issue 46, item 8: a text longer than the limit is cut, never silently
    from attnmetrics.models.hf import HFInputs

    tokenizer = transformers.AutoTokenizer.from_pretrained(checkpoint)
    inputs = HFInputs(tokenizer, max_length=5)
    ids = inputs.encode(["the film is good and the cast is fine", "good"])
    assert inputs.last_truncated == 1 and len(ids[0]) == 5 and ids[0][-1] == tokenizer.sep_token_id
    assert HFInputs(tokenizer, max_length=64).encode_split([("good", 1)]).truncated == 0
    out = tmp_path / "run"
    args = [*FLAGS, *FAST_BATTERY, "--model", f"hf:{checkpoint}", "--epochs", "1", "--max-length", "6"]
    assert main(["run", *args, "--skip", "adversarial", "permutation", "--out", str(out)]) == 0
    truncated = json.loads((out / "results.json").read_text())["data"]["truncated"]
    err = capsys.readouterr().err
    for split in ("train", "dev", "test"):
        assert 0 < truncated[split] <= 120
        assert f"attnmetrics: {truncated[split]} of 120 {split} texts are longer than --max-length 6 tokens" in err


def test_train_last_layers_fine_tunes_a_decoder_s_head_and_last_layers(tmp_path):
    checkpoint = tiny_llama(tmp_path / "llama")
    out = tmp_path / "run"
    args = [*FLAGS, *FAST_BATTERY, "--model", f"hf:{checkpoint}", "--epochs", "1", "--train-last-layers", "1"]
    assert main(["run", *args, "--out", str(out)]) == 0
    trained = json.loads((out / "results.json").read_text())["pretrained"]["trained"]
    assert trained["last_layers"] == 1 and trained["layers"] == 2 and 0 < trained["parameters"] < trained["of"]


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--encoder", "lstm"], "--train-last-layers applies to --model hf:"),
        (["--model", "hf:minilm", "--prompt", "sentiment"], "--train-last-layers: --prompt uses the model zero-shot"),
    ],
)
def test_train_last_layers_is_refused_where_nothing_fine_tunes(tmp_path, capsys, flags, message):
    assert main(["run", *FLAGS, *flags, "--train-last-layers", "1", "--out", str(tmp_path / "run")]) == 2
    assert message in capsys.readouterr().err
