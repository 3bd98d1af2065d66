"""Shared inputs of the tests and benchmarks: the checkout's paths, the real SST (when
ATTNMETRICS_SST_DIR names it) and a small SST-format sample the tests write themselves, ragged
attention batches and small decoders (float64 unless asked)."""

import errno
import math
import os
import random
from pathlib import Path

import torch
from torch import nn

F64 = torch.float64

#: the checkout's root
ROOT = Path(__file__).resolve().parents[1]
#: the real Stanford Sentiment Treebank (train/dev/test.txt), never in the checkout: the folder
#: that ATTNMETRICS_SST_DIR names (CI sets it), else None. Tests that read it carry the ``sst``
#: mark and skip without it (conftest.py); the rest run on SST_SAMPLE.
SST_DIR = Path(os.environ["ATTNMETRICS_SST_DIR"]) if os.environ.get("ATTNMETRICS_SST_DIR") else None


def _sample_tree(rng: random.Random) -> str:
    """One PTB-format sentence: filler words and sentiment words, the root label the sign of
    their balance (0-1 negative, 3-4 positive, 2 neutral: dropped by the binary loader)."""
    good, bad = ("good", "great", "moving", "funny", "fine", "warm"), ("bad", "dull", "awful", "flat", "weak", "cold")
    filler = ("the", "film", "a", "story", "is", "and", "its", "cast", "plot", "very", "with", "of", "this", "movie")
    words = [rng.choice(filler) for _ in range(rng.randint(3, 14))]
    score = 0
    for _ in range(rng.randint(1, 3)):
        polarity = rng.choice((1, -1))
        score += polarity
        words.insert(rng.randrange(len(words) + 1), rng.choice(good if polarity > 0 else bad))
    label = 2 if score == 0 else (4 if score > 1 else 3) if score > 0 else (0 if score < -1 else 1)
    return f"({label} " + " ".join(f"(2 {w})" for w in words) + " (2 .))"


def write_sst_sample(folder: Path, sizes=(400, 260, 1000), seed: int = 0) -> Path:
    """A small SST in the real files' format (PTB trees, train/dev/test.txt) written into
    ``folder``, for tests that need some data in SST's format rather than the real SST: the same
    files for a seed, each written atomically (concurrent test processes may write it)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    for name, size in zip(("train", "dev", "test"), sizes):
        text = "\n".join(_sample_tree(rng) for _ in range(size)) + "\n"
        path = folder / f"{name}.txt"
        if path.is_file() and path.read_text() == text:
            continue
        partial = folder / f".{name}.txt.{os.getpid()}"
        partial.write_text(text)
        os.replace(partial, path)
    return folder


#: a small SST-format sample (write_sst_sample), in the checkout's ignored build folder
SST_SAMPLE = write_sst_sample(ROOT / "build" / "test-data" / "sst-sample")

#: command-line flags of a quick run on the SST-format sample (a tiny model, one epoch)
QUICK_SST = [
    "--dataset",
    "sst",
    "--data-dir",
    str(SST_SAMPLE),
    "--limit",
    "160",
    "--epochs",
    "1",
    "--embeddings",
    "random",
    "--embed-dim",
    "24",
    "--hidden-size",
    "16",
    "--no-progress",
    "--threads",
    "1",
]
#: a short battery: fewer permutations and adversarial steps than J&W's
FAST_BATTERY = ["--permutations", "20", "--adversarial-steps", "20"]


def sentence_rows(seed: int = 0, rows: int = 6):
    """Rows of 1-8 random word ids (4..29) between <SOS>=2 and <EOS>=3, as the bundled classifiers
    take them: (ids as lists, tokens [B, T], lengths [B]) through ``models.text.collate``."""
    from attnmetrics.models.text import collate

    g = torch.Generator().manual_seed(seed)
    ids = [
        [2] + torch.randint(4, 30, (int(n),), generator=g).tolist() + [3]
        for n in torch.randint(1, 9, (rows,), generator=g)
    ]
    return ids, *collate(ids)


def batch(b=40, t=12, h=6, dtype=F64, seed=0, temperature=2.0, min_len=0):
    """Ragged batch: softmax attention over each prefix (zero on padding), random values."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_len, t + 1, (b,), generator=g)
    mask = torch.arange(t) < lengths[:, None]
    logits = torch.randn(b, t, generator=g, dtype=F64) * temperature
    att = torch.softmax(logits.masked_fill(~mask, -math.inf), 1).nan_to_num(0.0)
    values = torch.randn(b, t, h, generator=g, dtype=F64)
    return att.to(dtype), values.to(dtype), lengths


def heads_batch(b=30, heads=3, t=10, h=5, dtype=F64, seed=0, temperature=2.0, min_len=0, first=()):
    """Multi-head ragged batch: attention [B, heads, T], each head a softmax over the row's prefix
    (zero on padding), values [B, heads, T, H] (a transformer's per-head value vectors through
    its output projection). ``first``: lengths of the first rows (e.g. 0, 1)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_len, t + 1, (b,), generator=g)
    lengths[: len(first)] = torch.tensor(first, dtype=torch.int64)
    mask = (torch.arange(t) < lengths[:, None])[:, None, :]
    logits = torch.randn(b, heads, t, generator=g, dtype=F64) * temperature
    att = torch.softmax(logits.masked_fill(~mask, -math.inf), -1).nan_to_num(0.0)
    values = torch.randn(b, heads, t, h, generator=g, dtype=F64)
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


def ragged_batch(batch, lo, hi, hidden, *, temperature=2.0, shared_direction=0.5, seed=0, dtype=torch.float32):
    """The benchmarks' ragged batch: lengths uniform in [lo, hi], attention = softmax(temperature ·
    N(0, 1)) over each prefix (peaked enough that removing the top items matters, rarely one-hot),
    values N(0, 1) plus, with ``shared_direction``, a per-row multiple of one shared direction, so
    outputs range from confident (never flip) to near the decision boundary."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(lo, hi + 1, (batch,), generator=g)
    width = int(lengths.max())
    mask = torch.arange(width) < lengths[:, None]
    logits = torch.randn(batch, width, generator=g) * temperature
    attention = torch.softmax(logits.masked_fill(~mask, -math.inf), 1)
    direction = torch.randn(hidden, generator=g) if shared_direction else None
    values = torch.randn(batch, width, hidden, generator=g)
    if direction is not None:
        values += shared_direction * torch.randn(batch, 1, 1, generator=g) * direction
    return attention.to(dtype), values.to(dtype), lengths


def bench_decoder(kind, hidden, classes=2, seed=0):
    """The benchmarks' float32 decoders: ``linear`` (closed-form kernels) or a 64-unit tanh MLP."""
    torch.manual_seed(seed)
    if kind == "linear":
        return nn.Linear(hidden, classes)
    return nn.Sequential(nn.Linear(hidden, 64), nn.Tanh(), nn.Linear(64, classes)).eval()


def unwritable_folder(parent: Path, monkeypatch) -> None:
    """Make the folder ``parent`` unwritable: mode 0o500; where that binds nobody (root), the calls
    that would write in it fail as the kernel fails them (EACCES), existing paths as before."""
    parent.chmod(0o500)
    if not os.access(parent, os.W_OK):
        return
    real_mkdir, real_open = os.mkdir, os.open

    def inside(path) -> bool:
        return parent == Path(path).resolve() or parent in Path(path).resolve().parents

    def mkdir(path, *args, **kwargs):
        if inside(Path(path).parent) and not os.path.lexists(path):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(path))
        return real_mkdir(path, *args, **kwargs)

    def open_(path, flags, *args, **kwargs):
        if inside(Path(path).parent) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", mkdir)
    monkeypatch.setattr(os, "open", open_)
