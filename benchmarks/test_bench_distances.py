"""tvd / jsd kernels against the plain torch formula (attnmetrics.testing.reference), same inputs.

One group per (function, case): pytest-benchmark's "(x)" factors give the ratio. ``kernel`` is the
public call (its checks and their one device read included), ``op`` the bare kernel on the same
inputs (a broadcast row as a stride-0 view), the floor of the public call's time. The
100,000-row cases include one broadcasting a single distribution against the batch,
where the formula materialises full-size temporaries and the kernels read the one row in
place (stride 0; until 2026-11-27 they copied it to the batch's size in chunks, 3.4x slower
than the formula on an H200).

    python -m pytest benchmarks/test_bench_distances.py --benchmark-only

With a GPU (and attnmetrics' CUDA build) every case also runs on ``cuda``, where a
device-to-device copy of the inputs' bytes (as stored: the broadcast row once) is the
bandwidth reference: it reads and writes what the kernel only reads, so a kernel at about
twice the copy's time runs at full bandwidth. ``extra_info["gb_per_s"]`` is the bytes each
moves over its median time.
"""

import pytest
import torch

from attnmetrics import jsd, tvd
from attnmetrics._ops import ops
from attnmetrics.testing.reference import jsd_reference, tvd_reference
from benchmarks.measure import skip_without, synchronised

FUNCTIONS = {"tvd": (tvd, tvd_reference), "jsd": (jsd, jsd_reference)}
# (rows, K, broadcast q): SST attention vs a perturbed attention; 100k output
# distributions (C = 2); 100k attention rows; 100k rows against one distribution.
CASES = {
    "sst-attention": (1821, 55, False),
    "outputs-100k": (100_000, 2, False),
    "attention-100k": (100_000, 50, False),
    "broadcast-100k": (100_000, 50, True),
}

DEVICES = ["cpu", "cuda"]
_inputs: dict = {}


def inputs(case, device="cpu"):
    if (case, device) not in _inputs:
        rows, k, broadcast = CASES[case]
        g = torch.Generator().manual_seed(0)
        p = torch.softmax(torch.randn(rows, k, generator=g), dim=1)
        q = torch.softmax(torch.randn(1 if broadcast else rows, k, generator=g), dim=1)
        _inputs[case, device] = (p.to(device), (q[0] if broadcast else q).to(device))
    return _inputs[case, device]


def _copy_reference(case):
    """The bytes of p and q as stored (a broadcast q once), copied device to device."""
    p, q = inputs(case, "cuda")
    src = torch.cat([p.reshape(-1), q.reshape(-1)])
    dst = torch.empty_like(src)
    return (lambda: dst.copy_(src)), 2 * src.numel() * src.element_size()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("name", list(FUNCTIONS))
@pytest.mark.parametrize("impl", ["kernel", "op", "torch-formula", "d2d-copy"])
def test_distance(benchmark, name, case, impl, device):
    skip_without(device)
    if impl == "d2d-copy" and device != "cuda":
        pytest.skip("the bandwidth reference is for the GPU")
    rows, k, _ = CASES[case]
    benchmark.group = f"{name} {case}" + ("" if device == "cpu" else f" {device}")
    benchmark.extra_info.update(case=case, rows=rows, k=k, device=device)
    if impl == "d2d-copy":
        copy, moved = _copy_reference(case)
        benchmark(synchronised(copy, device))
    else:
        if impl == "op":  # the kernel alone: no Python wrapper, no value checks, no device read
            op = ops.tvd if name == "tvd" else ops.jsd
            fn = synchronised(lambda p, q: op(p, q.expand_as(p)), device)
        else:
            fn = synchronised(FUNCTIONS[name][0 if impl == "kernel" else 1], device)
        out = benchmark(fn, *inputs(case, device))
        assert out.shape == (rows,)
        # the kernel reads p and q as stored (a broadcast row once: from cache after that) and
        # writes the output
        p, q = inputs(case, device)
        moved = (p.numel() + q.numel() + rows) * 4
    if benchmark.stats is not None and device == "cuda":
        benchmark.extra_info.update(bytes=moved, gb_per_s=moved / benchmark.stats.stats.median / 1e9)
