"""``attnmetrics``: train an attention classifier on real data, run the faithfulness battery,
write a report.

    attnmetrics run --dataset mr --out runs/mr-lstm            # train + experiments + report
    attnmetrics run --dataset sst --data-dir path/to/sst
    attnmetrics train --dataset sst --data-dir DIR --out runs/sst-model
    attnmetrics evaluate runs/sst-model --out runs/sst-eval      # experiments on a saved model
    attnmetrics report runs/sst-lstm                             # re-render report.md and figures
    attnmetrics report runs/sst-lstm runs/sst-average --out runs/compare   # compare runs
    attnmetrics sweep configs/sweep.toml --jobs 2                # a grid of runs + one aggregated report
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np
import scipy
import torch

import attnmetrics
from attnmetrics.app import distributed, importances, sweep
from attnmetrics.app.battery import EXPERIMENTS, collect, merge, summarise, tested_forward
from attnmetrics.app.consistent_adversary import consistent_adversaries, jain_wallace_point
from attnmetrics.app.diagnostic_mlps import diagnostic_mlps
from attnmetrics.app.distributed import World
from attnmetrics.app.io import (
    check_out,
    claimed_folder,
    is_run_folder,
    run_folder,
    write_json_atomic,
    write_npz_atomic,
    write_parquet_atomic,
)
from attnmetrics.app.parser import build_parser
from attnmetrics.app.recipes import PRESETS, Preset, jain_wallace_length_filter, recipe_defaults
from attnmetrics.app.report import render, render_comparison
from attnmetrics.app.table import run_table
from attnmetrics.data import (
    GUTENBERG_HELD_OUT,
    ArtifactError,
    glove_matrix,
    load_dataset,
    load_gutenberg,
    load_minilm,
)
from attnmetrics.flip import removal_order
from attnmetrics.models.bpe import BPETokenizer
from attnmetrics.models.classifier import EncoderAttentionClassifier, ModelConfig
from attnmetrics.models.gpt import GPTConfig
from attnmetrics.models.gpt_classifier import EXTRACT_READOUT, GPTClassifier, GPTInputs
from attnmetrics.models.pretraining import PretrainConfig, load_gpt, pretrain
from attnmetrics.models.text import Vocabulary, collate
from attnmetrics.models.training import (
    Predictions,
    TrainConfig,
    load_checkpoint,
    predict,
    prediction_metrics,
    save_checkpoint,
    train,
    train_config_dict,
)
from attnmetrics.outputs import output_distribution

CHECKPOINT = "model"  # sub-folder of a run holding model.pt, model.json, vocab.json
#: results["battery"] of GPT-1's extract read-out: the procedures test the model's own attention
OWN_ATTENTION = (
    "GPT-1's own attention (--attention extract): the last layer's <extract> attention row, per head, over the "
    "real tokens; <start> and <extract> keep their weights, each head's real tokens are renormalised within "
    "their mass, tokens are removed and permuted in every head alike; orders and tau use the head mean "
    "(docs/definitions.md §15)"
)


def _environment(seed: int, device: str = "cpu") -> dict:
    return {
        "seed": seed,
        "device": device,
        "threads": torch.get_num_threads(),
        "versions": {
            "attnmetrics": attnmetrics.__version__,
            "python": platform.python_version(),
            "torch": torch.__version__,
            "numpy": np.__version__,
            "scipy": scipy.__version__,
        },
        "machine": platform.platform(),
    }


def _load_data(
    dataset: str,
    data_dir: Path | None,
    limit: int | None,
    seed: int,
    max_tokens: int | None = None,
    protocol: Preset = PRESETS["attnmetrics"],
):
    splits = load_dataset(dataset, data_dir=data_dir, seed=seed, max_tokens=max_tokens)
    if protocol.sst_length_filter and dataset == "sst":
        splits = jain_wallace_length_filter(splits)
    if limit:
        splits = type(splits)(
            splits.name, splits.classes, splits.train[:limit], splits.dev[:limit], splits.test[:limit], splits.info
        )
    print(splits.summary(), file=sys.stderr)
    empty = [name for name, n in splits.sizes().items() if n == 0]
    if empty:  # before any training: an empty split would give an untrained model or an empty report
        raise ValueError(f"dataset {splits.name!r} has an empty {' and '.join(empty)} split; nothing to train or test")
    return splits


def _gpt_model(args, splits, results: dict) -> tuple[GPTClassifier, GPTInputs]:
    """GPT-1's classifier: fine-tuned from ``--pretrained`` (its embeddings and first
    ``--transfer-layers`` blocks), or from scratch with a BPE learnt on the training split."""
    classes = len(splits.classes)
    head = {
        "num_classes": 1 if classes == 2 else classes,
        "attention": args.attention,
        "lm_weight": args.lm_weight,
    }
    torch.manual_seed(args.seed)  # the head and any block not transferred
    if args.pretrained:
        pre = load_gpt(args.pretrained)
        model = GPTClassifier.from_pretrained(pre, transfer_layers=args.transfer_layers, **head)
        tokenizer = pre.tokenizer
        last = (pre.meta.get("history") or [{}])[-1]
        results["pretrained"] = {
            "path": str(args.pretrained.resolve()),
            "step": pre.meta.get("step"),
            "val_ppl": last.get("val_ppl"),
            "transfer_layers": model.config.gpt.n_layer if args.transfer_layers is None else args.transfer_layers,
        }
    else:
        if args.transfer_layers is not None:
            raise ValueError("--transfer-layers needs --pretrained (the layers come from a pre-trained GPT)")
        tokenizer = BPETokenizer.train([text for text, _ in splits.train])
        model = GPTClassifier(GPTConfig.named(args.gpt_config, tokenizer.vocab_size), **head)
        results["pretrained"] = None
    return model.to(args.device), GPTInputs(tokenizer, model.config.gpt.context)


def _hf_model(args, splits, results: dict):
    """A Hugging Face classifier from ``--model hf:minilm`` (the pinned all-MiniLM-L6-v2) or
    ``hf:PATH``, with a new head for the data set's classes, and its tokenizer."""
    from attnmetrics.models.hf import HFClassifier  # optional transformers

    name = args.model[3:]
    path = load_minilm() if name == "minilm" else Path(name)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"--model {args.model}: {path} is not a Hugging Face checkpoint folder (no config.json)"
        )
    classes = len(splits.classes)
    torch.manual_seed(args.seed)  # the new classification head
    model, inputs = HFClassifier.from_pretrained(path, 1 if classes == 2 else classes)
    inputs.max_length = args.max_length
    results["pretrained"] = {"path": str(path.resolve()), "model": args.model}
    return model.to(args.device), inputs


def _train(args, results: dict):
    """Build the model ``--encoder`` names, train it with its family's recipe, record both."""
    protocol = PRESETS[args.protocol]
    splits = _load_data(args.dataset, args.data_dir, args.limit, args.split_seed, args.max_tokens, protocol)
    common = {
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "lr": args.lr,
        "weight_decay": args.weight_decay,
        "seed": args.seed,
        "progress": not args.no_progress,
    }
    make = None
    if args.model or args.encoder == "gpt":
        if getattr(args, "consistent_adversary", None) or getattr(args, "diagnostic", False):
            raise ValueError(
                f"--consistent-adversary and --diagnostic train BiLSTM-family models, not {args.model or 'gpt'}"
            )
        model, vocab = _hf_model(args, splits, results) if args.model else _gpt_model(args, splits, results)
        # GPT-1 sec. 4.1 and BERT's fine-tuning: linear warm-up then decay, decoupled weight decay.
        # Batches of rows of similar length (J&W's code): a transformer computes attention over
        # padding and throws it away, and SST's rows run from 3 to 60 tokens.
        tconf = TrainConfig(
            **common,
            amsgrad=False,
            schedule="linear",
            warmup=args.warmup,
            decoupled_weight_decay=True,
            sort_by_length=True,
        )
    else:
        model, vocab, make = _jain_wallace_model(args, splits, results)
        tconf = TrainConfig(
            **common,
            amsgrad=protocol.amsgrad,
            pos_weight=protocol.pos_weight if model.config.num_classes == 1 else None,
            sort_by_length=protocol.sort_by_length,
        )
    train_data, dev_data = vocab.encode_split(splits.train), vocab.encode_split(splits.dev)
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
    return model, vocab, splits, (make, tconf, train_data, dev_data)


def _jain_wallace_model(args, splits, results: dict):
    """J&W's classifier over a word vocabulary of the training split (GloVe-initialised by
    default); also returns ``make(config)``, a fresh model initialised as this one (W&P)."""
    vocab = Vocabulary.build(text for text, _ in splits.train)
    embeddings, embed_dim = None, args.embed_dim
    if args.embeddings == "glove":
        embeddings, found = glove_matrix(vocab, seed=args.seed)
        embed_dim = embeddings.shape[1]
        results["data"]["glove_coverage"] = found / max(len(vocab) - 4, 1)
    classes = len(splits.classes)
    config = ModelConfig(
        vocab_size=len(vocab),
        embed_dim=embed_dim,
        hidden_size=args.hidden_size,
        num_classes=1 if classes == 2 else classes,
        encoder=args.encoder,
        attention=args.attention,
        regulariser=args.regulariser,
        tying_weight=args.tying_weight,
        mlm_weight=args.mlm_weight,
    )

    def make(cfg: ModelConfig) -> EncoderAttentionClassifier:
        """A fresh model of ``cfg``, initialised as the base (same seed, same embeddings)."""
        torch.manual_seed(args.seed)
        return EncoderAttentionClassifier(cfg, embeddings).to(args.device)

    return make(config), vocab, make


def _wiegreffe(args, model, test, recipe, results: dict) -> None:
    """W&P 2019's trained experiments: model-consistent adversaries and diagnostic MLPs."""
    make, tconf, train_data, dev_data = recipe
    adversaries = []
    if args.consistent_adversary:
        t0 = time.perf_counter()
        summary, instances, adversaries = consistent_adversaries(
            model, make, train_data, dev_data, test, args.consistent_adversary, tconf
        )
        jw = jain_wallace_point(results)
        if jw:
            summary["jain_wallace"] = jw
        results["consistent_adversary"] = summary
        results["instances"]["consistent_adversary"] = instances
        results["wall_time_s"]["consistent_adversary"] = time.perf_counter() - t0
    if args.diagnostic:
        t0 = time.perf_counter()
        summary, instances = diagnostic_mlps(
            model, make, train_data, dev_data, test, tconf, adversaries[0] if adversaries else None
        )
        results["diagnostic"] = summary
        results["instances"]["diagnostic"] = instances
        results["wall_time_s"]["diagnostic"] = time.perf_counter() - t0


def _battery(args, model, test, splits, results: dict, w: World) -> bool:
    """The battery on the test split, into ``results``; under torchrun on this rank's share of
    the batches, gathered on rank 0. False on the other ranks (they write nothing)."""
    t0 = time.perf_counter()
    batches = [(int(b.index[0]), b.tokens, b.lengths) for b in test.batches(256)]
    mine = distributed.share(batches, [float(n.sum()) for _, _, n in batches], w)
    settings = dict(
        experiments=[e for e in EXPERIMENTS if e not in args.skip],
        permutations=args.permutations,
        adversarial_steps=args.adversarial_steps,
        adversarial_diversity=PRESETS[args.protocol].diversity_weight,
    )
    part = collect(
        model,
        mine,
        orders=args.orders,
        seed=args.seed,
        random_samples=args.random_samples,
        never_flipped=float("nan") if args.never_flipped == "nan" else 1.0,
        ig_steps=args.integrated_gradients,
        input_x_gradient=args.input_x_gradient,
        progress=w.main and not args.no_progress,
        **settings,
    )
    parts = distributed.gather((*part, time.perf_counter() - t0), w)
    if parts is None:
        return False
    summary, instances = summarise(*merge([p[:2] for p in parts]), splits.classes, **settings)
    results["wall_time_s"]["experiments"] = time.perf_counter() - t0
    results["wall_time_s"]["per_experiment"] = summary.pop("seconds")
    if w.size > 1:  # each rank's share and wall time; per_experiment sums the ranks' times
        results["wall_time_s"]["per_rank"] = [round(p[2], 3) for p in parts]
        results["distributed"]["instances"] = [len(p[0].get("instance", ())) for p in parts]
    results.update(summary)
    results["instances"] = instances
    results["conventions"] = {
        "special_tokens": "<SOS>/<EOS> (gpt: <start>/<extract>) masked out of attention; statistics over real tokens only",
        "epoch_selection": "J&W: the epoch with the best dev ROC-AUC; among tied epochs the lowest dev loss",
        "renormalisation": "L1 over the remaining attention weights",
        "flip_ties": "equal scores removed lower index first",
        "flip_denominator": "number of real tokens (attention items)",
        "flip_max_removed": "L - 1 (the last item is never removed)",
        "never_flipped": "NaN, left out of fraction statistics"
        if args.never_flipped == "nan"
        else "fraction 1.0 (Mohankumar et al. 2020)",
        "gradient_importance": "J&W: |grad x input| summed over classes, attention detached, L1-normalised",
        "kendall": "tau-b, two-sided p as scipy.stats.kendalltau defaults",
        "leave_one_out": "token deleted (sequence shortened, re-encoded); TVD of output distributions (1/2 L1)",
        "permutation": f"{args.permutations} permutations among real tokens, median output TVD per instance",
        "adversarial": f"J&W: 5 candidates, {args.adversarial_steps} Adam steps lr 0.01, "
        "loss -JSD + 500 ReLU(TVD - 0.01) - pairwise JSD; max JSD among outputs with TVD <= 0.05",
        "single_removal": "one weight zeroed, rest renormalised; output JSD in nats; McNemar exact test",
        "divergences": "JSD in nats (natural log), symmetric; TVD = 1/2 sum |p - q|; sums over a test set are means",
        "single_token": "T&S 2020: each real token alone between the row's own special tokens; tau-b between attention "
        "and the alone-probability of the full input's predicted class; top-attention token (ties: "
        "lower index) alone gives the full decision",
        "regulariser": "T&S 2020: concat = hidden (+) embedding; residual = hidden + Linear(embedding); tying = weight * "
        "mean over real tokens of ||P h_t - e_t||^2 (P = identity if H == E, else a learned Linear; "
        "e_t detached); mlm = weight * CE of masked real tokens (p = 0.15, replaced by <UNK>) through "
        "a head whose output matrix is the embedding matrix",
        "consistent_adversary": "W&P 2019: loss sum over batch of TVD(y_adv, y_base) - lambda KL(a_adv || a_base), KL "
        "over real tokens (0 log 0 = 0), base frozen; same init, data and recipe as the base; "
        "epoch kept: lowest mean dev objective; test TVD of outputs, JSD of attention (means)",
        "diagnostic": "W&P 2019: average encoder (Linear + tanh per token) with imposed attention in training and "
        "testing; epoch kept: best dev ROC-AUC (ties: lowest dev loss)",
    }
    return True


def _examples(args, model, test, vocab, splits, results: dict) -> None:
    """``results["examples"]`` for report.html (``--examples N``): the instances whose decision
    flips after the fewest attention-ordered removals (most faithful by S&S's flip search), those
    that need the most or never flip (least faithful), then random ones (seeded); each with its
    tokens, attention, gradient and leave-one-out scores, and its statistics from the battery."""
    inst = results["instances"]
    lengths = np.asarray(inst["lengths"])
    candidates = np.flatnonzero(lengths >= 2)
    if not args.examples or not len(candidates):
        return
    chosen: dict[int, str] = {}
    if inst.get("flip", {}).get("attention"):
        fraction = np.asarray(inst["flip"]["attention"]["fraction"], dtype=float)[candidates]
        flipped = candidates[np.isfinite(fraction)][np.argsort(fraction[np.isfinite(fraction)], kind="stable")]
        never = candidates[~np.isfinite(fraction)]
        third = max(1, args.examples // 3)
        for i in flipped[:third]:
            chosen[int(i)] = "most faithful: flips after the fewest attention-ordered removals"
        for i in [*never, *flipped[::-1]][:third]:
            chosen.setdefault(int(i), "least faithful: flips late or never under attention-ordered removal")
    rest = [int(i) for i in candidates if int(i) not in chosen]
    rng = np.random.default_rng(args.seed)
    for i in rng.permutation(rest)[: max(0, args.examples - len(chosen))]:
        chosen[int(i)] = "a random instance"
    index = list(chosen)
    tokens, lengths_t = collate([test.ids[i] for i in index])
    device = next(model.parameters()).device
    tokens, lengths_t = tokens.to(device), lengths_t.to(device)
    out, _ = tested_forward(model, tokens, lengths_t)
    scores = {"attention": out.attention}
    # every importance of the run (leave-one-out even where the battery skipped it)
    chosen_by = _importance_settings(args, ("loo",))
    for importance in importances.chosen(model, chosen_by):
        scores[importance.name] = importance.compute(model, tokens, lengths_t, chosen_by)
    order = removal_order(out.attention.double(), out.lengths)
    by_attention = inst.get("flip", {}).get("attention")
    examples = []
    for row, i in enumerate(index):
        n = int(out.lengths[row])
        ids = test.ids[i][model.lead : model.lead + n]
        removed = by_attention["removed"][i] if by_attention else None
        stats = {}
        if "kendall" in inst and "attention vs gradient" in inst["kendall"]:
            stats["tau attention vs gradient"] = inst["kendall"]["attention vs gradient"]["tau"][i]
        if "eraser" in inst:
            for metric in ("comprehensiveness", "sufficiency"):
                stats[f"{metric} AOPC (attention)"] = inst["eraser"]["attention"][metric]["aopc"][i]
        examples.append(
            {
                "instance": i,
                "why": chosen[i],
                "tokens": vocab.decode(ids),
                "label": splits.classes[test.labels[i]],
                "predicted": splits.classes[inst["predicted"][i]],
                "probability": float(output_distribution(out.logits[row : row + 1]).max()),
                "scores": {k: v[row, :n].double().tolist() for k, v in scores.items()},
                "flip_removed": removed,
                "removed_first": order[row, : max(removed or 0, 0)].tolist(),
                "stats": {k: float(v) if v is not None else math.nan for k, v in stats.items()},
            }
        )
    results["examples"] = examples


def _write_predictions(model, p: Predictions, folder: Path) -> None:
    """predictions.npz: the test split's predictions ``p`` in split order, real tokens only (for
    re-analysis across runs, e.g. W&P seed variance): logits [N, C] float32, attention [N, T]
    float32 (zero past each length), lengths [N] int64 (real tokens), labels [N] int64."""
    lengths = p.lengths - model.lead - model.trail
    attention = p.attention[:, model.lead : model.lead + int(lengths.max())]
    write_npz_atomic(
        folder / "predictions.npz",
        logits=p.logits.float().numpy(),
        attention=attention.float().numpy(),
        lengths=lengths.numpy(),
        labels=p.labels.numpy(),
    )


def _finish(results: dict, folder: Path, start: float) -> None:
    results["wall_time_s"]["total"] = time.perf_counter() - start
    # the per-instance values as one long table (app/table.py), then results.json: its
    # presence marks the run finished
    write_parquet_atomic(folder / "instances.parquet", run_table(results.get("instances", {})))
    write_json_atomic(folder / "results.json", results)
    render(results, folder)


def _report(args) -> int:
    runs = []
    for run in args.run_dirs:
        path = run / "results.json"
        if not path.is_file():
            print(f"attnmetrics: {run} is not a run folder (no results.json)", file=sys.stderr)
            return 2
        try:
            runs.append((run.name, json.loads(path.read_text())))
        except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
            print(f"attnmetrics: {path} is not readable JSON ({e}); rerun the run to rewrite it", file=sys.stderr)
            return 2
    if len(runs) == 1 and args.out is None:
        print(render(runs[0][1], args.run_dirs[0]))
        return 0
    if args.out is None:
        print("attnmetrics: comparing several runs needs --out FOLDER for comparison.md", file=sys.stderr)
        return 2
    if is_run_folder(args.out):
        print(
            f"attnmetrics: --out {args.out} is a run folder; write the comparison to a folder of its own",
            file=sys.stderr,
        )
        return 2
    print(render_comparison(runs, args.out))
    return 0


def _pretrain(args, w: World) -> int:
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
            result = pretrain(args.out, train_texts=train_texts, valid_text=valid_text, resume=True, device=args.device)
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
            result = pretrain(
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


#: errors that a user's input causes (files, folders, flags, data): one line, no traceback
INPUT_ERRORS = (FileExistsError, FileNotFoundError, ValueError, ArtifactError)


def _input_error(e: Exception, args) -> int:
    if args.debug:
        raise e
    notes = "".join(f"; {n}" for n in getattr(e, "__notes__", []))
    print(f"attnmetrics: {e}{notes} (--debug shows the traceback)", file=sys.stderr)
    return 2


def _exit_on_sigterm(signum, frame):
    # SIGTERM (a sweep stopping its cells, a scheduler's time limit) unwinds like Ctrl-C, so the
    # run folder's claim is given back and partial outputs are named, instead of a silent kill.
    sys.exit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command in ("run", "train"):
        recipe_defaults(args)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
    if getattr(args, "threads", None):
        torch.set_num_threads(args.threads)
    if args.command == "report":
        return _report(args)
    if args.command == "sweep":
        return sweep.main(args)
    if args.device == "cuda" and not torch.cuda.is_available():
        print(
            f"attnmetrics: --device cuda, but torch sees no CUDA GPU (torch {torch.__version__}, "
            f"CUDA {torch.version.cuda}); use --device cpu",
            file=sys.stderr,
        )
        return 2
    if args.device == "cuda":  # deterministic cuBLAS (read when its first handle is made)
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    w = distributed.world()
    if w.size == 1:
        return _command(args, w)
    if getattr(args, "consistent_adversary", None) or getattr(args, "diagnostic", False):
        print(
            f"attnmetrics: under torchrun ({w.size} ranks), --consistent-adversary and --diagnostic are not "
            "sharded; run them as one process",
            file=sys.stderr,
        )
        return 2
    distributed.start(w, args.device)
    code = _command(args, w)
    # Only a rank that succeeded leaves the group, once every rank has: tearing down a group
    # while another rank may still be in a collective with it can abort the process or hang.
    # A rank that fails exits as it is, and torchrun stops the others.
    if code == 0:
        distributed.stop()
    return code


def _command(args, w: World) -> int:
    if args.command == "pretrain":
        try:
            return _pretrain(args, w)
        except INPUT_ERRORS as e:
            return _input_error(e, args)
    return _run(args, w)


def _importance_settings(args, experiments=()) -> importances.Settings:
    """The optional importances the command's flags ask for (train has none of the flags)."""
    return importances.Settings(
        tuple(experiments), getattr(args, "integrated_gradients", 0) or 0, getattr(args, "input_x_gradient", False)
    )


def _saved_model(args, results: dict):
    """evaluate's model, vocabulary and data splits, from the run folder it names (the split,
    data folder and protocol it was trained with, unless the flags say otherwise)."""
    ckpt = load_checkpoint(args.model_run / CHECKPOINT)
    saved = ckpt.extra
    if ckpt.vocab is None or "dataset" not in saved:
        raise ValueError(
            f"{args.model_run / CHECKPOINT} was not saved by 'attnmetrics train' or 'run' "
            "(no vocab.json, or no dataset in model.json); it cannot be evaluated here"
        )
    data_dir = args.data_dir or (Path(saved["data_dir"]) if saved.get("data_dir") else None)
    # Checkpoints from before --split-seed split with the model seed.
    split_seed = saved.get("split_seed", saved.get("seed", 0))
    args.protocol = saved.get("protocol", "attnmetrics")  # the test split and battery it was trained for
    splits = _load_data(
        saved["dataset"], data_dir, args.limit, split_seed, saved.get("max_tokens"), PRESETS[args.protocol]
    )
    results["split_seed"] = split_seed
    results["config"]["dataset"] = saved["dataset"]
    results["data"].update(name=splits.name, classes=list(splits.classes), sizes=splits.sizes())
    results["model"] = ckpt.model.config.to_dict()
    return ckpt.model.to(args.device), ckpt.vocab, splits


def _train_and_save(args, results: dict, folder: Path | None):
    """train and run's model, vocabulary, splits and recipe, the model saved into ``folder``
    (None: not this rank's to write)."""
    # CUDA has no deterministic kernel for a few ops (e.g. embedding backward): warn there
    torch.use_deterministic_algorithms(True, warn_only=args.device == "cuda")
    model, vocab, splits, recipe = _train(args, results)
    results["split_seed"] = args.split_seed
    if folder is not None:
        extra = {
            "dataset": args.dataset,
            "data_dir": str(args.data_dir.resolve()) if args.data_dir else None,
            "seed": args.seed,
            "split_seed": args.split_seed,
            "max_tokens": args.max_tokens,
            "protocol": args.protocol,
        }
        save_checkpoint(folder / CHECKPOINT, model, vocab, extra=extra)
    return model, vocab, splits, recipe


def _tested_attention(model) -> str | None:
    """What the battery tests when it is not the model's attention head, for results["battery"]:
    GPT-1's own attention (the extract read-out), a Hugging Face classifier's (``model.battery``)."""
    if getattr(model, "attention_name", None) == EXTRACT_READOUT:
        return OWN_ATTENTION
    if isinstance(getattr(model, "battery", None), str):
        return model.battery
    return None


def _run(args, w: World) -> int:
    """train, run or evaluate (this rank's part of it under torchrun)."""
    start = time.perf_counter()
    missing = importances.missing_package(_importance_settings(args))  # before training
    if missing:
        return _input_error(ImportError(missing), args)
    results = {
        "command": args.command,
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        **_environment(args.seed, args.device),
        "data": {},
        "wall_time_s": {},
    }
    if w.size > 1:  # training data-parallel, the battery sharded (app/distributed.py)
        results["distributed"] = {"ranks": w.size, "backend": "gloo"}
    if args.command in ("run", "train") and args.out is None:
        args.out = Path("runs") / f"{args.dataset.replace(':', '_')}-{args.encoder}"
    trained_in = None  # the staging folder once it holds the trained model
    try:
        protect = (args.model_run,) if args.command == "evaluate" else ()
        # under torchrun rank 0 alone claims and writes the run folder
        claim = run_folder(args.out, args.overwrite, protect) if w.main else contextlib.nullcontext()
        with claim as folder:
            if args.command == "evaluate":
                model, vocab, splits = _saved_model(args, results)
            else:
                model, vocab, splits, recipe = _train_and_save(args, results, folder if w.main else None)
                trained_in = folder
            results["protocol"] = PRESETS[args.protocol].to_dict()
            test = vocab.encode_split(splits.test)
            predictions = predict(model, test) if w.main else None
            results["test"] = prediction_metrics(predictions) if w.main else None
            if args.command != "train":
                if tested := _tested_attention(model):
                    results["battery"] = tested
                if not _battery(args, model, test, splits, results, w):
                    return 0  # rank 0 writes
                if getattr(args, "consistent_adversary", None) or getattr(args, "diagnostic", False):
                    _wiegreffe(args, model, test, recipe, results)
            if not w.main:
                return 0
            if args.command != "train":
                _examples(args, model, test, vocab, splits, results)
            _write_predictions(model, predictions, folder)
            _finish(results, folder, start)
    except BaseException as e:
        if trained_in is not None and (trained_in / CHECKPOINT).exists():
            e.add_note(
                f"the trained model is kept in {trained_in}: `attnmetrics evaluate {trained_in} --out DIR` "
                "runs the battery on it without training again (move the folder to keep it)"
            )
        if isinstance(e, INPUT_ERRORS):
            return _input_error(e, args)
        raise
    test = results["test"]
    print(
        f"test: accuracy {test['accuracy']:.3f}, macro F1 {test['macro_f1']:.3f}, ROC-AUC {test['roc_auc']:.3f} "
        f"on {results['data']['sizes']['test']} instances ({time.perf_counter() - start:.0f} s in all)",
        file=sys.stderr,
    )
    print(f"wrote {args.out / 'report.md'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
