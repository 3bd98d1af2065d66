"""The argument parser of the ``attnmetrics`` command line: every subcommand's options.

Kept apart from the command line (:mod:`attnmetrics.app.cli`) and its commands so that the sweep runner can read
``run``'s options without importing the command line that runs sweeps.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from attnmetrics.app.argtypes import float_between, int_between, non_negative_float, non_negative_int, positive_int
from attnmetrics.app.battery import DEFAULT_ORDERS, EXPERIMENTS, importances
from attnmetrics.app.battery.registry import ALL, optional_names
from attnmetrics.app.recipes import PRESETS
from attnmetrics.data import DATASETS, GUTENBERG_HELD_OUT
from attnmetrics.flip import ORDERS
from attnmetrics.models.classifier import ATTENTIONS, ENCODERS, REGULARISERS
from attnmetrics.models.gpt import CONFIGS as GPT_CONFIGS
from attnmetrics.models.gpt import MAX_SIZES as GPT_MAX_SIZES
from attnmetrics.models.gpt_classifier import EXTRACT_READOUT
from attnmetrics.models.pretraining import PretrainConfig


def dataset_folder(text: str) -> tuple[str, Path]:
    """An argparse type: ``DATASET=FOLDER`` -> (dataset, folder)."""
    dataset, sep, folder = text.partition("=")
    if not sep or not dataset or not folder:
        raise argparse.ArgumentTypeError(f"must be DATASET=FOLDER (e.g. sst=path/to/sst), got {text!r}")
    return dataset, Path(folder)


#: ``--max-length`` of a Hugging Face model: [CLS]/[SEP] and two real tokens at least. Not 3: a
#: row of one real token has no Kendall tau and no flip (the battery tests rows of two or more;
#: battery/flip.py), so every statistic would have n = 0. GPT-2-like models add no specials and
#: could go lower, but 4 is the one bound that holds for both families at parse time, before the
#: tokenizer loads (tests/app/test_hf_run.py). The model's position limit is checked when it is
#: loaded (app/factory.py)
MIN_HF_LENGTH, MAX_HF_LENGTH = 4, 1 << 16


def positive_float(text: str) -> float:
    """An argparse type: a finite float > 0."""
    value = float(text)
    if not (0 < value < float("inf")):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


DESCRIPTION = """``attnmetrics``: train an attention classifier on real data, run the faithfulness battery,
write a report."""


def _add_data_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--protocol",
        choices=sorted(PRESETS),
        default="attnmetrics",
        help="jain-wallace: follow J&W's code where our defaults differ (SST length filter, positive-class "
        "weight, length-sorted batches, their adversarial weighting; docs/definitions.md §13)",
    )
    p.add_argument(
        "--dataset",
        choices=DATASETS,
        default="mr",
        metavar="NAME",
        help=f"dataset: {', '.join(DATASETS)} or any bbc:A-B topic pair (default: mr, the SST stand-in)",
    )
    p.add_argument("--data-dir", type=Path, help="folder with the dataset's files (sst: train.txt, dev.txt, test.txt)")
    p.add_argument("--limit", type=positive_int, help="use only the first N examples of each split (quick runs)")
    p.add_argument(
        "--test-limit",
        type=positive_int,
        metavar="N",
        help="use only the first N test examples (with --stratify, in the class shares), train and dev whole: "
        "the battery on a slice of the test split, the model trained on everything (after --limit)",
    )
    p.add_argument(
        "--stratify",
        action="store_true",
        help="--limit and --test-limit take the first examples of each class, in the split's class shares (SST's files list "
        "one class first: its first N are nearly all positive)",
    )
    p.add_argument(
        "--max-tokens", type=positive_int, help="truncate texts to N tokens (default: 400 for bbc, none otherwise)"
    )
    p.add_argument(
        "--split-seed",
        type=int_between(0, 2**32 - 1, " (numpy's seed range, as --seed)"),
        default=0,
        help="seed of the train/dev/test split, independent of --seed (default: 0)",
    )


def model_source(text: str) -> str:
    """An argparse type: ``hf:minilm``, ``hf:smollm2`` or ``hf:PATH`` (a Hugging Face checkpoint
    folder or a GGUF file)."""
    if not text.startswith("hf:") or len(text) == 3:
        raise argparse.ArgumentTypeError(
            f"expected hf:minilm, hf:smollm2 or hf:PATH (a Hugging Face checkpoint folder or GGUF file), got {text!r}"
        )
    return text


def _add_gpt_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("GPT-1 (--encoder gpt; Radford et al. 2018)")
    g.add_argument(
        "--pretrained",
        type=Path,
        help="fine-tune the GPT pre-trained in this folder ('attnmetrics pretrain'); without it the model "
        "trains from scratch (the paper's no-pre-training ablation) with a BPE learnt on the training split",
    )
    g.add_argument(
        "--lm-weight", type=non_negative_float, help="λ of the auxiliary language-model loss (default: 0.5; 0: off)"
    )
    g.add_argument(
        "--transfer-layers",
        type=non_negative_int,
        help="transfer the embeddings and the first N pre-trained blocks only (default: all)",
    )
    g.add_argument("--gpt-config", choices=sorted(GPT_CONFIGS), help="model size without --pretrained (default: small)")
    g.add_argument(
        "--grad-clip",
        type=non_negative_float,
        metavar="NORM",
        help="clip the global gradient norm at NORM in fine-tuning (default: 1, GPT-1's code; 0: off)",
    )
    g.add_argument(
        "--warmup",
        type=float_between(0, 1, high_open=True),
        help="linear warm-up, as a fraction of the steps (default: gpt 0.002, GPT-1's; hf 0.1, BERT's)",
    )


def _add_train_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        type=model_source,
        help="fine-tune a Hugging Face sequence classifier instead of --encoder: hf:minilm (all-MiniLM-L6-v2, "
        "fetched once), hf:smollm2 (SmolLM2-135M-Instruct, GGUF Q4_1, fetched once; needs .[llm]) or hf:PATH "
        "(a local checkpoint folder or GGUF file; BERT-like, GPT-2-like or Llama-layout: Llama, Qwen2, "
        "Mistral); the battery tests its own attention (the last layer's pooled row, per head)",
    )
    p.add_argument(
        "--prompt",
        metavar="NAME|TEMPLATE",
        help="use --model's causal language model zero-shot through a prompt, nothing trained: a shipped prompt "
        "(sentiment, sentiment-oneword, sentiment-plain for sst/mr; topic for bbc) or a template holding {text}, "
        "with --label-words; the classes' probabilities are the softmax over the label words' next-token logits "
        "at the answer position; only the text's tokens are explained (Llama-layout models)",
    )
    p.add_argument(
        "--label-words",
        nargs="+",
        metavar="WORD",
        help="--prompt: one word per class in the data set's class order, each one token of the model's "
        "tokenizer, with its leading space where the template puts one (e.g. ' negative' ' positive')",
    )
    p.add_argument(
        "--train-last-layers",
        type=int_between(0, 10_000, ""),
        metavar="K",
        help="--model hf: fine-tune the head and the last K layers only, the embeddings and the other layers "
        "frozen (a decoder LLM on the CPU; default: every parameter)",
    )
    p.add_argument(
        "--max-length",
        type=int_between(MIN_HF_LENGTH, MAX_HF_LENGTH, " (the specials and at least two real tokens)"),
        default=64,
        help=f"--model hf: truncate to N tokens, specials included (>= {MIN_HF_LENGTH}; at most the model's "
        "position limit)",
    )
    p.add_argument(
        "--encoder",
        choices=sorted(ENCODERS) + ["gpt"],
        default="lstm",
        help="encoder (default: lstm, a BiLSTM; gpt: a GPT-1 transformer, fine-tuned)",
    )
    p.add_argument(
        "--attention",
        choices=sorted(ATTENTIONS) + [EXTRACT_READOUT],
        default="tanh",
        help="attention (default: tanh, additive); gpt also takes extract, GPT-1's own read-out of the "
        "<extract> state, which weighs no token (the battery then does not apply)",
    )
    p.add_argument(
        "--embeddings",
        choices=("glove", "random"),
        help="initialise embeddings from GloVe 6B 50-d (default) or at random (default for babi1-3, as J&W)",
    )
    p.add_argument(
        "--embed-dim", type=positive_int, help="embedding size with --embeddings random (default: 300; 50 for babi)"
    )
    p.add_argument(
        "--hidden-size",
        type=positive_int,
        help="units per direction for lstm/gru; the whole H for cnn (a multiple of 4) and average (default: 128; "
        "32 for babi, J&W's)",
    )
    p.add_argument("--epochs", type=positive_int, help="default: 8 (J&W), 3 for gpt (GPT-1)")
    p.add_argument("--batch-size", type=positive_int, help="training batch size (default: 32, J&W's; 50 for babi)")
    p.add_argument("--lr", type=positive_float, help="default: 1e-3 (J&W), 6.25e-5 for gpt (GPT-1)")
    p.add_argument("--weight-decay", type=non_negative_float, help="default: 1e-5 (J&W), 0.01 for gpt (GPT-1)")
    p.add_argument(
        "--regulariser",
        choices=REGULARISERS,
        default="none",
        help="Tutek & Šnajder 2020: concat/residual (embedding past the encoder), tying/mlm (auxiliary loss)",
    )
    p.add_argument(
        "--tying-weight", type=non_negative_float, default=1.0, help="weight of the tying loss (--regulariser tying)"
    )
    p.add_argument(
        "--mlm-weight", type=non_negative_float, default=1.0, help="weight of the masked-LM loss (--regulariser mlm)"
    )


def _add_wiegreffe_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--consistent-adversary",
        nargs="+",
        type=non_negative_float,
        metavar="LAMBDA",
        help="Wiegreffe & Pinter 2019: train a model-consistent adversary for each λ",
    )
    p.add_argument(
        "--diagnostic",
        action="store_true",
        help="Wiegreffe & Pinter 2019: diagnostic MLPs with uniform/trained/base/adversary attention",
    )


def _add_battery_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--skip", nargs="+", default=[], choices=EXPERIMENTS, help="experiments to leave out")
    p.add_argument(
        "--permutations", type=positive_int, default=100, help="attention permutations per instance (J&W: 100)"
    )
    p.add_argument(
        "--adversarial-steps", type=positive_int, default=500, help="Adam steps of the adversarial search (J&W: 500)"
    )
    p.add_argument(
        "--adversarial-optimiser",
        choices=("adam", "amsgrad"),
        default=None,
        help="the adversarial search's optimiser: Adam (the paper; the default) or Adam with AMSGrad (J&W's "
        "code, model/Binary_Classification.py:38; the default of --protocol jain-wallace)",
    )
    p.add_argument(
        "--orders",
        nargs="+",
        default=list(DEFAULT_ORDERS),
        choices=ORDERS,
        help="removal orderings for the flip search",
    )
    p.add_argument("--random-samples", type=positive_int, default=1, help="random permutations per instance")
    for importance in importances():  # the optional importances' flags, each declared by its module
        if importance.option:
            flags, kwargs = importance.option["flags"], {k: v for k, v in importance.option.items() if k != "flags"}
            p.add_argument(*flags, **kwargs)
    names = optional_names()
    p.add_argument(
        "--importances",
        nargs="+",
        default=[],
        choices=(ALL, *names),
        metavar="NAME",
        help=f"turn on these optional importances ({', '.join(names)}), or {ALL}: every one that applies to the "
        "model (the attributions: BERT-like Hugging Face models and our GPT with --attention extract; integrated "
        "gradients and gradient x input: where Captum is installed); with their own flags, those win (e.g. "
        "--integrated-gradients STEPS). Default: none",
    )
    p.add_argument(
        "--examples",
        type=non_negative_int,
        default=6,
        help="instances shown in report.html (most and least faithful by the flip search, and random ones); 0: none",
    )
    p.add_argument(
        "--never-flipped",
        choices=("nan", "one"),
        default="nan",
        help="fraction for rows that never flip: NaN and left out (S&S), or 1.0 (Mohankumar et al.)",
    )
    p.add_argument(
        "--random-removal",
        choices=("non-top", "all", "not-first"),
        default="non-top",
        help="the tokens the random single removal draws among: every token but the top one (S&S, default), "
        "every token, or every token but the first (S&S's test_model.py as it runs; docs/definitions.md §5)",
    )
    p.add_argument(
        "--eraser-rounding",
        choices=("ceil", "floor", "decompx"),
        default="ceil",
        help="ERASER's k from a fraction f of L tokens: ceil(f L) (default), or floor(f L) with k = 0 fractions "
        "left out of the AOPC (docs/definitions.md §18), or decompx: DecompX's floor(L * f) of the float product "
        "with k = 0 fractions counted (Table 1)",
    )
    p.add_argument(
        "--eraser-aopc",
        choices=("eraser", "alti"),
        default="eraser",
        help="ERASER's AOPC: the mean over the fractions (default), or alti: ALTI's (Ferrando et al. 2022, aupc.py) "
        "running minimum (comprehensiveness) / maximum (sufficiency, from the empty rationale) of the "
        "probability, the drops summed over the fractions and divided by their number + 1",
    )
    p.add_argument(
        "--eraser-fractions",
        choices=("eraser", "decompx"),
        default="eraser",
        help="ERASER's fractions: eraser (1, 5, 10, 20, 50 %%, default) or decompx (10, 20, ..., 90 %%, DecompX's "
        "Table 1; with --eraser-rounding decompx and --eraser-mask-token the [MASK] id)",
    )
    p.add_argument(
        "--eraser-mask-token",
        type=non_negative_int,
        metavar="ID",
        help="ERASER replaces the removed tokens by this token id (mode mask, e.g. 103: bert-base-uncased's [MASK], "
        "as DecompX's Table 1) instead of deleting them (default)",
    )
    p.add_argument(
        "--attribution-aggregation",
        choices=("sum", "l2", "mean_abs"),
        default="sum",
        help="a token's integrated-gradients and gradient x input score from its attribution vector: |sum over "
        "the embedding| (default), l2: its L2 norm (ALTI's and DecompX's), mean_abs: the mean absolute value (ALTI's)",
    )
    p.add_argument(
        "--resumable",
        action="store_true",
        help="keep each finished battery block (32 instances on the CPU) in .OUT.battery beside --out, and when "
        "the same command is started again after a kill or a time limit, continue from the blocks it finished "
        "(the same flags, model weights and test instances, else refused); removed once --out is written",
    )


def _add_common_args(p: argparse.ArgumentParser, out_required: bool = False) -> None:
    where = "required" if out_required else "default: runs/DATASET-ENCODER, e.g. runs/mr-lstm"
    p.add_argument("--out", type=Path, required=out_required, help=f"run folder to write ({where})")
    p.add_argument("--overwrite", action="store_true", help="replace an existing run folder")
    _add_runtime_args(p)


def _add_runtime_args(p: argparse.ArgumentParser) -> None:
    """Seed, threads, device, progress and error display: every command that trains."""
    p.add_argument(
        "--seed",
        type=int_between(0, 2**32 - 1, " (torch's and numpy's seed range)"),
        default=0,
        help="seed of the weights' initialisation, batches and the battery (default: 0)",
    )
    p.add_argument("--debug", action="store_true", help="on an input error, show the traceback, not one line")
    p.add_argument(
        "--threads",
        type=positive_int,
        default=1,
        help="torch intra-op threads (default: 1; with more, another busy process on the machine slows every "
        "step many times over: benchmarks/test_bench_contention.py)",
    )
    p.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="where the model trains and the battery runs (default: cpu)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="attnmetrics", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="train a model, run every experiment, write a report")
    tr = sub.add_parser("train", help="train a model and save it in a run folder")
    ev = sub.add_parser("evaluate", help="run the experiments on a saved model")
    ev.add_argument("model_run", type=Path, help="run folder written by 'train' or 'run'")
    for p in (run, tr):
        _add_data_args(p)
        _add_train_args(p)
        _add_gpt_args(p)
    for p in (run, ev):
        _add_battery_args(p)
    _add_wiegreffe_args(run)
    _add_common_args(run)
    _add_common_args(tr)
    _add_common_args(ev, out_required=True)
    ev.add_argument("--data-dir", type=Path, help="dataset folder, if not the one the model was trained with")
    ev.add_argument("--limit", type=positive_int, help="use only the first N test examples")
    rep = sub.add_parser("report", help="re-render a run's report.md and figures, or compare several runs")
    rep.add_argument("run_dirs", type=Path, nargs="+", help="run folders holding results.json")
    rep.add_argument("--out", type=Path, help="folder for comparison.md (needed with several runs)")
    rep.add_argument("--overwrite", action="store_true", help="replace an existing comparison.md in --out")
    _add_sweep_args(sub.add_parser("sweep", help="run a grid of 'run' cells (resumable), then one aggregated report"))
    _add_pretrain_args(sub.add_parser("pretrain", help="pre-train a GPT language model on the Gutenberg books"))
    return parser


def _add_pretrain_args(p: argparse.ArgumentParser) -> None:
    defaults = PretrainConfig()
    p.add_argument("--out", type=Path, default=Path("runs/gpt-pre"), help="checkpoint folder (default: runs/gpt-pre)")
    p.add_argument("--config", choices=sorted(GPT_CONFIGS), help="model size (default: small)")
    for flag, help_, field, least in (
        ("--layers", "layers", "n_layer", 1),
        ("--d-model", "model width", "d_model", 1),
        ("--heads", "heads", "n_head", 1),
        # a fine-tuned classifier's row is <start>, at least one token, <extract>
        ("--context", "context length", "context", 3),
    ):
        p.add_argument(
            flag,
            type=int_between(least, GPT_MAX_SIZES[field]),
            help=f"override the config's {help_} ({least} to {GPT_MAX_SIZES[field]})",
        )
    p.add_argument(
        "--dropout",
        type=float_between(0, 1, high_open=True),
        help="override the config's residual, embedding and attention dropout (GPT-1: 0.1)",
    )
    p.add_argument("--steps", type=positive_int, help=f"optimiser steps (default: {defaults.steps})")
    p.add_argument(
        "--batch-size",
        type=positive_int,
        help=f"context windows per step (default: {defaults.batch_size})",
    )
    p.add_argument("--lr", type=positive_float, help=f"max learning rate (default and GPT-1's: {defaults.lr:g})")
    p.add_argument(
        "--warmup",
        type=non_negative_int,
        help=f"linear warm-up steps, then cosine decay (default: {defaults.warmup})",
    )
    p.add_argument(
        "--vocab-size",
        type=int_between(1, GPT_MAX_SIZES["vocab_size"]),
        help=f"BPE vocabulary size (default: {defaults.vocab_size})",
    )
    p.add_argument("--max-chars", type=positive_int, help="use only the first N characters of each book (quick runs)")
    p.add_argument(
        "--corpus",
        type=Path,
        help="pre-train on the UTF-8 .txt files in this folder instead of NLTK's Gutenberg books (one book a file)",
    )
    p.add_argument(
        "--held-out",
        metavar="FILE",
        help=f"the book (file name) kept for validation perplexity (default: {GUTENBERG_HELD_OUT})",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out from its latest checkpoint (flags that set the run must be the checkpoint's)",
    )
    _add_runtime_args(p)


def _add_sweep_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", type=Path, help="sweep config (TOML; see configs/sweep.toml)")
    p.add_argument("--out", type=Path, help="sweep folder (default: [sweep] out of the config)")
    p.add_argument("--jobs", type=positive_int, help="cells run at once (default: [sweep] jobs, else 1)")
    p.add_argument(
        "--data-dir",
        type=dataset_folder,
        action="append",
        metavar="DATASET=FOLDER",
        help="a dataset's folder, e.g. sst=path/to/sst (repeatable; overrides the config's [sweep] data_dirs)",
    )
    p.add_argument(
        "--executor",
        choices=("local", "slurm", "submitit-local"),
        help="where cells run: subprocesses here, Slurm jobs through submitit, or submitit's local executor "
        "(default: [sweep] executor, else local)",
    )
    slurm = p.add_argument_group("Slurm jobs (--executor slurm; default: the [sweep.slurm] table)")
    slurm.add_argument("--partition", help="Slurm partition")
    slurm.add_argument("--time-min", type=positive_int, help="time limit per cell, minutes")
    slurm.add_argument("--gpus", type=non_negative_int, help="GPUs per cell")
    slurm.add_argument("--cpus", type=positive_int, help="CPUs per cell")
    slurm.add_argument("--mem-gb", type=positive_int, help="memory per cell, GB")
    p.add_argument("--dry-run", action="store_true", help="list the cells and their commands, run nothing")
    p.add_argument("--report-only", action="store_true", help="aggregate the finished cells, run nothing")
    p.add_argument("--overwrite", action="store_true", help="rerun finished cells whose flags changed")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
