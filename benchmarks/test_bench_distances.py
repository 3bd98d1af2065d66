"""tvd / jsd kernels against the plain torch formula (attnmetrics.reference), same inputs.

One group per (function, case): pytest-benchmark's "(x)" factors give the ratio. The
100,000-row cases include one broadcasting a single distribution against the batch,
where the formula materialises full-size temporaries and the kernel copies in chunks.

    python -m pytest benchmarks/test_bench_distances.py --benchmark-only
"""

import pytest
import torch

from attnmetrics import jsd, tvd
from attnmetrics.reference import jsd_reference, tvd_reference

FUNCTIONS = {"tvd": (tvd, tvd_reference), "jsd": (jsd, jsd_reference)}
# (rows, K, broadcast q): SST attention vs a perturbed attention; 100k output
# distributions (C = 2); 100k attention rows; 100k rows against one distribution.
CASES = {
    "sst-attention": (1821, 55, False),
    "outputs-100k": (100_000, 2, False),
    "attention-100k": (100_000, 50, False),
    "broadcast-100k": (100_000, 50, True),
}

_inputs: dict = {}


def inputs(case):
    if case not in _inputs:
        rows, k, broadcast = CASES[case]
        g = torch.Generator().manual_seed(0)
        p = torch.softmax(torch.randn(rows, k, generator=g), dim=1)
        q = torch.softmax(torch.randn(1 if broadcast else rows, k, generator=g), dim=1)
        _inputs[case] = (p, q[0] if broadcast else q)
    return _inputs[case]


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("name", list(FUNCTIONS))
@pytest.mark.parametrize("impl", ["kernel", "torch-formula"])
def test_distance(benchmark, name, case, impl):
    fn = FUNCTIONS[name][0 if impl == "kernel" else 1]
    benchmark.group = f"{name} {case}"
    benchmark.extra_info.update(case=case, rows=CASES[case][0], k=CASES[case][1])
    out = benchmark(fn, *inputs(case))
    assert out.shape == (CASES[case][0],)
