"""The word vocabulary, padding and batches (attnmetrics.models.text)."""

from __future__ import annotations

import torch

from attnmetrics.data.tokens import EOS, PAD, SOS, UNK
from attnmetrics.models.text import EncodedSplit, Vocabulary, collate


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
