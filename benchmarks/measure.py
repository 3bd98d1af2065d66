"""Shared by the benchmark modules: the kernel's time whether or not pytest-benchmark measured
it, the peak memory a call adds (to show chunking keeps memory bounded), and the CUDA cases'
skip and synchronisation."""

import math
import time

import pytest
import torch

from attnmetrics import _ops


def skip_without(device):
    """Skip a ``cuda`` case without a GPU and attnmetrics' CUDA build."""
    if device == "cuda" and not (torch.cuda.is_available() and _ops.CUDA_KERNELS):
        pytest.skip("needs a CUDA GPU and attnmetrics' CUDA build")


def synchronised(fn, device):
    """fn, waiting for the GPU before returning, so that the timer sees the work."""
    if device != "cuda":
        return fn

    def run(*args, **kwargs):
        out = fn(*args, **kwargs)
        torch.cuda.synchronize()
        return out

    return run


def median_seconds(benchmark, fn):
    """The benchmark's median; under --benchmark-disable (CI's smoke run) one timed call of ``fn``."""
    if benchmark.stats is not None:
        return benchmark.stats.stats.median
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def timed(fn):
    """(fn(), its wall time in seconds), for the one-shot reference approaches."""
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def _status_mib(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) / 1024
    return math.nan


def peak_extra_mib(fn):
    """Peak resident memory above the current level while ``fn`` runs (Linux), in MiB; NaN elsewhere."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets the high-water mark VmHWM
    except OSError:
        return math.nan
    before = _status_mib("VmRSS")
    fn()
    return _status_mib("VmHWM") - before
