"""Language-model pre-training of :class:`~attnmetrics.models.gpt.GPT` (Radford et al. 2018,
sec. 3.1 and 4.1): maximise sum_t log P(u_t | u_{t-k}, ..., u_{t-1}) over random contiguous
windows of the token stream, with Adam, linear warm-up and cosine decay.

- Data: the training texts are encoded chunk by chunk into a token file on disk and read back
  memory-mapped, so memory stays bounded whatever the corpus size; each step draws ``batch_size``
  windows of ``context + 1`` tokens at uniformly random offsets (GPT-1: "randomly sampled,
  contiguous sequences") from a seeded generator.
- Validation: perplexity per BPE token on the held-out book (``GUTENBERG_HELD_OUT``), over its
  consecutive non-overlapping windows of ``context`` predictions.
- Checkpoints: ``out_dir/step-NNNNNNN/`` holds ``model.pt`` (state dict), ``model.json`` (model
  config, pre-training config, history), ``tokenizer.json`` and ``training.pt`` (optimizer,
  scheduler, step, generator and RNG states). A checkpoint is written into a temporary folder,
  renamed into place, and only then named by ``out_dir/latest`` (temp file + ``os.replace``), so
  a crash at any moment leaves the previous checkpoint in force. Resuming restores everything a
  step depends on, so N steps in one run and N/2 + resume + N/2 give identical weights.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor
from tqdm.auto import tqdm

from attnmetrics.data import GUTENBERG_HELD_OUT, load_gutenberg, sha256_file
from attnmetrics.models.bpe import DEFAULT_VOCAB_SIZE, BPETokenizer
from attnmetrics.models.files import load_tensors
from attnmetrics.models.gpt import GPT, GPTConfig
from attnmetrics.models.parallel import all_reduce_gradients, data_parallel


@dataclass
class PretrainConfig:
    """A pre-training run. GPT-1 (sec. 4.1) used max lr 2.5e-4, 2,000 warm-up steps, batches of
    64 × 512 tokens, 100 epochs, and decoupled L2 of 0.01 on non-bias, non-gain weights.

    ``lr``: GPT-1's 2.5e-4 suits the ``small`` model too; a higher one is worse, not faster
    (measured: :data:`LR_MEASUREMENT`).
    ``grad_clip``: the global gradient norm is clipped at 1 (not in the paper; OpenAI's released
    GPT-1 code does so). ``eval_windows`` caps the validation windows (None: the whole held-out
    book). The defaults (``small``, 1.2M tokens) take about 15 minutes on one free CPU thread at
    1,435 tokens/s, tokenizer and evaluations included; the runs of :data:`LR_MEASUREMENT`, three
    jobs sharing two cores, took 30.
    """

    steps: int = 600
    batch_size: int = 16
    lr: float = 2.5e-4
    warmup: int = 60
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    vocab_size: int = DEFAULT_VOCAB_SIZE
    seed: int = 0
    eval_every: int = 200
    eval_windows: int | None = None
    eval_batch_size: int = 32
    checkpoint_every: int = 200
    progress: bool = True

    def __post_init__(self):
        for name in ("steps", "batch_size", "eval_every", "eval_batch_size", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.warmup < 0 or self.lr <= 0:
            raise ValueError(f"warmup must be >= 0 and lr > 0, got {self.warmup}, {self.lr}")

    @classmethod
    def from_dict(cls, d: dict) -> PretrainConfig:
        unknown = set(d) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown pre-training config keys: {sorted(unknown)}")
        return cls(**d)


#: Max lr -> {step: validation loss} (nats per BPE token, first 100 windows of the held-out book)
#: of the ``small`` model under the default schedule (600 steps of 16 × 128 tokens, warm-up 60,
#: cosine to 0, seed 0; one CPU thread). At 1e-3 the post-LN model stays on the unigram plateau
#: (about 6.9 nats) for the whole run; at GPT-1's 2.5e-4 it leaves it by step 200 and ends at 6.14
#: (perplexity 464; train loss 7.65 -> 5.61). (Over the
#: first 150 steps alone, warm-up 15, max lrs 2.5e-4 / 1e-3 / 3e-3 all end on the plateau:
#: 6.90 / 6.94 / 6.96.)
LR_MEASUREMENT: dict[float, dict[int, float]] = {
    2.5e-4: {100: 6.921, 200: 6.630, 300: 6.320, 400: 6.204, 500: 6.147, 600: 6.140},
    1e-3: {100: 7.002, 200: 6.949, 300: 6.895, 400: 6.922, 500: 6.895, 600: 6.895},
}


# --------------------------------------------------------------------------- token stream


def encode_to_file(
    tokenizer: BPETokenizer, texts: Iterable[str], path: str | os.PathLike, chunk_chars: int = 1 << 20
) -> int:
    """Encode ``texts`` into ``path`` as one stream of uint16 ids (uint32 past 65,536 ids), a
    chunk of about ``chunk_chars`` characters at a time, so memory is bounded by the chunk.
    Chunks end at a line break where there is one. Returns the number of tokens.

    The texts are concatenated as they come; GPT-1 trained on one stream of books too.
    """
    dtype = _token_dtype(tokenizer.vocab_size)
    path = Path(path)
    n = 0
    with open(path, "wb") as f:
        for text in texts:
            start = 0
            while start < len(text):
                end = min(start + chunk_chars, len(text))
                if end < len(text):
                    cut = text.rfind("\n", start, end)
                    end = cut + 1 if cut > start else end
                ids = np.asarray(tokenizer.encode(text[start:end]), dtype=dtype)
                f.write(ids.tobytes())
                n += len(ids)
                start = end
    return n


def _token_dtype(vocab_size: int) -> type[np.unsignedinteger]:
    return np.uint16 if vocab_size <= 1 << 16 else np.uint32


def read_tokens(path: str | os.PathLike, vocab_size: int) -> np.ndarray:
    """The token file written by :func:`encode_to_file`, memory-mapped (read-only)."""
    return np.memmap(path, dtype=_token_dtype(vocab_size), mode="r")


def check_stream(path: str | os.PathLike, vocab_size: int, context: int, name: str) -> None:
    """Refuse the token file ``path`` (of :func:`encode_to_file`) if it is shorter than one window
    of ``context + 1`` tokens: too short to train on or to validate with.

    Raises:
        ValueError: one line naming the text (``name``), the tokens it has and those needed.
    """
    n = Path(path).stat().st_size // np.dtype(_token_dtype(vocab_size)).itemsize
    if n < context + 1:
        raise ValueError(
            f"{name} is too short to pre-train on: {n} tokens after BPE, at least {context + 1} needed "
            f"(one window: the model's context {context} + 1); give a longer text"
        )


def sample_windows(tokens: np.ndarray, batch_size: int, context: int, generator: torch.Generator) -> Tensor:
    """``batch_size`` windows of ``context + 1`` consecutive tokens at uniform random offsets
    -> int64 ``[batch_size, context + 1]`` (inputs ``[:, :-1]``, targets ``[:, 1:]``).

    Raises ValueError when the stream is shorter than one window."""
    if len(tokens) < context + 1:
        raise ValueError(f"the token stream ({len(tokens)} tokens) is shorter than one window ({context + 1})")
    offsets = torch.randint(0, len(tokens) - context, (batch_size,), generator=generator).tolist()
    return torch.from_numpy(np.stack([tokens[o : o + context + 1] for o in offsets]).astype(np.int64))


def consecutive_windows(tokens: np.ndarray, context: int, batch_size: int) -> Iterator[Tensor]:
    """Non-overlapping windows covering the stream in order, ``[b, context + 1]`` int64 each
    (consecutive windows share their boundary token, so every token but the first is a target
    exactly once); a shorter tail is dropped."""
    n = (len(tokens) - 1) // context
    for start in range(0, n, batch_size):
        rows = [tokens[i * context : i * context + context + 1] for i in range(start, min(start + batch_size, n))]
        yield torch.from_numpy(np.stack(rows).astype(np.int64))


def lm_loss(model: GPT, windows: Tensor) -> Tensor:
    """Mean next-token cross-entropy of windows ``[B, context + 1]`` (float, nats per token)."""
    logits = model(windows[:, :-1]).logits
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), windows[:, 1:].reshape(-1))


@torch.no_grad()
def validation_loss(
    model: GPT, tokens: np.ndarray, batch_size: int = 32, max_windows: int | None = None
) -> tuple[float, int]:
    """(mean nats per token, tokens scored) over :func:`consecutive_windows` of the model's
    context (the first ``max_windows`` of them); perplexity is ``exp`` of the first.
    Raises ValueError when the stream holds no window."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    total, count = 0.0, 0
    try:
        for w in consecutive_windows(tokens, model.config.context, batch_size):
            if max_windows is not None:
                w = w[: max(max_windows - count // model.config.context, 0)]
                if not len(w):
                    break
            w = w.to(device)
            total += float(lm_loss(model, w).double()) * w[:, 1:].numel()
            count += w[:, 1:].numel()
    finally:
        model.train(was_training)
    if not count:
        raise ValueError(f"validation stream of {len(tokens)} tokens holds no window of {model.config.context + 1}")
    return total / count, count


# --------------------------------------------------------------------------- optimisation


def make_optimizer(model: GPT, config: PretrainConfig) -> torch.optim.Optimizer:
    """Adam with GPT-1's decoupled L2 (AdamW, Loshchilov & Hutter) on matrices only: biases,
    layer-norm gains and the embeddings (GPT-1's "non bias or gain weights" are the matrices)
    are not decayed. The tied output weight is the embedding, so it appears once."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (decay if p.ndim == 2 and "tokens" not in name and "positions" not in name else no_decay).append(p)
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=config.lr,
    )


def lr_factor(step: int, warmup: int, total: int) -> float:
    """Multiplier of the max lr at optimiser step ``step`` (0-based): linear from 1/warmup up to 1
    over ``warmup`` steps, then cosine to 0 at ``total`` (GPT-1 sec. 4.1)."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(total - warmup, 1)
    return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))


def make_scheduler(optimizer: torch.optim.Optimizer, config: PretrainConfig) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, config.warmup, config.steps))


# --------------------------------------------------------------------------- checkpoints

_LATEST = "latest"
_FORMAT = 1


def _umask() -> int:
    """The process's umask (read by setting it and putting it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _atomic_write(path: Path, data: bytes) -> None:
    """Write via a temporary file in the same folder and ``os.replace``: readers see the old
    file or the whole new one, never a part."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp's 0600 would ignore the umask
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class TrainingState(NamedTuple):
    """Everything a step depends on besides the weights."""

    step: int
    optimizer: dict
    scheduler: dict
    generator: Tensor
    rng: Tensor
    history: list[dict]
    running: tuple[float, int] = (0.0, 0)  # the train loss summed since the last evaluation, and its steps


def save_pretraining_checkpoint(
    out_dir: str | os.PathLike,
    model: GPT,
    tokenizer: BPETokenizer,
    config: PretrainConfig,
    state: TrainingState,
    keep: int = 1,
    extra: dict | None = None,
) -> Path:
    """Write ``out_dir/step-NNNNNNN/`` (see the module docstring), point ``latest`` at it, and
    delete all but the newest ``keep`` step folders; ``extra`` (JSON-ready) goes into
    ``model.json``. A write killed before its rename left a ``.step-N.XXXX`` folder: removed here,
    by the next checkpoint of the run (rank 0 alone writes them). Returns the checkpoint folder."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in out_dir.glob(".step-*.*"):  # a write killed before its rename (one writer: rank 0)
        if stale.is_dir() and re.fullmatch(r"\.step-\d+\.[A-Za-z0-9_]+", stale.name):
            shutil.rmtree(stale, ignore_errors=True)
    name = f"step-{state.step:07d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=out_dir))
    try:
        tmp.chmod(0o777 & ~_umask())  # mkdtemp's 0700 would ignore the umask
        torch.save(model.state_dict(), tmp / "model.pt")
        meta = {
            "format": _FORMAT,
            "model": model.config.to_dict(),
            "pretraining": asdict(config),
            "step": state.step,
            "history": state.history,
            **(extra or {}),
        }
        (tmp / "model.json").write_text(json.dumps(meta, indent=2))
        tokenizer.save(tmp / "tokenizer.json")
        torch.save(state._asdict(), tmp / "training.pt")
        target = out_dir / name
        if target.exists():  # the same step saved again (a resumed run's first save)
            shutil.rmtree(target)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _atomic_write(out_dir / _LATEST, name.encode())
    for old in sorted(out_dir.glob("step-*"))[:-keep] if keep else []:
        if old.name != name:
            shutil.rmtree(old, ignore_errors=True)
    return target


def _resolve(path: str | os.PathLike) -> Path:
    """A run folder (its ``latest``) or a checkpoint folder itself.

    Raises:
        ValueError: ``latest`` names anything but a folder inside the run folder (an absolute
            path, ``..``, a path with a separator).
    """
    path = Path(path)
    if (path / _LATEST).is_file():
        name = (path / _LATEST).read_text().strip()
        if not re.fullmatch(r"step-\d+", name):
            raise ValueError(
                f"{path / _LATEST}: {name!r} is not a step folder of this run (outside it, or not step-N); "
                "expected a name such as step-0000600"
            )
        return path / name
    return path


def checkpoint_meta(path: str | os.PathLike) -> dict:
    """``model.json`` of a checkpoint folder, or of a run folder's latest checkpoint (no weights read).

    Raises:
        FileNotFoundError: no ``model.json``.
        ValueError: not JSON, or ``latest`` outside the run folder.
    """
    file = _resolve(path) / "model.json"
    try:
        return json.loads(file.read_text())
    except ValueError as e:
        raise ValueError(f"{file}: not a checkpoint's model.json ({e})") from None


class Pretrained(NamedTuple):
    model: GPT
    tokenizer: BPETokenizer
    meta: dict


def load_gpt(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> Pretrained:
    """The model and tokenizer of a checkpoint folder, or of a run folder's latest checkpoint
    (weights read with ``torch.load(weights_only=True)``).

    Raises:
        FileNotFoundError: not a checkpoint (a file named).
        ValueError: an unreadable config or weights that do not match it.
    """
    path = _resolve(path)
    for name in ("model.pt", "model.json", "tokenizer.json"):
        if not (path / name).is_file():
            raise FileNotFoundError(f"{path} is not a GPT checkpoint: {name} is missing")
    try:
        meta = json.loads((path / "model.json").read_text())
        config = GPTConfig.from_dict(meta["model"])
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path / 'model.json'}: not a GPT config ({e!r})") from None
    if meta.get("format") != _FORMAT:
        raise ValueError(f"{path}: unsupported checkpoint format {meta.get('format')}")
    tokenizer = BPETokenizer.load(path / "tokenizer.json")
    if tokenizer.vocab_size != config.vocab_size:
        raise ValueError(f"{path}: tokenizer has {tokenizer.vocab_size} ids, model.json says {config.vocab_size}")
    state = load_tensors(path / "model.pt", "the weights")
    _check_shapes(path, config, state)
    model = GPT(config)
    model.load_state_dict(state)
    return Pretrained(model.to(map_location), tokenizer, meta)


def _check_shapes(path: Path, config: GPTConfig, state: object) -> None:
    """Raise a one-line ValueError naming the first key where ``state`` and the model ``config``
    describes (built on the meta device: no memory) differ."""
    with torch.device("meta"):
        expected = {k: tuple(v.shape) for k, v in GPT(config).state_dict().items()}
    found = (
        {k: tuple(v.shape) for k, v in state.items() if isinstance(v, torch.Tensor)} if isinstance(state, dict) else {}
    )
    for key in sorted(expected.keys() | found.keys()):
        if expected.get(key) != found.get(key):
            raise ValueError(
                f"{path / 'model.pt'} does not match model.json at {key!r}: the config gives shape "
                f"{expected.get(key)}, the weights {found.get(key)} (None: absent)"
            )


def load_training_state(path: str | os.PathLike) -> TrainingState:
    """``training.pt`` of a checkpoint (or a run's latest), read with ``weights_only=True``.

    Raises:
        ValueError: one line naming the file, if it cannot be read (truncated or damaged) or
            does not hold a training state.
    """
    file = _resolve(path) / "training.pt"
    state = load_tensors(file, "the training state")
    try:
        return TrainingState(**state)
    except TypeError as e:  # not a dict, or other keys
        raise ValueError(f"{file}: not a training state saved by attnmetrics ({e})") from None


# --------------------------------------------------------------------------- the loop


@dataclass
class PretrainResult:
    """``history``: one dict per evaluation (step, train_loss, val_loss, val_ppl, tokens, seconds)."""

    checkpoint: Path
    step: int
    history: list[dict] = field(default_factory=list)
    seconds: float = 0.0


def _corpus(cache_dir) -> tuple[list[str], str]:
    books = load_gutenberg(cache_dir)
    return [t for n, t in books.items() if n != GUTENBERG_HELD_OUT], books[GUTENBERG_HELD_OUT]


def _starting_point(out_dir: Path, model_config, config, train_texts, tokenizer, resume: bool):
    """(model, tokenizer, config, training state or None, checkpoint metadata or None): the
    latest checkpoint's when resuming, else a fresh model seeded by ``config.seed`` (the
    tokenizer trained on ``train_texts`` unless given)."""
    if resume:
        if not (out_dir / _LATEST).is_file():
            raise ValueError(f"{out_dir}: nothing to resume (no {_LATEST} checkpoint)")
        model, tokenizer, meta = load_gpt(out_dir)
        return model, tokenizer, PretrainConfig.from_dict(meta["pretraining"]), load_training_state(out_dir), meta
    config = config or PretrainConfig()
    torch.manual_seed(config.seed)  # the initial weights
    tokenizer = tokenizer or BPETokenizer.train(train_texts, config.vocab_size)
    if isinstance(model_config, str):
        model_config = GPTConfig.named(model_config, tokenizer.vocab_size)
    if model_config.vocab_size != tokenizer.vocab_size:
        raise ValueError(f"model vocab_size {model_config.vocab_size} != tokenizer's {tokenizer.vocab_size}")
    return GPT(model_config), tokenizer, config, None, None


def _checked_streams(out_dir: Path, vocab_size: int, context: int, train_name: str, valid_name: str) -> dict:
    """The digests of ``out_dir``'s token streams (``train_tokens_sha256``, ``valid_tokens_sha256``),
    each first checked to hold a window (:func:`check_stream`; on every rank, so each raises alike)."""
    for s, name in (("train", train_name), ("valid", valid_name)):
        check_stream(out_dir / f"{s}.tokens", vocab_size, context, name)
    return {f"{s}_tokens_sha256": sha256_file(out_dir / f"{s}.tokens") for s in ("train", "valid")}


def _step(model, optimizer, windows: Tensor, rank: int, world: int, device, grad_clip: float) -> Tensor:
    """One optimiser step on this rank's slice of ``windows`` (every rank draws the same ones),
    the gradient summed over the ranks weighted by their windows; returns the batch's loss (the
    mean over every rank's windows)."""
    mine = windows[rank::world].to(device)
    optimizer.zero_grad(set_to_none=True)
    loss = lm_loss(model, mine) if len(mine) else torch.zeros((), device=device)
    if len(mine):
        loss.backward()
    if world > 1:
        all_reduce_gradients(model, len(mine) / len(windows))
        summed = (loss.detach() * len(mine)).reshape(1).to(torch.float64)
        dist.all_reduce(summed)
        loss = summed[0] / len(windows)
    if grad_clip:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    return loss


def pretrain(
    out_dir: str | os.PathLike,
    model_config: str | GPTConfig = "small",
    config: PretrainConfig | None = None,
    *,
    train_texts: list[str] | None = None,
    valid_text: str | None = None,
    tokenizer: BPETokenizer | None = None,
    resume: bool = False,
    stop_at: int | None = None,
    cache_dir: str | os.PathLike | None = None,
    device: str | torch.device = "cpu",
    train_name: str = "the training texts",
    valid_name: str = "the validation text",
) -> PretrainResult:
    """Pre-train a GPT for ``config.steps`` steps into ``out_dir`` (checkpoints as in the module
    docstring, the last one at the final step).

    ``model_config``: a :data:`~attnmetrics.models.gpt.CONFIGS` name (its ``vocab_size`` is the
    tokenizer's) or a full :class:`GPTConfig`. Texts default to the Gutenberg books less the
    held-out one (``valid_text``); the tokenizer is trained on ``train_texts`` unless given.
    ``resume`` continues from ``out_dir``'s latest checkpoint (its model config, pre-training
    config and tokenizer are used; the arguments' are ignored). ``stop_at`` ends the run (with a
    checkpoint) after that step, without changing the schedule, so a run can be split in parts.

    Data-parallel under ``torch.distributed`` (torchrun): every rank must pass the same
    tokenizer (``attnmetrics pretrain`` broadcasts rank 0's) and see ``out_dir``; rank 0 alone
    writes the token streams, the checkpoints and the validation history, the others read the
    streams it wrote. Each step's windows are drawn as one process draws them and split over
    the ranks, so a resumed run continues the same stream on any number of ranks.

    Raises ValueError when ``resume`` finds no checkpoint or, before the first step, when the
    training texts or the validation text are too short for a window (named ``train_name``,
    ``valid_name``).
    """
    out_dir = Path(out_dir)
    start_time = time.perf_counter()
    if train_texts is None or valid_text is None:
        corpus_train, corpus_valid = _corpus(cache_dir)
        train_texts = corpus_train if train_texts is None else train_texts
        valid_text = corpus_valid if valid_text is None else valid_text
    model, tokenizer, config, state, meta = _starting_point(
        out_dir, model_config, config, train_texts, tokenizer, resume
    )
    model.to(device).train()
    optimizer = make_optimizer(model, config)
    scheduler = make_scheduler(optimizer, config)
    generator = torch.Generator().manual_seed(config.seed)
    step, history, running, seen = 0, [], 0.0, 0
    if state is not None:
        optimizer.load_state_dict(state.optimizer)
        scheduler.load_state_dict(state.scheduler)
        generator.set_state(state.generator)
        torch.set_rng_state(state.rng)  # dropout masks on the CPU (a GPU run resumes up to them)
        step, history = state.step, list(state.history)
        running, seen = state.running

    rank, world = data_parallel()
    main = rank == 0
    if main:
        out_dir.mkdir(parents=True, exist_ok=True)
        # Rebuilt each run (deterministic from the tokenizer and texts), so a resumed run reads the same stream.
        encode_to_file(tokenizer, train_texts, out_dir / "train.tokens")
        encode_to_file(tokenizer, [valid_text], out_dir / "valid.tokens")
    if world > 1:
        dist.barrier()  # the token streams are written (out_dir must be shared by the ranks)
    streams = _checked_streams(out_dir, tokenizer.vocab_size, model.config.context, train_name, valid_name)
    if resume:
        for key, digest in streams.items():
            if meta.get(key) != digest:
                raise ValueError(f"{out_dir}: the texts given to resume are not the ones the run started on ({key})")
    train_tokens = read_tokens(out_dir / "train.tokens", tokenizer.vocab_size)
    valid_tokens = read_tokens(out_dir / "valid.tokens", tokenizer.vocab_size)

    def snapshot() -> TrainingState:
        return TrainingState(
            step,
            optimizer.state_dict(),
            scheduler.state_dict(),
            generator.get_state(),
            torch.get_rng_state(),
            history,
            (running, seen),
        )

    context = model.config.context
    per_step = config.batch_size * context
    end = min(config.steps, stop_at) if stop_at is not None else config.steps
    bar = tqdm(
        total=config.steps * per_step,
        initial=step * per_step,
        unit="tok",
        unit_scale=True,
        desc="pre-training",
        disable=not (config.progress and main),
    )
    checkpoint = out_dir / f"step-{step:07d}"
    while step < end:
        # Data-parallel (torchrun): every rank draws the same windows, runs its slice of them and
        # steps on the gradient summed over ranks, weighted by windows (models/training.py).
        windows = sample_windows(train_tokens, config.batch_size, context, generator)
        loss = _step(model, optimizer, windows, rank, world, device, config.grad_clip)
        scheduler.step()
        step += 1
        running += loss.item()
        seen += 1
        bar.update(per_step)
        bar.set_postfix(loss=f"{loss.item():.3f}", lr=f"{scheduler.get_last_lr()[0]:.2e}", refresh=False)
        if main and (step % config.eval_every == 0 or step == config.steps):
            val, scored = validation_loss(model, valid_tokens, config.eval_batch_size, config.eval_windows)
            history.append(
                {
                    "step": step,
                    "train_loss": running / seen,
                    "val_loss": val,
                    "val_ppl": math.exp(val),
                    "val_tokens": scored,
                    "tokens": step * per_step,
                    "seconds": time.perf_counter() - start_time,
                }
            )
            running, seen = 0.0, 0
            if config.progress:
                r = history[-1]
                tqdm.write(
                    f"step {step}: train loss {r['train_loss']:.4f}, val loss {val:.4f} (ppl {r['val_ppl']:.1f})"
                )
        if main and (step % config.checkpoint_every == 0 or step == end):
            checkpoint = save_pretraining_checkpoint(out_dir, model, tokenizer, config, snapshot(), extra=streams)
    bar.close()
    if main and (step == 0 or not (out_dir / _LATEST).is_file()):
        checkpoint = save_pretraining_checkpoint(out_dir, model, tokenizer, config, snapshot(), extra=streams)
    if world > 1:
        dist.barrier()  # rank 0's last checkpoint is written before any rank returns
    return PretrainResult(checkpoint, step, history, time.perf_counter() - start_time)
