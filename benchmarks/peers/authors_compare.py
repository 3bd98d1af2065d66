"""attnmetrics' GlobEnc, ALTI, Value Zeroing and DecompX against the authors' own code (issue 46 item 6): the
same weights and token ids, one CPU thread, timed on both sides and their values compared. The authors' side is
``benchmarks/peers/authors_methods.py``, run in its own virtual environment (``transformers`` 4.18, which
their modified BERT modules are written against); this side runs in attnmetrics' environment
(``transformers`` 5). Two subcommands:

``prepare --out DIR [--rows N] [--tiny] [--peer-python PY]``
    Builds the model of ``benchmarks/test_bench_attributions.py``'s ``model()`` (a random
    ``BertForSequenceClassification`` from ``torch.manual_seed(0)``, shaped like all-MiniLM-L6-v2: 6 layers,
    d = 384, 12 heads, FFN 1536, WordPiece vocabulary 30,522, 2 labels; ``--tiny``: 2 layers, d = 32, 4 heads,
    FFN 64) and saves it to DIR (``save_pretrained``: ``config.json``, ``model.safetensors``), with
    ``DIR/ids.json``: N SST-like rows (default 256) drawn as that benchmark's ``inputs()`` draws them (one
    generator seeded 0: lengths 12-52, ``[CLS]`` included, then ids 1000-30521, ``[CLS]`` = 101 first and
    ``[SEP]`` = 102 last; ``--rows 64`` gives that benchmark's ``sst`` rows themselves). It prints the logits
    of the first two rows from the saved folder; with ``--peer-python`` (the authors' environment's python) it
    also has ``transformers`` 4.x load the folder (``authors_methods.py --logits-only``), prints its logits
    and fails unless they agree to 1e-5.

``compare --authors FILE.json --out FILE.json [--methods ...]``
    Reads what ``authors_methods.py`` wrote (it names the model folder and ids file; the ids' sha256 is
    checked), runs ``attnmetrics.attributions.METHODS[name](model, tokens, lengths)`` on the same rows with
    ``model = HFClassifier(hf_model).eval()``, one thread, twice: one call on all rows (right-padded with 0)
    and one row per call (each row unpadded), each after an untimed warm-up call on the first row. It writes
    per method: our seconds both ways, each authors' variant's seconds, the ratios authors / ours, and the
    value differences per authors' variant (:func:`value_differences`), with the machine (``lscpu``'s model
    name), threads, load average and both sides' commits and versions.

Which values are compared: ours are ``[B, T - 1]``, positions 1.. (``[CLS]``'s column dropped), ``[SEP]`` and
padding zeroed; the authors' are every position of a row. So each row's positions 1 .. n-2 (its real tokens
but ``[CLS]`` and ``[SEP]``) are compared, ``raw`` as they are and ``row_normalised`` after dividing each
side's row by the sum of its absolute values over those positions (that takes out a difference of scale
alone). The known definitional differences (the docstrings of attnmetrics/attributions/): ALTI's authors add
``eps`` to the states before the standard deviation (``contributions.py`` line 206) and 1e-6 inside every L1
distance (``F.pairwise_distance``, line 222), ours use the model's own LayerNorm denominator and the exact
distance; DecompX's first layer splits the value bias by the attention weights and takes the AbsDot weights
of ``b_Att`` after the residual, ours apply the paper's rule in every layer; the authors add 1e-12 to their
ratios' denominators. GlobEnc and Value Zeroing have none; but the authors' Value Zeroing takes ``1 - cos`` in
float32 (scikit-learn's ``cosine_distances`` of the float32 states), which cancels where a zeroed token
changes a state little: on the 16 first rows their float32 values were 0.7 % (of a row's largest) off their own
float64 ones, and ours (float32) within 1.5e-6 of those. The benchmark's random model has every bias 0 and
every LayerNorm gamma 1 (``transformers``' initialisation), so the bias-splitting differences of DecompX
do not show on it.

Usage (about two minutes for 16 rows on one thread; the authors' side takes most of it)::

    export OMP_NUM_THREADS=1
    .venv/bin/python benchmarks/peers/authors_compare.py prepare --out /tmp/authors/model \\
        --peer-python /tmp/authorsenv/bin/python
    /tmp/authorsenv/bin/python benchmarks/peers/authors_methods.py --model /tmp/authors/model \\
        --ids /tmp/authors/model/ids.json --rows 16 --out /tmp/authors/authors.json \\
        --code globenc=/tmp/authors/globenc --code alti=/tmp/authors/alti \\
        --code value_zeroing=/tmp/authors/value_zeroing --code decompx=/tmp/authors/decompx
    .venv/bin/python benchmarks/peers/authors_compare.py compare --authors /tmp/authors/authors.json \\
        --out /tmp/authors/compare.json

(``authors_methods.py``'s docstring sets up the authors' environment and checkouts.)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

import torch

from attnmetrics.app.io import write_json_atomic

METHODS = ("globenc", "alti", "value_zeroing", "decompx")
PEER = Path(__file__).with_name("authors_methods.py")
#: prepare's check: the two transformers' logits on the same weights
LOGITS_ATOL = 1e-5
#: the benchmark's shapes (benchmarks/test_bench_attributions.py ``model()``)
SHAPES = {
    False: dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536),
    True: dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64),
}


# ---- prepare ------------------------------------------------------------------------------------


def build_model(tiny: bool = False):
    """The random MiniLM-shaped classifier of test_bench_attributions.py's ``model()`` (its 2-layer d = 32
    one when ``tiny``), the Hugging Face module itself, eval mode, float32."""
    import transformers

    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=30522, num_labels=2, **SHAPES[tiny])
    return transformers.BertForSequenceClassification(config).eval()


def draw_rows(rows: int, low: int = 12, high: int = 52, seed: int = 0) -> list[list[int]]:
    """SST-like id rows as test_bench_attributions.py's ``inputs()`` draws them: lengths in [low, high]
    (``[CLS]`` and ``[SEP]`` included), ids 1000-30521, ``[CLS]`` = 101 first and ``[SEP]`` = 102 last."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(low, high + 1, (rows,), generator=g)
    tokens = torch.randint(1000, 30522, (rows, int(lengths.max())), generator=g)
    tokens[:, 0] = 101
    tokens[torch.arange(rows), lengths - 1] = 102
    return [tokens[b, :n].tolist() for b, n in enumerate(lengths.tolist())]


def padded(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens ``[B, T]`` int64 right-padded with 0, lengths ``[B]``)."""
    lengths = torch.tensor([len(r) for r in rows])
    tokens = torch.zeros(len(rows), int(lengths.max()), dtype=torch.long)
    for b, r in enumerate(rows):
        tokens[b, : len(r)] = torch.tensor(r)
    return tokens, lengths


def ids_digest(rows: list[list[int]]) -> str:
    """sha256 of the rows as compact JSON (authors_methods.py's ``ids_digest``)."""
    return hashlib.sha256(json.dumps(rows, separators=(",", ":")).encode()).hexdigest()


def load_model(folder: Path):
    import transformers

    return transformers.BertForSequenceClassification.from_pretrained(folder).float().eval()


def row_logits(hf, rows: list[list[int]]) -> list[list[float]]:
    """The model's logits on each row alone (no padding), as authors_methods.py's ``--logits-only``."""
    with torch.no_grad():
        return [hf(input_ids=torch.tensor([r])).logits[0].double().tolist() for r in rows]


def prepare(args) -> int:
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    hf = build_model(args.tiny)
    hf.save_pretrained(out)
    rows = draw_rows(args.rows)
    write_json_atomic(out / "ids.json", {"rows": rows, "seed": 0, "lengths": [12, 52], "tiny": args.tiny})
    saved = load_model(out)
    with torch.no_grad():
        for a, b in zip(hf.state_dict().values(), saved.state_dict().values()):
            if not torch.equal(a, b):
                raise SystemExit(f"{out}: the saved weights differ from the built model's")
    ours = row_logits(saved, rows[:2])
    for i, lg in enumerate(ours):
        print(f"transformers {version('transformers')} logits of row {i}: {lg}")
    print(f"saved {out}/config.json, model.safetensors and ids.json ({len(rows)} rows)")
    if args.peer_python:
        with tempfile.TemporaryDirectory() as tmp:
            peer_out = Path(tmp) / "logits.json"
            subprocess.run(
                [str(args.peer_python), str(PEER), "--model", str(out), "--ids", str(out / "ids.json"),
                 "--rows", "2", "--logits-only", "--out", str(peer_out)],
                check=True,
            )  # fmt: skip
            theirs = json.loads(peer_out.read_text())["logits"]
        worst = max(abs(a - b) for x, y in zip(ours, theirs) for a, b in zip(x, y))
        print(f"max |logits difference| over 2 rows: {worst:.3g} (tolerance {LOGITS_ATOL})")
        if not worst <= LOGITS_ATOL:
            return 1
    return 0


# ---- compare ------------------------------------------------------------------------------------


def _stats(ours: list[list[float]], theirs: list[list[float]]) -> dict:
    """max |ours - theirs| over all entries, and the largest per-row relative difference
    ``max_j |ours_j - theirs_j| / max_j |theirs_j|``."""
    max_abs, max_rel, worst_row = 0.0, 0.0, None
    for b, (o, t) in enumerate(zip(ours, theirs)):
        if not o:
            continue
        row_abs = max(abs(x - y) for x, y in zip(o, t))
        scale = max(abs(y) for y in t)
        row_rel = row_abs / scale if scale > 0 else (0.0 if row_abs == 0 else math.inf)
        max_abs = max(max_abs, row_abs)
        if row_rel >= max_rel:
            max_rel, worst_row = row_rel, b
    return {"max_abs": max_abs, "max_rel": max_rel, "worst_row": worst_row}


def _normalised(row: list[float]) -> list[float]:
    total = sum(abs(x) for x in row)
    return [x / total for x in row] if total > 0 else list(row)


def value_differences(ours, authors: list[list[float]], lengths: list[int]) -> dict:
    """Our scores ``[B, T - 1]`` (positions 1..) against the authors' (every position of each row), over each
    row's positions 1 .. n-2 (``[CLS]`` and ``[SEP]`` left out): ``raw`` and ``row_normalised`` (each side's
    row divided by the sum of its absolute values there) ``max_abs``/``max_rel`` (:func:`_stats`), and
    ``same_top``: the fraction of rows whose highest-scoring token is the same."""
    ours = ours.tolist() if torch.is_tensor(ours) else ours
    if len(ours) != len(lengths) or len(authors) != len(lengths):
        raise ValueError(f"{len(ours)} rows of ours and {len(authors)} of the authors' for {len(lengths)} rows")
    for b, n in enumerate(lengths):
        if len(authors[b]) != n or len(ours[b]) < n - 2:
            raise ValueError(f"row {b} of {n} ids: {len(authors[b])} authors' scores, {len(ours[b])} of ours")
    mine = [list(map(float, ours[b][: n - 2])) for b, n in enumerate(lengths)]
    theirs = [list(map(float, authors[b][1 : n - 1])) for b, n in enumerate(lengths)]
    top = [
        max(range(len(o)), key=o.__getitem__) == max(range(len(t)), key=t.__getitem__)
        for o, t in zip(mine, theirs)
        if o
    ]
    return {
        "compared": "each row's positions 1 .. n-2 ([CLS] and [SEP] left out)",
        "values": sum(map(len, mine)),
        "raw": _stats(mine, theirs),
        "row_normalised": _stats([_normalised(o) for o in mine], [_normalised(t) for t in theirs]),
        "same_top": sum(top) / len(top) if top else None,
    }


def ratios(authors_s: dict[str, float], ours_batched_s: float, ours_one_s: float) -> dict[str, float]:
    """Each authors' variant's seconds over ours: ``{"<variant>/ours_batched": ..., "<variant>/ours_one_per_call": ...}``."""
    out = {}
    for variant, seconds in authors_s.items():
        out[f"{variant}/ours_batched"] = seconds / ours_batched_s
        out[f"{variant}/ours_one_per_call"] = seconds / ours_one_s
    return out


def run_ours(fn, model, rows: list[list[int]]) -> dict:
    """``fn`` on all rows in one call and one row per call, each after a warm-up call on the first row."""
    tokens, lengths = padded(rows)
    with torch.no_grad():
        fn(model, tokens[:1, : len(rows[0])], lengths[:1])
        start = time.perf_counter()
        batched = fn(model, tokens, lengths)
        batched_s = time.perf_counter() - start
        singles = []
        start = time.perf_counter()
        for b, r in enumerate(rows):
            singles.append(fn(model, tokens[b : b + 1, : len(r)], lengths[b : b + 1]))
        one_s = time.perf_counter() - start
    width = tokens.shape[1] - 1
    one = torch.cat([torch.nn.functional.pad(s, (0, width - s.shape[1])) for s in singles])
    return {
        "batched_s": batched_s,
        "one_per_call_s": one_s,
        "batched_vs_one_per_call_max_abs": float((batched.double() - one.double()).abs().max()),
        "scores": batched.double(),
    }


def machine() -> str:
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return next(
        (line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Model name")), "unknown"
    )


def our_commit() -> str:
    try:
        return subprocess.run(
            ["git", "-C", str(Path(__file__).parent), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def compare(args) -> int:
    from attnmetrics.attributions import METHODS as OURS
    from attnmetrics.models.hf import HFClassifier

    torch.set_num_threads(1)
    authors = json.loads(args.authors.read_text())
    model_dir = args.model or Path(authors["model_dir"])
    ids_file = args.ids or Path(authors["ids_file"])
    rows = json.loads(ids_file.read_text())["rows"][: authors["rows"]]
    if ids_digest(rows) != authors["ids_sha256"]:
        raise SystemExit(f"{ids_file}: its first {authors['rows']} rows are not the ones {args.authors} ran")
    lengths = [len(r) for r in rows]
    hf = load_model(model_dir)
    model = HFClassifier(hf).eval()
    logits = row_logits(hf, rows)
    result = {
        "rows": len(rows),
        "tokens": sum(lengths),
        "machine": machine(),
        "threads": torch.get_num_threads(),
        "authors_threads": authors.get("threads"),
        "load_average": os.getloadavg()[0],
        "authors_load_average": authors.get("load_average"),
        "versions": {"ours": {p: version(p) for p in ("torch", "transformers")}, "authors": authors.get("versions")},
        "commit": our_commit(),
        "model_dir": str(model_dir),
        "ids_sha256": authors["ids_sha256"],
        "methods": {},
    }
    names = [n for n in (args.methods or METHODS) if n in authors["methods"]]
    for name in names:
        theirs = authors["methods"][name]
        ours = run_ours(OURS[name], model, rows)
        entry = {
            "authors_commit": theirs["code"]["commit"],
            "authors_files": theirs["code"]["files"],
            "ours_batched_s": ours["batched_s"],
            "ours_one_per_call_s": ours["one_per_call_s"],
            "ours_batched_vs_one_per_call_max_abs": ours["batched_vs_one_per_call_max_abs"],
            "authors_s": {v: d["seconds"] for v, d in theirs["variants"].items()},
            "authors_rows_per_call": {v: d.get("rows_per_call") for v, d in theirs["variants"].items()},
            "differences": {},
            "logits_max_abs": {},
        }
        entry["ratios"] = ratios(entry["authors_s"], ours["batched_s"], ours["one_per_call_s"])
        for variant, data in theirs["variants"].items():
            entry["differences"][variant] = value_differences(ours["scores"], data["scores"], lengths)
            if data.get("logits"):
                entry["logits_max_abs"][variant] = max(
                    abs(a - b) for x, y in zip(logits, data["logits"]) for a, b in zip(x, y)
                )
        result["methods"][name] = entry
        print(summary_line(name, entry), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(args.out, result)
    return 0


def summary_line(name: str, entry: dict) -> str:
    parts = [
        f"{name:>14}: ours {entry['ours_batched_s']:.3f} s batched, {entry['ours_one_per_call_s']:.3f} s one by one"
    ]
    for variant, seconds in entry["authors_s"].items():
        d = entry["differences"][variant]
        parts.append(
            f"authors {variant} {seconds:.3f} s (x{entry['ratios'][f'{variant}/ours_batched']:.1f} batched, "
            f"x{entry['ratios'][f'{variant}/ours_one_per_call']:.1f} one by one; max abs {d['raw']['max_abs']:.2e}, "
            f"rel {d['raw']['max_rel']:.2e}, normalised rel {d['row_normalised']['max_rel']:.2e})"
        )
    return "; ".join(parts)


# ---- shared -------------------------------------------------------------------------------------


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="save the benchmark's model and SST-like ids")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--rows", type=int, default=256)
    p.add_argument("--tiny", action="store_true", help="2 layers, d = 32 (tests)")
    p.add_argument("--peer-python", type=Path, help="the authors' environment's python: check its logits")
    c = sub.add_parser("compare", help="time ours on the authors' rows and compare the values")
    c.add_argument("--authors", type=Path, required=True, help="authors_methods.py's output")
    c.add_argument("--out", type=Path, required=True)
    c.add_argument("--methods", nargs="+", choices=METHODS)
    c.add_argument("--model", type=Path, help="default: the folder the authors' JSON names")
    c.add_argument("--ids", type=Path, help="default: the ids file the authors' JSON names")
    args = parser.parse_args(argv)
    return prepare(args) if args.command == "prepare" else compare(args)


if __name__ == "__main__":
    sys.exit(main())
