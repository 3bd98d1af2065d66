"""Shared by the benchmark modules: the kernel's time whether or not pytest-benchmark measured
it, the peak memory a call adds (to show chunking keeps memory bounded), and the CUDA cases'
skip and synchronisation."""

import math
import statistics
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


def matmul_gmacs(n: int = 1024, repeats: int = 20, device: str = "cpu") -> float:
    """This process's multiply-add rate in GMAC/s at its torch threads (or on ``device``, TF32 as
    torch leaves it: off for matrix products): the best of ``repeats`` float32 ``n x n`` matrix
    products, the pace a transformer's dense layers can reach there."""
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    mm = synchronised(lambda: torch.mm(a, b), device)
    mm()  # warm: the library's kernels and buffers
    best = min(timed(mm)[1] for _ in range(repeats))
    return n**3 / best / 1e9


def encoder_macs(config, positions: int) -> int:
    """Multiply-adds of one forward pass of a BERT-like encoder (a Hugging Face ``config``:
    ``hidden_size`` d, ``intermediate_size`` d_ff, ``num_hidden_layers``, ``num_labels`` C) over a
    row of ``positions`` tokens at its own length: per layer 4 T d² (query, key, value, output),
    2 T² d (scores and mixing) and 2 T d d_ff (feed-forward), then the pooler and the classifier
    at the pooled position (d² + d C). The embeddings and LayerNorms (O(T d)) are left out: a
    floor, not an estimate."""
    t, d, f = positions, config.hidden_size, config.intermediate_size
    per_layer = 4 * t * d * d + 2 * t * t * d + 2 * t * d * f
    return config.num_hidden_layers * per_layer + d * d + d * config.num_labels


def floor_info(macs: int, seconds: float, rates: list[float] | None = None) -> dict:
    """``extra_info`` entries for a time against its multiply-add floor at this machine's rate:
    the median of ``rates`` (:func:`rounds_beside_rate`'s, read beside the timed rounds), else one
    reading now."""
    rate = statistics.median(rates) if rates else matmul_gmacs()
    floor = macs / (rate * 1e9)
    return dict(
        multiply_adds=int(macs),
        machine_gmacs=rate,
        machine_gmacs_by_round=list(rates or [rate]),
        multiply_add_floor_s=floor,
        times_floor=seconds / floor,
    )


def rounds_beside_rate(benchmark, fn, args=(), rounds=3):
    """(``fn(*args)``, its median seconds, the machine's multiply-add rate read before each round):
    one warm-up and ``rounds`` timed rounds of pytest-benchmark, :func:`matmul_gmacs` before each.
    This VM's rate moves by up to a fifth within minutes (60-79 GMAC/s in one session), so a floor
    from a rate read once, apart from the rounds, moved the ratio as much; read beside them, both
    sides see the same machine."""
    rates = []

    def setup():
        rates.append(matmul_gmacs())
        return args, {}

    result = benchmark.pedantic(fn, setup=setup, rounds=rounds, iterations=1, warmup_rounds=1)
    return result, median_seconds(benchmark, lambda: fn(*args)), rates[1:] or rates


#: the transformer benchmarks' random BERT classifiers: 4 layers, d = 256; all-MiniLM-L6-v2's shape;
#: and CI's smoke run's (under --benchmark-disable)
SMALL_BERT = dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024)
MINILM_BERT = dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536)
SMOKE_BERT = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)


def random_bert(shape: dict, smoke: bool, labels: int = 2):
    """(model, its Hugging Face config, a description): a random ``BertForSequenceClassification`` of
    ``shape`` (:data:`SMOKE_BERT` when ``smoke``) through our adapter, eval mode, CPU float32,
    seeded, offline; skips without transformers."""
    transformers = pytest.importorskip("transformers", reason="transformers is optional")
    from attnmetrics.models.hf import HFClassifier

    torch.manual_seed(0)
    shape = SMOKE_BERT if smoke else shape
    config = transformers.BertConfig(vocab_size=30522, num_labels=labels, **shape)
    model = HFClassifier(transformers.BertForSequenceClassification(config)).eval()
    return model, config, "random BertForSequenceClassification " + ", ".join(f"{k}={v}" for k, v in shape.items())
