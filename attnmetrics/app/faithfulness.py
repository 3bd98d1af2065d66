"""The faithfulness battery of ``run`` and ``evaluate`` on a model's test split: :func:`battery`
drives :mod:`attnmetrics.app.battery` (sharded under torchrun) into results.json, and
:func:`examples` picks and scores the instances report.html's token view shows."""

from __future__ import annotations

import math
import time
from dataclasses import fields
from pathlib import Path

import numpy as np

from attnmetrics.app import battery as registry
from attnmetrics.app import distributed
from attnmetrics.app.battery import EXPERIMENTS, BatteryConfig, collect, merge, summarise, tested_forward
from attnmetrics.app.config import RunConfig
from attnmetrics.app.conventions import OWN_ATTENTION, PAIR_TASK, conventions
from attnmetrics.app.distributed import World
from attnmetrics.app.results import Results
from attnmetrics.app.resumable import BatteryBlocks, fingerprints
from attnmetrics.flip import removal_order
from attnmetrics.models.gpt_classifier import EXTRACT_READOUT, GPTClassifier
from attnmetrics.models.pair import is_pair_model
from attnmetrics.models.text import collate
from attnmetrics.outputs import output_distribution
from attnmetrics.protocol import capability

#: Instances per battery block on the CPU; on a GPU a block holds up to :data:`GPU_BLOCK_ROWS`
#: (every procedure below chunks its work to its memory budget either way). A GPU's calls cost
#: mostly their launches, and each block repeats every step's launches (the adversary's
#: optimiser steps, ERASER's model calls): SST's test set is 8 blocks on the CPU, 1 on a GPU.
CPU_BLOCK_ROWS = 256
GPU_BLOCK_ROWS = 2048
#: Instances per battery block on the CPU under ``--resumable``: each finished block is kept, so a
#: run cut off loses at most one block's work (on a GPU, :data:`CPU_BLOCK_ROWS`)
RESUMABLE_CPU_ROWS = 32


def block_rows(device, instances: int, ranks: int = 1, resumable: bool = False) -> int:
    """Instances per battery block on ``device`` (a ``torch.device``): :data:`CPU_BLOCK_ROWS` on
    the CPU; on a GPU up to :data:`GPU_BLOCK_ROWS`, and no more than every rank's equal share.
    Under ``resumable``: :data:`RESUMABLE_CPU_ROWS` on the CPU, :data:`CPU_BLOCK_ROWS` on a GPU."""
    if resumable:
        return RESUMABLE_CPU_ROWS if device.type == "cpu" else CPU_BLOCK_ROWS
    if device.type == "cpu":
        return CPU_BLOCK_ROWS
    return max(CPU_BLOCK_ROWS, min(GPU_BLOCK_ROWS, math.ceil(instances / ranks)))


def battery(
    config: RunConfig,
    model,
    test,
    splits,
    adversarial_diversity: float,
    results: Results,
    w: World,
    adversarial_amsgrad: bool = False,
    blocks: Path | None = None,
) -> bool:
    """The battery on the test split, into ``results``; under torchrun on this rank's share of
    the batches, gathered on rank 0. False on the other ranks (they write nothing).
    ``adversarial_diversity``: the protocol preset's weight of the adversarial candidates' diversity;
    ``adversarial_amsgrad``: the preset's adversarial optimiser (AMSGrad or not), which
    ``--adversarial-optimiser`` overrides; ``blocks``: the folder that keeps each finished
    block (``--resumable``, :mod:`attnmetrics.app.resumable`), whose blocks finished by an
    earlier start of the same run are read instead of run again.

    Raises:
        ValueError: ``blocks`` holds blocks of another run (what differs is named).
    """
    t0 = time.perf_counter()
    rows = block_rows(next(model.parameters()).device, len(test), w.size, blocks is not None)
    batches = [(int(b.index[0]), b.tokens, b.lengths) for b in test.batches(rows)]
    battery_config = BatteryConfig(
        experiments=[e for e in EXPERIMENTS if e not in config.skip],
        orders=config.orders,
        seed=config.seed,
        random_samples=config.random_samples,
        never_flipped=float("nan") if config.never_flipped == "nan" else 1.0,
        random_removal=(config.random_removal or "non-top").replace("-", "_"),
        eraser_rounding=config.eraser_rounding or "ceil",
        eraser_aopc=config.eraser_aopc or "eraser",
        eraser_fractions=config.eraser_fractions or "eraser",
        eraser_mask_token=config.eraser_mask_token,
        permutations=config.permutations,
        adversarial_steps=config.adversarial_steps,
        adversarial_diversity=adversarial_diversity,
        adversarial_amsgrad=adversarial_amsgrad
        if config.adversarial_optimiser is None
        else config.adversarial_optimiser == "amsgrad",
        options=importance_options(config),
    )
    settings = {f.name: getattr(battery_config, f.name) for f in fields(battery_config)}
    kept, resumed = None, []
    if blocks is not None:
        prints = fingerprints(results["config"], settings, model, batches)
        kept = BatteryBlocks.open(blocks, prints, len(batches), rows, results["versions"]["commit"])
        # the blocks finished before this start, as rank 0 sees them (every rank shares the rest alike)
        done = set(distributed.broadcast(kept.done([first for first, _, _ in batches]), w))
        resumed = [kept.load(first) for first in sorted(done)] if w.main else []
        batches = [b for b in batches if b[0] not in done]
    mine = distributed.share(batches, [float(n.sum()) for _, _, n in batches], w)
    part = collect(
        model, mine, progress=w.main and not config.no_progress, on_block=kept.save if kept else None, **settings
    )
    parts = distributed.gather((*part, time.perf_counter() - t0), w)
    if parts is None:
        return False
    merged = merge([p[:2] for p in parts] + [r[:2] for r in resumed])
    summary, instances = summarise(*merged, splits.classes, **settings)
    if kept is not None:
        results["resumable"] = {
            "folder": kept.folder.name,
            "blocks": len(done) + len(batches),
            "rows_per_block": rows,
            "resumed_blocks": len(done),
            # the code each block was computed with (blocks of an earlier start may predate this one)
            "commits": sorted({r[2] for r in resumed} | {results["versions"]["commit"] or ""}),
        }
    results["wall_time_s"]["experiments"] = time.perf_counter() - t0
    results["wall_time_s"]["per_experiment"] = summary.pop("seconds")
    if w.size > 1:  # each rank's share and wall time; per_experiment sums the ranks' times
        results["wall_time_s"]["per_rank"] = [round(p[2], 3) for p in parts]
        results["distributed"]["instances"] = [len(p[0].get("instance", ())) for p in parts]
    results.update(summary)
    results["instances"] = instances
    results["conventions"] = conventions(battery_config)
    if is_pair_model(model):
        results["conventions"]["pair_task"] = PAIR_TASK
    return True


def examples(config: RunConfig, model, test, vocab, splits, results: Results) -> None:
    """``results["examples"]`` for report.html (``--examples N``): the instances whose decision
    flips after the fewest attention-ordered removals (most faithful by S&S's flip search), those
    that need the most or never flip (least faithful), then random ones (seeded); each with its
    tokens, attention, gradient and leave-one-out scores, and its statistics from the battery."""
    inst = results["instances"]
    lengths = np.asarray(inst["lengths"])
    candidates = np.flatnonzero(lengths >= 2)
    if not config.examples or not len(candidates):
        return
    chosen: dict[int, str] = {}
    if inst.get("flip", {}).get("attention"):
        fraction = np.asarray(inst["flip"]["attention"]["fraction"], dtype=float)[candidates]
        flipped = candidates[np.isfinite(fraction)][np.argsort(fraction[np.isfinite(fraction)], kind="stable")]
        never = candidates[~np.isfinite(fraction)]
        third = max(1, config.examples // 3)
        for i in flipped[:third]:
            chosen[int(i)] = "most faithful: flips after the fewest attention-ordered removals"
        for i in [*never, *flipped[::-1]][:third]:
            chosen.setdefault(int(i), "least faithful: flips late or never under attention-ordered removal")
    rest = [int(i) for i in candidates if int(i) not in chosen]
    rng = np.random.default_rng(config.seed)
    for i in rng.permutation(rest)[: max(0, config.examples - len(chosen))]:
        chosen[int(i)] = "a random instance"
    index = list(chosen)
    tokens, lengths_t = collate([test.ids[i] for i in index])
    device = next(model.parameters()).device
    tokens, lengths_t = tokens.to(device), lengths_t.to(device)
    out, _ = tested_forward(model, tokens, lengths_t)
    scores = {"attention": out.attention}
    # every importance of the run (leave-one-out even where the battery skipped it)
    chosen_by = importance_settings(config, ("loo",))
    for importance in registry.chosen(model, chosen_by):
        scores[importance.name] = importance.compute(model, tokens, lengths_t, chosen_by)
    order = removal_order(out.attention.double(), out.lengths)
    by_attention = inst.get("flip", {}).get("attention")
    shown = []
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
        question = model.config.question_width if is_pair_model(model) else 0  # a pair model's fixed question part
        if question:
            asked = [w[1:] for w in vocab.decode(test.ids[i][-question:]) if w != "<PAD>"]
        shown.append(
            {
                "instance": i,
                "why": chosen[i],
                "tokens": vocab.decode(ids),
                **({"question": asked} if question else {}),
                "label": splits.classes[test.labels[i]],
                "predicted": splits.classes[inst["predicted"][i]],
                "probability": float(output_distribution(out.logits[row : row + 1]).max()),
                "scores": {k: v[row, :n].double().tolist() for k, v in scores.items()},
                "flip_removed": removed,
                "removed_first": order[row, : max(removed or 0, 0)].tolist(),
                "stats": {k: float(v) if v is not None else math.nan for k, v in stats.items()},
            }
        )
    results["examples"] = shown


def tested_attention(model) -> str | None:
    """What the battery tests when it is not the model's attention head, for results["battery"]:
    GPT-1's own attention (the extract read-out), a Hugging Face classifier's; None otherwise."""
    if isinstance(model, GPTClassifier):  # its own attention only with the extract read-out
        return OWN_ATTENTION["gpt"] if model.attention_name == EXTRACT_READOUT else None
    if capability(model, "tested_attention") is None:
        return None
    return OWN_ATTENTION["hf" if type(model).__name__ == "HFClassifier" else "own"]


def importance_settings(config: RunConfig, experiments=()) -> registry.Settings:
    """The optional importances the command's flags ask for (train has none of the flags)."""
    return registry.Settings(tuple(experiments), importance_options(config))


def importance_options(config: RunConfig) -> dict:
    """The importances' options: the optional importances' (``config.importance_options``) and, where
    not the default, ``--attribution-aggregation`` (integrated gradients and gradient x input read it)."""
    options = dict(config.importance_options)
    if config.attribution_aggregation not in (None, "sum"):
        options["attribution_aggregation"] = config.attribution_aggregation
    return options
