"""report.md of a run (tables, with the figures beside it) and a comparison of several runs.

Everything here reads the plain ``results`` dictionary written to ``results.json``, so
``attnmetrics report RUN`` re-renders a report without the model.
"""

from __future__ import annotations

import sys
import zipfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from attnmetrics.app.battery import experiments
from attnmetrics.app.io import write_text_atomic
from attnmetrics.app.markdown import fmt, table
from attnmetrics.app.summaries import get
from attnmetrics.app.token_view import render_token_view


def _model_line(results: dict) -> str:
    m = results.get("model", {})
    if m.get("encoder") == "hf" and m.get("architecture"):  # a Hugging Face model: its class says what it is
        return f"{m['architecture']} + own attention"
    if m.get("encoder") == "prompted":  # a causal LM zero-shot: its class and the prompt
        return f"{m.get('architecture') or 'causal LM'} zero-shot, prompt {m.get('prompt', {}).get('name', '?')}"
    if m.get("kind") == "pair":  # J&W's QA/NLI model: the battery is over the passage, the question fixed
        return (
            f"{m.get('encoder', '?')} encoder + {m.get('attention', '?')} attention over the passage, "
            "conditioned on the question (held fixed)"
        )
    return f"{m.get('encoder', '?')} encoder + {m.get('attention', '?')} attention"


def _commit(results: dict) -> str:
    """The run's code commit as results.json records it; a run from before it was recorded says so."""
    versions = results.get("versions", {})
    if "commit" not in versions:
        return "unknown (not recorded by the attnmetrics that wrote this run)"
    return versions["commit"] or "unknown (not run from a git checkout)"


def _sections() -> list:
    """Every registered experiment with a report section, in the report's order."""
    found = [e for e in experiments() if e.section]
    return sorted(found, key=lambda e: e.order if e.report_order is None else e.report_order)


def _timing(wall: dict) -> list[str]:
    """A line of where the wall time went: training, then each part of the battery."""
    parts = [f"training {fmt(wall['training'], 1)} s"] if "training" in wall else []
    per = wall.get("per_experiment", {})
    if per:
        inner = ", ".join(f"{name} {fmt(sec, 1)}" for name, sec in per.items())
        parts.append(f"battery {fmt(wall.get('experiments'), 1)} s ({inner})")
    return [f"Wall time: {'; '.join(parts)}.", ""] if parts else []


#: the confidence level of the test accuracy's interval in the chance-level check
CHANCE_CONFIDENCE = 0.95


def chance_level(results: dict, folder: Path) -> str | None:
    """A warning, in words, where the model is at chance level: the Wilson interval of its test
    accuracy (``scipy.stats.binomtest``'s ``proportion_ci``, :data:`CHANCE_CONFIDENCE`) reaches the
    majority-class rate of the test labels (predictions.npz in ``folder``), so always predicting
    the majority class does as well; None where it does not, or without the test labels."""
    accuracy = (results.get("test") or {}).get("accuracy")
    try:
        with np.load(folder / "predictions.npz") as f:
            labels = f["labels"]
    except (OSError, KeyError, ValueError, EOFError, zipfile.BadZipFile):
        return None  # no test labels (or unreadable): nothing to compare with
    if accuracy is None or not labels.size:
        return None
    from scipy.stats import binomtest  # scipy.stats loads in a report, not in every command's start

    n, counts = labels.size, np.bincount(labels)
    majority = counts.max() / n
    ci = binomtest(round(accuracy * n), n).proportion_ci(confidence_level=CHANCE_CONFIDENCE, method="wilson")
    if ci.low > majority:
        return None
    classes = results["data"].get("classes") or []
    name = classes[counts.argmax()] if counts.argmax() < len(classes) else f"class {counts.argmax()}"
    return (
        f"the model is at chance level: its test accuracy {fmt(accuracy)} ({100 * CHANCE_CONFIDENCE:g} % Wilson "
        f"interval [{fmt(ci.low)}, {fmt(ci.high)}] over {n} instances) is not above the majority-class rate "
        f"{fmt(majority)} (always {name!r}), so the faithfulness numbers and the method ranking describe a model "
        "no better than a constant guess"
    )


def render(results: dict, folder: str | Path) -> Path:
    """Write ``report.md`` (and its figures) for ``results`` into ``folder``; returns the report path."""
    folder = Path(folder)
    cfg, data = results["config"], results["data"]
    lines = [
        f"# attnmetrics report: {cfg.get('dataset')} / {_model_line(results)}",
        "",
        f"Seed {results.get('seed')}, device {results.get('device')}, "
        f"wall time {fmt(results.get('wall_time_s', {}).get('total'), 1)} s, "
        f"attnmetrics {results.get('versions', {}).get('attnmetrics')}, torch {results.get('versions', {}).get('torch')}, "
        f"code commit {_commit(results)}.",
        "",
        *_timing(results.get("wall_time_s", {})),
        "## Data and model",
        "",
        table(
            [
                [
                    data["name"],
                    data["sizes"]["train"],
                    data["sizes"]["dev"],
                    data["sizes"]["test"],
                    ", ".join(data["classes"]),
                ]
            ],
            ["dataset", "train", "dev", "test", "classes"],
        ),
        "",
    ]
    if "test" in results:
        t = results["test"]
        lines += [
            table(
                [
                    [
                        fmt(t.get("accuracy")),
                        fmt(t.get("macro_f1")),
                        fmt(t.get("roc_auc")),
                        results.get("training", {}).get("best_epoch", "–"),
                    ]
                ],
                ["test accuracy", "macro F1", "ROC-AUC", "best epoch"],
            ),
            "",
        ]
    pretrained = results.get("pretrained") or {}  # None: a GPT trained from scratch
    if weights := pretrained.get("weights"):  # a quantised checkpoint: every number is the quantised model's
        lines += [f"Weights: {pretrained.get('model')}, {weights}.", ""]
    if (m := results.get("model") or {}).get("encoder") == "prompted":
        words = ", ".join(f"{c} {w!r}" for c, w in m["prompt"].get("label_words", {}).items())
        lines += [
            f"Zero-shot through the prompt {m['prompt'].get('name')!r}"
            f"{' (in the chat template)' if m['prompt'].get('chat') else ''}: `{m['prompt'].get('template')!r}`; "
            f"label words {words}; the classes' probabilities are the softmax over the label words' next-token "
            "logits at the answer position. Only the text's tokens are explained; nothing was trained.",
            "",
        ]
    if warning := chance_level(results, folder):
        print(f"attnmetrics: warning: {folder}: {warning}", file=sys.stderr)
        lines += [f"**Warning**: {warning}.", ""]
    if isinstance(results.get("battery"), str):
        lines += ["## Faithfulness battery", "", results["battery"], ""]
    for experiment in _sections():
        if experiment.name in results:
            lines += experiment.section(results)
            name = experiment.figure(results, folder) if experiment.figure else None
            if name:
                lines += [f"![{experiment.alt}]({name})", ""]
    if render_token_view(results, folder):
        lines += ["The evidence on the text, for a few instances: [report.html](report.html).", ""]
    path = folder / "report.md"
    write_text_atomic(path, "\n".join(lines))
    return path


def render_comparison(runs: Sequence[tuple[str, dict]], folder: str | Path) -> Path:
    """Write ``comparison.md`` into ``folder``: one row per run, the headline number of each
    experiment side by side (each run's own report.md holds the details)."""
    folder = Path(folder)
    rows = []
    for name, r in runs:
        rows.append(
            [
                name,
                r["data"]["name"],
                _model_line(r),
                fmt(get(r, "test", "accuracy")),
                fmt(get(r, "test", "macro_f1")),
                fmt(get(r, "flip", "attention", "never_flipped_rate")),
                fmt(get(r, "flip", "attention", "fraction", "mean")),
                fmt(get(r, "flip", "random", "fraction", "mean")),
                fmt(get(r, "kendall", "attention vs gradient", "overall", "mean")),
                fmt(get(r, "kendall", "attention vs loo", "overall", "mean")),
                fmt(get(r, "permutation", "overall", "median")),
                fmt(get(r, "adversarial", "overall", "mean")),
                fmt(get(r, "single_removal", "top", "flip_rate")),
                fmt(get(r, "single_removal", "random", "flip_rate")),
            ]
        )
    headers = [
        "run",
        "dataset",
        "model",
        "accuracy",
        "macro F1",
        "never flips (attention order)",
        "flip fraction (attention)",
        "flip fraction (random)",
        "τ attention–gradient",
        "τ attention–LOO",
        "permutation median TVD",
        "adversarial mean max JSD",
        "flips, top removed",
        "flips, random removed",
    ]
    lines = [
        "# attnmetrics comparison",
        "",
        table(rows, headers),
        "",
        "Each run's report.md has the per-class and per-bin breakdowns and the figures.",
        "",
    ]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "comparison.md"
    write_text_atomic(path, "\n".join(lines))
    return path
