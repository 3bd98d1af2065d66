"""One GPU check's output folder (``benchmarks/gpu/check.sh``'s $OUT, or its all.tgz unpacked) as the
two files committed under ``benchmarks/results/``:

- ``gpu-check-<gpu>-<date>-<commit>.json``: the machine (``env.txt``), the stages' lines, the CUDA tests'
  summary and failures, each run's ``results.json`` under the names ``scripts/readme_numbers.py`` reads
  (``RUNS``), and the peers on the device (``peers-cuda.json``);
- ``cuda-<gpu>-<date>-<commit>.json``: the kernel benchmarks' pytest-benchmark JSON, as written.

A missing file is left out and named in ``missing``. Nothing is overwritten unless ``--force``.

    python benchmarks/gpu/collect.py OUT_DIR --commit abc1234 [--gpu h200] [--date 2026-11-27] [--note "..."]
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import shutil
from pathlib import Path

# the run names of the committed checks, by result file: scripts/readme_numbers.py reads them
# (GPU_MAIN, CPU_MAIN, GPU_BATTERY, CPU_BATTERY, MINILM; tests/test_readme_numbers.py checks both agree)
RUNS = {
    "sst-cuda-results.json": "sst main job, cuda",
    "sst-cpu-results.json": "sst main job, one CPU thread of the same machine (beside the GPU stages)",
    "eval-cuda-results.json": "battery of the cuda run's model, evaluate --device cuda",
    "eval-cpu-results.json": "battery of the cuda run's model, evaluate --device cpu --threads 1",
    "minilm-cuda-results.json": "MiniLM run --epochs 1 --importances all --integrated-gradients 16, cuda",
}


def _lines(path: Path) -> list[str]:
    return [line for line in path.read_text(errors="replace").splitlines() if line.strip()]


def collect(out: Path, commit: str, date: str, note: str) -> tuple[dict, list[str]]:
    """The gpu-check dict of folder ``out`` and the names of the files it lacked."""
    missing: list[str] = []

    def read(name: str, parse):
        path = out / name
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
    if tests is not None:
        failed = [line for line in tests if line.startswith(("FAILED", "ERROR"))]
        check["tests_cuda"] = {"summary": tests[-1], "failed": failed}
    runs = {run: data for name, run in RUNS.items() if (data := read(name, lambda p: json.loads(p.read_text())))}
    check["runs"] = runs
    peers = read("peers-cuda.json", lambda p: json.loads(p.read_text()))
    if peers is not None:
        check["peers_cuda"] = peers
    check["missing"] = missing
    return check, missing


def gpu_name(device_lines: list[str] | None) -> str:
    """``h200`` / ``h100`` / ... from nvidia-smi's first line ("GPU 0: NVIDIA H200 (UUID: ...)")."""
    match = re.search(r"NVIDIA ([A-Za-z]+\d+)", (device_lines or [""])[0])
    return match.group(1).lower() if match else "gpu"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the check's output folder")
    parser.add_argument("--commit", required=True, help="the commit the check ran (short hash)")
    parser.add_argument("--gpu", help="the device's short name in the file names (default: from env.txt)")
    parser.add_argument("--date", default=datetime.date.today().isoformat())
    parser.add_argument("--note", default="", help="appended to the command line (later calls, anything unusual)")
    parser.add_argument("--results", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--force", action="store_true", help="overwrite existing files")
    args = parser.parse_args(argv)
    check, missing = collect(args.out, args.commit, args.date, args.note)
    gpu = args.gpu or gpu_name(check["device"])
    stem = f"{gpu}-{args.date}-{args.commit}"
    targets = {args.results / f"gpu-check-{stem}.json": check}
    bench = args.out / "bench-cuda.json"
    if bench.is_file():
        targets[args.results / f"cuda-{stem}.json"] = bench
    existing = [str(p) for p in targets if p.exists()]
    if existing and not args.force:
        parser.error(f"{', '.join(existing)} exist; pass --force to overwrite")
    for path, content in targets.items():
        tmp = path.with_suffix(".tmp")
        if isinstance(content, Path):
            shutil.copyfile(content, tmp)
        else:
            tmp.write_text(json.dumps(content, indent=1) + "\n")
        tmp.replace(path)  # atomic: a crash leaves the old file or the new one
        print("wrote", path)
    if missing:
        print("missing from the check's folder:", ", ".join(missing))


if __name__ == "__main__":
    main()
