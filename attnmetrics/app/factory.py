"""The model factory of ``run``, ``train`` and ``evaluate``: :func:`build` trains the model the
configuration names (J&W's BiLSTM family, GPT-1 or a Hugging Face classifier), with its family's
recipe, and saves it into the run folder; or, for ``evaluate``, loads the one a run folder saved.
Either way with its vocabulary, the data splits and the protocol preset it was trained under."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attnmetrics.app.config import RunConfig
from attnmetrics.app.recipes import PRESETS, Preset, jain_wallace_length_filter
from attnmetrics.app.results import Results
from attnmetrics.data import Splits, glove_matrix, load_dataset, load_minilm, load_smollm2
from attnmetrics.data.pairs import is_pair
from attnmetrics.models.bpe import BPETokenizer
from attnmetrics.models.classifier import EncoderAttentionClassifier, ModelConfig
from attnmetrics.models.gpt import GPTConfig
from attnmetrics.models.gpt_classifier import GPTClassifier, GPTInputs
from attnmetrics.models.pair import (
    PAIR_ATTENTIONS,
    PAIR_ENCODERS,
    PairAttentionClassifier,
    PairModelConfig,
    PairVocabulary,
)
from attnmetrics.models.pretraining import load_gpt
from attnmetrics.models.text import EncodedSplit, Vocabulary
from attnmetrics.models.training import (
    TrainConfig,
    load_checkpoint,
    save_checkpoint,
    train,
    train_config_dict,
)

CHECKPOINT = "model"  # sub-folder of a run holding model.pt, model.json, vocab.json


@dataclass(frozen=True)
class Recipe:
    """How the model was trained, for W&P's experiments that train more models alike: ``make``
    (J&W's family only) gives a fresh model initialised as this one."""

    make: Callable[[ModelConfig], EncoderAttentionClassifier] | None
    train_config: TrainConfig
    train_data: EncodedSplit
    dev_data: EncodedSplit


@dataclass(frozen=True)
class Built:
    """The factory's model, with its vocabulary (or tokenizer inputs), the data splits, the
    protocol preset and, when trained here, the recipe (None for a saved model)."""

    model: torch.nn.Module
    vocab: Any  # a Vocabulary, or the tokenizer's inputs (GPTInputs, a Hugging Face model's)
    splits: Splits
    protocol: Preset
    recipe: Recipe | None = None


def build(config: RunConfig, results: Results, folder: Path | None) -> Built:
    """evaluate's saved model, or train and run's model trained and saved into ``folder`` (None:
    not this rank's to write); the model, data and training recorded in ``results``."""
    if config.command == "evaluate":
        return _saved_model(config, results)
    return _train_and_save(config, results, folder)


def load_data(
    dataset: str,
    data_dir: Path | None,
    limit: int | None,
    seed: int,
    max_tokens: int | None = None,
    protocol: Preset = PRESETS["attnmetrics"],
    stratify: bool = False,
    test_limit: int | None = None,
) -> Splits:
    """The data set's splits (``limit``: the first N of each; ``test_limit``: then the first N of
    the test split alone; ``stratify``: the first of each class in the split's class shares, see
    :func:`first_examples`), the preset's filter applied; their sizes printed. Raises ValueError if
    a split is empty."""
    splits = load_dataset(dataset, data_dir=data_dir, seed=seed, max_tokens=max_tokens)
    if protocol.sst_length_filter and dataset == "sst":
        splits = jain_wallace_length_filter(splits)
    if limit:
        train, dev, test = (first_examples(x, limit, stratify) for x in (splits.train, splits.dev, splits.test))
        info = {**splits.info, "limit": f"first {limit} of each split" + (", stratified by class" if stratify else "")}
        splits = type(splits)(splits.name, splits.classes, train, dev, test, info)
    if test_limit:
        test = first_examples(splits.test, test_limit, stratify)
        info = {
            **splits.info,
            "test_limit": f"first {test_limit} test examples" + (", stratified by class" if stratify else ""),
        }
        splits = type(splits)(splits.name, splits.classes, splits.train, splits.dev, test, info)
    print(splits.summary(), file=sys.stderr)
    empty = [name for name, n in splits.sizes().items() if n == 0]
    if empty:  # before any training: an empty split would give an untrained model or an empty report
        raise ValueError(f"dataset {splits.name!r} has an empty {' and '.join(empty)} split; nothing to train or test")
    return splits


def run_data(config: RunConfig, protocol: Preset) -> Splits:
    """:func:`load_data` with ``run``'s and ``train``'s data flags (``--dataset``, ``--data-dir``,
    ``--limit``, ``--split-seed``, ``--max-tokens``, ``--stratify``, ``--test-limit``)."""
    return load_data(
        config.dataset,
        config.data_dir,
        config.limit,
        config.split_seed,
        config.max_tokens,
        protocol,
        config.stratify,
        config.test_limit,
    )


def first_examples(examples: list, limit: int, stratify: bool = False) -> list:
    """The first ``limit`` examples, or with ``stratify`` the first ones of each class, as many as
    the class's share of ``examples`` gives (largest remainders; file order kept): SST's files list
    one class first, so their first N are nearly all of it."""
    if not stratify or len(examples) <= limit:
        return examples[:limit]
    labels = np.array([y for _, y in examples])
    classes, counts = np.unique(labels, return_counts=True)
    quota = counts * limit / len(examples)
    take = np.floor(quota).astype(int)
    take[np.argsort(-(quota - take), kind="stable")[: limit - take.sum()]] += 1
    left = dict(zip(classes.tolist(), take.tolist()))
    kept = []
    for example in examples:
        if left[example[1]] > 0:
            left[example[1]] -= 1
            kept.append(example)
    return kept


def _gpt_model(config: RunConfig, splits, results: Results) -> tuple[GPTClassifier, GPTInputs]:
    """GPT-1's classifier: fine-tuned from ``--pretrained`` (its embeddings and first
    ``--transfer-layers`` blocks), or from scratch with a BPE learnt on the training split."""
    classes = len(splits.classes)
    head = {
        "num_classes": 1 if classes == 2 else classes,
        "attention": config.attention,
        "lm_weight": config.lm_weight,
    }
    torch.manual_seed(config.seed)  # the head and any block not transferred
    if config.pretrained:
        pre = load_gpt(config.pretrained)
        model = GPTClassifier.from_pretrained(pre, transfer_layers=config.transfer_layers, **head)
        tokenizer = pre.tokenizer
        last = (pre.meta.get("history") or [{}])[-1]
        results["pretrained"] = {
            "path": str(config.pretrained.resolve()),
            "step": pre.meta.get("step"),
            "val_ppl": last.get("val_ppl"),
            "transfer_layers": model.config.gpt.n_layer if config.transfer_layers is None else config.transfer_layers,
        }
    else:
        if config.transfer_layers is not None:
            raise ValueError("--transfer-layers needs --pretrained (the layers come from a pre-trained GPT)")
        tokenizer = BPETokenizer.train([text for text, _ in splits.train])
        model = GPTClassifier(GPTConfig.named(config.gpt_config, tokenizer.vocab_size), **head)
        results["pretrained"] = None
    return model.to(config.device), GPTInputs(tokenizer, model.config.gpt.context)


def _hf_model(config: RunConfig, splits, results: Results):
    """A Hugging Face classifier from ``--model hf:minilm`` (the pinned all-MiniLM-L6-v2),
    ``hf:smollm2`` (the pinned SmolLM2-135M-Instruct, GGUF Q4_1) or ``hf:PATH`` (a folder or a
    GGUF file), with a new head for the data set's classes, and its tokenizer."""
    from attnmetrics.models.hf import HFClassifier  # optional transformers

    name = config.model[3:]
    path = {"minilm": load_minilm, "smollm2": load_smollm2}.get(name, lambda: Path(name))()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"--model {config.model}: no such GGUF file {path}")
    elif not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"--model {config.model}: {path} is not a Hugging Face checkpoint folder (no config.json) nor a GGUF file"
        )
    classes = len(splits.classes)
    torch.manual_seed(config.seed)  # the new classification head
    model, inputs = HFClassifier.from_pretrained(path, 1 if classes == 2 else classes)
    limit = getattr(model.hf.config, "max_position_embeddings", None)  # GPT-2's n_positions too
    if limit is not None and config.max_length > limit:
        raise ValueError(
            f"--max-length {config.max_length}: more tokens than {path}'s position limit {limit} "
            f"(max_position_embeddings in config.json); use --max-length {limit} or less"
        )
    inputs.max_length = config.max_length
    upcast = _report_upcast(model, path)
    results["pretrained"] = {"path": str(path.resolve()), "model": config.model, "upcast_from": upcast}
    if config.train_last_layers is not None:
        trained = model.train_last_layers(config.train_last_layers)
        total = sum(p.numel() for p in model.parameters())
        results["pretrained"]["trained"] = {
            "last_layers": config.train_last_layers,
            "layers": len(model.blocks),
            "parameters": trained,
            "of": total,
        }
    if path.suffix == ".gguf":  # what every number of the run is computed on
        quantisation = getattr(model.hf.config, "quantization_type", None) or path.stem.rsplit(".", 1)[-1]
        results["pretrained"]["weights"] = f"GGUF {quantisation}, dequantised to float32"
    return model.to(config.device), inputs


def _prompted_model(config: RunConfig, splits, results: Results):
    """``--model``'s causal language model used zero-shot through ``--prompt`` (nothing trained),
    and its inputs (the text's tokens alone)."""
    from attnmetrics.models.prompted import PromptedLM, prompt_named  # optional transformers

    name = config.model[3:]
    path = {"smollm2": load_smollm2}.get(name, lambda: Path(name))()
    if name == "minilm":
        raise ValueError("--prompt needs a causal language model; hf:minilm is an encoder (try hf:smollm2)")
    if path.suffix != ".gguf" and not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"--model {config.model}: {path} is not a Hugging Face checkpoint folder (no config.json) nor a GGUF file"
        )
    prompt = prompt_named(config.prompt, config.label_words, splits.classes)
    model, inputs = PromptedLM.from_pretrained(path, prompt, splits.classes, config.max_length)
    limit = getattr(model.hf.config, "max_position_embeddings", None)
    longest = config.max_length + len(model.prefix_ids) + len(model.suffix_ids)
    if limit is not None and longest > limit:
        raise ValueError(
            f"--max-length {config.max_length}: with the prompt's {len(model.prefix_ids) + len(model.suffix_ids)} "
            f"tokens, inputs of up to {longest} tokens, more than {path}'s position limit {limit}; use --max-length "
            f"{limit - longest + config.max_length} or less"
        )
    upcast = _report_upcast(model, path)
    results["pretrained"] = {"path": str(path.resolve()), "model": config.model, "upcast_from": upcast}
    if path.suffix == ".gguf":
        quantisation = getattr(model.hf.config, "quantization_type", None) or path.stem.rsplit(".", 1)[-1]
        results["pretrained"]["weights"] = f"GGUF {quantisation}, dequantised to float32"
    results["prompt"] = {
        "name": prompt.name,
        "template": prompt.template,
        "chat": prompt.chat,
        "label_words": dict(zip(splits.classes, model.label_words)),
        "prefix_tokens": len(model.prefix_ids),
        "suffix_tokens": len(model.suffix_ids),
    }
    return model.to(config.device), inputs


def _zero_shot(config: RunConfig, results: Results) -> Built:
    """``--prompt``: the model used as it is, nothing trained; the dev split is encoded only to
    count what --max-length cuts."""
    protocol = PRESETS[config.protocol]
    splits = run_data(config, protocol)
    model, inputs = _prompted_model(config, splits, results)
    say_truncated("dev", inputs.encode_split(splits.dev), inputs, results)
    results["data"].update(
        name=splits.name, classes=list(splits.classes), sizes=splits.sizes(), vocabulary=len(inputs), info=splits.info
    )
    results["model"] = model.config.to_dict()
    results["training"] = {"zero_shot": True}
    return Built(model, inputs, splits, protocol)


def say_truncated(name: str, split: EncodedSplit, encoder, results: Results) -> None:
    """Never cut texts silently: how many of split ``name``'s texts ``encoder`` cut to its length
    limit, on stderr (when any) and in ``results["data"]["truncated"]``."""
    results["data"].setdefault("truncated", {})[name] = split.truncated
    if split.truncated:
        print(
            f"attnmetrics: {split.truncated} of {len(split)} {name} texts are longer than --max-length "
            f"{getattr(encoder, 'max_length', '?')} tokens and were cut to it",
            file=sys.stderr,
        )


def _report_upcast(model, source: Path) -> str | None:
    """Say on stderr that a Hugging Face model's half-precision weights were upcast to float32 at
    load (:attr:`~attnmetrics.models.hf.HFClassifier.upcast_from`); their dtype's name, None if none was."""
    dtype = getattr(model, "upcast_from", None)
    if dtype is None:
        return None
    name = str(dtype).removeprefix("torch.")
    print(
        f"attnmetrics: {source}: its weights are {name}; upcast to float32 to train and test it "
        "(half precision overflows to NaN in fine-tuning)",
        file=sys.stderr,
    )
    return name


def _jain_wallace_model(config: RunConfig, splits, results: Results):
    """J&W's classifier over a word vocabulary of the training split (GloVe-initialised by
    default); also returns ``make(config)``, a fresh model initialised as this one (W&P)."""
    vocab = Vocabulary.build(text for text, _ in splits.train)
    embeddings, embed_dim = _word_embeddings(config, vocab, results)
    classes = len(splits.classes)
    model_config = ModelConfig(
        vocab_size=len(vocab),
        embed_dim=embed_dim,
        hidden_size=config.hidden_size,
        num_classes=1 if classes == 2 else classes,
        encoder=config.encoder,
        attention=config.attention,
        regulariser=config.regulariser,
        tying_weight=config.tying_weight,
        mlm_weight=config.mlm_weight,
    )

    def make(cfg: ModelConfig) -> EncoderAttentionClassifier:
        """A fresh model of ``cfg``, initialised as the base (same seed, same embeddings)."""
        torch.manual_seed(config.seed)
        return EncoderAttentionClassifier(cfg, embeddings).to(config.device)

    return make(model_config), vocab, make


def _word_embeddings(config: RunConfig, vocab, results: Results):
    """``(matrix [V, E] or None, E)``: GloVe rows for ``vocab`` with ``--embeddings glove`` (its
    coverage recorded), else None and ``--embed-dim``."""
    if config.embeddings != "glove":
        return None, config.embed_dim
    embeddings, found = glove_matrix(vocab, seed=config.seed)
    results["data"]["glove_coverage"] = found / max(len(vocab) - 4, 1)
    return embeddings, embeddings.shape[1]


def _pair_model(config: RunConfig, splits, results: Results) -> tuple[PairAttentionClassifier, PairVocabulary]:
    """J&W's question-answering / inference model (``models/pair.py``) over a word vocabulary of
    the training split's passages and questions; ValueError for a model or experiment that does
    not take a pair of texts."""
    if config.model or config.encoder == "gpt":
        raise ValueError(
            f"{splits.name} is a pair task (passage and question): it runs J&W's pair model "
            f"(--encoder {'|'.join(PAIR_ENCODERS)}), not {config.model or '--encoder gpt'}"
        )
    if config.consistent_adversary or config.diagnostic:
        raise ValueError(f"--consistent-adversary and --diagnostic take single-text data sets, not {splits.name}")
    if config.regulariser not in (None, "none"):
        raise ValueError(f"--regulariser {config.regulariser} is not built for the pair model ({splits.name})")
    if config.attention not in PAIR_ATTENTIONS:
        raise ValueError(f"the pair model's attention is one of {PAIR_ATTENTIONS}, got --attention {config.attention}")
    vocab = PairVocabulary.build_pairs(pair for pair, _ in splits.train)
    embeddings, embed_dim = _word_embeddings(config, vocab, results)
    model_config = PairModelConfig(
        vocab_size=len(vocab),
        question_width=vocab.question_width,
        num_classes=len(splits.classes),
        embed_dim=embed_dim,
        hidden_size=config.hidden_size,
        encoder=config.encoder,
        attention=config.attention,
    )
    torch.manual_seed(config.seed)
    return PairAttentionClassifier(model_config, embeddings).to(config.device), vocab


def _train(config: RunConfig, results: Results) -> Built:
    """Build the model ``--encoder`` names, train it with its family's recipe, record both."""
    protocol = PRESETS[config.protocol]
    splits = run_data(config, protocol)
    common = {
        "epochs": config.epochs,
        "batch_size": config.batch_size,
        "lr": config.lr,
        "weight_decay": config.weight_decay,
        "seed": config.seed,
        "progress": not config.no_progress,
    }
    make = None
    pairs = is_pair(splits.train[0][0])
    if pairs:
        model, vocab = _pair_model(config, splits, results)
        tconf = TrainConfig(**common, amsgrad=protocol.amsgrad, sort_by_length=protocol.sort_by_length)
    elif config.model or config.encoder == "gpt":
        if config.consistent_adversary or config.diagnostic:
            raise ValueError(
                f"--consistent-adversary and --diagnostic train BiLSTM-family models, not {config.model or 'gpt'}"
            )
        model, vocab = _hf_model(config, splits, results) if config.model else _gpt_model(config, splits, results)
        # GPT-1 sec. 4.1 and BERT's fine-tuning: linear warm-up then decay, decoupled weight decay.
        # Batches of rows of similar length (J&W's code): a transformer computes attention over
        # padding and throws it away, and SST's rows run from 3 to 60 tokens.
        tconf = TrainConfig(
            **common,
            amsgrad=False,
            schedule="linear",
            warmup=config.warmup,
            decoupled_weight_decay=True,
            sort_by_length=True,
            grad_clip=config.grad_clip or 0.0,  # GPT-1's 1.0 (recipes.RECIPES); none for hf
        )
    else:
        model, vocab, make = _jain_wallace_model(config, splits, results)
        tconf = TrainConfig(
            **common,
            amsgrad=protocol.amsgrad,
            pos_weight=protocol.pos_weight if model.config.num_classes == 1 else None,
            sort_by_length=protocol.sort_by_length,
        )
    train_data, dev_data = vocab.encode_split(splits.train), vocab.encode_split(splits.dev)
    say_truncated("train", train_data, vocab, results)
    say_truncated("dev", dev_data, vocab, results)
    result = train(model, train_data, dev_data, tconf)
    results["data"].update(
        name=splits.name, classes=list(splits.classes), sizes=splits.sizes(), vocabulary=len(vocab), info=splits.info
    )
    results["model"] = model.config.to_dict()
    results["training"] = {
        "config": train_config_dict(tconf),
        "best_epoch": result.best_epoch,
        "best_dev": result.best_dev,
        "history": result.history,
    }
    results["wall_time_s"]["training"] = result.seconds
    return Built(model, vocab, splits, protocol, Recipe(make, tconf, train_data, dev_data))


def _saved_model(config: RunConfig, results: Results) -> Built:
    """evaluate's model, vocabulary and data splits, from the run folder it names (the split,
    data folder and protocol it was trained with, unless the flags say otherwise)."""
    ckpt = load_checkpoint(config.model_run / CHECKPOINT)
    _report_upcast(ckpt.model, config.model_run / CHECKPOINT)
    saved = ckpt.extra
    if ckpt.vocab is None or "dataset" not in saved:
        raise ValueError(
            f"{config.model_run / CHECKPOINT} was not saved by 'attnmetrics train' or 'run' "
            "(no vocab.json, or no dataset in model.json); it cannot be evaluated here"
        )
    data_dir = config.data_dir or (Path(saved["data_dir"]) if saved.get("data_dir") else None)
    # Checkpoints from before --split-seed split with the model seed.
    split_seed = saved.get("split_seed", saved.get("seed", 0))
    protocol = PRESETS[saved.get("protocol", "attnmetrics")]  # the test split and battery it was trained for
    splits = load_data(saved["dataset"], data_dir, config.limit, split_seed, saved.get("max_tokens"), protocol)
    results["split_seed"] = split_seed
    results["config"]["dataset"] = saved["dataset"]
    results["data"].update(name=splits.name, classes=list(splits.classes), sizes=splits.sizes())
    results["model"] = ckpt.model.config.to_dict()
    return Built(ckpt.model.to(config.device), ckpt.vocab, splits, protocol)


def _train_and_save(config: RunConfig, results: Results, folder: Path | None) -> Built:
    """train and run's model, vocabulary, splits and recipe, the model saved into ``folder``
    (None: not this rank's to write)."""
    # CUDA has no deterministic kernel for a few ops (e.g. embedding backward): warn there
    torch.use_deterministic_algorithms(True, warn_only=config.device == "cuda")
    built = _zero_shot(config, results) if config.prompt else _train(config, results)
    results["split_seed"] = config.split_seed
    if folder is not None:
        extra = {
            "dataset": config.dataset,
            "data_dir": str(config.data_dir.resolve()) if config.data_dir else None,
            "seed": config.seed,
            "split_seed": config.split_seed,
            "max_tokens": config.max_tokens,
            "protocol": config.protocol,
        }
        save_checkpoint(folder / CHECKPOINT, built.model, built.vocab, extra=extra)
    return built
