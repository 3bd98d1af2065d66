"""A tiny attention classifier implementing the protocol, independent of models/ (for procedure tests)."""

import torch
from torch import nn


class ToyClassifier(nn.Module):
    lead, trail = 1, 1

    def __init__(self, vocab=30, dim=6, hidden=5, classes=2, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.embedding = nn.Embedding(vocab, dim)
        self.proj = nn.Linear(dim, hidden)
        self.score = nn.Linear(hidden, 1)
        self.decoder = nn.Linear(hidden, classes)
        self.double()

    def embed(self, tokens):
        return self.embedding(tokens)

    def encode(self, embedded, lengths):
        mask = torch.arange(embedded.shape[1]) < lengths[:, None]
        # mixes neighbours so a token's gradient depends on the context, as an RNN's would
        h = torch.tanh(self.proj(embedded + 0.5 * torch.roll(embedded, 1, dims=1)))
        return h * mask[..., None]

    def attend(self, hidden, lengths):
        t = torch.arange(hidden.shape[1])
        real = (t >= self.lead) & (t < (lengths - self.trail)[:, None])
        s = self.score(hidden).squeeze(-1).masked_fill(~real, float("-inf"))
        return torch.softmax(s, dim=1)


def toy_batch(rows=4, width=9, vocab=30, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, width + 1, (rows,), generator=g)
    lengths[0] = width
    tokens = torch.randint(1, vocab, (rows, width), generator=g)
    tokens[torch.arange(width) >= lengths[:, None]] = 0
    return tokens, lengths


class ProtocolOnly:
    """``model`` through the protocol's members alone (no ``deletion_logits`` or other
    capability): leave-one-out builds its edits with the ``leave_one_out_batch`` kernel and runs
    the whole model, as for a transformer. ``encode_calls`` counts the model calls."""

    def __init__(self, model):
        self.model, self.lead, self.trail, self.decoder = model, model.lead, model.trail, model.decoder
        self.encode_calls = 0

    def embed(self, tokens):
        return self.model.embed(tokens)

    def encode(self, embedded, lengths):
        self.encode_calls += 1
        return self.model.encode(embedded, lengths)

    def attend(self, hidden, lengths):
        return self.model.attend(hidden, lengths)
