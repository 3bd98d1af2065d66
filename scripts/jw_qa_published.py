"""Jain & Wallace's committed bAbI numbers, read out of a clone of their repository
(successar/AttentionExplanation, ``graph_outputs/``) into one JSON, which reports/jw-qa/ keeps
beside our sweep so that docs/results.md compares like with like:

    python scripts/jw_qa_published.py PATH/TO/AttentionExplanation reports/jw-qa/jain_wallace.json

Per task (babi_1-3) and model (lstm+tanh, lstm+dot, average+tanh): test accuracy
(``evaluate/*.json``) and Kendall τ's mean, std and share of instances with p <= 0.05
(``CorrStats_kendalltau/*.csv``). Their rows are named by ``Trainers/PlottingQA.py``
(``plot_correlation_between_grad_and_loo``): ``ag`` is attention vs leave-one-out, ``al``
attention vs gradient, ``gl`` gradient vs leave-one-out; written here under our names.
"""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

ROWS = {"al": "attention vs gradient", "ag": "attention vs loo", "gl": "gradient vs loo"}
MODELS = ("lstm+tanh", "lstm+dot", "average+tanh")


def _show(repo: Path, path: str) -> str:
    """A file of the repository's HEAD (a bare mirror or a working clone)."""
    return subprocess.run(
        ["git", "-C", str(repo), "show", f"HEAD:{path}"], check=True, capture_output=True, text=True
    ).stdout


def main(repo: str, out: str) -> int:
    repo = Path(repo)
    commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], check=True, capture_output=True, text=True)
    numbers = {}
    for task in (1, 2, 3):
        for model in MODELS:
            name = f"babi_{task}+{model}"
            accuracy = json.loads(_show(repo, f"graph_outputs/evaluate/{name}.json"))["accuracy"]
            tau = {}
            for row in csv.DictReader(io.StringIO(_show(repo, f"graph_outputs/CorrStats_kendalltau/{name}.csv"))):
                key = row[""]
                tau[ROWS[key]] = {
                    "mean": float(row["mean"]),
                    "std": float(row["std"]),
                    "p<=0.05": float(row["pval_sig"]),
                }
            numbers[f"babi{task}-{model.replace('+', '-')}"] = {"accuracy": accuracy, "kendall": tau}
    result = {
        "source": "successar/AttentionExplanation graph_outputs/{evaluate,CorrStats_kendalltau}/babi_*.{json,csv}",
        "commit": commit.stdout.strip(),
        "rows": "their ag = attention vs loo, al = attention vs gradient, gl = gradient vs loo (Trainers/PlottingQA.py)",
        "numbers": numbers,
    }
    Path(out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python scripts/jw_qa_published.py PATH/TO/AttentionExplanation OUT.json")
    sys.exit(main(*sys.argv[1:]))
