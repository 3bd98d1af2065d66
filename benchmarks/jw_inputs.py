"""Shared inputs of the benchmarks on J&W's BiLSTM: the model (random weights, a 5,000-word
vocabulary) and ragged <SOS> ... <EOS> rows of SST-like and IMDB-like lengths."""

from __future__ import annotations

import torch

from attnmetrics.models.classifier import EncoderAttentionClassifier, ModelConfig

VOCAB = 5000
# (batch, min real tokens, max real tokens); every row also holds <SOS> and <EOS>
CASES = {
    "sst": (1821, 10, 55),  # SST's test set size, its sentence lengths
    "imdb": (100, 20, 400),  # IMDB-like reviews
}


def make_model(seed=0, embed_dim=50):
    torch.manual_seed(seed)
    return EncoderAttentionClassifier(ModelConfig(VOCAB, embed_dim=embed_dim, hidden_size=128, num_classes=1)).eval()


def make_batch(batch, lo, hi, seed=0):
    """<SOS>=2, random ids in [4, VOCAB), <EOS>=3, padding 0; real lengths uniform in [lo, hi]."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(lo, hi + 1, (batch,), generator=g) + 2
    width = int(lengths.max())
    pos = torch.arange(width)
    tokens = torch.randint(4, VOCAB, (batch, width), generator=g)
    tokens[:, 0] = 2
    tokens[pos == (lengths - 1)[:, None]] = 3
    tokens[pos >= lengths[:, None]] = 0
    return tokens, lengths
