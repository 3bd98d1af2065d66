"""Training, prediction, metrics and checkpoints for the attention classifiers (J&W's recipe).

Adam (lr 1e-3, amsgrad as in J&W's code), weight decay 1e-5 on everything but the attention
layer, batch 32, 8 epochs; after each epoch the dev ROC-AUC decides which epoch's weights
are kept. Seeded and deterministic on CPU.

The loop is shared by the paper experiments that train: an ``attention_source`` imposes
attention (W&P's uniform/base/adversary diagnostic MLPs) and an ``objective`` replaces the
loss and the epoch choice (W&P's model-consistent adversary).
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NamedTuple, Protocol

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from sklearn.metrics import accuracy_score, f1_score, roc_auc_score
from torch import Tensor
from tqdm.auto import tqdm

from attnmetrics.models.bpe import BPETokenizer
from attnmetrics.models.classifier import EncoderAttentionClassifier, ModelConfig
from attnmetrics.models.files import load_tensors
from attnmetrics.models.gpt_classifier import GPTClassifier, GPTClassifierConfig, GPTInputs
from attnmetrics.models.pair import PairAttentionClassifier, PairModelConfig, PairVocabulary
from attnmetrics.models.parallel import all_reduce_gradients, data_parallel
from attnmetrics.models.text import Batch, EncodedSplit, Vocabulary
from attnmetrics.outputs import decision, output_distribution


@dataclass
class TrainConfig:
    epochs: int = 8
    batch_size: int = 32
    lr: float = 1e-3
    weight_decay: float = 1e-5
    amsgrad: bool = True
    seed: int = 0
    #: weight of the positive class in a binary (sigmoid) loss; "balanced" is J&W's N_neg / N_pos
    pos_weight: float | str | None = None
    #: batches of rows of similar length, in a shuffled order (J&W's code), instead of shuffled rows
    sort_by_length: bool = False
    #: the learning rate's schedule over all training steps: "constant", or "linear" (GPT-1's
    #: fine-tuning: linear warm-up over the first ``warmup`` fraction of the steps, then a
    #: linear decay to 0)
    schedule: str = "constant"
    warmup: float = 0.0
    #: weight decay as AdamW's (decoupled from the gradient; GPT-1's code) instead of Adam's L2
    decoupled_weight_decay: bool = False
    #: clip the global gradient norm at this value before each step (GPT-1's fine-tuning code: 1,
    #: openai/finetune-transformer-lm opt.py:30-31); 0: no clipping (J&W's recipe)
    grad_clip: float = 0.0
    eval_batch_size: int = 256
    progress: bool = True

    def __post_init__(self):
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if not 0 <= self.warmup < 1:
            raise ValueError(f"warmup is a fraction of the training steps in [0, 1), got {self.warmup}")
        if self.warmup and self.schedule == "constant":
            raise ValueError("warmup needs schedule='linear'")
        if not (isinstance(self.grad_clip, (int, float)) and math.isfinite(self.grad_clip) and self.grad_clip >= 0):
            raise ValueError(f"grad_clip must be a finite number >= 0 (0: off), got {self.grad_clip!r}")


SCHEDULES = ("constant", "linear")


def lr_factor(step: int, warmup_steps: int, total: int) -> float:
    """GPT-1's fine-tuning schedule (sec. 4.1): the learning rate's multiplier at ``step``
    (0-based): linear from 1/warmup_steps to 1 over the warm-up, then linear to 0 at ``total``."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    return max(0.0, (total - step) / max(1, total - warmup_steps))


@dataclass
class TrainResult:
    """``history`` holds one dict per epoch: train_loss, dev metrics, seconds."""

    best_epoch: int
    best_dev: dict
    history: list[dict] = field(default_factory=list)
    seconds: float = 0.0


class Predictions(NamedTuple):
    """A whole split in its original order: logits [N, C], attention [N, T_max] (zero past
    each row's length), lengths [N] int64, labels [N] int64."""

    logits: Tensor
    attention: Tensor
    lengths: Tensor
    labels: Tensor


#: (tokens [B, T] int64, lengths [B] int64) -> attention [B, T] to impose on the model
AttentionSource = Callable[[Tensor, Tensor], Tensor]


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (call before building a model to fix its initialisation)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def loss_fn(logits: Tensor, labels: Tensor, pos_weight: float | None = None) -> Tensor:
    """BCE-with-logits for one sigmoid output (C = 1), cross-entropy for C >= 2; batch mean.
    ``pos_weight`` multiplies the positive examples' BCE terms (C = 1 only)."""
    if logits.shape[1] == 1:
        weight = None if pos_weight is None else logits.new_tensor(pos_weight)
        return F.binary_cross_entropy_with_logits(logits[:, 0], labels.to(logits.dtype), pos_weight=weight)
    if pos_weight is not None:
        raise ValueError(f"pos_weight applies to a binary (C = 1) model only, got C = {logits.shape[1]}")
    return F.cross_entropy(logits, labels)


def balanced_pos_weight(labels: list[int]) -> float:
    """J&W's positive-class weight for a binary training set: N / N_pos - 1 = N_neg / N_pos."""
    positives = sum(1 for y in labels if y == 1)
    if positives == 0:
        raise ValueError("pos_weight='balanced' needs at least one positive training example")
    return len(labels) / positives - 1


def make_optimizer(model: EncoderAttentionClassifier, config: TrainConfig) -> torch.optim.Optimizer:
    """Adam with weight decay on every parameter except the attention layer's (J&W), or those
    a model names in ``no_weight_decay()`` (a Hugging Face model: biases and LayerNorms, BERT's).
    An attention without parameters (``uniform``) gets an empty group, which Adam accepts.
    On CUDA the update is Adam's fused kernel (one launch for every parameter, not a few per
    tensor); on the CPU torch's default, so CPU trainings stay bit for bit what they were."""
    exempt = model.no_weight_decay() if hasattr(model, "no_weight_decay") else model.attention_parameters()
    ids = {id(p) for p in exempt}
    rest = [p for p in model.parameters() if id(p) not in ids]
    return torch.optim.Adam(
        [
            {"params": rest, "weight_decay": config.weight_decay},
            {"params": list(exempt), "weight_decay": 0.0},
        ],
        lr=config.lr,
        amsgrad=config.amsgrad,
        decoupled_weight_decay=config.decoupled_weight_decay,
        fused=True if all(p.is_cuda for p in model.parameters()) else None,
    )


def _imposed(source: AttentionSource | None, tokens: Tensor, lengths: Tensor) -> Tensor | None:
    if source is None:
        return None
    with torch.no_grad():
        return source(tokens, lengths).detach()


class Objective(Protocol):
    """What :func:`train` minimises and how it picks the epoch to keep."""

    def loss(self, model: EncoderAttentionClassifier, batch: Batch, attention: Tensor | None) -> Tensor:
        """Training loss of one batch (on the model's device); ``attention`` [B, T] is imposed or None."""

    def select(
        self, model: EncoderAttentionClassifier, dev: EncodedSplit, source: AttentionSource | None, batch_size: int
    ) -> tuple[float | tuple[float, ...], dict]:
        """(score, higher is better: a float, or a tuple compared in order; dev metrics for the
        history) after an epoch."""


class Classification:
    """J&W's objective: the task loss (:func:`loss_fn`) plus the model's ``auxiliary_loss``
    when it has one (T&Š's tying / masked-LM regularisers); the epoch with the best dev
    ROC-AUC is kept, and among epochs tied on it (a saturated dev set, e.g. two BBC topics
    at ROC-AUC 1.0 from the first epoch on) the one with the lowest dev loss."""

    def __init__(self, pos_weight: float | None = None):
        self.pos_weight = pos_weight

    def loss(self, model, batch, attention):
        if hasattr(model, "states"):
            out = model.states(batch.tokens, batch.lengths, attention)
            logits, embedded, hidden = out.logits, out.embedded, out.hidden
        else:
            (logits, _), embedded, hidden = model(batch.tokens, batch.lengths, attention), None, None
        loss = loss_fn(logits, batch.labels, self.pos_weight)
        aux = getattr(model, "auxiliary_loss", None)
        extra = aux(batch.tokens, batch.lengths, embedded, hidden) if aux is not None and hidden is not None else None
        return loss if extra is None else loss + extra

    def select(self, model, dev, source, batch_size):
        metrics = evaluate(model, dev, batch_size, attention_source=source)
        auc = -math.inf if math.isnan(metrics["roc_auc"]) else metrics["roc_auc"]
        return (auc, -metrics["loss"]), metrics


def _batches(data: EncodedSplit | Iterable[Batch], batch_size: int) -> Iterable[Batch]:
    return data.batches(batch_size) if isinstance(data, EncodedSplit) else data


def _to(batch: Batch, device: torch.device) -> Batch:
    return Batch(*(t.to(device) for t in batch))


@torch.no_grad()
def predict(
    model: EncoderAttentionClassifier,
    batches: EncodedSplit | Iterable[Batch],
    batch_size: int = 256,
    attention_source: AttentionSource | None = None,
) -> Predictions:
    """Run the model (on whatever device it is) over a split (an :class:`EncodedSplit` or its
    batches); rows come back on the CPU in split order (by ``Batch.index``). With
    ``attention_source`` its attention is imposed on every batch."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    parts = []
    try:
        for b in _batches(batches, batch_size):
            tokens, lengths = b.tokens.to(device), b.lengths.to(device)
            logits, attention = model(tokens, lengths, _imposed(attention_source, tokens, lengths))
            parts.append((b.index, logits.cpu(), attention.cpu(), b.lengths, b.labels))
    finally:
        model.train(was_training)
    if not parts:
        raise ValueError("predict: no batches")
    n = sum(len(p[0]) for p in parts)
    T = max(p[2].shape[1] for p in parts)
    C = parts[0][1].shape[1]
    logits = torch.empty(n, C)
    attention = torch.zeros(n, T)
    lengths = torch.empty(n, dtype=torch.int64)
    labels = torch.empty(n, dtype=torch.int64)
    for index, lg, at, ln, lb in parts:
        logits[index] = lg.float()
        attention[index, : at.shape[1]] = at.float()
        lengths[index] = ln
        labels[index] = lb
    return Predictions(logits, attention, lengths, labels)


def classification_metrics(logits: Tensor, labels: Tensor) -> dict:
    """accuracy, macro F1 and ROC-AUC (binary; macro one-vs-rest for C >= 3) from logits [N, C].

    ROC-AUC is NaN when the labels hold a single class (it is undefined there).
    """
    probs = output_distribution(logits.float()).numpy()
    y = labels.numpy()
    pred = decision(logits).numpy()  # argmax ties go to the lower class (p = 0.5 -> 0)
    classes = np.arange(probs.shape[1])
    if len(np.unique(y)) < 2:
        auc = float("nan")
    elif probs.shape[1] == 2:
        auc = float(roc_auc_score(y, probs[:, 1]))
    else:
        auc = float(roc_auc_score(y, probs, multi_class="ovr", average="macro", labels=classes))
    return {
        "accuracy": float(accuracy_score(y, pred)),
        "macro_f1": float(f1_score(y, pred, average="macro", labels=classes, zero_division=0)),
        "roc_auc": auc,
    }


def evaluate(
    model: EncoderAttentionClassifier,
    data: EncodedSplit | Iterable[Batch],
    batch_size: int = 256,
    attention_source: AttentionSource | None = None,
) -> dict:
    """accuracy, macro_f1, roc_auc and mean loss over a split (``attention_source``: as in :func:`predict`)."""
    return prediction_metrics(predict(model, data, batch_size, attention_source))


def prediction_metrics(p: Predictions) -> dict:
    """accuracy, macro_f1, roc_auc and mean loss of a split's :class:`Predictions`."""
    return {**classification_metrics(p.logits, p.labels), "loss": float(loss_fn(p.logits, p.labels))}


def train(
    model: EncoderAttentionClassifier,
    train_data: EncodedSplit,
    dev_data: EncodedSplit,
    config: TrainConfig | None = None,
    *,
    attention_source: AttentionSource | None = None,
    objective: Objective | None = None,
) -> TrainResult:
    """Train in place, on the device the model is on; at the end the model holds the weights
    of the epoch with the best dev score (the first such epoch on ties).

    Data-parallel under ``torch.distributed`` (torchrun): every rank draws the same batches,
    runs rows ``rank::world`` of each, and steps on the gradient summed over ranks with each
    rank's loss weighted by its share of the rows (the batch mean's gradient, up to rounding;
    dropout masks differ from one process's), so the ranks' weights stay identical and each
    scores the whole dev split alike.

    ``attention_source`` imposes attention in training and on dev (W&P's diagnostic MLPs);
    ``objective`` (default :class:`Classification`: task loss + auxiliary loss, dev ROC-AUC)
    sets the loss and the dev score."""
    config = config or TrainConfig()
    pos_weight = balanced_pos_weight(train_data.labels) if config.pos_weight == "balanced" else config.pos_weight
    objective = objective or Classification(pos_weight)
    device = next(model.parameters()).device
    seed_everything(config.seed)
    generator = torch.Generator().manual_seed(config.seed)
    optimizer = make_optimizer(model, config)
    n_batches = math.ceil(len(train_data) / config.batch_size)
    scheduler = None
    if config.schedule == "linear":
        steps = config.epochs * n_batches
        warmup_steps = math.ceil(config.warmup * steps)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, warmup_steps, steps))
    rank, world = data_parallel()
    progress = config.progress and rank == 0
    start = time.perf_counter()
    history: list[dict] = []
    best_key, best_state, best_epoch, best_dev = None, None, 0, {}
    for epoch in range(1, config.epochs + 1):
        t0 = time.perf_counter()
        model.train()
        # the epoch's summed loss stays on the device: no read of it waits on a batch
        total, seen = torch.zeros((), dtype=torch.float64, device=device), 0
        bar = tqdm(
            train_data.batches(config.batch_size, shuffle=True, generator=generator, by_length=config.sort_by_length),
            total=n_batches,
            desc=f"epoch {epoch}/{config.epochs}",
            disable=not progress,
            leave=False,
        )
        for b in bar:
            rows = len(b.labels)
            b = _to(Batch(*(t[rank::world] for t in b)) if world > 1 else b, device)
            optimizer.zero_grad(set_to_none=True)
            if len(b.labels):  # a batch smaller than the world leaves some ranks without rows
                loss = objective.loss(model, b, _imposed(attention_source, b.tokens, b.lengths))
                loss.backward()
                total += loss.detach().double() * len(b.labels)
                seen += len(b.labels)
            if world > 1:
                all_reduce_gradients(model, len(b.labels) / rows)
            if config.grad_clip:  # the whole batch's gradient, after the ranks' are summed
                torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
            if progress:
                bar.set_postfix(loss=f"{total.item() / max(seen, 1):.4f}", refresh=False)
        total = total.item()
        if world > 1:  # the epoch's mean loss over every rank's rows
            sums = torch.tensor([total, seen], dtype=torch.float64)
            dist.all_reduce(sums)
            total, seen = sums[0].item(), int(sums[1].item())
        key, dev = objective.select(model, dev_data, attention_source, config.eval_batch_size)
        record = {
            "epoch": epoch,
            "train_loss": total / max(seen, 1),
            **{f"dev_{k}": v for k, v in dev.items()},
            "seconds": time.perf_counter() - t0,
        }
        history.append(record)
        if best_state is None or key > best_key:
            best_key, best_epoch, best_dev = key, epoch, dev
            best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        if progress:
            shown = ", ".join(f"dev {k} {v:.4f}" for k, v in dev.items() if k in ("accuracy", "roc_auc", "objective"))
            tqdm.write(f"epoch {epoch}: train loss {record['train_loss']:.4f}, {shown} ({record['seconds']:.1f}s)")
    if best_state is not None:
        model.load_state_dict(best_state)
    return TrainResult(best_epoch, best_dev, history, time.perf_counter() - start)


# --------------------------------------------------------------------------- checkpoints

_WEIGHTS, _CONFIG, _VOCAB = "model.pt", "model.json", "vocab.json"
_FORMAT = 1


class Checkpoint(NamedTuple):
    """``model``: an :class:`EncoderAttentionClassifier` or a :class:`GPTClassifier`; ``vocab``:
    its :class:`Vocabulary` or :class:`GPTInputs` (None if none was saved)."""

    model: EncoderAttentionClassifier | GPTClassifier
    vocab: Vocabulary | GPTInputs | None
    extra: dict


def save_checkpoint(
    directory: str | os.PathLike,
    model: EncoderAttentionClassifier | GPTClassifier,
    vocab: Vocabulary | GPTInputs | None = None,
    extra: dict | None = None,
) -> Path:
    """Write ``model.pt`` (state_dict only), ``model.json`` (model config + ``extra``, which must
    be JSON-serialisable, e.g. the TrainConfig and dataset) and the vocabulary: ``vocab.json``
    (words) or ``tokenizer.json`` (a GPT's BPE)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), directory / _WEIGHTS)
    meta = {"format": _FORMAT, "model": model.config.to_dict(), "extra": extra or {}}
    (directory / _CONFIG).write_text(json.dumps(meta, indent=2))
    if vocab is not None:
        vocab.save(directory / getattr(vocab, "filename", _VOCAB))
    return directory


def _model_config(saved: dict) -> ModelConfig | GPTClassifierConfig:
    if saved.get("kind") == "pair":
        return PairModelConfig.from_dict(saved)
    if saved.get("encoder") == "prompted":
        from attnmetrics.models.prompted import PromptedLMConfig  # optional transformers

        return PromptedLMConfig.from_dict(saved)
    if saved.get("encoder") == "hf":
        from attnmetrics.models.hf import HFClassifierConfig  # optional transformers

        return HFClassifierConfig.from_dict(saved)
    return (GPTClassifierConfig if saved.get("encoder") == "gpt" else ModelConfig).from_dict(saved)


def _build(config: ModelConfig | GPTClassifierConfig) -> EncoderAttentionClassifier | GPTClassifier:
    if isinstance(config, GPTClassifierConfig):
        return GPTClassifier.from_config(config)
    if isinstance(config, PairModelConfig):
        return PairAttentionClassifier(config)
    if getattr(config, "encoder", None) == "hf":
        from attnmetrics.models.hf import HFClassifier

        return HFClassifier.from_config(config)
    if getattr(config, "encoder", None) == "prompted":  # its weights are its source's
        from attnmetrics.models.prompted import PromptedLM

        return PromptedLM.from_config(config)
    return EncoderAttentionClassifier(config)


def _load_vocab(directory: Path, config: ModelConfig | GPTClassifierConfig) -> Vocabulary | GPTInputs | None:
    if getattr(config, "encoder", None) == "prompted":
        from attnmetrics.models.prompted import PromptInputs

        path = directory / PromptInputs.filename
        return PromptInputs.load(path) if path.is_dir() else None
    if getattr(config, "encoder", None) == "hf":
        from attnmetrics.models.hf import HFInputs

        path = directory / HFInputs.filename
        return HFInputs.load(path) if path.is_dir() else None
    if isinstance(config, GPTClassifierConfig):
        path = directory / GPTInputs.filename
        if not path.is_file():
            return None
        vocab = GPTInputs(BPETokenizer.load(path), config.gpt.context)
        size = config.gpt.vocab_size
    else:
        path = directory / _VOCAB
        if not path.is_file():
            return None
        reader = PairVocabulary if isinstance(config, PairModelConfig) else Vocabulary
        vocab, size = reader.load(path), config.vocab_size
    if len(vocab) != size:
        raise ValueError(f"{directory}: {path.name} holds {len(vocab)} tokens, model.json says {size}")
    return vocab


def load_checkpoint(directory: str | os.PathLike, map_location: str | torch.device = "cpu") -> Checkpoint:
    """Rebuild a model saved by :func:`save_checkpoint` (``torch.load(weights_only=True)``).

    ``model.json`` is checked against ``model.pt`` before anything of its size is allocated: the
    weights are memory-mapped, the configured model is built on the meta device (no memory),
    and every tensor's name and shape must agree, so an edited config (a huge ``vocab_size``,
    ``lead``/``trail`` other than the ``<SOS>``/``<EOS>`` the vocabulary adds) is refused.

    Raises:
        FileNotFoundError: ``model.pt`` or ``model.json`` is missing (the vocabulary file is
            optional: ``vocab`` is then None).
        ValueError: a file that cannot be read (named), an unknown format, or a config that
            does not match the weights (the first differing tensor named, with both shapes).
    """
    directory = Path(directory)
    for name in (_WEIGHTS, _CONFIG):
        if not (directory / name).is_file():
            raise FileNotFoundError(f"{directory} is not a checkpoint: {name} is missing")
    try:
        meta = json.loads((directory / _CONFIG).read_text())
        config = _model_config(meta["model"])
    except (ValueError, KeyError, TypeError) as e:  # JSONDecodeError is a ValueError
        raise ValueError(f"{directory / _CONFIG}: not a model config saved by attnmetrics ({e!r})") from None
    if meta.get("format") != _FORMAT:
        raise ValueError(f"{directory}: unsupported checkpoint format {meta.get('format')}")
    if isinstance(config, ModelConfig) and (config.lead, config.trail) != (1, 1):
        raise ValueError(
            f"{directory / _CONFIG}: lead/trail must be 1/1 (the <SOS>/<EOS> the vocabulary adds), "
            f"got {config.lead}/{config.trail}"
        )
    state = load_tensors(directory / _WEIGHTS, "the weights", mmap=True)
    if getattr(config, "encoder", None) == "prompted":  # no weights of its own: rebuilt from its source
        expected = {}
    else:
        with torch.device("meta"):
            expected = {k: tuple(v.shape) for k, v in _build(config).state_dict().items()}
    found = {k: tuple(v.shape) for k, v in state.items()} if isinstance(state, dict) else {}
    for key in sorted(expected.keys() | found.keys()):
        if expected.get(key) != found.get(key):
            raise ValueError(
                f"{directory}: model.json does not match model.pt at {key!r}: the config gives shape "
                f"{expected.get(key)}, the weights {found.get(key)} (None: absent)"
            )
    vocab = _load_vocab(directory, config)
    model = _build(config)
    model.load_state_dict(state)
    return Checkpoint(model.to(map_location), vocab, meta.get("extra", {}))


def train_config_dict(config: TrainConfig) -> dict:
    """TrainConfig as a JSON-ready dict (for ``save_checkpoint(extra=...)``/results.json)."""
    return asdict(config)
