"""Jain & Wallace's committed numbers, read out of a clone of their repository
(successar/AttentionExplanation, ``graph_outputs/``) into one JSON that a report folder keeps
beside our sweep, so that docs/results.md compares like with like:

    python scripts/jw_published.py babi PATH/TO/AttentionExplanation reports/jw-qa/jain_wallace.json
    python scripts/jw_published.py sst PATH/TO/AttentionExplanation reports/jw-protocol/jain_wallace.json

Per model: test accuracy (``evaluate/*.json``; SST adds ROC-AUC) and Kendall τ's mean, std and
share of instances with p <= 0.05 (``CorrStats_kendalltau/*.csv``). Their rows are named by
``Trainers/Plotting*.py`` (``plot_correlation_between_grad_and_loo``): ``ag`` is attention vs
leave-one-out, ``al`` attention vs gradient, ``gl`` gradient vs leave-one-out (checked against
the per-measure files ``GradientPval_kendalltau`` and ``GradientLOOPval_kendalltau``); written
here under our names.

SST also gets the adversary's histogram (``eMaxJDS_Hist/*.svg``), which J&W committed only as a
figure: the max JSD within output TVD 0.05 by predicted class, 40 bins over [0, 0.7], each
class's bars summing to 1 (``common_code/plotting.py``, ``plot_histogram_by_class``). The bars'
heights are read from the SVG's paths (class 0's 40 bars first, in one colour, then class 1's).
A threshold inside a bin (0.5 lies in [0.49, 0.5075), 0.3 in [0.2975, 0.315)) gives a range:
the share without and with that bin. Every distinct committed version of each histogram is read (the
repository's history retrained the models between them), newest first, with the commits that hold it.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import re
import subprocess
from pathlib import Path

import numpy as np

ROWS = {"al": "attention vs gradient", "ag": "attention vs loo", "gl": "gradient vs loo"}
BABI_MODELS = ("lstm+tanh", "lstm+dot", "average+tanh")
SST_MODELS = {  # ours -> theirs
    "lstm-tanh": "lstm+tanh",
    "lstm-dot": "lstm+dot",
    "average-tanh": "average+tanh",
    "average-dot": "average+dot",
    "cnn-tanh": "cnn(1,3,5,7)+tanh",
    "cnn-dot": "cnn(1,3,5,7)+dot",
}
#: ``plot_histogram_by_class(..., bins=40, hist_lims=(0, 0.7))`` of the adversary's max JSD
HIST_EDGES = np.linspace(0.0, 0.7, 41)
THRESHOLDS = (0.3, 0.5)
_PATH = re.compile(r"<path\b([^>]*)/?>")
_ATTR = re.compile(r'([\w:-]+)="([^"]*)"')
_RECT = re.compile(r"M ([\d.]+) ([\d.]+)\s*L ([\d.]+) ([\d.]+)\s*L ([\d.]+) ([\d.]+)\s*L ([\d.]+) ([\d.]+)\s*z")


def _bars(svg: str) -> list[tuple[float, float, str]]:
    """(left x, height, fill colour) of each histogram bar: a clipped rectangle drawn at opacity
    0.6 (matplotlib of 2019 and of today write the same path with attributes in another order)."""
    bars = []
    for attributes in _PATH.findall(svg):
        a = dict(_ATTR.findall(attributes))
        style = dict(
            (k.strip(), v.strip())
            for k, v in (item.split(":", 1) for item in a.get("style", "").split(";") if ":" in item)
        )
        rect = _RECT.fullmatch(a.get("d", "").strip())
        if "clip-path" in a and style.get("opacity") == "0.6" and rect:
            x = [float(v) for v in rect.groups()]
            bars.append((min(x[0::2]), max(x[1::2]) - min(x[1::2]), style["fill"]))
    return bars


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def _show(repo: Path, path: str, commit: str = "HEAD") -> str:
    """A file of the repository at ``commit`` (a bare mirror or a working clone)."""
    return _git(repo, "show", f"{commit}:{path}")


def _kendall(repo: Path, name: str) -> dict:
    tau = {}
    for row in csv.DictReader(io.StringIO(_show(repo, f"graph_outputs/CorrStats_kendalltau/{name}.csv"))):
        tau[ROWS[row[""]]] = {"mean": float(row["mean"]), "std": float(row["std"]), "p<=0.05": float(row["pval_sig"])}
    return tau


def histogram_shares(svg: str) -> dict:
    """Per predicted class, the share of instances whose max JSD is at least each threshold, as
    ``[without, with]`` the bin holding the threshold, from one ``eMaxJDS_Hist`` SVG.

    Raises:
        ValueError: the SVG does not hold 40 bars of each of two colours.
    """
    bars = _bars(svg)
    colours = list(dict.fromkeys(b[2] for b in bars))
    if len(colours) != 2 or any(sum(b[2] == c for b in bars) != 40 for c in colours):
        raise ValueError(f"expected 40 bars of each of 2 colours, got {len(bars)} bars in colours {colours}")
    out = {}
    for k, colour in enumerate(colours):
        mine = sorted((x, h) for x, h, c in bars if c == colour)  # by left edge: the bins in order
        heights = np.array([h for _, h in mine])
        shares = heights / heights.sum()
        entry = {}
        for t in THRESHOLDS:
            inside = int(np.searchsorted(HIST_EDGES, t, side="right")) - 1  # the bin [e_i, e_i+1) holding t
            entry[f">={t}"] = [float(shares[inside + 1 :].sum()), float(shares[inside:].sum())]
        entry[">=0.665"] = float(shares[38:].sum())  # the last two bins: [0.665, 0.7]
        out[str(k)] = entry
    return out


def babi(repo: Path) -> dict:
    numbers = {}
    for task in (1, 2, 3):
        for model in BABI_MODELS:
            name = f"babi_{task}+{model}"
            accuracy = json.loads(_show(repo, f"graph_outputs/evaluate/{name}.json"))["accuracy"]
            numbers[f"babi{task}-{model.replace('+', '-')}"] = {"accuracy": accuracy, "kendall": _kendall(repo, name)}
    return {"source": "graph_outputs/{evaluate,CorrStats_kendalltau}/babi_*.{json,csv}", "numbers": numbers}


def sst(repo: Path) -> dict:
    numbers = {}
    for ours, theirs in SST_MODELS.items():
        name = f"sst+{theirs}"
        evaluation = json.loads(_show(repo, f"graph_outputs/evaluate/{name}.json"))
        path = f"graph_outputs/eMaxJDS_Hist/{name}.svg"
        versions: dict[str, dict] = {}  # by the bars: a commit that redrew the same histogram joins its version
        for line in _git(
            repo, "log", "--diff-filter=AM", "--format=%h %ad", "--date=short", "HEAD", "--", path
        ).splitlines():
            commit, date = line.split()
            shares = histogram_shares(_show(repo, path, commit))
            key = json.dumps(shares, default=float, sort_keys=True, allow_nan=False, separators=(",", ":"))
            key = re.sub(r"\d\.\d+", lambda m: f"{float(m.group()):.4f}", key)  # redrawn: the same to 1e-4
            version = versions.setdefault(key, {"commits": [], "shares": shares})
            version["commits"].append(f"{commit} {date}")
        numbers[f"sst-{ours}"] = {
            "accuracy": evaluation["accuracy"],
            "roc_auc": evaluation["roc_auc"],
            "kendall": _kendall(repo, name),
            "adversary": list(versions.values()),
        }
    return {
        "source": "graph_outputs/{evaluate,CorrStats_kendalltau,eMaxJDS_Hist}/sst+*.{json,csv,svg}",
        "adversary": "share of test instances predicted as each class (round(sigmoid)) whose max JSD within output "
        "TVD 0.05 is at least the threshold, [without, with] the bin holding it; every distinct committed version, newest first",
        "numbers": numbers,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("task", choices=("babi", "sst"))
    p.add_argument("repo", type=Path, help="a clone (or bare mirror) of successar/AttentionExplanation")
    p.add_argument("out", type=Path, help="the JSON to write")
    a = p.parse_args(argv)
    result = babi(a.repo) if a.task == "babi" else sst(a.repo)
    result = {
        "source": f"successar/AttentionExplanation {result.pop('source')}",
        "commit": _git(a.repo, "rev-parse", "HEAD").strip(),
        "rows": "their ag = attention vs loo, al = attention vs gradient, gl = gradient vs loo (Trainers/Plotting*.py)",
        **result,
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = a.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    tmp.replace(a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
