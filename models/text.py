"""Text -> token ids -> padded batches: the word vocabulary, on J&W's preprocessing and special
tokens (:mod:`attnmetrics.data.tokens`, which the data sets share).

Every encoded row is ``<SOS> w_1 ... w_n <EOS>``; the classifier masks the two special
positions out of attention (docs/definitions.md §1), so ``lengths`` count them and ``lead = trail = 1``.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch
from torch import Tensor

from attnmetrics.data.tokens import EOS, SOS, SPECIALS, UNK, tokenize


class Batch(NamedTuple):
    """One padded batch. tokens [B, T] int64 (0 = ``<PAD>``); lengths [B] int64 counting
    ``<SOS>``/``<EOS>``; labels [B] int64; index [B] int64 = rows' positions in their split."""

    tokens: Tensor
    lengths: Tensor
    labels: Tensor
    index: Tensor


def collate(ids: Sequence[Sequence[int]]) -> tuple[Tensor, Tensor]:
    """Pad id lists to ``tokens [B, T] int64`` (with ``<PAD>`` = 0) and ``lengths [B] int64``."""
    lengths = torch.tensor([len(row) for row in ids], dtype=torch.int64)
    tokens = torch.zeros(len(ids), int(lengths.max()) if len(ids) else 0, dtype=torch.int64)
    for i, row in enumerate(ids):
        tokens[i, : len(row)] = torch.as_tensor(row, dtype=torch.int64)
    return tokens, lengths


@dataclass
class EncodedSplit:
    """A split as token id lists (each wrapped in ``<SOS> … <EOS>``) and integer labels;
    ``truncated``: how many of its texts the encoder cut to its length limit."""

    ids: list[list[int]]
    labels: list[int]
    truncated: int = 0

    def __len__(self) -> int:
        return len(self.ids)

    def batches(
        self, batch_size: int, shuffle: bool = False, generator: torch.Generator | None = None, by_length: bool = False
    ) -> Iterator[Batch]:
        """Yield padded batches; with ``shuffle`` the order is a permutation drawn from
        ``generator`` (so a seeded generator gives the same batches every run). With
        ``by_length`` (J&W's code) the rows are sorted by length (stable) and cut into
        consecutive batches, and ``shuffle`` permutes the batches, not the rows."""
        n = len(self.ids)
        if by_length:
            order = torch.argsort(torch.tensor([len(r) for r in self.ids]), stable=True)
            starts = torch.arange(0, n, batch_size)
            starts = starts[torch.randperm(len(starts), generator=generator)] if shuffle else starts
        else:
            order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
            starts = torch.arange(0, n, batch_size)
        for start in starts.tolist():
            index = order[start : start + batch_size]
            tokens, lengths = collate([self.ids[i] for i in index.tolist()])
            labels = torch.tensor([self.labels[i] for i in index.tolist()], dtype=torch.int64)
            yield Batch(tokens, lengths, labels, index)

    def subset(self, n: int) -> EncodedSplit:
        """The first ``n`` rows (for quick runs and tests)."""
        return EncodedSplit(self.ids[:n], self.labels[:n])


class TextEncoder:
    """What turns texts into id lists (a word vocabulary, a BPE, a model's own tokenizer); a
    subclass gives ``encode(texts) -> list[list[int]]`` and gets :meth:`encode_split`. One that
    cuts texts to a length limit says how many it cut in its last ``encode`` (``last_truncated``)."""

    last_truncated: int = 0

    def encode(self, texts: Iterable[str]) -> list[list[int]]:
        raise NotImplementedError

    def encode_split(self, pairs: Iterable[tuple[str, int]]) -> EncodedSplit:
        """``(text, label)`` pairs -> :class:`EncodedSplit` (with how many texts were cut)."""
        pairs = list(pairs)
        ids = self.encode(t for t, _ in pairs)
        return EncodedSplit(ids, [int(y) for _, y in pairs], self.last_truncated)


class Vocabulary(TextEncoder):
    """Word <-> id map; ids 0–3 are ``<PAD> <UNK> <SOS> <EOS>``, then words by frequency."""

    def __init__(self, words: Iterable[str]):
        self.itos: list[str] = list(SPECIALS)
        for w in words:
            if w in SPECIALS:
                raise ValueError(f"word {w!r} clashes with a special token")
            self.itos.append(w)
        self.stoi: dict[str, int] = {w: i for i, w in enumerate(self.itos)}
        if len(self.stoi) != len(self.itos):
            raise ValueError("vocabulary words must be unique")

    @classmethod
    def build(cls, texts: Iterable[str], min_count: int = 1, max_size: int | None = None) -> Vocabulary:
        """Vocabulary of the tokens seen at least ``min_count`` times in ``texts`` (the
        training split only, so dev/test words the model never trained on map to ``<UNK>``).
        Ordered by count, ties alphabetically, so it is the same on every run."""
        counts = Counter(tok for text in texts for tok in tokenize(text))
        words = sorted((w for w, c in counts.items() if c >= min_count), key=lambda w: (-counts[w], w))
        return cls(words[:max_size] if max_size is not None else words)

    def __len__(self) -> int:
        return len(self.itos)

    def __contains__(self, word: str) -> bool:
        return word in self.stoi

    def encode_text(self, text: str) -> list[int]:
        """One text -> ``[SOS, ids..., EOS]``."""
        return [SOS] + [self.stoi.get(tok, UNK) for tok in tokenize(text)] + [EOS]

    def encode(self, texts: Iterable[str]) -> list[list[int]]:
        """Texts -> id lists, each wrapped in ``<SOS> … <EOS>``."""
        return [self.encode_text(t) for t in texts]

    def decode(self, ids: Iterable[int]) -> list[str]:
        return [self.itos[i] for i in ids]

    def save(self, path: str | os.PathLike) -> None:
        Path(path).write_text(json.dumps({"specials": list(SPECIALS), "words": self.itos[len(SPECIALS) :]}))

    @classmethod
    def load(cls, path: str | os.PathLike) -> Vocabulary:
        """Read a file written by :meth:`save`; ValueError names a file that is not one."""
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
            words = data["words"]
        except (ValueError, KeyError, TypeError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            raise ValueError(f"{path}: cannot read the vocabulary (truncated or damaged: {e!r})") from None
        if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
            raise ValueError(
                f"{path}: cannot read the vocabulary (truncated or damaged: words is not a list of strings)"
            )
        if data.get("specials") != list(SPECIALS):
            raise ValueError(
                f"{path}: vocabulary was saved with specials {data.get('specials')}, expected {list(SPECIALS)}"
            )
        return cls(data["words"])
