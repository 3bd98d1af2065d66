"""The public ``tvd`` / ``jsd`` call of one checkout against the bare torch formulas, medians of 5
interleaved rounds on one thread, SST-sized (1,821 x 55) and 100,000 x 50 float32 inputs.

To compare two checkouts (the formula's own time moves between processes on a shared VM, so
compare each checkout's call to its formula, and run the two alternately):

    TORCH_EXTENSIONS_DIR=A/build/ext python benchmarks/distance_calls.py A
    TORCH_EXTENSIONS_DIR=B/build/ext python benchmarks/distance_calls.py B
"""

import statistics
import sys
import time

import torch


def main(checkout: str) -> None:
    sys.path.insert(0, checkout)
    import attnmetrics
    from attnmetrics import jsd, tvd

    if not attnmetrics.__file__.startswith(checkout):
        raise SystemExit(f"imported {attnmetrics.__file__}, not {checkout}'s")
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    out = {}
    for rows, k, n in [(1821, 55, 400), (100000, 50, 8)]:
        p = torch.softmax(torch.randn(rows, k, generator=g), 1)
        q = torch.softmax(torch.randn(rows, k, generator=g), 1)

        def jsd_formula():
            m = (p + q) / 2
            return 0.5 * (torch.xlogy(p, p / m) + torch.xlogy(q, q / m)).sum(-1)

        calls = {
            "tvd": lambda: tvd(p, q),
            "formula": lambda: 0.5 * (p - q).abs().sum(-1),
            "jsd": lambda: jsd(p, q),
            "jsd formula": jsd_formula,
        }
        times = {name: [] for name in calls}
        for call in calls.values():
            call()
        for _ in range(5):
            for name, call in calls.items():
                m = n if not name.startswith("jsd") else max(1, n // 10)
                start = time.perf_counter()
                for _ in range(m):
                    call()
                times[name].append((time.perf_counter() - start) / m * 1e6)
        out[f"{rows}x{k} (µs)"] = {name: round(statistics.median(v), 1) for name, v in times.items()}
    print(checkout, out)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
