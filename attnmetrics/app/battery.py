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
from dataclasses import dataclass, field
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
from attnmetrics.protocol import Forward, TestedAttention, capability, forward
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
    tested = capability(model, "tested_attention")
    own = tested(tokens, lengths) if tested else None
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
    chosen_by = Settings(tuple(experiments), ig_steps, input_x_gradient)
    run = _Run(
        tuple(experiments),
        tuple(orders),
        random_samples,
        never_flipped,
        permutations,
        adversarial_steps,
        adversarial_diversity,
        chosen_by,
        chosen(model, chosen_by),  # beside attention: Kendall partners, flip and ERASER orders
        experiment_seeds(seed),
    )
    acc: dict[str, list[Tensor]] = defaultdict(list)  # per-instance tensors, concatenated at the end
    seconds: dict[str, float] = defaultdict(float)  # wall time of each experiment, over all batches
    batches = list(batches)
    with contextlib.closing(_Progress(len(batches), battery_parts(experiments), progress)) as bar:
        for index, (first, tokens, lengths) in enumerate(batches):
            b = _Block(run, model, acc, seconds, bar, index)
            b.forward(first, tokens.to(device), lengths.to(device))
            for name, step in _STEPS:
                if name in experiments:
                    b.start(name)
                    step(b)
                if name == "kendall" and b.own is not None:
                    _heads(b)  # each head on its own, once the importances are in
    return {k: torch.cat(v).cpu().numpy() for k, v in acc.items()}, dict(seconds)


@dataclass(frozen=True)
class _Run:
    """collect's settings, for every block."""

    experiments: tuple[str, ...]
    orders: tuple[str, ...]
    random_samples: int
    never_flipped: float
    permutations: int
    adversarial_steps: int
    adversarial_diversity: float
    chosen_by: Settings
    importances: list
    seeds: dict[str, int]


@dataclass
class _Block:
    """One instance block as the battery runs on it: its forward pass, the attention the
    procedures test, its keyed random draws, the importances found so far, and where every
    per-instance value and wall time goes."""

    run: _Run
    model: torch.nn.Module
    acc: dict[str, list[Tensor]]
    seconds: dict[str, float]
    bar: _Progress
    index: int
    scores: dict[str, Tensor] = field(default_factory=dict)  # attention and every importance, [B, T_real]
    # set by forward():
    tokens: Tensor = field(init=False)
    lengths: Tensor = field(init=False)
    out: Forward = field(init=False)  # the forward pass, real tokens (attention: the head mean if own)
    own: TestedAttention | None = field(init=False)  # a transformer's own attention, or None
    args: tuple = field(init=False)  # (attention, values, decoder, lengths): what the procedures test
    keyed: dict[str, KeyedRows] = field(init=False)  # each experiment's draws, keyed by instance
    t0: float = field(init=False)  # the last lap's time

    def start(self, part: str) -> None:
        self.bar.start(self.index, part)

    def lap(self, part: str) -> None:
        """Add the time since the last lap to ``part``'s wall time."""
        self.t0 = _lap(self.seconds, part, self.t0)

    def keep(self, key: str, value: Tensor) -> None:
        self.acc[key].append(value)

    def forward(self, first: int, tokens: Tensor, lengths: Tensor) -> None:
        """The block's forward pass and the attention the procedures test (``self.args``:
        attention, values, decoder, lengths), its draws keyed by instance from ``first``."""
        self.start("forward")
        self.t0 = time.perf_counter()
        self.tokens, self.lengths = tokens, lengths
        self.keyed = {name: KeyedRows(s, first) for name, s in self.run.seeds.items()}
        self.keep("instance", torch.arange(first, first + len(lengths)))
        self.out, self.own = out, own = tested_forward(self.model, tokens, lengths)
        if own is not None:
            self.args = (own.attention, own.values, own.decoder, own.lengths)
        else:
            self.args = (out.attention, out.hidden, self.model.decoder, out.lengths)
        self.keep("predicted", attnmetrics.decision(out.logits))
        self.keep("lengths", out.lengths)
        self.keep("max_attention", out.attention.max(1).values)
        self.scores = {"attention": out.attention}
        self.lap("forward")

    def flip(self, name: str, order, samples: int = 1, generator=None) -> None:
        r = attnmetrics.flip_fraction(
            *self.args, order=order, samples=samples, generator=generator, never_flipped=self.run.never_flipped
        )
        _keep_flip(self.acc, name, r)


def _flip(b: _Block) -> None:
    """S&S's decision-flip search in each removal order."""
    for name in b.run.orders:
        b.flip(name, name, b.run.random_samples if name == "random" else 1, b.keyed["flip"])
    b.lap("flip")


def _kendall(b: _Block) -> None:
    """Every importance (importances.py), then Kendall τ between each pair with attention (J&W)."""
    for importance in b.run.importances:
        if importance.experiment:
            b.start(importance.experiment)
        else:
            b.bar.show(importance.name)
        name = importance.name
        score = importance.compute(b.model, b.tokens, b.lengths, b.run.chosen_by)
        b.scores[name] = score.to(b.out.attention.dtype)
        b.lap(name)
        if importance.flip_order and "flip" in b.run.experiments:  # an order to remove by, never an attention
            b.flip(name, b.scores[name])
            b.lap("flip")
    for x, y in combinations(b.scores, 2):
        kt = attnmetrics.kendall_tau(b.scores[x], b.scores[y], b.out.lengths)
        b.keep(f"kendall/{x} vs {y}/tau", kt.tau)
        b.keep(f"kendall/{x} vs {y}/pvalue", kt.pvalue)
    b.lap("kendall")


def _heads(b: _Block) -> None:
    """A transformer's own attention, each head on its own: how it differs from the head mean,
    and (with the Kendall experiment) how it ranks tokens against each importance."""
    for h in range(b.own.attention.shape[1]):
        head = b.own.attention[:, h]
        b.keep(f"heads/h{h}/max attention", head.max(-1).values)
        b.keep(f"heads/h{h}/JSD from the head mean", attnmetrics.jsd(head, b.out.attention))
        if "kendall" in b.run.experiments:
            for importance in b.run.importances:
                if importance.head_partner:
                    tau = attnmetrics.kendall_tau(head, b.scores[importance.name], b.out.lengths).tau
                    b.keep(f"heads/h{h}/tau vs {importance.name}", tau)
    b.lap("heads")


def _permutation(b: _Block) -> None:
    """J&W's permutation test."""
    r = attnmetrics.permutation_test(*b.args, permutations=b.run.permutations, generator=b.keyed["permutation"])
    b.keep("permutation/median_tvd", r.median_tvd)
    b.lap("permutation")


def _adversarial(b: _Block) -> None:
    """J&W's adversarial attention search."""
    r = attnmetrics.adversarial_attention(
        *b.args,
        steps=b.run.adversarial_steps,
        diversity_weight=b.run.adversarial_diversity,
        generator=b.keyed["adversarial"],
    )
    b.keep("adversarial/max_jsd", r.max_jsd)
    b.keep("adversarial/output_tvd", r.output_tvd)
    b.lap("adversarial")


def _single_removal(b: _Block) -> None:
    """S&S's single-weight removal, of each kind."""
    for which in SINGLE_REMOVALS:
        r = attnmetrics.single_removal(*b.args, which=which, generator=b.keyed["single_removal"])
        b.keep(f"single_removal/{which}/jsd", r.jsd)
        b.keep(f"single_removal/{which}/flipped", r.flipped)
    b.lap("single_removal")


def _single_token(b: _Block) -> None:
    """T&Š's single-token-input test."""
    r = single_token_test(b.model, b.tokens, b.lengths, full=b.out)
    b.keep("single_token/tau", r.tau)
    b.keep("single_token/pvalue", r.pvalue)
    b.keep("single_token/top_agrees", r.top_agrees)
    b.lap("single_token")


def _eraser(b: _Block) -> None:
    """ERASER's comprehensiveness and sufficiency of every importance the battery has for these
    rows (attention, and the others with the Kendall experiment), against a random ordering."""
    ranked = {
        "attention": b.out.attention,
        "random": b.keyed["eraser"].uniform(len(b.lengths), b.out.attention.shape[1:]),
    }
    ranked.update((k, v) for k, v in b.scores.items() if k != "attention")
    for name, ranking in ranked.items():
        for metric, fn in ERASER_METRICS.items():
            r = fn(b.model, b.tokens, b.lengths, ranking.to(b.tokens.device))
            b.keep(f"eraser/{name}/{metric}/aopc", r.aopc)
            b.keep(f"eraser/{name}/{metric}/values", r.values)
    b.lap("eraser")


#: the battery's experiments in the order they run on a block (leave-one-out runs within Kendall's)
_STEPS = (
    ("flip", _flip),
    ("kendall", _kendall),
    ("permutation", _permutation),
    ("adversarial", _adversarial),
    ("single_removal", _single_removal),
    ("single_token", _single_token),
    ("eraser", _eraser),
)


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
