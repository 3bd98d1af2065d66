"""``attnmetrics pretrain``: pre-train a GPT language model on the Gutenberg books."""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from attnmetrics.app import distributed
from attnmetrics.app.distributed import World
from attnmetrics.app.io import check_out, claimed_folder
from attnmetrics.data import GUTENBERG_HELD_OUT, load_gutenberg
from attnmetrics.models.bpe import BPETokenizer
from attnmetrics.models.gpt import GPTConfig
from attnmetrics.models.pretraining import PretrainConfig
from attnmetrics.models.pretraining import pretrain as pretrain_gpt


@dataclass(frozen=True)
class PretrainArgs:
    """``pretrain``'s flags (attnmetrics/app/parser.py has their help); None: the config's."""

    out: Path
    config: str
    layers: int | None
    d_model: int | None
    heads: int | None
    context: int | None
    dropout: float | None
    steps: int
    batch_size: int
    lr: float
    warmup: int
    vocab_size: int
    max_chars: int | None
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
        if args.out.exists() and any(args.out.iterdir()) and not args.resume:
            raise FileExistsError(f"{args.out} exists; --resume continues its pre-training, or choose another --out")
    books = load_gutenberg()
    cut = (lambda text: text[: args.max_chars]) if args.max_chars else (lambda text: text)
    train_texts = [cut(text) for name, text in books.items() if name != GUTENBERG_HELD_OUT]
    valid_text = cut(books[GUTENBERG_HELD_OUT])
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
                args.out, train_texts=train_texts, valid_text=valid_text, resume=True, device=args.device
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
