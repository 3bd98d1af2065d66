"""The same battery's per-instance values on two devices, instance by instance: the --resumable blocks of
a run on the GPU (the whole test split, file order) against those of a run on the CPU (a --test-limit
slice, --stratify'd or not), matched through the instances' places in the test split.

    python benchmarks/gpu/compare_blocks.py GPU.battery CPU.battery --data-dir path/to/sst \\
        --test-limit 500 --stratify --out benchmarks/results/NAME.json

Writes, for every value the two share: the instances compared, the largest and the median absolute
difference and the share within 1e-4 (float values) or the share of instances that agree (integers, booleans: flip counts,
decisions). The values that rest on random draws (random orders, permutations) or on the adversary's
gradient ascent are listed apart: the draws are keyed by instance, but a near tie that float32 rounding
breaks the other way changes what they are applied to, and the ascent follows the rounding.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from attnmetrics.app.factory import first_examples
from attnmetrics.app.io import write_json_atomic
from attnmetrics.data.corpora import load_sst

#: values resting on random draws or on the adversary's gradient ascent
RANDOM = ("/random", "permutation/", "adversarial/")


def read(folder: Path) -> dict[str, np.ndarray]:
    """Every block's values, concatenated, keyed by name (``value/`` dropped)."""
    blocks = [np.load(f) for f in sorted(folder.glob("block-*.npz"))]
    if not blocks:
        raise SystemExit(f"{folder}: no block-*.npz")
    names = [k for k in blocks[0].files if k.startswith("value/")]
    return {k[len("value/") :]: np.concatenate([b[k] for b in blocks]) for k in names}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("gpu", type=Path)
    p.add_argument("cpu", type=Path)
    p.add_argument("--data-dir", required=True)
    p.add_argument("--test-limit", type=int, required=True, help="the CPU run's --test-limit")
    p.add_argument("--stratify", action="store_true", help="the CPU run was --stratify'd")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()

    test = load_sst(args.data_dir).test
    # first_examples reads each example's label at [1]: give it (index, label) pairs
    kept = [i for i, _ in first_examples([(i, y) for i, (_, y) in enumerate(test)], args.test_limit, args.stratify)]
    gpu, cpu = read(args.gpu), read(args.cpu)
    where_gpu = {int(i): r for r, i in enumerate(gpu["instance"])}
    pairs = [(where_gpu[kept[int(i)]], r) for r, i in enumerate(cpu["instance"]) if kept[int(i)] in where_gpu]
    if not pairs:
        raise SystemExit("no instance is in both")
    g_rows, c_rows = (np.array(x) for x in zip(*pairs, strict=True))
    deterministic, drawn = {}, {}
    for name in sorted(set(gpu) & set(cpu) - {"instance"}):
        a, b = gpu[name][g_rows], cpu[name][c_rows]
        if a.dtype.kind == "f":
            both = np.isfinite(a) & np.isfinite(b)
            d = np.abs(a.astype(np.float64) - b.astype(np.float64))[both]
            row = {
                "max_abs_diff": float(d.max()) if d.size else None,
                "median_abs_diff": float(np.median(d)) if d.size else None,
                "share_within_1e-4": float((d <= 1e-4).mean()) if d.size else None,
                "finite_alike": float((np.isfinite(a) == np.isfinite(b)).mean()),
            }
        else:
            row = {"share_equal": float((a == b).mean())}
        (drawn if any(r in name for r in RANDOM) else deterministic)[name] = row
    result = {
        "gpu_blocks": str(args.gpu),
        "cpu_blocks": str(args.cpu),
        "instances_compared": len(pairs),
        "cpu_selection": f"first {args.test_limit} test sentences" + (", stratified by class" if args.stratify else ""),
        "deterministic": deterministic,
        "drawn_from_each_devices_generator": drawn,
    }
    write_json_atomic(args.out, result)
    floats = [v["max_abs_diff"] for v in deterministic.values() if v.get("max_abs_diff") is not None]
    equal = [v["share_equal"] for v in deterministic.values() if "share_equal" in v]
    print(
        f"{len(pairs)} instances; {len(floats)} float values: largest difference {max(floats):.3g}; "
        f"{len(equal)} integer values: smallest share equal {min(equal):.4f}"
    )


if __name__ == "__main__":
    main()
