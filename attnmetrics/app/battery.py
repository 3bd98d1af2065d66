"""The faithfulness battery on a trained model's test split (J&W 2019; S&S 2019; T&Š 2020's
single-token-input test).

Runs per evaluation batch and gathers per-instance results, so memory stays bounded by
the batch size whatever the size of the test set.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from itertools import combinations

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

import attnmetrics
from attnmetrics import KeyedRows
from attnmetrics.app.importances import Settings, chosen
from attnmetrics.app.summaries import (
    adversarial_summary,
    eraser_summary,
    flip_summary,
    permutation_summary,
    single_removal_summary,
    stats,
    tau_summary,
)
from attnmetrics.eraser import ERASER_FRACTIONS, comprehensiveness, sufficiency
from attnmetrics.permutation import draw_seed
from attnmetrics.protocol import forward
from attnmetrics.single_removal import WHICH
from attnmetrics.single_token import single_token_test

#: S&S 2019's orderings (sec. 4): attention, random, gradient w.r.t. attention, attention x gradient; plus reverse.
DEFAULT_ORDERS = ("attention", "random", "gradient", "attn_grad", "reverse")
#: experiments of the battery, in the order they run; each can be skipped
EXPERIMENTS = ("flip", "kendall", "loo", "permutation", "adversarial", "single_removal", "single_token", "eraser")
#: ERASER's metrics (DeYoung et al. 2020, sec. 4), over every importance ordering the battery has
ERASER_METRICS = {"comprehensiveness": comprehensiveness, "sufficiency": sufficiency}
#: S&S 2019 (sec. 3): which single weight is removed
SINGLE_REMOVALS = WHICH


def _lap(seconds: dict, name: str, start: float) -> float:
    """Add the time since ``start`` to ``seconds[name]``; return now."""
    now = time.perf_counter()
    seconds[name] += now - start
    return now


class _Progress:
    """One bar over every (instance block, experiment) step of the battery: it moves as each
    experiment of each block finishes and names the one running, e.g. ``block 3/8: loo``."""

    def __init__(self, blocks: int, parts: Sequence[str], enabled: bool):
        self.blocks, self.block, self.running = blocks, 0, None
        self.bar = tqdm(total=blocks * len(parts), desc="faithfulness", unit="step", disable=not enabled, leave=False)

    def start(self, block: int, part: str) -> None:
        """Block ``block`` (0-based) starts ``part``, one of ``parts``: the step before it is done."""
        if self.running is not None:
            self.bar.update()
        self.block, self.running = block, part
        self.show(part)

    def show(self, label: str) -> None:
        """Name what the running step is doing now (e.g. an importance within Kendall's step)."""
        self.bar.set_postfix_str(f"block {self.block + 1}/{self.blocks}: {label}")

    def close(self) -> None:
        if self.running is not None:
            self.bar.update()
        self.bar.close()


def battery_parts(experiments: Sequence[str]) -> list[str]:
    """The steps the battery runs on each instance block: the forward pass, then each chosen
    experiment in :data:`EXPERIMENTS`' order (leave-one-out only as a Kendall τ partner)."""
    return ["forward"] + [e for e in EXPERIMENTS if e in experiments and (e != "loo" or "kendall" in experiments)]


def _keep_flip(acc: dict, name: str, r) -> None:
    """A flip result's per-instance rows (``[B]``, or ``[samples, B]``: the samples side by side)."""
    rows = r.removed.shape[-1]
    acc[f"flip/{name}/removed"].append(r.removed.reshape(-1, rows).T)
    acc[f"flip/{name}/fraction"].append(r.fraction.reshape(-1, rows).T)


def tested_forward(model, tokens: Tensor, lengths: Tensor):
    """The model's forward output and the attention the battery tests: a transformer's own
    (``model.tested_attention``: ``[B, heads, T]``, docs/definitions.md §15) where the model
    offers it, else None and the attention head's (``out.attention``, ``[B, T]``). With its
    own attention, ``out.attention`` is their head mean, which every token-level view uses."""
    out = forward(model, tokens, lengths)
    own = model.tested_attention(tokens, lengths) if hasattr(model, "tested_attention") else None
    if own is not None:
        out = out._replace(attention=own.attention.mean(1))
    return out, own


#: run_battery's settings that collect uses and summarise does not take
_COLLECT_ONLY = ("orders", "seed", "random_samples", "never_flipped", "ig_steps", "input_x_gradient")


def run_battery(
    model: torch.nn.Module,
    batches: Iterable[tuple[Tensor, Tensor]],
    class_names: Sequence[str],
    experiments: Sequence[str] = EXPERIMENTS,
    orders: Sequence[str] = DEFAULT_ORDERS,
    seed: int = 0,
    random_samples: int = 1,
    never_flipped: float = float("nan"),
    permutations: int = 100,
    adversarial_steps: int = 500,
    progress: bool = True,
    adversarial_diversity: float = 1.0,
    ig_steps: int = 0,
    input_x_gradient: bool = False,
) -> tuple[dict, dict]:
    """Run the chosen experiments over ``batches`` of (tokens [B, T] int64, lengths [B] int64),
    special tokens included, on the model's device (each batch is moved there). The batches'
    rows are the instances 0, 1, 2, ... in order.

    Returns (summary, instances): summary statistics for ``results.json`` and per-instance
    lists (for figures and for re-analysis), both keyed by experiment; ``summary["seconds"]``
    is the wall time of each part (the forward pass, each experiment; Kendall's gradient
    and leave-one-out apart from the τ themselves), summed over the batches. The same as
    :func:`collect` over the batches with their first instances, then :func:`summarise`.
    """
    settings = dict(
        experiments=experiments,
        orders=orders,
        seed=seed,
        random_samples=random_samples,
        never_flipped=never_flipped,
        permutations=permutations,
        adversarial_steps=adversarial_steps,
        adversarial_diversity=adversarial_diversity,
        ig_steps=ig_steps,
        input_x_gradient=input_x_gradient,
    )
    numbered, first = [], 0
    for tokens, lengths in batches:
        numbered.append((first, tokens, lengths))
        first += len(lengths)
    x, seconds = collect(model, numbered, progress=progress, **settings)
    for name in _COLLECT_ONLY:
        settings.pop(name)
    return summarise(x, seconds, class_names, **settings)


def experiment_seeds(seed: int) -> dict[str, int]:
    """One int64 seed per experiment that draws at random, derived from the run's ``seed``, so
    the experiments' draws are independent of each other (and of the batches: KeyedRows)."""
    g = torch.Generator().manual_seed(seed)
    return {name: draw_seed(g) for name in ("flip", "permutation", "adversarial", "single_removal", "eraser")}


def collect(
    model: torch.nn.Module,
    batches: Iterable[tuple[int, Tensor, Tensor]],
    experiments: Sequence[str] = EXPERIMENTS,
    orders: Sequence[str] = DEFAULT_ORDERS,
    seed: int = 0,
    random_samples: int = 1,
    never_flipped: float = float("nan"),
    permutations: int = 100,
    adversarial_steps: int = 500,
    adversarial_diversity: float = 1.0,
    ig_steps: int = 0,
    input_x_gradient: bool = False,
    progress: bool = True,
) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """The battery's per-instance values over ``batches`` of (first, tokens, lengths): ``first``
    the global index of the batch's first instance, which keys every random draw of its rows
    (:class:`attnmetrics.KeyedRows`), so an instance's values do not depend on the batch it is
    in or on the process that runs it (``torchrun``, one share of the batches per rank).

    Returns (values, seconds): ``values[name]`` an array with one entry (a row of
    ``random_samples`` for the random flip order) per instance, ``values["instance"]`` the
    global indices; ``seconds[part]`` wall time summed over the batches. With ``ig_steps``,
    integrated gradients (Captum, that many integration points), and with ``input_x_gradient``
    the whole model's gradient x input, join the importances: each a Kendall τ partner, a
    flip-search and an ERASER ordering.
    """
    unknown = set(experiments) - set(EXPERIMENTS)
    if unknown:
        raise ValueError(f"unknown experiments {sorted(unknown)}; choose from {EXPERIMENTS}")
    model.eval()
    device = next(model.parameters()).device  # batches run where the model is
    seeds = experiment_seeds(seed)
    chosen_by = Settings(tuple(experiments), ig_steps, input_x_gradient)
    importances = chosen(model, chosen_by)  # beside attention: Kendall partners, flip and ERASER orders
    acc: dict[str, list[Tensor]] = defaultdict(list)  # per-instance tensors, concatenated at the end
    seconds: dict[str, float] = defaultdict(float)  # wall time of each experiment, over all batches
    batches = list(batches)
    with contextlib.closing(_Progress(len(batches), battery_parts(experiments), progress)) as bar:
        for block, (first, tokens, lengths) in enumerate(batches):
            bar.start(block, "forward")
            t0 = time.perf_counter()
            tokens, lengths = tokens.to(device), lengths.to(device)
            keyed = {name: KeyedRows(s, first) for name, s in seeds.items()}
            acc["instance"].append(torch.arange(first, first + len(lengths)))
            out, own = tested_forward(model, tokens, lengths)
            if own is not None:
                args = (own.attention, own.values, own.decoder, own.lengths)
            else:
                args = (out.attention, out.hidden, model.decoder, out.lengths)
            acc["predicted"].append(attnmetrics.decision(out.logits))
            acc["lengths"].append(out.lengths)
            acc["max_attention"].append(out.attention.max(1).values)
            t0 = _lap(seconds, "forward", t0)
            if "flip" in experiments:
                bar.start(block, "flip")
                for name in orders:
                    samples = random_samples if name == "random" else 1
                    r = attnmetrics.flip_fraction(
                        *args, order=name, samples=samples, generator=keyed["flip"], never_flipped=never_flipped
                    )
                    _keep_flip(acc, name, r)
                t0 = _lap(seconds, "flip", t0)
            if "kendall" in experiments:
                bar.start(block, "kendall")
                scores = {"attention": out.attention}
                for importance in importances:
                    if importance.experiment:
                        bar.start(block, importance.experiment)
                    else:
                        bar.show(importance.name)
                    name = importance.name
                    scores[name] = importance.compute(model, tokens, lengths, chosen_by).to(out.attention.dtype)
                    t0 = _lap(seconds, name, t0)
                    if importance.flip_order and "flip" in experiments:  # an order to remove by, never an attention
                        r = attnmetrics.flip_fraction(*args, order=scores[name], never_flipped=never_flipped)
                        _keep_flip(acc, name, r)
                        t0 = _lap(seconds, "flip", t0)
                for a, b in combinations(scores, 2):
                    kt = attnmetrics.kendall_tau(scores[a], scores[b], out.lengths)
                    acc[f"kendall/{a} vs {b}/tau"].append(kt.tau)
                    acc[f"kendall/{a} vs {b}/pvalue"].append(kt.pvalue)
                t0 = _lap(seconds, "kendall", t0)
            if own is not None:  # each head on its own: how it differs from the others, how it ranks tokens
                for h in range(own.attention.shape[1]):
                    head = own.attention[:, h]
                    acc[f"heads/h{h}/max attention"].append(head.max(-1).values)
                    acc[f"heads/h{h}/JSD from the head mean"].append(attnmetrics.jsd(head, out.attention))
                    if "kendall" in experiments:
                        for importance in importances:
                            if importance.head_partner:
                                tau = attnmetrics.kendall_tau(head, scores[importance.name], out.lengths).tau
                                acc[f"heads/h{h}/tau vs {importance.name}"].append(tau)
                t0 = _lap(seconds, "heads", t0)
            if "permutation" in experiments:
                bar.start(block, "permutation")
                r = attnmetrics.permutation_test(*args, permutations=permutations, generator=keyed["permutation"])
                acc["permutation/median_tvd"].append(r.median_tvd)
                t0 = _lap(seconds, "permutation", t0)
            if "adversarial" in experiments:
                bar.start(block, "adversarial")
                r = attnmetrics.adversarial_attention(
                    *args,
                    steps=adversarial_steps,
                    diversity_weight=adversarial_diversity,
                    generator=keyed["adversarial"],
                )
                acc["adversarial/max_jsd"].append(r.max_jsd)
                acc["adversarial/output_tvd"].append(r.output_tvd)
                t0 = _lap(seconds, "adversarial", t0)
            if "single_removal" in experiments:
                bar.start(block, "single_removal")
                for which in SINGLE_REMOVALS:
                    r = attnmetrics.single_removal(*args, which=which, generator=keyed["single_removal"])
                    acc[f"single_removal/{which}/jsd"].append(r.jsd)
                    acc[f"single_removal/{which}/flipped"].append(r.flipped)
                t0 = _lap(seconds, "single_removal", t0)
            if "single_token" in experiments:
                bar.start(block, "single_token")
                r = single_token_test(model, tokens, lengths, full=out)
                acc["single_token/tau"].append(r.tau)
                acc["single_token/pvalue"].append(r.pvalue)
                acc["single_token/top_agrees"].append(r.top_agrees)
                t0 = _lap(seconds, "single_token", t0)

            if "eraser" in experiments:
                bar.start(block, "eraser")
                # every importance the battery has for these rows, against a random ordering
                ranked = {
                    "attention": out.attention,
                    "random": keyed["eraser"].uniform(len(lengths), out.attention.shape[1:]),
                }
                if "kendall" in experiments:
                    ranked.update((k, v) for k, v in scores.items() if k != "attention")
                for name, ranking in ranked.items():
                    for metric, fn in ERASER_METRICS.items():
                        r = fn(model, tokens, lengths, ranking.to(device))
                        acc[f"eraser/{name}/{metric}/aopc"].append(r.aopc)
                        acc[f"eraser/{name}/{metric}/values"].append(r.values)
                t0 = _lap(seconds, "eraser", t0)
    return {k: torch.cat(v).cpu().numpy() for k, v in acc.items()}, dict(seconds)


def merge(parts: Sequence[tuple[dict[str, np.ndarray], dict[str, float]]]) -> tuple[dict, dict]:
    """:func:`collect`'s outputs on disjoint shares of the instances, as one: values in instance
    order, seconds summed (the processes' total, not the wall time)."""
    parts = [(x, s) for x, s in parts if len(x.get("instance", ()))]
    if not parts:
        return {}, {}
    order = np.argsort(np.concatenate([x["instance"] for x, _ in parts]), kind="stable")
    values = {k: np.concatenate([x[k] for x, _ in parts])[order] for k in parts[0][0]}
    seconds: dict[str, float] = defaultdict(float)
    for _, s in parts:
        for k, v in s.items():
            seconds[k] += v
    return values, dict(seconds)


def summarise(
    x: dict[str, np.ndarray],
    seconds: dict[str, float],
    class_names: Sequence[str],
    experiments: Sequence[str] = EXPERIMENTS,
    permutations: int = 100,
    adversarial_steps: int = 500,
    adversarial_diversity: float = 1.0,
) -> tuple[dict, dict]:
    """(summary, instances) for ``results.json`` from :func:`collect`'s (merged) values; the
    flip orderings are those the values hold."""
    summary_seconds = {k: round(v, 3) for k, v in seconds.items()}
    lengths, predicted, max_attention = x["lengths"], x["predicted"], x["max_attention"]
    summary: dict = {"seconds": summary_seconds}
    instances: dict = {
        "predicted": predicted.tolist(),
        "lengths": lengths.tolist(),
        "max_attention": max_attention.tolist(),
    }
    if "flip" in experiments:
        summary["flip"] = {}
        instances["flip"] = {}
        for name in dict.fromkeys(k.split("/")[1] for k in x if k.startswith("flip/")):  # orders, rollout
            # sample after sample (app/table.py's layout)
            removed, fraction = x[f"flip/{name}/removed"].T.reshape(-1), x[f"flip/{name}/fraction"].T.reshape(-1)
            reps = removed.size // lengths.size  # random with several samples
            summary["flip"][name] = flip_summary(removed, fraction, np.tile(lengths, reps))
            instances["flip"][name] = {"removed": removed.tolist(), "fraction": fraction.astype(float).tolist()}
    if "kendall" in experiments:
        summary["kendall"], instances["kendall"] = {}, {}
        for pair in dict.fromkeys(k.split("/")[1] for k in x if k.startswith("kendall/")):
            tau, p = x[f"kendall/{pair}/tau"], x[f"kendall/{pair}/pvalue"]
            summary["kendall"][pair] = tau_summary(tau, p, predicted, class_names)
            instances["kendall"][pair] = {"tau": tau.tolist(), "pvalue": p.tolist()}
    if "permutation" in experiments:
        tvd = x["permutation/median_tvd"]
        summary["permutation"] = permutation_summary(tvd, max_attention, lengths, predicted, class_names)
        summary["permutation"]["permutations"] = permutations
        instances["permutation"] = {"median_tvd": tvd.tolist()}
    if "adversarial" in experiments:
        jsd, tvd = x["adversarial/max_jsd"], x["adversarial/output_tvd"]
        summary["adversarial"] = adversarial_summary(jsd, tvd, max_attention, lengths, predicted, class_names)
        summary["adversarial"]["steps"] = adversarial_steps
        summary["adversarial"]["diversity_weight"] = adversarial_diversity
        instances["adversarial"] = {"max_jsd": jsd.tolist(), "output_tvd": tvd.tolist()}
    if "single_removal" in experiments:
        jsd = {w: x[f"single_removal/{w}/jsd"] for w in SINGLE_REMOVALS}
        flipped = {w: x[f"single_removal/{w}/flipped"] for w in SINGLE_REMOVALS}
        summary["single_removal"] = single_removal_summary(jsd, flipped, lengths)
        instances["single_removal"] = {
            w: {"jsd": jsd[w].tolist(), "flipped": flipped[w].tolist()} for w in SINGLE_REMOVALS
        }
    heads = sorted({k.split("/")[1] for k in x if k.startswith("heads/")}, key=lambda h: int(h[1:]))
    if heads:
        metrics = list(dict.fromkeys(k.split("/", 2)[2] for k in x if k.startswith("heads/")))
        instances["heads"] = {h: {m: x[f"heads/{h}/{m}"].astype(float).tolist() for m in metrics} for h in heads}
        real = lengths > 0
        # the mean over the rows where the value is defined (τ is NaN for rows of ties), NaN if none
        summary["heads"] = {m: [stats(x[f"heads/{h}/{m}"][real])["mean"] for h in heads] for m in metrics}
    if "single_token" in experiments:
        tau, p, agrees = x["single_token/tau"], x["single_token/pvalue"], x["single_token/top_agrees"]
        taus = tau_summary(tau, p, predicted, class_names)
        has_tokens = lengths > 0
        summary["single_token"] = {
            "tau": taus["overall"],
            "tau_per_class": taus["per_class"],
            "top_token_agreement": float(agrees[has_tokens].mean()) if has_tokens.any() else float("nan"),
            "n": int(has_tokens.sum()),
        }
        instances["single_token"] = {"tau": tau.tolist(), "pvalue": p.tolist(), "top_token_agrees": agrees.tolist()}
    if "eraser" in experiments:
        summary["eraser"] = {"fractions": list(ERASER_FRACTIONS)}
        instances["eraser"] = {}
        names = dict.fromkeys(k.split("/")[1] for k in x if k.startswith("eraser/"))
        for name in names:
            summary["eraser"][name], instances["eraser"][name] = {}, {}
            for metric in ERASER_METRICS:
                aopc, values = x[f"eraser/{name}/{metric}/aopc"], x[f"eraser/{name}/{metric}/values"]
                summary["eraser"][name][metric] = eraser_summary(aopc, values, predicted, class_names)
                # fraction after fraction (app/table.py's samples)
                instances["eraser"][name][metric] = {"aopc": aopc.tolist(), "values": values.T.reshape(-1).tolist()}
    return summary, instances
