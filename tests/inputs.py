"""Shared inputs of the tests and benchmarks: the checkout's paths (the real SST beside it),
ragged attention batches and small decoders (float64 unless asked)."""

import math
import os
from pathlib import Path

import torch
from torch import nn

F64 = torch.float64

#: the checkout's root
ROOT = Path(__file__).resolve().parents[1]
#: the real Stanford Sentiment Treebank (train/dev/test.txt), kept beside the checkout, never in it
SST_DIR = Path(os.environ.get("ATTNMETRICS_SST_DIR", ROOT.parent / "shared" / "data" / "sst"))


def batch(b=40, t=12, h=6, dtype=F64, seed=0, temperature=2.0, min_len=0):
    """Ragged batch: softmax attention over each prefix (zero on padding), random values."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_len, t + 1, (b,), generator=g)
    mask = torch.arange(t) < lengths[:, None]
    logits = torch.randn(b, t, generator=g, dtype=F64) * temperature
    att = torch.softmax(logits.masked_fill(~mask, -math.inf), 1).nan_to_num(0.0)
    values = torch.randn(b, t, h, generator=g, dtype=F64)
    return att.to(dtype), values.to(dtype), lengths


def linear(h, c, dtype=F64, seed=1):
    torch.manual_seed(seed)
    return nn.Linear(h, c).to(dtype)


def mlp(h, c, dtype=F64, seed=2):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(h, 8), nn.Tanh(), nn.Linear(8, c)).to(dtype).eval()


def make_decoder(kind, h, c, dtype=F64):
    return linear(h, c, dtype) if kind == "linear" else mlp(h, c, dtype)


def wrapped(dec):
    """The same map as `dec`, hidden from the closed-form path."""
    return lambda x: dec(x)


def gen(seed):
    return torch.Generator().manual_seed(seed)
