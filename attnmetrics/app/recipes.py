"""Training presets, in one place: the recipe defaults of each model family (:data:`RECIPES`,
filled in by :func:`recipe_defaults`) and the ``--protocol`` presets (:data:`PRESETS`).

``--protocol jain-wallace`` follows Jain & Wallace's code where attnmetrics' defaults differ
(docs/definitions.md §13); the default, ``attnmetrics``, changes nothing. (The flag and the
``protocol`` key of results.json keep their names; in the code, "protocol" means only the model
interface, :mod:`attnmetrics.protocol`.)

What the preset sets (each recorded under ``protocol`` in results.json):

- SST length filter (their preprocessing): sentences of at most 5 tokens are dropped, and the
  longest sentence of each split, which leaves 6,355 / 1,725 train / test sentences (J&W's
  Table 1); the other datasets are not filtered.
- Training: a positive-class weight N / N_pos - 1 in the binary loss, batches of rows of similar
  length in a shuffled order, AMSGrad (which attnmetrics uses by default too).
- Adversarial attention: their weighting of the candidates' diversity term, 6.25 times smaller
  than attnmetrics' (``diversity_weight = 0.16``), and their optimiser, Adam with AMSGrad
  (``adversarial_amsgrad``; ``AdversaryMulti``, model/Binary_Classification.py:38).
  ``--adversarial-optimiser adam|amsgrad`` overrides it.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass

from attnmetrics.data import Splits
from attnmetrics.data.tokens import tokenize


@dataclass(frozen=True)
class Preset:
    """A ``--protocol`` preset: what it changes, recorded under ``protocol`` in results.json."""

    name: str
    sst_length_filter: bool = False  # drop sentences of <= 5 tokens and each split's longest
    pos_weight: str | None = None  # "balanced": N / N_pos - 1 on the positive class (binary tasks)
    sort_by_length: bool = False  # length-sorted batches in a shuffled order
    amsgrad: bool = True
    diversity_weight: float = 1.0  # weight of the adversarial candidates' mean pairwise JSD
    adversarial_amsgrad: bool = False  # the adversarial search's Adam with AMSGrad (J&W's code)

    def to_dict(self) -> dict:
        return asdict(self)


#: the ``--protocol`` presets by name
PRESETS = {
    "attnmetrics": Preset("attnmetrics"),
    "jain-wallace": Preset(
        "jain-wallace",
        sst_length_filter=True,
        pos_weight="balanced",
        sort_by_length=True,
        diversity_weight=1 / 6.25,
        adversarial_amsgrad=True,
    ),
}


#: the training recipe's defaults per encoder family: J&W's for theirs, GPT-1's fine-tuning
#: (Radford et al. 2018 sec. 4.1: lr 6.25e-5, 3 epochs, linear warm-up over 0.2 % of the steps,
#: then linear decay; AdamW-style weight decay 0.01 and the gradient norm clipped at 1 as in their
#: code: openai/finetune-transformer-lm train.py:333, opt.py:30-31)
RECIPES = {
    "jain-wallace": {"epochs": 8, "lr": 1e-3, "weight_decay": 1e-5},
    "gpt": {"epochs": 3, "lr": 6.25e-5, "weight_decay": 0.01, "warmup": 0.002, "grad_clip": 1.0},
    # BERT's fine-tuning (Devlin et al. 2019, sec. A.3: lr in {2, 3, 5}e-5, 2-4 epochs, warm-up 10 %)
    "hf": {"epochs": 3, "lr": 5e-5, "weight_decay": 0.01, "warmup": 0.1},
}


#: J&W's model sizes and batch size by data set (None: every other one): their bAbI models start
#: from random 50-d embeddings, 32 units, batches of 50 (Trainers/DatasetQA.py, get_Babi_*)
_BABI = {"embeddings": "random", "embed_dim": 50, "hidden_size": 32, "batch_size": 50}
SIZES = {
    None: {"embeddings": "glove", "embed_dim": 300, "hidden_size": 128, "batch_size": 32},
    **{f"babi{task}{size}": _BABI for task in (1, 2, 3) for size in ("", "-1k")},
}

#: the flags of GPT-1 alone (--encoder gpt), by dest, and the defaults of those that have one
#: (filled in for every model, so every run's results.json ``config`` names them as before)
GPT_ONLY = {"pretrained": "--pretrained", "lm_weight": "--lm-weight", "transfer_layers": "--transfer-layers",
            "gpt_config": "--gpt-config", "grad_clip": "--grad-clip"}  # fmt: skip
GPT_DEFAULTS = {"lm_weight": 0.5, "gpt_config": "small"}


def recipe_defaults(args: argparse.Namespace) -> None:
    """Fill the training flags left unset (None) with the model family's :data:`RECIPES`.

    Raises:
        ValueError: a flag of GPT-1's (:data:`GPT_ONLY`) given with another model (one line
            naming the flag and the model), where it would be ignored.
    """
    family = "hf" if getattr(args, "model", None) else "gpt" if args.encoder == "gpt" else "jain-wallace"
    # the model's sizes and batch: J&W's per data set (bAbI: Trainers/DatasetQA.py), for every family
    for key, value in SIZES.get(getattr(args, "dataset", None), SIZES[None]).items():
        if hasattr(args, key) and getattr(args, key) is None:  # evaluate has none of them
            setattr(args, key, value)
    check_prompt(args)
    if getattr(args, "train_last_layers", None) is not None and family != "hf":
        raise ValueError("--train-last-layers applies to --model hf: (a transformer's layers), not to --encoder models")
    if getattr(args, "prompt", None):
        return  # zero-shot: no training flags to fill
    if family != "gpt":
        given = [flag for dest, flag in GPT_ONLY.items() if getattr(args, dest, None) is not None]
        if given:
            model = f"--model {args.model}" if family == "hf" else f"--encoder {args.encoder}"
            raise ValueError(f"{given[0]} applies to --encoder gpt only, not to {model}: leave it out")
    for key, value in GPT_DEFAULTS.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    recipe = RECIPES[family]
    for key, value in recipe.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)


#: the training flags a zero-shot prompted model has no use for (nothing is trained)
TRAINING_FLAGS = {
    "epochs": "--epochs",
    "lr": "--lr",
    "weight_decay": "--weight-decay",
    "warmup": "--warmup",
    "grad_clip": "--grad-clip",
    "train_last_layers": "--train-last-layers",
}


def check_prompt(args: argparse.Namespace) -> None:
    """ValueError, in one line naming the flag, for ``--prompt`` without ``--model``, with a
    training flag (a prompted model is used zero-shot: nothing is trained), or ``--label-words``
    without ``--prompt``."""
    prompt = getattr(args, "prompt", None)
    if getattr(args, "label_words", None) and not prompt:
        raise ValueError("--label-words applies to --prompt only: leave it out, or give --prompt")
    if not prompt:
        return
    if not getattr(args, "model", None):
        raise ValueError("--prompt needs --model hf:NAME or hf:PATH (a causal language model, e.g. hf:smollm2)")
    given = [flag for dest, flag in TRAINING_FLAGS.items() if getattr(args, dest, None) is not None]
    if given:
        raise ValueError(f"{given[0]}: --prompt uses the model zero-shot (nothing is trained): leave {given[0]} out")


def jain_wallace_length_filter(splits: Splits, min_tokens: int = 6) -> Splits:
    """J&W's SST filter: keep sentences of at least ``min_tokens`` tokens (after their preprocessing),
    then drop the longest remaining sentence of each split (the last of the longest, in file order)."""

    def keep(examples):
        counted = [(len(tokenize(text)), (text, y)) for text, y in examples]  # each text tokenised once
        kept = [(n, example) for n, example in counted if n >= min_tokens]
        if kept:
            longest = max(range(len(kept)), key=lambda i: (kept[i][0], i))
            del kept[longest]
        return [example for _, example in kept]

    return Splits(
        splits.name,
        splits.classes,
        keep(splits.train),
        keep(splits.dev),
        keep(splits.test),
        {**splits.info, "length_filter": f"jain-wallace: >= {min_tokens} tokens, each split's longest dropped"},
    )
