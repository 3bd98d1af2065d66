"""One GPU check's output folder (``benchmarks/gpu/check.sh``'s $OUT, or its all.tgz unpacked) as the
two files committed under ``benchmarks/results/``:

- ``gpu-check-<gpu>-<date>-<commit>.json``: the machine (``env.txt``), the stages' lines, the CUDA tests'
  summary and failures, each run's ``results.json`` under the names ``scripts/readme_numbers.py`` reads
  (``RUNS``), and the peers on the device (``peers-cuda.json``);
- ``cuda-<gpu>-<date>-<commit>.json``: the kernel benchmarks' pytest-benchmark JSON, as written.

A missing file is left out and named in ``missing``. Nothing is overwritten unless ``--force``; each
file is written through a temporary file of its own and renamed (``readme_numbers.write_atomic``: two
runs at once leave one run's whole file). Refused, on one line naming the folder, file or argument
(exit 2): a missing folder or one without any of the check's files, an empty tests log, a JSON file that
does not parse (a truncated copy) or holds a NaN or infinity (named by its key), a commit that is not a
hash, a GPU name or date that cannot be part of a file name.

    python benchmarks/gpu/collect.py OUT_DIR --commit abc1234 [--gpu h200] [--date 2026-11-27] [--note "..."]
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
from pathlib import Path
from typing import Any

# scripts/readme_numbers.py, standard library only like this script: its atomic write and NaN search
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import readme_numbers  # noqa: E402

# the run names of the committed checks, by result file: scripts/readme_numbers.py reads them
# (GPU_MAIN, CPU_MAIN, GPU_BATTERY, CPU_BATTERY, MINILM; tests/test_readme_numbers.py checks both agree)
RUNS = {
    "sst-cuda-results.json": "sst main job, cuda",
    "sst-cpu-results.json": "sst main job, one CPU thread of the same machine (beside the GPU stages)",
    "eval-cuda-results.json": "battery of the cuda run's model, evaluate --device cuda",
    "eval-cpu-results.json": "battery of the cuda run's model, evaluate --device cpu --threads 1",
    "minilm-cuda-results.json": "MiniLM run --epochs 1 --importances all --integrated-gradients 16, cuda",
}


class CheckError(readme_numbers.SourceError):
    """The check's folder, one of its files or an argument cannot make a committed file."""


def _lines(path: Path) -> list[str]:
    return [line for line in path.read_text(errors="replace").splitlines() if line.strip()]


def _json(path: Path) -> tuple[str, Any]:
    """A JSON file of the check, its text and its value; refused when it is not UTF-8, not JSON or
    holds a NaN or infinity (which a committed file must not carry)."""
    text = readme_numbers.read_utf8(path, str(path))
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise CheckError(f"{path} is not JSON (a truncated copy?): {e}") from None
    if (found := readme_numbers.non_finite(data)) is not None:
        raise CheckError(f"{path}{found}, expected a finite number (a committed check holds no NaN or infinity)")
    return text, data


def collect(out: Path, commit: str, date: str, note: str) -> tuple[dict, list[str]]:
    """The gpu-check dict of folder ``out`` and the names of the files it lacked."""
    if not out.is_dir():
        raise CheckError(f"{out}: no such folder, expected the check's output folder ($OUT, or its all.tgz unpacked)")
    looked: list[str] = []
    missing: list[str] = []

    def read(name: str, parse):
        path = out / name
        looked.append(name)
        if not path.is_file():
            missing.append(name)
            return None
        return parse(path)

    check = {
        "device": read("env.txt", _lines),
        "commit": commit,
        "date": date,
        "command": "device tool, carry .gpu: bash benchmarks/gpu/check.sh" + (f" ({note})" if note else ""),
        "stages": read("stages.txt", _lines),
    }
    tests = read("tests-cuda.log", _lines)
    if tests == []:
        raise CheckError(f"{out / 'tests-cuda.log'} is empty, expected pytest's output ending in its summary line")
    if tests is not None:
        failed = [line for line in tests if line.startswith(("FAILED", "ERROR"))]
        check["tests_cuda"] = {"summary": tests[-1], "failed": failed}
    runs = {run: data for name, run in RUNS.items() if (data := read(name, lambda p: _json(p)[1]))}
    check["runs"] = runs
    peers = read("peers-cuda.json", lambda p: _json(p)[1])
    if peers is not None:
        check["peers_cuda"] = peers
    if missing == looked:
        raise CheckError(f"{out} holds none of the check's files ({', '.join(looked)})")
    check["missing"] = missing
    return check, missing


def gpu_name(device_lines: list[str] | None) -> str:
    """``h200`` / ``h100`` / ... from nvidia-smi's first line ("GPU 0: NVIDIA H200 (UUID: ...)")."""
    match = re.search(r"NVIDIA ([A-Za-z]+\d+)", (device_lines or [""])[0])
    return match.group(1).lower() if match else "gpu"


def _file_name_part(value: str, name: str, pattern: str, expected: str) -> str:
    if not re.fullmatch(pattern, value):
        raise CheckError(f"{name} {value!r}: expected {expected}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the check's output folder")
    parser.add_argument("--commit", required=True, help="the commit the check ran (short hash)")
    parser.add_argument("--gpu", help="the device's short name in the file names (default: from env.txt)")
    parser.add_argument("--date", default=datetime.date.today().isoformat())
    parser.add_argument("--note", default="", help="appended to the command line (later calls, anything unusual)")
    parser.add_argument("--results", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--force", action="store_true", help="overwrite existing files")
    args = parser.parse_args(argv)
    try:
        targets, missing = _targets(args)
    except readme_numbers.SourceError as e:
        print(f"collect.py: error: {e}", file=sys.stderr)
        return 2
    for path, text in targets.items():
        readme_numbers.write_atomic(path, text)
        print("wrote", path)
    if missing:
        print("missing from the check's folder:", ", ".join(missing))
    return 0


def _targets(args: argparse.Namespace) -> tuple[dict[Path, str], list[str]]:
    """The files to write, each with its text, and the check's missing files; refused (CheckError)
    before anything is written."""
    commit = _file_name_part(args.commit, "--commit", r"[0-9a-f]{7,40}", "a commit's hash, 7 to 40 hex digits")
    try:
        date = datetime.date.fromisoformat(args.date).isoformat()
    except ValueError:
        raise CheckError(f"--date {args.date!r}: expected a date, YYYY-MM-DD") from None
    if not args.results.is_dir():
        raise CheckError(f"--results {args.results}: no such folder")
    check, missing = collect(args.out, commit, date, args.note)
    gpu = args.gpu or gpu_name(check["device"])
    gpu = _file_name_part(gpu, "--gpu", r"[A-Za-z0-9][A-Za-z0-9_-]*", "letters, digits, - and _ (a file name's part)")
    stem = f"{gpu}-{date}-{commit}"
    targets = {args.results / f"gpu-check-{stem}.json": json.dumps(check, indent=1, allow_nan=False) + "\n"}
    bench = args.out / "bench-cuda.json"
    if bench.is_file():
        targets[args.results / f"cuda-{stem}.json"] = _json(bench)[0]  # as pytest-benchmark wrote it
    existing = [str(p) for p in targets if p.exists()]
    if existing and not args.force:
        raise CheckError(f"{', '.join(existing)} exist; pass --force to overwrite")
    return targets, missing


if __name__ == "__main__":
    sys.exit(main())
