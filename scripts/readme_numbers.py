"""The README's and docs' numbers that come from committed results, filled from those files.

A quoted number is wrapped in a named marker, invisible in rendered markdown::

    ALTI <!-- n:minilm.alti.comprehensiveness -->0.252<!-- /n --> > integrated gradients ...

and its key names, in ``SOURCES`` below, the committed file it comes from (JSON, or a report.md's
tables and text where the run's JSON is not committed), the path into it and the format it is
quoted in (``<!-- n:KEY:SPEC -->`` quotes a one-value key with another format spec, e.g. ``.1f``).
``python scripts/readme_numbers.py`` rewrites every marked number from its source (each file
atomically; it prints what changed); ``--check`` changes nothing and exits 1, listing each marked
number that differs from its source (file, line, key, both values); ``--list`` prints every key with
its value. A marker that cannot be quoted (its key, source file or path into it missing, its source
not UTF-8 or not JSON, a NaN or infinity in what it quotes, a ratio over zero, a format spec that does
not apply) is named on one line and leaves its document as it was, and a missing or non-UTF-8 document
is refused: either exits 2 (as diff does: 1 for a difference, 2 for trouble). Markers inside code (a
`code span` or a fenced block) are examples and left alone. ``tests/test_readme_numbers.py`` runs the
check.

**Seed-level intervals.** ``seed_t_interval(file, group_a, group_b, statistic)`` quotes "mean [low,
high]" of the per-seed differences a − b of an aggregate.json's ``statistics[statistic]["per_seed"]``
over the seeds both groups have (paired by seed): a t interval, mean ± t(0.975, n − 1) · s / √n
(``T975``: the table of Student's t quantiles for df 1..30, tested against scipy). Beside the
bootstrap interval over seeds then instances it says how far a handful of seeds carries a difference.

**Separation claims.** A word the docs use to say two results are apart (or not) is wrapped in a
claim marker naming the keys it rests on, and the check verifies it from the same sources::

    ... 2 blocks <!-- sep-paired:gpt1x.transfer-2-transfer-0.diff.ci -->above<!-- /sep --> none ...
    ... <!-- sep:KEY_A:KEY_B -->apart<!-- /sep -->    <!-- nosep:KEY_A:KEY_B -->overlap<!-- /sep -->

``sep:A:B`` holds when the intervals of keys A and B (each key's last two values: the "[low, high]"
of an interval quote, or a "min–max" range) do not overlap (touching is overlap); ``sep-paired:K``
when the interval of K (a paired difference) excludes 0; ``nosep:`` and ``nosep-paired:`` claim the
opposite (overlap; includes 0). A claim the numbers do not bear out is named on one line with both
intervals (``docs/results.md:466: sep a:b: marked separated, but a [0.552, 0.592] and b [0.590,
0.629] overlap``) and exits 2, as an unresolved marker does: rewriting the numbers cannot fix
it. Standard library only: it reads JSON and markdown and imports nothing of attnmetrics
(benchmarks/gpu/collect.py borrows its atomic write and its NaN search).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import reprlib
import sys
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# The markdown files whose markers are checked and rewritten, relative to the repository root.
DOCUMENTS = ("README.md", "docs/results.md", "docs/speed.md")

MARKER = re.compile(r"<!-- n:(?P<key>[A-Za-z0-9_.\-]+)(?::(?P<spec>[^ >]+))? -->(?P<text>.*?)<!-- /n -->")
OPENING = re.compile(r"<!-- n:")
LINE_START = re.compile(r" {0,3}<!-- (?:n|(?:no)?sep(?:-paired)?):")
CLAIM = re.compile(
    r"<!-- (?P<neg>no)?sep(?P<paired>-paired)?:(?P<keys>[A-Za-z0-9_.\-]+(?::[A-Za-z0-9_.\-]+)*) -->"
    r"(?P<text>.*?)<!-- /sep -->"
)
CLAIM_OPENING = re.compile(r"<!-- (?:no)?sep(?:-paired)?:")
FENCE = re.compile(r" {0,3}(`{3,}|~{3,})")
CODE_SPAN = re.compile(r"(`+)(?!`).*?(?<!`)\1(?!`)")

Step = str | int | Mapping[str, Any] | re.Pattern[str]


class SourceError(Exception):
    """A marker cannot be quoted from its source (see the module's docstring), or a document is
    missing or not UTF-8."""


@dataclass(frozen=True)
class Value:
    """One value read from a committed file: ``path`` steps into its JSON, or into
    ``markdown_source`` of a ``.md`` file (a ``str`` is a key, an ``int`` an index, a mapping picks
    the one list element whose fields equal it, ``...`` standing for any value, a compiled pattern
    takes its first group's match in a string); ``then``, if given, maps what was found (a sum)."""

    file: str
    path: tuple[Step, ...] = ()
    then: Callable[[Any], Any] | None = None

    def resolve(self, root: Path, cache: dict[str, Any]) -> Any:
        if self.file not in cache:
            source = root / self.file
            if not source.is_file():
                raise SourceError(f"source file {self.file} not found")
            text = read_utf8(source, f"source file {self.file}")
            if source.suffix == ".md":
                cache[self.file] = markdown_source(text)
            else:
                try:
                    cache[self.file] = json.loads(text)
                except json.JSONDecodeError as e:
                    raise SourceError(f"source file {self.file} is not JSON: {e}") from None
        x = cache[self.file]
        for i, step in enumerate(self.path):
            x = _step(x, step, self.file, self.path[: i + 1])
        if (found := non_finite(x)) is not None:
            raise SourceError(f"{self.file}{_show(self.path)}{found}, not a finite number")
        return x if self.then is None else _apply(self.then, (x,), f"{self.file}{_show(self.path)}")


def read_utf8(path: Path, name: str) -> str:
    """``path``'s text; a file that is not UTF-8 is a :class:`SourceError` naming it as ``name``."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise SourceError(f"{name} is not UTF-8: {e}") from None


def non_finite(x: Any, at: tuple[Step, ...] = ()) -> str | None:
    """Where in ``x`` (a JSON value) its first NaN or infinity is, and it: ``['a'][0] is nan``
    ("" + `` is nan`` when ``x`` is one); None when it has none."""
    if isinstance(x, float) and not math.isfinite(x):
        return f"{_show(at)} is {x!r}"
    items = x.items() if isinstance(x, dict) else enumerate(x) if isinstance(x, list) else ()
    return next((found for k, v in items if (found := non_finite(v, (*at, k))) is not None), None)


def _apply(f: Callable[..., Any], args: Sequence[Any], where: str) -> Any:
    """``f(*args)``, a failure (a division by zero, a field that is not there) a :class:`SourceError`
    naming ``where`` the arguments come from and the arguments."""
    try:
        return f(*args)
    except (ArithmeticError, LookupError, TypeError, ValueError) as e:
        shown = ", ".join(map(reprlib.repr, args))
        raise SourceError(f"{where}: {shown}: {type(e).__name__}: {e}") from None


def markdown_source(markdown: str) -> dict[str, Any]:
    """A committed report.md whose JSON is not committed: ``text``, and ``tables``, every row of
    every pipe table, each a mapping from its table's header to the cell's stripped text, with
    ``_section`` (the heading above it, less a trailing parenthetical) and ``_label`` (a bold line
    above it under that heading, e.g. ``attention vs gradient``, or "")."""
    rows: list[dict[str, str]] = []
    header: list[str] | None = None
    section = label = ""
    lines = markdown.splitlines()
    for i, line in enumerate(lines):
        if not line.startswith("|"):
            header = None
            if line.startswith("#"):
                section, label = re.sub(r"\s*\(.*\)$", "", line.lstrip("#").strip()), ""
            elif re.fullmatch(r"\*\*[^*]+\*\*", line.strip()):
                label = line.strip().strip("*")
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            rule = lines[i + 1] if i + 1 < len(lines) else ""
            if re.fullmatch(r"\|?(\s*:?-+:?\s*\|)+\s*:?-*:?\s*", rule):
                header = cells
            continue
        if not all(set(c) <= set("-: ") for c in cells):
            rows.append({**dict(zip(header, cells)), "_section": section, "_label": label})
    return {"text": markdown, "tables": rows}


def cell_number(text: str) -> float:
    return float(text)


def interval_low(text: str) -> float:
    return float(text.strip("[]").split(",")[0])


def interval_high(text: str) -> float:
    return float(text.strip("[]").split(",")[1])


def _step(x: Any, step: Step, file: str, where: tuple[Step, ...]) -> Any:
    missing = SourceError(f"{file} has no {_show(where)}")
    if isinstance(step, re.Pattern):
        found = step.search(x) if isinstance(x, str) else None
        if found is None:
            raise missing
        return found[1]
    if isinstance(step, Mapping):
        if not isinstance(x, list):
            raise missing
        found = [
            e for e in x if isinstance(e, dict) and all(k in e and (v is ... or e[k] == v) for k, v in step.items())
        ]
        if len(found) != 1:
            raise SourceError(f"{file}: {len(found)} elements match {_show(where)}, not one")
        return found[0]
    if isinstance(step, int) and not isinstance(step, bool):
        if not isinstance(x, list) or not -len(x) <= step < len(x):
            raise missing
        return x[step]
    if not isinstance(x, dict) or step not in x:
        raise missing
    return x[step]


def _show(path: Iterable[Step]) -> str:
    return "".join(
        f"[{dict(s)!r}]" if isinstance(s, Mapping) else f"[/{s.pattern}/]" if isinstance(s, re.Pattern) else f"[{s!r}]"
        for s in path
    )


@dataclass(frozen=True)
class Quote:
    """How a key is quoted: ``fmt`` (a ``str.format`` template) applied to its values, or to
    ``combine(*values)`` when ``combine`` is given (a ratio, a minimum); ``minus`` is the sign
    quoted for a negative number (the docs' "−")."""

    fmt: str
    values: tuple[Value, ...]
    combine: Callable[..., Any] | None = None
    minus: str = "-"
    typeset: Callable[[float], str] | None = None  # formats the one value instead of ``fmt`` (e.g. by size)

    @property
    def files(self) -> str:
        """The files its values come from, each named once."""
        return ", ".join(dict.fromkeys(v.file for v in self.values))

    def numbers(self, root: Path, cache: dict[str, Any]) -> list[Any]:
        """The values the key quotes: its values, or what ``combine`` makes of them (one value, or
        a tuple of them: an interval's estimate, low and high)."""
        values = [v.resolve(root, cache) for v in self.values]
        if self.combine is not None:
            combined = _apply(self.combine, values, self.files)
            values = list(combined) if isinstance(combined, tuple) else [combined]
        return values

    def text(self, root: Path, cache: dict[str, Any], spec: str | None = None) -> str:
        values = self.numbers(root, cache)
        fmt = self.fmt
        if spec is not None:
            if len(values) != 1:
                raise SourceError(f"a format spec ({spec}) quotes one value; this key has {len(values)}")
            fmt = "{:" + spec + "}"
        for v in values:
            if not isinstance(v, int | float) or isinstance(v, bool):
                raise SourceError(f"value {v!r} from {self.files} is not a number")
            if not math.isfinite(v):
                raise SourceError(f"value {v!r} from {self.files} is not a finite number")
        if self.typeset is not None and spec is None:
            text = self.typeset(*values)
        else:
            try:
                text = fmt.format(*values)
            except (LookupError, ValueError) as e:
                raise SourceError(f"format {fmt!r} does not apply to {', '.join(map(repr, values))}: {e}") from None
        return text.replace("-", self.minus)


def one(fmt: str, file: str, *path: Step, then: Callable[[Any], Any] | None = None, minus: str = "-") -> Quote:
    """A key quoting one value: ``fmt`` is a format spec (``.3f``)."""
    return Quote("{:" + fmt + "}", (Value(file, path, then),), minus=minus)


def interval(file: str, *at: Step, estimate: str = "estimate", bounds: str = "ci95", minus: str = "-") -> Quote:
    """A table cell "estimate [low, high]" of the entry at ``at`` (its ``estimate`` key and ``bounds``)."""
    values = tuple(Value(file, (*at, *k)) for k in ((estimate,), (bounds, 0), (bounds, 1)))
    return Quote("{:.3f} [{:.3f}, {:.3f}]", values, minus=minus)


def ratio(fmt: str, numerator: Value, denominator: Value) -> Quote:
    return Quote("{:" + fmt + "}", (numerator, denominator), lambda a, b: a / b)


#: Student's t distribution's 0.975 quantile (a two-sided 95 % interval) for df = 1..30: the standard
#: table values (e.g. NIST/SEMATECH e-Handbook of Statistical Methods, sec. 1.3.6.7.2, to 3 decimals:
#: 12.706, 4.303, 3.182, 2.776, 2.571, ...), here to 6 decimals; tests/test_readme_numbers.py checks
#: each against scipy.stats.t.ppf(0.975, df).
T975 = (
    12.706205, 4.302653, 3.182446, 2.776445, 2.570582, 2.446912, 2.364624, 2.306004, 2.262157, 2.228139,
    2.200985, 2.178813, 2.160369, 2.144787, 2.131450, 2.119905, 2.109816, 2.100922, 2.093024, 2.085963,
    2.079614, 2.073873, 2.068658, 2.063899, 2.059539, 2.055529, 2.051831, 2.048407, 2.045230, 2.042272,
)  # fmt: skip


def t_interval(values: Sequence[float]) -> tuple[float, float, float]:
    """The mean of ``values`` and its 95 % t interval, mean ± t(0.975, n − 1) · s / √n (s the sample
    standard deviation, ddof 1); 2 to 31 values."""
    n = len(values)
    if not 2 <= n <= len(T975) + 1:
        raise ValueError(f"a t interval needs 2 to {len(T975) + 1} values, not {n}")
    mean = sum(values) / n
    s = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = T975[n - 2] * s / math.sqrt(n)
    return mean, mean - half, mean + half


def paired_seed_differences(a: Mapping[str, float], b: Mapping[str, float]) -> list[float]:
    """``a[seed] − b[seed]`` for every seed both per-seed mappings have, in seed order."""
    seeds = sorted(a.keys() & b.keys(), key=lambda k: (len(k), k))
    return [a[k] - b[k] for k in seeds]


def seed_t_interval(
    file: str, group_a: str, group_b: str, statistic: str, statistic_b: str | None = None, minus: str = "−"
) -> Quote:
    """ "mean [low, high]": the t interval (:func:`t_interval`) of the per-seed differences a − b of
    ``statistic`` between two groups of an aggregate.json, paired by seed (``statistic_b``, if given,
    is b's statistic: two methods' columns of one group)."""
    a, b = (
        Value(file, ("groups", g, "statistics", st, "per_seed"))
        for g, st in ((group_a, statistic), (group_b, statistic_b or statistic))
    )
    return Quote("{:.3f} [{:.3f}, {:.3f}]", (a, b), lambda x, y: t_interval(paired_seed_differences(x, y)), minus=minus)


# --- the committed sources ---------------------------------------------------------------------

GPU = "benchmarks/results/gpu-check-h100-2026-11-26-674e96a.json"
GPU_H200 = "benchmarks/results/gpu-check-h200-2026-11-27-ff3101f.json"
GPU_MAIN = ("runs", "sst main job, cuda")
CPU_MAIN = ("runs", "sst main job, one CPU thread of the same machine (beside the GPU stages)")
GPU_BATTERY = ("runs", "battery of the cuda run's model, evaluate --device cuda")
CPU_BATTERY = ("runs", "battery of the cuda run's model, evaluate --device cpu --threads 1")
MINILM = ("runs", "MiniLM run --epochs 1 --importances all --integrated-gradients 16, cuda")
EARLY = "benchmarks/results/sst-main-job-cuda-h100-2026-11-26-4a9fea4.json"
SWEEP = "reports/sweep/aggregate.json"
CPU_BENCH = "benchmarks/results/cpu-epyc-avx2-1thread.json"
LOO_JW = "benchmarks/results/loo-jw-cpu-1thread.json"
ERASER = "benchmarks/results/eraser-cpu-1thread.json"
LOO_CAPTUM = "benchmarks/results/loo-captum-cpu-1thread.json"
SST_LSTM = "reports/sst-lstm/report.md"
MR_LSTM = "reports/mr-lstm/report.md"
CI_RUN = "benchmarks/results/ci-run-2core-2026-11-28.json"
SST_GPT_EXTRACT = "reports/sst-gpt-extract/report.md"
GPT1 = "reports/gpt1/report.md"
GPT1_GROUPS = (
    *(f"{g}/sst-gpt-tanh" for g in ("pretrained", "scratch", "no-lm", "pretrained-lr", "scratch-lr")),
    *(f"transfer-{k}/sst-gpt-tanh" for k in range(4)),
    *(f"{g}/tweets-gpt-tanh" for g in ("pretrained", "no-lm")),
    "bilstm/sst-lstm-tanh",
    "bilstm/tweets-lstm-tanh",
)
ATTRIBUTIONS = "benchmarks/results/attributions-cpu-1thread.json"
# The attention-derived attributions whose ours-vs-loop ratios are in ATTRIBUTIONS.
#: every attention-derived method of benchmarks/test_bench_attributions.py (attributions.METHODS)
ATTRIBUTION_METHODS = ("value_norm", "globenc", "alti", "value_zeroing", "chefer", "decompx", "attention_flow")

# The battery's methods in the MiniLM run's method table, by their battery names (the keys' middle part).
MINILM_METHODS = (
    "alti",
    "loo",
    "ig",
    "globenc",
    "value_zeroing",
    "value_norm",
    "gradient",
    "input_x_gradient",
    "rollout",
    "attention",
)
MINILM_COLUMNS = ("tau_loo", "comprehensiveness", "sufficiency", "flip_fraction", "never_flips")
# The columns the table leaves empty (null in the JSON): leave-one-out is the τ's reference, and the
# plain gradient has no ordering of its own in the flip search.
MINILM_EMPTY = {"loo": ("tau_loo", "flip_fraction", "never_flips"), "gradient": ("flip_fraction", "never_flips")}


def _sum(d: Mapping[str, float]) -> float:
    return sum(d.values())


def _wall_in(file: str) -> Callable[..., Value]:
    """``wall(run, *path, then=None)``: a run's ``wall_time_s`` entry in a check's file."""

    def wall(run: tuple[str, ...], *path: Step, then: Callable[[Any], Any] | None = None) -> Value:
        return Value(file, (*run, "wall_time_s", *path), then)

    return wall


def _gpu_check(prefix: str = "gpu", file: str = GPU) -> dict[str, Quote]:
    """A run of benchmarks/gpu/check.sh: the H100's (``gpu.``, docs/speed.md "On a GPU (NVIDIA
    H100)") and the H200's (``h200.``, the README's speed sentence and table)."""
    _wall = _wall_in(file)
    s: dict[str, Quote] = {}
    for name, run in (("main.cuda", GPU_MAIN), ("main.cpu", CPU_MAIN)):
        s[f"{prefix}.{name}.total_s"] = Quote("{:.1f}", (_wall(run, "total"),))
        s[f"{prefix}.{name}.training_s"] = Quote("{:.1f}", (_wall(run, "training"),))
        s[f"{prefix}.{name}.battery_s"] = Quote("{:.1f}", (_wall(run, "experiments"),))
    s[f"{prefix}.main.speedup"] = ratio(".1f", _wall(CPU_MAIN, "total"), _wall(GPU_MAIN, "total"))
    s[f"{prefix}.main.training_speedup"] = ratio(".1f", _wall(CPU_MAIN, "training"), _wall(GPU_MAIN, "training"))
    epochs = Value(file, (*GPU_MAIN, "training", "history"))
    s[f"{prefix}.main.cuda.epoch_min_s"] = Quote("{:.1f}", (epochs,), lambda h: min(e["seconds"] for e in h))
    s[f"{prefix}.main.cuda.epoch_max_s"] = Quote("{:.1f}", (epochs,), lambda h: max(e["seconds"] for e in h))
    s[f"{prefix}.main.cuda.accuracy"] = one(".4f", file, *GPU_MAIN, "test", "accuracy")
    s[f"{prefix}.main.cuda.loss"] = one(".4f", file, *GPU_MAIN, "test", "loss")
    for name, run, fmt in (("battery.cuda", GPU_BATTERY, "{:.2f}"), ("battery.cpu", CPU_BATTERY, "{:.1f}")):
        s[f"{prefix}.{name}.battery_s"] = Quote(fmt, (_wall(run, "experiments"),))
        s[f"{prefix}.{name}.procedures_s"] = Quote(fmt, (_wall(run, "per_experiment", then=_sum),))
    s[f"{prefix}.battery.speedup"] = ratio(".1f", _wall(CPU_BATTERY, "experiments"), _wall(GPU_BATTERY, "experiments"))
    s[f"{prefix}.battery.procedures_speedup"] = ratio(
        ".1f", _wall(CPU_BATTERY, "per_experiment", then=_sum), _wall(GPU_BATTERY, "per_experiment", then=_sum)
    )
    for part in ("eraser", "adversarial", "gradient", "loo"):
        cuda, cpu = _wall(GPU_BATTERY, "per_experiment", part), _wall(CPU_BATTERY, "per_experiment", part)
        s[f"{prefix}.battery.cuda.{part}_s"] = Quote("{:.2f}", (cuda,))
        s[f"{prefix}.battery.cpu.{part}_s"] = Quote("{:.3g}", (cpu,))
        s[f"{prefix}.battery.{part}_speedup"] = ratio(".2g", cpu, cuda)
    s[f"{prefix}.minilm.battery_s"] = Quote("{:.1f}", (_wall(MINILM, "experiments"),))
    for part, fmt in (
        ("adversarial", "{:.1f}"),
        ("ig", "{:.1f}"),
        ("eraser", "{:.1f}"),
        ("loo", "{:.1f}"),
        ("value_zeroing", "{:.1f}"),
        ("globenc", "{:.2f}"),
        ("alti", "{:.2f}"),
    ):
        s[f"{prefix}.minilm.{part}_s"] = Quote(fmt, (_wall(MINILM, "per_experiment", part),))
    return s


def _h200_extras() -> dict[str, Quote]:
    """The H200 check's file beyond :func:`_gpu_check`'s keys: the MiniLM methods added after the
    H100's run, the later MiniLM run with attention flow's C++ max flows, the peers on the device."""
    wall, s = _wall_in(GPU_H200), {}
    for part in ("attention_flow", "decompx", "chefer"):
        s[f"h200.minilm.{part}_s"] = Quote("{:.1f}", (wall(MINILM, "per_experiment", part),))
    after = (
        "runs",
        "MiniLM run --epochs 1 --importances all --integrated-gradients 16, cuda, at 1323a44 (attention flow's max flows in C++)",
    )
    s["h200.minilm_op.battery_s"] = Quote("{:.1f}", (wall(after, "experiments"),))
    for part in ("attention_flow", "adversarial", "ig", "eraser"):
        s[f"h200.minilm_op.{part}_s"] = Quote("{:.1f}", (wall(after, "per_experiment", part),))
    s["h200.minilm_op.flow_speedup"] = ratio(
        ".1f", wall(MINILM, "per_experiment", "attention_flow"), wall(after, "per_experiment", "attention_flow")
    )
    for name in ("loo_ours", "ig_ours", *(f"{m}_captum_{v}" for m, v in PEER_VARIANTS)):
        s[f"h200.peers.{name}_s"] = one(".2f", GPU_H200, "peers_cuda", f"{name}_s")
    for m, v in PEER_VARIANTS:
        s[f"h200.peers.{m}_captum_{v}_ratio"] = one(".2f", GPU_H200, "peers_cuda", f"{m}_captum_{v}_ratio")
    return s


#: peers_cuda.py's Captum users: (method, variant)
PEER_VARIANTS = (
    ("loo", "stock_per_eval_1"),
    ("loo", "stock_per_eval_16"),
    ("loo", "bucketed"),
    ("ig", "stock_internal_64"),
    ("ig", "stock_internal_1024"),
    ("ig", "bucketed_internal_1024"),
)


def _gpu_check_earlier() -> dict[str, Quote]:
    """The earlier H100 check (docs/speed.md, "the battery shaped for the device (an earlier run)")."""
    s: dict[str, Quote] = {}
    run_, ev_, cpu_ = (
        ("runs", k) for k in ("run --device cuda", "evaluate --device cuda", "evaluate --device cpu --threads 1")
    )

    def early(run: tuple[str, ...], *path: Step) -> Value:
        return Value(EARLY, (*run, "wall_time_s", *path))

    s["gpu_early.run.battery_s"] = Quote("{:.2f}", (early(run_, "experiments"),))
    s["gpu_early.evaluate.battery_s"] = Quote("{:.2f}", (early(ev_, "experiments"),))
    s["gpu_early.cpu.battery_s"] = Quote("{:.1f}", (early(cpu_, "experiments"),))
    s["gpu_early.battery_speedup"] = ratio(".1f", early(cpu_, "experiments"), early(run_, "experiments"))
    for part in ("eraser", "adversarial", "gradient", "loo"):
        cuda, cpu = early(run_, "per_experiment", part), early(cpu_, "per_experiment", part)
        s[f"gpu_early.run.{part}_s"] = Quote("{:.2f}", (cuda,))
        s[f"gpu_early.cpu.{part}_s"] = Quote("{:.3g}", (cpu,))
        s[f"gpu_early.{part}_speedup"] = ratio(".2g", cpu, cuda)
    s["gpu_early.run.total_s"] = Quote("{:.1f}", (early(run_, "total"),))
    s["gpu_early.run.training_s"] = Quote("{:.1f}", (early(run_, "training"),))
    s["gpu_early.run.epoch_min_s"] = one(".1f", EARLY, *run_, "epoch_seconds", then=min)
    s["gpu_early.run.epoch_max_s"] = one(".1f", EARLY, *run_, "epoch_seconds", then=max)
    s["gpu_early.run.accuracy"] = one(".3f", EARLY, *run_, "test", "accuracy")
    return s


def _minilm_table() -> dict[str, Quote]:
    """The MiniLM run's method table (docs/results.md; the README's ranking)."""
    s: dict[str, Quote] = {}
    s["minilm.accuracy"] = one(".3f", GPU, *MINILM, "test", "accuracy")
    s["minilm.instances"] = one(",", GPU, *MINILM, "methods", "rows", "comprehensiveness")
    s["minilm.flip_rows"] = one(",", GPU, *MINILM, "methods", "rows", "flip_fraction")
    cells = [
        ((*MINILM, "methods", "methods", {"method": m}, c), f"{m}.{c}")
        for m in MINILM_METHODS
        for c in MINILM_COLUMNS
        if c not in MINILM_EMPTY.get(m, ())
    ]
    cells += [
        ((*MINILM, "methods", "baseline", "random", c), f"random.{c}") for c in ("comprehensiveness", "sufficiency")
    ]
    for at, name in cells:
        mean, lo, hi = Value(GPU, (*at, "mean")), Value(GPU, (*at, "ci95", 0)), Value(GPU, (*at, "ci95", 1))
        s[f"minilm.{name}"] = Quote("{:.3f}", (mean,))
        s[f"minilm.{name}.lo"] = Quote("{:.3f}", (lo,))
        s[f"minilm.{name}.hi"] = Quote("{:.3f}", (hi,))
        s[f"minilm.{name}.ci"] = interval(GPU, *at, estimate="mean")
    return s


#: the methods tables over three seeds (sweeps on an H100): key prefix -> (aggregate.json, group)
METHOD_SWEEPS = {
    "minilm3": ("reports/minilm-methods/aggregate.json", "minilm/sst-lstm-tanh"),
    "gpt3": ("reports/gpt-methods/aggregate.json", "gpt-extract/sst-gpt-extract"),
}
METHOD_SWEEP_NAMES = (
    "attention", "gradient", "loo", "rollout", "ig", "input_x_gradient", "value_norm", "globenc", "alti",
    "value_zeroing", "chefer", "decompx", "attention_flow",
)  # fmt: skip


def _method_sweeps() -> dict[str, Quote]:
    """The MiniLM and GPT methods tables over three seeds (docs/results.md; the README's
    rankings): ``PREFIX.METHOD.COLUMN`` (``.ci``: "mean [low, high]") and the test accuracy."""
    s: dict[str, Quote] = {}
    for prefix, (file, group) in METHOD_SWEEPS.items():
        acc = ("groups", group, "statistics", "test accuracy")
        s[f"{prefix}.accuracy"] = one(".3f", file, *acc, "estimate")
        s[f"{prefix}.accuracy.ci"] = interval(file, *acc)
        table = ("groups", group, "methods")
        cells = [
            ((*table, "methods", {"method": m}, c), f"{m}.{c}")
            for m in METHOD_SWEEP_NAMES
            for c in MINILM_COLUMNS
            if c not in MINILM_EMPTY.get(m, ())
        ]
        cells += [((*table, "baseline", "random", c), f"random.{c}") for c in ("comprehensiveness", "sufficiency")]
        for at, name in cells:
            s[f"{prefix}.{name}"] = one(".3f", file, *at, "mean", minus="−")
            s[f"{prefix}.{name}.ci"] = interval(file, *at, estimate="mean", minus="−")
    return s


#: the MiniLM methods table under its authors' ERASER protocols (reports/minilm-protocols, issue 47):
#: key prefix -> (group, the methods its grid ran)
PROTOCOLS_FILE = "reports/minilm-protocols/aggregate.json"
PROTOCOL_GROUPS = {
    "mprot.alti": ("alti/sst-lstm-tanh", METHOD_SWEEP_NAMES),
    "mprot.alti_l2": ("alti-l2/sst-lstm-tanh", ("attention", "gradient", "ig", "input_x_gradient")),
    "mprot.decompx": ("decompx/sst-lstm-tanh", METHOD_SWEEP_NAMES),
}
#: the published numbers beside them (reports/minilm-protocols/published.json): key -> the authors' own
#: method key, per paper and model
PUBLISHED_PROTOCOLS = {
    ("alti", "roberta"): (
        "ours", "ours_l2", "ig_abs_mean", "ig_l2", "grad_input_mean_abs_mean", "grad_input_l2", "grad", "norm2",
        "norm", "rollout",
    ),
    ("alti", "distilbert"): (
        "ours", "ig_abs_mean", "ig_l2", "grad_input_mean_abs_mean", "grad_input_l2", "grad", "norm2", "rollout",
    ),
    ("decompx", "bert-base"): (
        "DecompX", "ALTI (Ferrando et al., 2022)", "Integrated Gradients", "Gradient×Input",
        "GlobEnc (Modarressi et al., 2022)", "+ FFN",
    ),
}  # fmt: skip


#: the protocol tables' method pairs whose paired differences over the seeds the docs quote
PROTOCOL_PAIRS = {
    "mprot.alti": (
        ("alti", "ig"), ("ig", "input_x_gradient"), ("input_x_gradient", "globenc"), ("globenc", "rollout"),
        ("loo", "alti"), ("decompx", "alti"), ("chefer", "alti"),
    ),
    "mprot.decompx": (
        ("decompx", "alti"), ("alti", "ig"), ("ig", "input_x_gradient"), ("input_x_gradient", "globenc"),
        ("chefer", "alti"), ("chefer", "loo"),
    ),
}  # fmt: skip


def _protocol_key(method: str) -> str:
    """A published method's name as a key: DecompX's "GlobEnc (Modarressi et al., 2022)" -> "globenc"."""
    return {"Gradient×Input": "gxi", "Integrated Gradients": "ig", "+ FFN": "globenc_ffn"}.get(
        method, method.split(" (")[0].lower()
    )


def _protocols() -> dict[str, Quote]:
    """The MiniLM methods table under ALTI's and DecompX's protocols over three seeds and the authors'
    numbers (docs/results.md): ``mprot.GRID.METHOD.METRIC`` (``.ci``: "mean [low, high]"),
    ``mprot.GRID.accuracy``, and ``pub.PAPER.MODEL.METHOD.METRIC``, METRIC comprehensiveness or
    sufficiency."""
    s: dict[str, Quote] = {}
    metrics = ("comprehensiveness", "sufficiency")
    for prefix, (group, methods) in PROTOCOL_GROUPS.items():
        s[f"{prefix}.accuracy"] = one(".3f", PROTOCOLS_FILE, "groups", group, "statistics", "test accuracy", "estimate")
        table = ("groups", group, "methods")
        cells = [((*table, "methods", {"method": m}, c), f"{m}.{c}") for m in methods for c in metrics]
        cells += [((*table, "baseline", "random", c), f"random.{c}") for c in metrics]
        for at, name in cells:
            s[f"{prefix}.{name}"] = one(".3f", PROTOCOLS_FILE, *at, "mean", minus="−")
            s[f"{prefix}.{name}.ci"] = interval(PROTOCOLS_FILE, *at, estimate="mean", minus="−")
    for prefix, pairs in PROTOCOL_PAIRS.items():
        group = PROTOCOL_GROUPS[prefix][0]
        for a, b in pairs:
            for metric in metrics:
                column = "methods/{}/" + metric + " AOPC"
                s[f"{prefix}.{a}-{b}.{metric}.seed_t"] = seed_t_interval(
                    PROTOCOLS_FILE, group, group, column.format(a), column.format(b)
                )
    published = "reports/minilm-protocols/published.json"
    for (paper, model), methods in PUBLISHED_PROTOCOLS.items():
        for method in methods:
            for metric in metrics:
                at = (paper, "models", model, method, metric)
                s[f"pub.{paper}.{model}.{_protocol_key(method)}.{metric}"] = one(".3f", published, *at, minus="−")
    return s


def _jw_encoders() -> dict[str, Quote]:
    """J&W's CNN + tanh and BiLSTM + dot over three seeds (docs/results.md, J&W's protocol):
    ``jw3.MODEL.STATISTIC.ci`` quotes "estimate [low, high]"."""
    file = "reports/jw-encoders/aggregate.json"
    s: dict[str, Quote] = {}
    for model, group in (("cnn", "cnn/sst-cnn-tanh"), ("dot", "dot/sst-lstm-dot")):
        for name, statistic in (
            ("tau_ag", "τ attention vs gradient"),
            ("tau_al", "τ attention vs loo"),
            ("tau_gl", "τ gradient vs loo"),
            ("accuracy", "test accuracy"),
            ("permutation", "permutation median TVD"),
        ):
            at = ("groups", group, "statistics", statistic)
            s[f"jw3.{model}.{name}.ci"] = interval(file, *at)
            s[f"jw3.{model}.{name}"] = one(".3f", file, *at, "estimate")
    return s


#: J&W's statistics quoted beside their committed numbers: key, the aggregate's statistic, the path into
#: their numbers (None: they committed it only as a figure)
JW_STATISTICS = (
    ("accuracy", "test accuracy", ("accuracy",)),
    ("tau_ag", "τ attention vs gradient", ("kendall", "attention vs gradient", "mean")),
    ("tau_al", "τ attention vs loo", ("kendall", "attention vs loo", "mean")),
    ("tau_gl", "τ gradient vs loo", ("kendall", "gradient vs loo", "mean")),
    ("permutation", "permutation median TVD", None),
    ("adversarial", "adversarial max JSD (mean)", None),
    ("flip_attention", "flip fraction (attention)", None),
)
JW_NEVER = ("never_attention", "never flips (attention)", None)


def _jw_qa() -> dict[str, Quote]:
    """J&W's bAbI tasks over three seeds (reports/jw-qa, docs/results.md) beside their committed
    numbers (reports/jw-qa/jain_wallace.json): ``jwqa.TASK.MODEL.STATISTIC`` (``.ci``: "estimate
    [low, high]"; ``.min``/``.max`` over the seeds) and ``jwqa.pub.TASK.MODEL.STATISTIC``, TASK
    babi1-3, MODEL lstm-tanh, lstm-dot, average-tanh."""
    file, published = "reports/jw-qa/aggregate.json", "reports/jw-qa/jain_wallace.json"
    statistics = (*JW_STATISTICS, ("flip_gradient", "flip fraction (gradient)", None), JW_NEVER)
    s: dict[str, Quote] = {}
    for task in ("babi1", "babi2", "babi3"):
        for model, grid in (("lstm-tanh", "lstm"), ("lstm-dot", "lstm"), ("average-tanh", "average")):
            at = ("groups", f"{grid}/{task}-{model}", "statistics")
            for name, statistic, theirs in statistics:
                key = f"jwqa.{task}.{model}.{name}"
                s[key] = one(".3f", file, *at, statistic, "estimate", minus="−")
                s[f"{key}.ci"] = interval(file, *at, statistic, minus="−")
                s[f"{key}.min"] = one(".3f", file, *at, statistic, "min", minus="−")
                s[f"{key}.max"] = one(".3f", file, *at, statistic, "max", minus="−")
                if theirs is not None:
                    s[f"jwqa.pub.{task}.{model}.{name}"] = one(
                        ".3f", published, "numbers", f"{task}-{model}", *theirs, minus="−"
                    )
    return s


JW_PROTOCOL_MODELS = ("lstm-tanh", "lstm-dot", "average-tanh", "average-dot", "cnn-tanh", "cnn-dot")


def _published_share_range(versions: list, cls: str, threshold: str) -> tuple[float, float]:
    """The lowest "without the bin" and highest "with the bin" share over J&W's committed versions."""
    return min(v["shares"][cls][threshold][0] for v in versions), max(v["shares"][cls][threshold][1] for v in versions)


SMOLLM2 = "reports/smollm2-sst/aggregate.json"
#: the orderings of SmolLM2's battery (reports/smollm2-sst, docs/results.md)
SMOLLM2_ORDERINGS = (
    "attention", "gradient", "loo", "rollout", "value_norm", "alti", "value_zeroing", "chefer", "ig",
    "alti_logit", "attnlrp", "attention_flow", "random",
)  # fmt: skip


def _smollm2() -> dict[str, Quote]:
    """SmolLM2 zero-shot on SST over three prompts (reports/smollm2-sst): ``smollm2.{accuracy,macro_f1}.ci``
    and ``.prompt.PROMPT`` (the whole test split), ``smollm2.instances``; the battery's
    ``smollm2.battery.{accuracy.ci,instances}``, ``smollm2.battery.METHOD.{comprehensiveness,sufficiency}``
    (AOPC, "estimate [low, high]"), ``smollm2.battery.tau.A.B`` (τ, A before B as the report names it),
    ``smollm2.battery.loo-alti.comprehensiveness.paired`` (the adjacent methods' paired difference),
    ``smollm2.battery.{permutation,adversarial}``, ``smollm2.battery.never_flips.attention`` and
    ``smollm2.battery.flip.attention-random`` (the common rows' paired flip-fraction difference)."""
    s: dict[str, Quote] = {}
    accuracy = ("groups", "accuracy/sst-prompted-s0", "statistics")
    for key, name in (("accuracy", "test accuracy"), ("macro_f1", "test macro F1")):
        s[f"smollm2.{key}.ci"] = interval(SMOLLM2, *accuracy, name)
        for prompt in ("sentiment", "sentiment-oneword", "sentiment-plain"):
            s[f"smollm2.{key}.prompt.{prompt}"] = one(".3f", SMOLLM2, *accuracy, name, "per_seed", prompt)
    s["smollm2.instances"] = one(",d", SMOLLM2, *accuracy, "test accuracy", "instances")
    battery = ("groups", "battery/sst-prompted-s0", "statistics")
    s["smollm2.battery.accuracy.ci"] = interval(SMOLLM2, *battery, "test accuracy")
    s["smollm2.battery.instances"] = one("d", SMOLLM2, *battery, "test accuracy", "instances")
    for method in SMOLLM2_ORDERINGS:
        for metric in ("comprehensiveness", "sufficiency"):
            s[f"smollm2.battery.{method}.{metric}"] = interval(SMOLLM2, *battery, f"methods/{method}/{metric} AOPC")
    for a, b in (("attention", "loo"), ("gradient", "loo"), ("attention", "value_norm")) + tuple(
        ("loo", m) for m in ("rollout", "value_norm", "alti", "value_zeroing", "chefer", "ig", "alti_logit", "attnlrp")
    ):
        s[f"smollm2.battery.tau.{a}.{b}"] = interval(SMOLLM2, *battery, f"τ {a} vs {b}")
    s["smollm2.battery.permutation"] = interval(SMOLLM2, *battery, "permutation median TVD")
    s["smollm2.battery.adversarial"] = interval(SMOLLM2, *battery, "adversarial max JSD (mean)")
    s["smollm2.battery.never_flips.attention"] = interval(SMOLLM2, *battery, "never flips (attention)")
    s["smollm2.battery.flip.attention-random"] = interval(
        SMOLLM2, *battery, "flip fraction, common rows: attention − random", minus="−"
    )
    paired = ("groups", "battery/sst-prompted-s0", "methods", "paired", "pairs", {"a": "loo", "b": "alti"})
    s["smollm2.battery.loo-alti.comprehensiveness.paired"] = interval(SMOLLM2, *paired, estimate="mean", minus="−")
    return s


def _bootstrap() -> dict[str, Quote]:
    """The aggregate's counted bootstrap against gathering (docs/speed.md): ``bootstrap.{gathering_s,counted_s,speedup}``."""
    file = "benchmarks/results/bootstrap-cpu1-2026-11-29.json"
    info = ("benchmarks", 0, "extra_info")
    return {
        "bootstrap.gathering_s": one(".2f", file, *info, "gathering_s"),
        "bootstrap.counted_s": one(".2f", file, *info, "counted_s"),
        "bootstrap.speedup": one(".1f", file, *info, "speedup"),
    }


def _jw_protocol() -> dict[str, Quote]:
    """J&W's SST grid under their protocol over five seeds (reports/jw-protocol, docs/results.md) beside
    their committed numbers (reports/jw-protocol/jain_wallace.json): ``jwp.MODEL.STATISTIC`` (``.ci``:
    "estimate [low, high]"; ``.range``: "min–max" over the seeds), ``jwp.pub.MODEL.STATISTIC``;
    the adversary's shares ``jwp.MODEL.share{0.3,0.5}.{0,1}`` (per predicted class) and J&W's
    ``jwp.pub.MODEL.share{0.3,0.5}.{0,1}`` ("low–high" over their committed versions, without and with
    the bin that holds the threshold), ``.newest`` their newest version's; ``jwp.MODEL.ss_minus_ORDER``
    S&S's attention order's flip fraction minus another order's on the rows both flip; MODEL as lstm-tanh, and
    ``re.lstm-tanh`` the random-embedding probe. S&S's draws: ``jwp.ss.{not-first,non-top}.STATISTIC``
    and ``jwp.ss.random.seed_t`` (not-first − non-top, paired by seed)."""
    file, published = "reports/jw-protocol/aggregate.json", "reports/jw-protocol/jain_wallace.json"
    statistics = (*JW_STATISTICS, JW_NEVER)
    s: dict[str, Quote] = {}

    def ours(key: str, group: str, statistic: str) -> None:
        at = ("groups", group, "statistics", statistic)
        s[key] = one(".3f", file, *at, "estimate", minus="−")
        s[f"{key}.ci"] = interval(file, *at, minus="−")
        dash = " to " if "ss_minus" in key else "–"  # a difference's range may be negative: "−0.226 to −0.049"
        s[f"{key}.range"] = Quote(
            "{:.3f}" + dash + "{:.3f}", (Value(file, (*at, "min")), Value(file, (*at, "max"))), minus="−"
        )

    models = [(m, f"jw/sst-{m}") for m in JW_PROTOCOL_MODELS] + [("re.lstm-tanh", "random-embeddings/sst-lstm-tanh")]
    for model, group in models:
        for name, statistic, theirs in statistics:
            ours(f"jwp.{model}.{name}", group, statistic)
            if theirs is not None and not model.startswith("re."):
                s[f"jwp.pub.{model}.{name}"] = one(".3f", published, "numbers", f"sst-{model}", *theirs, minus="−")
        for other in ("random", "gradient", "attn_grad"):  # S&S's orderings on common rows, paired
            ours(f"jwp.{model}.ss_minus_{other}", group, f"flip fraction, common rows: attention − {other}")
        for t in ("0.3", "0.5"):
            for cls, name in (("0", "negative"), ("1", "positive")):
                ours(f"jwp.{model}.share{t}.{cls}", group, f"adversarial share max JSD ≥ {t} (predicted {name})")
                if model.startswith("re."):
                    continue
                versions = Value(published, ("numbers", f"sst-{model}", "adversary"))
                s[f"jwp.pub.{model}.share{t}.{cls}"] = Quote(
                    "{:.2f}–{:.2f}", (versions,), lambda v, c=cls, t=t: _published_share_range(v, c, f">={t}")
                )
                newest = Value(published, ("numbers", f"sst-{model}", "adversary", 0, "shares", cls, f">={t}"))
                s[f"jwp.pub.{model}.share{t}.{cls}.newest"] = Quote("{:.2f}–{:.2f}", (newest,), tuple)
    for draw in ("not-first", "non-top"):
        for name, statistic in (
            ("top_flips", "single removal flips (top)"),
            ("random_flips", "single removal flips (random)"),
            ("top_jsd", "single removal JSD (top)"),
            ("random_jsd", "single removal JSD (random)"),
            ("accuracy", "test accuracy"),
        ):
            ours(f"jwp.ss.{draw}.{name}", f"ss-{draw}/sst-lstm-tanh", statistic)
    for name, statistic in (("flips", "single removal flips (random)"), ("jsd", "single removal JSD (random)")):
        s[f"jwp.ss.random_{name}.seed_t"] = seed_t_interval(
            file, "ss-not-first/sst-lstm-tanh", "ss-non-top/sst-lstm-tanh", statistic, minus="−"
        )
    return s


def _wp_ts_seeds() -> dict[str, Quote]:
    """W&P's adversary and diagnostic and T&S's regularisers over three seeds (docs/results.md):
    ``wpts3.ca.LAMBDA.{jsd,tvd}`` (``.range``: "min–max" over seeds), ``wpts3.diag.ATTENTION``,
    ``wpts3.REGULARISER.{perm,acc}.ci``."""
    file = "reports/wp-ts-seeds/aggregate.json"
    adversary = ("groups", "adversary/sst-lstm-tanh")
    s: dict[str, Quote] = {}

    def spread(key: str, *at: Step) -> None:
        s[key] = Quote("{:.3f}", (Value(file, (*at, "mean")),))
        s[f"{key}.range"] = Quote("{:.3f}–{:.3f}", (Value(file, (*at, "min")), Value(file, (*at, "max"))))

    for lam in (0.001, 0.01, 0.1, 1.0):
        row = (*adversary, "consistent_adversary", "per_lambda", {"lambda": lam})
        spread(f"wpts3.ca.{lam}.jsd", *row, "jsd_mean")
        spread(f"wpts3.ca.{lam}.tvd", *row, "tvd_mean")
    for attention in ("uniform", "base", "trained", "adversary"):
        spread(f"wpts3.diag.{attention}", *adversary, "diagnostic", attention, "macro_f1")
    for regulariser in ("none", "concat", "residual", "tying", "mlm"):
        for name, statistic in (
            ("perm", "permutation median TVD"),
            ("acc", "test accuracy"),
            ("adv", "adversarial max JSD (mean)"),
        ):
            group = f"tutek/sst-lstm-tanh-{regulariser}"
            s[f"wpts3.{regulariser}.{name}.ci"] = interval(file, "groups", group, "statistics", statistic)
            if regulariser != "none":  # against none, paired by seed
                s[f"wpts3.{regulariser}.{name}.seed_t"] = seed_t_interval(
                    file, group, "tutek/sst-lstm-tanh-none", statistic, minus="−"
                )
    return s


def _wp_diagnostic() -> dict[str, Quote]:
    """W&P's diagnostic MLPs over five seeds (reports/wp-diagnostic): ``wpd.VARIANT`` macro F1 (mean
    over seeds; ``.range`` "min–max") and ``wpd.VARIANT-base`` the mean per-seed difference from the
    base model's attention with its t interval, "mean [low, high]"."""
    file = "reports/wp-diagnostic/aggregate.json"
    diagnostic = ("groups", "diagnostic/sst-lstm-tanh", "diagnostic")
    s: dict[str, Quote] = {}
    for variant in ("uniform", "base", "trained", "adversary"):
        at = (*diagnostic, variant, "macro_f1")
        s[f"wpd.{variant}"] = one(".3f", file, *at, "mean")
        s[f"wpd.{variant}.range"] = Quote("{:.3f}–{:.3f}", (Value(file, (*at, "min")), Value(file, (*at, "max"))))
        if variant != "base":
            paired = (*diagnostic, "paired", f"{variant} − base", "macro_f1")
            s[f"wpd.{variant}-base"] = interval(file, *paired, estimate="mean", bounds="t95", minus="−")
    return s


def _sweep() -> dict[str, Quote]:
    """The target sweep's aggregate (docs/results.md, "The target sweep")."""
    s: dict[str, Quote] = {}

    def stat(group: str, name: str, field: str = "mean") -> Value:
        return Value(SWEEP, ("groups", group, "statistics", name, field))

    for group in ("sst-lstm-tanh", "sst-average-tanh", "mr-lstm-tanh", "mr-average-tanh"):
        for field in ("mean", "std"):
            s[f"sweep.wp.{group}.tau_attention_gradient.{field}"] = Quote(
                "{:.2f}", (stat(f"wp/{group}", "τ attention vs gradient", field),)
            )
    lstm = "wp/sst-lstm-tanh"
    s["sweep.wp.sst-lstm-tanh.adversarial_jsd"] = Quote("{:.2f}", (stat(lstm, "adversarial max JSD (mean)"),))
    for order in ("attention", "random"):
        s[f"sweep.wp.sst-lstm-tanh.flip_fraction.{order}.percent"] = Quote(
            "{:.0f}", (stat(lstm, f"flip fraction ({order})"),), lambda x: 100 * x
        )
    for group in ("sst-lstm-tanh", "sst-lstm-uniform"):
        s[f"sweep.wp.{group}.accuracy"] = Quote("{:.3f}", (stat(f"wp/{group}", "test accuracy"),))
    variance = ("groups", lstm, "seed_variance")
    s["sweep.wp.sst-lstm-tanh.seed_median_jsd"] = one(".2f", SWEEP, *variance, "median_jsd", "mean")
    s["sweep.wp.sst-lstm-tanh.seed_mean_tvd"] = one(".2f", SWEEP, *variance, "mean_tvd", "mean")
    adversary = ("groups", "adversary/sst-lstm-tanh")
    at = (*adversary, "consistent_adversary", "per_lambda", {"lambda": 0.01})
    s["sweep.adversary.lambda_0.01.jsd"] = one(".2f", SWEEP, *at, "jsd_mean", "mean")
    s["sweep.adversary.lambda_0.01.tvd"] = one(".2f", SWEEP, *at, "tvd_mean", "mean")
    for attention in ("base", "uniform"):
        s[f"sweep.diagnostic.{attention}.macro_f1"] = one(
            ".3f", SWEEP, *adversary, "diagnostic", attention, "macro_f1", "mean"
        )
    for regulariser, fmt in (("none", "{:.3f}"), ("tying", "{:.2f}"), ("mlm", "{:.2f}")):
        s[f"sweep.tutek.{regulariser}.permutation_tvd"] = Quote(
            fmt, (stat(f"tutek/sst-lstm-tanh-{regulariser}", "permutation median TVD"),)
        )
    for regulariser in ("none", "tying"):
        s[f"sweep.tutek.{regulariser}.accuracy"] = Quote(
            "{:.3f}", (stat(f"tutek/sst-lstm-tanh-{regulariser}", "test accuracy"),)
        )
    s["sweep.tutek.tying.mcnemar_p"] = one(
        ".2f", SWEEP, "paired_tests", {"group": "tutek/sst-lstm-tanh-tying", "seed": 0}, "pvalue"
    )
    return s


def _gpt1() -> dict[str, Quote]:
    """GPT-1's ablations (docs/results.md): reports/gpt1/report.md's models table (its aggregate.json
    is not committed)."""
    s: dict[str, Quote] = {}

    def cell(group: str, column: str, then: Callable[[str], float] = cell_number) -> Value:
        return Value(GPT1, ("tables", {"group": group, "statistic": "test accuracy"}, column), then)

    for group in GPT1_GROUPS:
        name = group.split("/")[0] + "." + group.split("/")[1].split("-")[0]  # e.g. transfer-0.sst
        mean = cell(group, "mean over seeds")
        s[f"gpt1.{name}.accuracy"] = Quote("{:.3f}", (mean,))
        s[f"gpt1.{name}.accuracy.ci"] = Quote(
            "{:.3f} [{:.3f}, {:.3f}]",
            (mean, cell(group, "95% CI (instances)", interval_low), cell(group, "95% CI (instances)", interval_high)),
        )
        s[f"gpt1.{name}.seeds"] = Quote("{:.0f}", (cell(group, "seeds"),))
        s[f"gpt1.{name}.accuracy.range"] = Quote("{:.3f}–{:.3f}", (cell(group, "min"), cell(group, "max")))
    s["gpt1.scratch.sst.accuracy.min"] = Quote("{:.3f}", (cell("scratch/sst-gpt-tanh", "min"),))
    # the blocks' gain in points: all 4 transferred against the embeddings only, as the table rounds them
    s["gpt1.transfer.gain_points"] = Quote(
        "{:.1f}",
        (cell("pretrained/sst-gpt-tanh", "mean over seeds"), cell("transfer-0/sst-gpt-tanh", "mean over seeds")),
        lambda a, b: 100 * (a - b),
    )
    return s


def _gpt1_extract() -> dict[str, Quote]:
    """GPT-1's ablations with its <extract> read-out over three seeds (docs/results.md):
    ``gpt1x.GRID.accuracy[.ci|.min|.max]`` and the paired differences ``gpt1x.A-B.diff[.ci]``."""
    file = "reports/gpt1-extract/aggregate.json"
    s: dict[str, Quote] = {}
    for grid in ("pretrained", "scratch", "no-lm", "transfer-0", "transfer-2"):
        at = ("groups", f"{grid}/sst-gpt-extract", "statistics", "test accuracy")
        s[f"gpt1x.{grid}.accuracy.ci"] = interval(file, *at)
        s[f"gpt1x.{grid}.accuracy"] = one(".3f", file, *at, "estimate")
        s[f"gpt1x.{grid}.accuracy.min"] = one(".3f", file, *at, "min")
        s[f"gpt1x.{grid}.accuracy.max"] = one(".3f", file, *at, "max")
    s["gpt1x.pretraining.ppl"] = one(".1f", "reports/gpt1-extract/pretraining.json", "history", -1, "val_ppl")
    for a, b in (
        ("pretrained", "scratch"),
        ("pretrained", "no-lm"),
        ("pretrained", "transfer-0"),
        ("transfer-2", "transfer-0"),
    ):
        at = ("comparisons", {"a": f"{a}/sst-gpt-extract", "b": f"{b}/sst-gpt-extract"}, "difference")
        s[f"gpt1x.{a}-{b}.diff.ci"] = interval(file, *at, minus="−")
        s[f"gpt1x.{a}-{b}.diff"] = one(".3f", file, *at, "estimate", minus="−")
    return s


#: the methods tables' pairs whose comprehensiveness differences the docs quote, per prefix: (a, b,
#: whether the two are adjacent in the table, so that the report has their paired bootstrap difference)
METHOD_PAIRS = {
    "minilm3": (("decompx", "chefer", True), ("chefer", "alti", True), ("globenc", "input_x_gradient", False)),
    "gpt3": (
        ("decompx", "chefer", True), ("chefer", "alti", True), ("loo", "rollout", True), ("rollout", "ig", False),
        ("attention", "ig", False), ("globenc", "input_x_gradient", False),
    ),
}  # fmt: skip
#: GPT-1's <extract> ablations compared (a, b), as reports/gpt1-extract/sweep.toml's ``compare``
GPT1X_PAIRS = (
    ("pretrained", "scratch"), ("pretrained", "no-lm"), ("pretrained", "transfer-0"), ("transfer-2", "transfer-0"),
)  # fmt: skip


def _seed_level() -> dict[str, Quote]:
    """Seed-level t intervals (:func:`seed_t_interval`) beside the bootstrap ones (docs/results.md):
    ``gpt1x.A-B.diff.seed_t`` (test accuracy), ``PREFIX.A-B.comprehensiveness.seed_t`` and the methods
    table's paired bootstrap difference of adjacent methods, ``PREFIX.A-B.comprehensiveness.paired``."""
    s: dict[str, Quote] = {}
    file = "reports/gpt1-extract/aggregate.json"
    for a, b in GPT1X_PAIRS:
        s[f"gpt1x.{a}-{b}.diff.seed_t"] = seed_t_interval(
            file, f"{a}/sst-gpt-extract", f"{b}/sst-gpt-extract", "test accuracy"
        )
    for prefix, pairs in METHOD_PAIRS.items():
        file, group = METHOD_SWEEPS[prefix]
        for a, b, adjacent in pairs:
            column = "methods/{}/comprehensiveness AOPC"
            s[f"{prefix}.{a}-{b}.comprehensiveness.seed_t"] = seed_t_interval(
                file, group, group, column.format(a), column.format(b)
            )
            if adjacent:
                paired = ("groups", group, "methods", "paired", "pairs", {"a": a, "b": b})
                key = f"{prefix}.{a}-{b}.comprehensiveness.paired"
                s[key] = interval(file, *paired, estimate="mean", minus="−")
    return s


def _single_runs() -> dict[str, Quote]:
    """The single runs' committed report.md (docs/results.md, "What a run gives"; the README's main
    job): the default BiLSTM on SST and on ``mr``, and GPT-1's own attention (their results.json
    are not committed)."""
    s: dict[str, Quote] = {}
    for name, file in (("sst_lstm", SST_LSTM), ("mr_lstm", MR_LSTM), ("sst_gpt_extract", SST_GPT_EXTRACT)):

        def cell(row: Mapping[str, Any], column: str, fmt: str = ".3f", file: str = file, **kw: Any) -> Quote:
            return one(fmt, file, "tables", row, column, then=cell_number, **kw)

        def kendall(pair: str) -> dict[str, Any]:
            return {"_label": pair, "instances": "all", "mean τ": ...}

        s[f"{name}.accuracy"] = cell({"test accuracy": ...}, "test accuracy")
        s[f"{name}.roc_auc"] = cell({"ROC-AUC": ...}, "ROC-AUC")
        for order in ("attention", "random"):
            # the table of every row's statistics (newer reports add a paired table in the section)
            flip = {"_section": "Decision flip under attention removal", "ordering": order, "never flips": ...}
            s[f"{name}.flip.{order}.never"] = cell(flip, "never flips", ".2f")
            s[f"{name}.flip.{order}.fraction"] = cell(flip, "mean fraction", ".2f")
            s[f"{name}.flip.{order}.percent"] = Quote(
                "{:.0f}", (Value(file, ("tables", flip, "mean fraction"), cell_number),), lambda x: 100 * x
            )
        for pair in ("attention vs gradient", "attention vs loo", "gradient vs loo"):
            key = pair.replace(" vs ", "_")
            s[f"{name}.tau.{key}"] = cell(kendall(pair), "mean τ", ".2f")
            s[f"{name}.tau.{key}.std"] = cell(kendall(pair), "std", ".2f")
            s[f"{name}.tau.{key}.significant"] = cell(kendall(pair), "p ≤ 0.05", ".2f")
        s[f"{name}.permutation.median"] = cell({"_section": "Permuted attention", "instances": "all"}, "median")
        s[f"{name}.adversarial.mean"] = cell({"_section": "Adversarial attention", "instances": "all"}, "mean", ".2f")
        for weight in ("top", "random"):
            s[f"{name}.single_removal.{weight}.flips"] = cell({"weight removed": weight}, "decision flips")
        s[f"{name}.single_removal.top.flips.percent"] = Quote(
            "{:.0f}",
            (Value(file, ("tables", {"weight removed": "top"}, "decision flips"), cell_number),),
            lambda x: 100 * x,
        )
    for name, file in (("sst_lstm", SST_LSTM), ("mr_lstm", MR_LSTM)):
        s[f"{name}.best_epoch"] = one(".0f", file, "tables", {"best epoch": ...}, "best epoch", then=cell_number)
    # the main job's size and time (the report's header lines)
    s["mr_lstm.test_size"] = one(",.0f", MR_LSTM, "tables", {"test": ...}, "test", then=cell_number)
    total = re.compile(r"wall time ([0-9.]+) s")
    s["mr_lstm.wall_time_min"] = one(".1f", MR_LSTM, "text", total, then=lambda x: float(x) / 60)
    for phase in ("training", "battery"):
        s[f"mr_lstm.{phase}_s"] = one(".0f", MR_LSTM, "text", re.compile(rf"{phase} ([0-9.]+) s"), then=float)
    adversary_share = re.compile(r"share above 0\.5: ([0-9]+\.[0-9]+)")
    s["sst_lstm.adversarial.above_half"] = one(".3f", SST_LSTM, "text", adversary_share, then=float)
    s["sst_lstm.adversarial.above_half.percent"] = one(
        ".0f", SST_LSTM, "text", adversary_share, then=lambda x: 100 * float(x)
    )
    for order in ("attention", "gradient", "loo", "random"):
        row = {"ordering": order, "comprehensiveness AOPC": ...}
        s[f"sst_lstm.eraser.{order}.comprehensiveness"] = one(
            ".3f", SST_LSTM, "tables", row, "comprehensiveness AOPC", then=cell_number, minus="−"
        )
        s[f"sst_lstm.eraser.{order}.sufficiency"] = one(
            ".3f", SST_LSTM, "tables", row, "sufficiency AOPC", then=cell_number, minus="−"
        )
    for head in (1, 2):
        s[f"sst_gpt_extract.head{head}.tau_gradient"] = one(
            ".2f", SST_GPT_EXTRACT, "tables", {"head": f"head {head}"}, "tau vs gradient", then=cell_number, minus="−"
        )
    return s


def _ci_run() -> dict[str, Quote]:
    """The README's test command, timed on a fresh clone (CI_RUN)."""
    stage = ("stages_s",)
    return {
        "ci.minutes": one(".0f", CI_RUN, "total_s", then=lambda x: x / 60),
        "ci.build_s": one(".0f", CI_RUN, *stage, "py311 kernel build"),
        "ci.suite_min": one(".0f", CI_RUN, *stage, "py311 suite (a clone alone)", then=lambda x: x / 60),
        "ci.bench_min": one(
            ".0f", CI_RUN, *stage, "py311 benchmarks, once each (--benchmark-disable)", then=lambda x: x / 60
        ),
    }


def _cpu_table() -> dict[str, Quote]:
    """docs/speed.md's first table: each op against the papers' approach, one CPU thread (CPU_BENCH)."""
    s: dict[str, Quote] = {}

    def bench(key: str, name: str, field: str, fmt: str, scale: float = 1.0) -> None:
        """``name``: the benchmark's name, or its fullname where two files share the name."""
        pick = {"fullname" if "::" in name else "name": name}
        at = ("benchmarks", pick, *(("stats", "median") if field == "median" else ("extra_info", field)))
        s[f"cpu.{key}"] = one(fmt, CPU_BENCH, *at, then=lambda x: scale * x)

    def ratio_of(key: str, a: tuple[str, str], b: tuple[str, str], fmt: str) -> None:
        def value(name: str, field: str) -> Value:
            return Value(CPU_BENCH, ("benchmarks", {"name": name}, "stats", field))

        s[f"cpu.{key}"] = ratio(fmt, value(*a), value(*b))

    for case in ("sst", "imdb"):
        name = f"benchmarks/test_bench_kendall.py::test_kernel[{case}-cpu]"
        bench(f"kendall.{case}.ours_ms", name, "median", ".1f", 1e3)
        bench(f"kendall.{case}.loop_ms", name, "scipy_loop_s", ".0f", 1e3)
        bench(f"kendall.{case}.speedup", name, "ratio", ".0f")
    # (case, ours' unit and format, the sequential search's unit and format, the speed-up's format)
    for case, ours, loop, speedup in (
        ("sst-linear", ("ms", ".1f"), ("ms", ".0f"), ".0f"),
        ("imdb-linear", ("ms", ".1f"), ("s", ".2f"), ".0f"),
        ("sst-mlp", ("ms", ".0f"), ("ms", ".0f"), ".1f"),
        ("imdb-mlp", ("s", ".2f"), ("s", ".2f"), ".1f"),
    ):
        name = f"test_flip_fraction_vs_sequential[{case}-cpu]"
        for part, field, (unit, fmt) in (("ours", "kernel_median_s", ours), ("loop", "sequential_s", loop)):
            bench(f"flip.{case}.{part}_{unit}", name, field, fmt, 1e3 if unit == "ms" else 1.0)
        bench(f"flip.{case}.speedup", name, "speedup", speedup)
    bench(
        "flip.imdb-linear.read_once_ms",
        "test_flip_fraction_vs_sequential[imdb-linear-cpu]",
        "read_inputs_once_s",
        ".1f",
        1e3,
    )
    bench(
        "flip.imdb-linear.times_read_once",
        "test_flip_fraction_vs_sequential[imdb-linear-cpu]",
        "times_reading_inputs_once",
        ".2f",
    )
    bench("flip.large.ms", "test_flip_fraction_large_bounded_memory[linear-cpu]", "median", ".0f", 1e3)
    bench("flip.large.extra_mib", "test_flip_fraction_large_bounded_memory[linear-cpu]", "peak_extra_rss_mib", ".0f")
    for case, ours, loop, speedup in (
        ("linear-sst", ".1f", ".2f", ".0f"),
        ("linear-imdb", ".1f", ".1f", ".0f"),
        ("mlp-sst", ".0f", ".2f", ".0f"),
    ):
        name = f"test_permutation_test_vs_jw_loop[{case}]"
        bench(f"permutation.{case}.ours_ms", name, "kernel_median_s", ours, 1e3)
        bench(f"permutation.{case}.loop_s", name, "jw_loop_s", loop)
        bench(f"permutation.{case}.speedup", name, "speedup", speedup)
    for case in ("linear", "mlp"):
        name = f"test_adversarial_vs_per_instance[{case}]"
        bench(f"adversarial.{case}.ours_ms", name, "batched_median_s", ".0f", 1e3)
        bench(f"adversarial.{case}.loop_s", name, "per_instance_s", ".2f")
        bench(f"adversarial.{case}.speedup", name, "speedup", ".0f")
    for metric, ours, formula, speedup in (("tvd", ".1f", ".1f", ".1f"), ("jsd", ".1f", ".0f", ".1f")):
        kernel = f"test_distance[kernel-{metric}-attention-100k-cpu]"
        torch = f"test_distance[torch-formula-{metric}-attention-100k-cpu]"
        bench(f"{metric}.ours_ms", kernel, "median", ours, 1e3)
        bench(f"{metric}.formula_ms", torch, "median", formula, 1e3)
        ratio_of(f"{metric}.speedup", (torch, "median"), (kernel, "median"), speedup)
    return s


def _seconds(x: float) -> str:
    """Seconds as the speed tables quote them: one decimal below 100, none above."""
    return f"{x:.1f}" if x < 99.95 else f"{x:.0f}"


def _leave_one_out_and_eraser() -> dict[str, Quote]:
    """docs/speed.md's leave-one-out and ERASER rows (LOO_JW, ERASER) and the Captum table (LOO_CAPTUM)."""
    s: dict[str, Quote] = {}

    def extra(file: str, name: str, field: str, fmt: str | Callable[[float], str]) -> Quote:
        value = Value(file, ("benchmarks", {"name": name}, "extra_info", field))
        return Quote(fmt, (value,)) if isinstance(fmt, str) else Quote("{}", (value,), typeset=fmt)

    for case, loop in (("sst", "{:.1f}"), ("imdb", "{:.0f}")):
        name = f"test_leave_one_out_vs_jw_loop[{case}]"
        s[f"loo.{case}.ours_s"] = extra(LOO_JW, name, "leave_one_out_s", "{:.1f}")
        s[f"loo.{case}.loop_s"] = extra(LOO_JW, name, "jw_loop_s", loop)
        s[f"loo.{case}.speedup"] = extra(LOO_JW, name, "speedup", "{:.1f}")
    s["loo.sst.loop_batch32_s"] = extra(LOO_JW, "test_leave_one_out_vs_jw_loop[sst]", "jw_loop_bsize32_s", "{:.1f}")
    s["loo.sst.speedup_batch32"] = extra(LOO_JW, "test_leave_one_out_vs_jw_loop[sst]", "speedup_vs_bsize32", "{:.1f}")
    for e in (50, 300):
        ours, ferret = f"test_eraser_sst[ours-E{e}]", f"test_eraser_sst[ferret-E{e}]"
        s[f"eraser.e{e}.ours_s"] = extra(ERASER, ours, "seconds", "{:.1f}")
        s[f"eraser.e{e}.ferret_s"] = extra(ERASER, ferret, "seconds", "{:.1f}")
        s[f"eraser.e{e}.speedup"] = ratio(
            ".1f",
            Value(ERASER, ("benchmarks", {"name": ferret}, "extra_info", "seconds")),
            Value(ERASER, ("benchmarks", {"name": ours}, "extra_info", "seconds")),
        )
    for case in ("sst-E50", "sst-E300", "imdb-E50", "imdb-E300"):
        name, key = f"test_leave_one_out_vs_captum[{case}]", f"captum.{case.lower()}"
        s[f"{key}.mask_s"] = extra(LOO_CAPTUM, name, "leave_one_out_mask_s", _seconds)
        s[f"{key}.delete_s"] = extra(LOO_CAPTUM, name, "leave_one_out_delete_s", _seconds)
        s[f"{key}.grouped_s"] = extra(LOO_CAPTUM, name, "captum_bucketed_s", _seconds)
        info = Value(LOO_CAPTUM, ("benchmarks", {"name": name}, "extra_info"))
        s[f"{key}.stock_s"] = Quote(
            "{}", (info,), lambda e: e["captum_stock_s"][str(e["captum_stock_best_per_eval"])], typeset=_seconds
        )
        s[f"{key}.stock_per_eval"] = extra(LOO_CAPTUM, name, "captum_stock_best_per_eval", "{:d}")
        s[f"{key}.mask_vs_grouped"] = extra(LOO_CAPTUM, name, "mask_speedup_vs_bucketed", "{:.1f}")
        s[f"{key}.mask_vs_stock"] = extra(LOO_CAPTUM, name, "mask_speedup_vs_stock", "{:.1f}")
    return s


TRANSFORMER_FLOOR = "benchmarks/results/transformer-battery-cpu-1thread.json"


def _transformer_floor() -> dict[str, Quote]:
    """docs/speed.md's transformer battery against its multiply-add floor, one CPU thread:
    ``tfloor.PROCEDURE.{s,floor_s,times}`` and each benchmark's own comparisons."""
    s: dict[str, Quote] = {}

    def extra(name: str, field: str, fmt: str) -> Quote:
        return Quote(fmt, (Value(TRANSFORMER_FLOOR, ("benchmarks", {"name": name}, "extra_info", field)),))

    for key, name, field in (
        ("loo", "test_leave_one_out_vs_captum_on_a_transformer", "leave_one_out_mask_s"),
        ("eraser", "test_eraser_on_a_transformer", "eraser_s"),
        ("adversary", "test_adversarial_on_a_transformer", "factored_values_s"),
        ("ig", "test_integrated_gradients_vs_captum", "integrated_gradients_s"),
    ):
        s[f"tfloor.{key}.s"] = extra(name, field, "{:.2f}")
        s[f"tfloor.{key}.floor_s"] = extra(name, "multiply_add_floor_s", "{:.2f}")
        s[f"tfloor.{key}.times"] = extra(name, "times_floor", "{:.2f}")
        s[f"tfloor.{key}.gmacs"] = extra(name, "machine_gmacs", "{:.0f}")
    s["tfloor.adversary.dense_s"] = extra("test_adversarial_on_a_transformer", "dense_values_s", "{:.2f}")
    s["tfloor.adversary.factored_speedup"] = extra("test_adversarial_on_a_transformer", "factored_speedup", "{:.1f}")
    s["tfloor.eraser.ferret_s"] = extra("test_eraser_on_a_transformer", "ferret_approach_s", "{:.2f}")
    s["tfloor.eraser.vs_ferret"] = extra("test_eraser_on_a_transformer", "speedup_vs_ferret_approach", "{:.1f}")
    s["tfloor.loo.vs_bucketed"] = extra(
        "test_leave_one_out_vs_captum_on_a_transformer", "mask_speedup_vs_bucketed", "{:.1f}"
    )
    s["tfloor.loo.vs_stock"] = extra("test_leave_one_out_vs_captum_on_a_transformer", "mask_speedup_vs_stock", "{:.1f}")
    s["tfloor.ig.vs_bucketed"] = extra("test_integrated_gradients_vs_captum", "speedup_vs_bucketed", "{:.2f}")
    s["tfloor.ig.vs_stock"] = extra("test_integrated_gradients_vs_captum", "speedup_vs_stock", "{:.1f}")
    return s


FLOW = "benchmarks/results/attention-flow-cpu-1thread.json"


def _flow_step() -> dict[str, Quote]:
    """Attention flow's max flows (the ``attention_flow`` op) against scipy's and networkx's, one
    CPU thread (docs/speed.md, README's speed tables): ``flow.ROWS.{ours_ms,scipy_ms,vs_scipy,vs_networkx}``."""
    s: dict[str, Quote] = {}
    for rows in (3, 8, 64):
        ours = ("benchmarks", {"name": f"test_flow_step[{rows}-ours]"})
        s[f"flow.{rows}.ours_ms"] = Quote("{:.1f}", (Value(FLOW, (*ours, "stats", "median"), lambda t: t * 1e3),))
        s[f"flow.{rows}.scipy_ms"] = Quote(
            "{:.0f}", (Value(FLOW, (*ours, "extra_info", "scipy_s"), lambda t: t * 1e3),)
        )
        s[f"flow.{rows}.vs_scipy"] = Quote("{:.1f}", (Value(FLOW, (*ours, "extra_info", "ratio_vs_scipy")),))
        if rows <= 8:
            s[f"flow.{rows}.vs_networkx"] = Quote("{:,.0f}", (Value(FLOW, (*ours, "extra_info", "ratio_vs_loop")),))
    return s


def _attributions() -> dict[str, Quote]:
    """The attention-derived attributions against their plain loops, one CPU thread (docs/speed.md)."""
    s: dict[str, Quote] = {}

    def loop_ratio(method: str) -> Value:
        return Value(
            ATTRIBUTIONS, ("benchmarks", {"name": f"test_ours[{method}-loop-cpu]"}, "extra_info", "ratio_vs_loop")
        )

    def ours(method: str, case: str) -> tuple[Step, ...]:
        return ("benchmarks", {"name": f"test_ours[{method}-{case}-cpu]"})

    for method in ATTRIBUTION_METHODS:
        sst_fmt = ".1f" if method in ("value_zeroing", "decompx") else ".2f"
        s[f"attributions.{method}.ours_ms"] = one(
            ".1f", ATTRIBUTIONS, *ours(method, "loop"), "extra_info", "ours_s", then=lambda x: 1e3 * x
        )
        s[f"attributions.{method}.loop_s"] = one(".3g", ATTRIBUTIONS, *ours(method, "loop"), "extra_info", "loop_s")
        s[f"attributions.{method}.loop_speedup"] = Quote("{:.0f}", (loop_ratio(method),))
        s[f"attributions.{method}.sst_s"] = one(sst_fmt, ATTRIBUTIONS, *ours(method, "sst"), "stats", "median")
    for method in ATTRIBUTION_METHODS:  # batched (rows grouped by length) against a row a call
        info = (*ours(method, "sst"), "extra_info")
        s[f"attributions.{method}.batched_s"] = one(".2f", ATTRIBUTIONS, *info, "ours_s")
        s[f"attributions.{method}.one_by_one_s"] = one(".2f", ATTRIBUTIONS, *info, "one_by_one_s")
        s[f"attributions.{method}.vs_one_by_one"] = one(".2f", ATTRIBUTIONS, *info, "ratio_vs_one_by_one")
    gains = tuple(
        Value(ATTRIBUTIONS, (*ours(m, "sst"), "extra_info", "ratio_vs_one_by_one")) for m in ATTRIBUTION_METHODS
    )
    s["attributions.vs_one_by_one.min"] = Quote("{:.2f}", gains, lambda *r: min(r))
    s["attributions.vs_one_by_one.max"] = Quote("{:.2f}", gains, lambda *r: max(r))
    ratios = tuple(loop_ratio(m) for m in ATTRIBUTION_METHODS)
    s["attributions.loop_speedup.min"] = Quote("{:.0f}", ratios, lambda *r: min(r))
    s["attributions.loop_speedup.max"] = Quote("{:.0f}", ratios, lambda *r: max(r))
    return s


AUTHORS = "benchmarks/results/authors-methods-cpu1-2026-11-29.json"
#: the authors' variants that authors_methods.py times, per method (its "authors_s" keys)
AUTHOR_VARIANTS = {
    "globenc": ("one_per_call", "batched"),
    "alti": ("one_per_call", "contributions_once"),
    "value_zeroing": ("one_per_call",),
    "decompx": ("one_per_call", "batched"),
}


def _authors_methods() -> dict[str, Quote]:
    """Our GlobEnc, ALTI, Value Zeroing and DecompX against the authors' code, same weights and ids, one
    CPU thread (benchmarks/peers/authors_compare.py; docs/speed.md): ``authors.METHOD.{ours_s,ours_one_s}``
    (one call on all rows; a row a call), ``authors.METHOD.VARIANT_s`` (the authors' code as run by
    VARIANT), ``authors.METHOD.best_s`` (their fastest variant), ``authors.METHOD.ratio`` (that over ours,
    one call) and ``.ratio_one`` (over ours a row a call), ``authors.METHOD.rel`` (the largest difference of
    row-normalised values, relative to the row's largest, against their one-sentence variant)."""
    s: dict[str, Quote] = {"authors.rows": one("d", AUTHORS, "rows"), "authors.tokens": one(",d", AUTHORS, "tokens")}
    for method, variants in AUTHOR_VARIANTS.items():
        at = ("methods", method)
        ours = Value(AUTHORS, (*at, "ours_batched_s"))
        alone = Value(AUTHORS, (*at, "ours_one_per_call_s"))
        theirs = tuple(Value(AUTHORS, (*at, "authors_s", v)) for v in variants)
        s[f"authors.{method}.ours_s"] = one(".2f", AUTHORS, *at, "ours_batched_s")
        s[f"authors.{method}.ours_one_s"] = one(".2f", AUTHORS, *at, "ours_one_per_call_s")
        for variant in variants:
            s[f"authors.{method}.{variant}_s"] = one(".2f", AUTHORS, *at, "authors_s", variant)
        s[f"authors.{method}.best_s"] = Quote("{:.2f}", theirs, lambda *t: min(t))
        s[f"authors.{method}.ratio"] = Quote("{:.1f}", (ours, *theirs), lambda o, *t: min(t) / o)
        s[f"authors.{method}.ratio_one"] = Quote("{:.1f}", (alone, *theirs), lambda o, *t: min(t) / o)
        s[f"authors.{method}.same_top"] = one(".3f", AUTHORS, *at, "differences", "one_per_call", "same_top")
        s[f"authors.{method}.rel"] = one(
            ".1e", AUTHORS, *at, "differences", "one_per_call", "row_normalised", "max_rel"
        )
    return s


LLM_LOO = "benchmarks/results/llm-loo-smollm2-cpu1-2026-11-29.json"


def _llm_loo() -> dict[str, Quote]:
    """SmolLM2's leave-one-out against Captum on one CPU thread (benchmarks/test_bench_llm_loo.py,
    docs/speed.md): ``llmloo.{sentences,deletions,ours_s,stock_s,bucketed_s,vs_stock,vs_bucketed,positions,
    macs,times_floor,diff}``, ``llmloo.load_{ours,stock,bucketed}`` (the load average at each side's end)."""
    ours = ("benchmarks", {"name": "test_leave_one_out_prefix_reuse"}, "extra_info")
    stock = ("benchmarks", {"name": "test_captum_llm_attribution_stock"}, "extra_info")
    bucketed = ("benchmarks", {"name": "test_captum_feature_ablation_bucketed"}, "extra_info")
    return {
        "llmloo.sentences": one("d", LLM_LOO, *ours, "sentences"),
        "llmloo.deletions": one(",d", LLM_LOO, *ours, "deletions"),
        "llmloo.ours_s": one(".1f", LLM_LOO, *ours, "leave_one_out_s"),
        "llmloo.stock_s": one(".1f", LLM_LOO, *stock, "captum_stock_s"),
        "llmloo.bucketed_s": one(".1f", LLM_LOO, *bucketed, "captum_bucketed_s"),
        "llmloo.vs_stock": one(".2f", LLM_LOO, *bucketed, "speedup_vs_stock"),
        "llmloo.vs_bucketed": one(".2f", LLM_LOO, *bucketed, "speedup_vs_bucketed"),
        "llmloo.positions": one(".3f", LLM_LOO, *ours, "positions_ratio"),
        "llmloo.macs": one(".3f", LLM_LOO, *ours, "multiply_adds_ratio"),
        "llmloo.times_floor": one(".2f", LLM_LOO, *ours, "times_floor"),
        "llmloo.load_ours": one(".2f", LLM_LOO, *ours, "load_average"),
        "llmloo.load_stock": one(".2f", LLM_LOO, *stock, "load_average"),
        "llmloo.load_bucketed": one(".2f", LLM_LOO, *bucketed, "load_average"),
        "llmloo.diff": Quote(
            "{:.1e}",
            (Value(LLM_LOO, (*stock, "max_abs_diff_vs_ours")), Value(LLM_LOO, (*bucketed, "max_abs_diff_vs_ours"))),
            lambda *d: max(d),
        ),
    }


LLM_METHODS_FILE = "benchmarks/results/llm-methods-cpu1-2026-11-29.json"


def _llm_methods() -> dict[str, Quote]:
    """The decoder methods batched by length against a row a call (benchmarks/test_bench_llm_methods.py,
    docs/speed.md): ``llmmethods.METHOD.{batched_s,one_by_one_s,vs_one_by_one}``, ``llmmethods.vs.{min,max}``."""
    s: dict[str, Quote] = {}
    gains = []
    for method in ("value_norm", "alti", "alti_logit", "value_zeroing", "chefer", "attnlrp"):
        info = ("benchmarks", {"name": f"test_batched[{method}]"}, "extra_info")
        s[f"llmmethods.{method}.batched_s"] = one(".2f", LLM_METHODS_FILE, *info, "ours_s")
        s[f"llmmethods.{method}.one_by_one_s"] = one(".2f", LLM_METHODS_FILE, *info, "one_by_one_s")
        s[f"llmmethods.{method}.vs_one_by_one"] = one(".2f", LLM_METHODS_FILE, *info, "ratio_vs_one_by_one")
        gains.append(Value(LLM_METHODS_FILE, (*info, "ratio_vs_one_by_one")))
    s["llmmethods.vs.min"] = Quote("{:.2f}", tuple(gains), lambda *r: min(r))
    s["llmmethods.vs.max"] = Quote("{:.2f}", tuple(gains), lambda *r: max(r))
    return s


LLM_BATTERY = "benchmarks/results/smollm2-battery-cpu1-2026-11-29.json"


def _llm_battery() -> dict[str, Quote]:
    """SmolLM2's whole battery on 2 SST sentences, one thread, before and after 2026-11-29's changes
    (docs/speed.md): ``llmbattery.{before,after}.{experiments,eraser,value_zeroing,ig}_s``,
    ``llmbattery.ratio.{experiments,eraser,value_zeroing,ig}``."""
    s: dict[str, Quote] = {}
    runs = {"before": "before", "after": "and_eraser_shared"}
    for key, run in runs.items():
        s[f"llmbattery.{key}.experiments_s"] = one(".1f", LLM_BATTERY, "runs", run, "experiments_s")
        for part in ("eraser", "value_zeroing", "ig"):
            s[f"llmbattery.{key}.{part}_s"] = one(".1f", LLM_BATTERY, "runs", run, "per_experiment_s", part)
    for part in ("experiments", "eraser", "value_zeroing", "ig"):
        s[f"llmbattery.ratio.{part}"] = one(".1f", LLM_BATTERY, "ratios", part)
    return s


def _sources(*parts: dict[str, Quote]) -> dict[str, Quote]:
    sources: dict[str, Quote] = {}
    for part in parts:
        if twice := sources.keys() & part.keys():
            raise ValueError(f"keys defined twice: {sorted(twice)}")
        sources.update(part)
    return sources


SOURCES: dict[str, Quote] = _sources(
    _gpu_check(),
    _gpu_check("h200", GPU_H200),
    _h200_extras(),
    _gpu_check_earlier(),
    _minilm_table(),
    _method_sweeps(),
    _protocols(),
    _jw_encoders(),
    _jw_qa(),
    _jw_protocol(),
    _bootstrap(),
    _smollm2(),
    _llm_battery(),
    _wp_diagnostic(),
    _wp_ts_seeds(),
    _sweep(),
    _gpt1(),
    _gpt1_extract(),
    _seed_level(),
    _single_runs(),
    _ci_run(),
    _cpu_table(),
    _leave_one_out_and_eraser(),
    _transformer_floor(),
    _flow_step(),
    _attributions(),
    _llm_loo(),
    _authors_methods(),
    _llm_methods(),
)


# --- the markers -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    """A marked number that differs from its source (``problem`` None), or a marker that cannot
    be resolved (``problem`` says why)."""

    document: str
    line: int
    key: str
    quoted: str
    source: str | None = None  # the source's file, or None when the key is not in the mapping
    expected: str | None = None
    problem: str | None = None

    def __str__(self) -> str:
        where = f"{self.document}:{self.line}: {self.key}"
        if self.problem is not None:
            return f"{where}: {self.problem}"
        return f"{where}: quoted {self.quoted!r}, {self.source} gives {self.expected!r}"


def fill(
    text: str, document: str, sources: Mapping[str, Quote], root: Path, cache: dict[str, Any] | None = None
) -> tuple[str, list[Finding]]:
    """``text`` with every marked number replaced by its source's, and the findings: each number
    that differed and each marker that could not be resolved (left as it was)."""
    cache = {} if cache is None else cache
    findings: list[Finding] = []
    out: list[str] = []
    fence: str | None = None
    for n, line in enumerate(text.splitlines(keepends=True), 1):
        opens = FENCE.match(line)
        if fence is not None or opens:  # code blocks are quoted as they are
            if fence is None:
                fence = opens[1]
            elif line.strip().startswith(fence):
                fence = None
            out.append(line)
            continue
        code = [m.span() for m in CODE_SPAN.finditer(line)]  # markers in `code` are examples, not markers

        def quoted_code(m: re.Match[str], code: list[tuple[int, int]] = code) -> bool:
            return any(a <= m.start() < b for a, b in code)

        markers = [m for m in MARKER.finditer(line) if not quoted_code(m)]
        if len([m for m in OPENING.finditer(line) if not quoted_code(m)]) != len(markers):
            findings.append(Finding(document, n, "?", "", problem="a marker not closed by <!-- /n --> on its line"))
        if LINE_START.match(line):
            # CommonMark: "<!--" opening a line starts an HTML block, which would show the line raw.
            findings.append(
                Finding(document, n, "?", "", problem="a marker opens the line (an HTML block in markdown)")
            )
        claims = [m for m in CLAIM.finditer(line) if not quoted_code(m)]
        if len([m for m in CLAIM_OPENING.finditer(line) if not quoted_code(m)]) != len(claims):
            unclosed = "a claim marker not closed by <!-- /sep --> on its line"
            findings.append(Finding(document, n, "?", "", problem=unclosed))
        for claim in claims:
            if (found := check_claim(claim, document, n, sources, root, cache)) is not None:
                findings.append(found)

        def replace(m: re.Match[str], n: int = n) -> str:
            key, spec, quoted = m["key"], m["spec"], m["text"]
            quote = sources.get(key)
            if quote is None:
                findings.append(Finding(document, n, key, quoted, problem=f"key {key!r} is not in the mapping"))
                return m[0]
            try:
                expected = quote.text(root, cache, spec)
            except SourceError as e:
                findings.append(Finding(document, n, key, quoted, quote.files, problem=str(e)))
                return m[0]
            if expected == quoted:
                return m[0]
            findings.append(Finding(document, n, key, quoted, quote.files, expected))
            return m[0].replace(f"-->{quoted}<!--", f"-->{expected}<!--", 1)

        out.append(MARKER.sub(lambda m: m[0] if quoted_code(m) else replace(m), line))
    return "".join(out), findings


def _interval_of(key: str, sources: Mapping[str, Quote], root: Path, cache: dict[str, Any]) -> tuple[float, float]:
    """The "[low, high]" a key quotes: its last two values (an interval quote's, or a range's)."""
    quote = sources.get(key)
    if quote is None:
        raise SourceError(f"key {key!r} is not in the mapping")
    values = quote.numbers(root, cache)
    if len(values) < 2 or not all(isinstance(v, int | float) and math.isfinite(v) for v in values[-2:]):
        raise SourceError(f"key {key!r} quotes no interval (its last two values are not a low and a high)")
    low, high = values[-2:]
    if low > high:
        raise SourceError(f"key {key!r}: its interval's low {low!r} is above its high {high!r}")
    return low, high


def check_claim(
    claim: re.Match[str], document: str, line: int, sources: Mapping[str, Quote], root: Path, cache: dict[str, Any]
) -> Finding | None:
    """A :class:`Finding` (with its ``problem``) when a claim marker (``sep:A:B``, ``sep-paired:K`` and
    their ``nosep`` forms; the module's docstring) is not borne out by its keys' intervals, or cannot be
    checked; None when it holds."""
    keys, negated, paired = claim["keys"].split(":"), bool(claim["neg"]), bool(claim["paired"])
    name = f"{claim['neg'] or ''}sep{claim['paired'] or ''}:{claim['keys']}"

    def found(problem: str) -> Finding:
        return Finding(document, line, name, claim["text"], problem=problem)

    if len(keys) != (1 if paired else 2):
        return found(f"a {'paired ' if paired else ''}claim names {1 if paired else 2} key(s), not {len(keys)}")
    try:
        intervals = [_interval_of(k, sources, root, cache) for k in keys]
    except SourceError as e:
        return found(str(e))

    def show(k: str, iv: tuple[float, float]) -> str:
        return f"{k} [{iv[0]:.3f}, {iv[1]:.3f}]"

    if paired:
        ((low, high),) = intervals
        apart = low > 0 or high < 0
        if apart == negated:
            said = "not separated from 0" if negated else "separated from 0"
            fact = "excludes" if apart else "includes"
            return found(f"marked {said}, but {show(keys[0], (low, high))} {fact} 0")
        return None
    (a_low, a_high), (b_low, b_high) = intervals
    apart = a_high < b_low or b_high < a_low
    if apart == negated:
        said = "overlapping" if negated else "separated"
        fact = "do not overlap" if apart else "overlap"
        return found(f"marked {said}, but {show(keys[0], intervals[0])} and {show(keys[1], intervals[1])} {fact}")
    return None


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file of its own in ``path``'s folder (two writers
    at once never share one), synced, then renamed over ``path``: a reader sees the old file or the
    whole new one. An existing file keeps its mode; a new one gets the umask's."""
    try:
        mode = path.stat().st_mode & 0o7777
    except FileNotFoundError:
        umask = os.umask(0)  # the only way to read it; set straight back
        os.umask(umask)
        mode = 0o666 & ~umask
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def run(
    root: Path,
    documents: Sequence[str] = DOCUMENTS,
    sources: Mapping[str, Quote] = SOURCES,
    write: bool = True,
) -> list[Finding]:
    """Check (``write`` False) or rewrite every marked number in ``documents``; the findings. A
    document is rewritten only when every marker in it resolved, and nothing is written when a
    document is missing."""
    cache: dict[str, Any] = {}
    filled: list[tuple[Path, str, list[Finding]]] = []
    for document in documents:
        path = root / document
        if not path.is_file():
            raise SourceError(f"document {document} not found under {root}")
        original = read_utf8(path, f"document {document}")
        text, findings = fill(original, document, sources, root, cache)
        filled.append((path, text if text != original else "", findings))
    if write:
        for path, text, findings in filled:
            if text and not any(f.problem for f in findings):
                write_atomic(path, text)
    return [f for _, _, findings in filled for f in findings]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "documents", nargs="*", default=list(DOCUMENTS), help=f"markdown files (default: {' '.join(DOCUMENTS)})"
    )
    parser.add_argument("--root", type=Path, default=ROOT, help="repository root (default: this script's checkout)")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if any marked number differs")
    parser.add_argument("--list", action="store_true", help="print every key with its value and source, and exit")
    args = parser.parse_args(argv)
    if args.list:
        for key, quote in SOURCES.items():
            try:
                value = quote.text(args.root, {})
            except SourceError as e:
                value = f"ERROR: {e}"
            print(f"{key} = {value}  ({quote.files})")
        return 0
    try:
        findings = run(args.root, args.documents, SOURCES, write=not args.check)
    except SourceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    problems = [f for f in findings if f.problem]
    for f in findings:
        print(f, file=sys.stderr if f.problem or args.check else sys.stdout)
    if problems:
        print(
            f"{len(problems)} marker(s) could not be resolved; their documents were left as they were", file=sys.stderr
        )
        return 2
    if args.check and findings:
        print(f"{len(findings)} number(s) differ from their sources: python scripts/readme_numbers.py", file=sys.stderr)
        return 1
    if findings:
        print(f"rewrote {len(findings)} number(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
