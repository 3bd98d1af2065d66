"""J&W's attention classifier: embed -> encode -> attend -> decode.

Implements ``attnmetrics.protocol.AttentionClassifier``. Encoders and attention layers are
small modules looked up by name (``ENCODERS``, ``ATTENTIONS``) so that others (CNN, average,
GRU; dot attention) can be added beside the BiLSTM and tanh attention without touching the
classifier.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence


def real_token_mask(lengths: Tensor, T: int, lead: int = 1, trail: int = 1) -> Tensor:
    """lengths [B] -> bool [B, T], True at the real tokens ``lead <= t < length - trail``."""
    t = torch.arange(T, device=lengths.device)
    return (t >= lead) & (t < (lengths - trail).unsqueeze(1))


class LSTMEncoder(nn.Module):
    """One-layer BiLSTM over packed sequences: [B, T, E], lengths [B] -> [B, T, 2·hidden],
    exactly zero on padding (so padding never leaks into contexts or gradients)."""

    def __init__(self, embed_dim: int, hidden_size: int = 128, bidirectional: bool = True):
        super().__init__()
        self.rnn = nn.LSTM(embed_dim, hidden_size, batch_first=True, bidirectional=bidirectional)
        self.output_size = hidden_size * (2 if bidirectional else 1)

    def forward(self, embedded: Tensor, lengths: Tensor) -> Tensor:
        T = embedded.shape[1]
        packed = pack_padded_sequence(embedded, lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, _ = self.rnn(packed)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=T)
        return out


class TanhAttention(nn.Module):
    """Additive attention (J&W, after Bahdanau): score_t = v · tanh(W h_t + b), softmax over
    the positions where ``mask`` is True; every other position gets exactly 0."""

    def __init__(self, hidden_size: int, attention_dim: int):
        super().__init__()
        self.proj = nn.Linear(hidden_size, attention_dim)
        self.v = nn.Linear(attention_dim, 1, bias=False)

    def forward(self, hidden: Tensor, mask: Tensor) -> Tensor:
        """hidden [B, T, H], mask [B, T] bool -> attention [B, T]."""
        scores = self.v(torch.tanh(self.proj(hidden))).squeeze(-1)
        weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
        # A row with no real token would be all NaN; zeros make its context the zero vector.
        return weights.masked_fill(~mask, 0.0)


ENCODERS = {"lstm": LSTMEncoder}
ATTENTIONS = {"tanh": TanhAttention}


@dataclass
class ModelConfig:
    """Everything needed to rebuild a classifier (saved as JSON beside the state_dict).

    ``num_classes == 1`` is one sigmoid logit for a binary task (J&W); ``>= 2`` softmax.
    ``attention_dim`` defaults to half the encoder's output (J&W: 256 -> 128)."""

    vocab_size: int
    embed_dim: int = 300
    hidden_size: int = 128
    num_classes: int = 1
    encoder: str = "lstm"
    attention: str = "tanh"
    attention_dim: int | None = None
    lead: int = 1
    trail: int = 1

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> ModelConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown model config keys: {sorted(unknown)}")
        return cls(**d)


class AttentionClassifier(nn.Module):
    """embedding -> encoder -> attention -> ``decoder = nn.Linear(H, C)``.

    ``forward(tokens [B, T], lengths [B])`` -> ``(logits [B, C], attention [B, T])``.
    ``lengths`` count ``<SOS>``/``<EOS>`` (``lead = trail = 1``), which attention masks out.
    """

    def __init__(self, config: ModelConfig, embeddings: Tensor | None = None):
        super().__init__()
        if config.encoder not in ENCODERS:
            raise ValueError(f"unknown encoder {config.encoder!r}; choose from {sorted(ENCODERS)}")
        if config.attention not in ATTENTIONS:
            raise ValueError(f"unknown attention {config.attention!r}; choose from {sorted(ATTENTIONS)}")
        if config.num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {config.num_classes}")
        self.config = config
        self.lead, self.trail = config.lead, config.trail
        self.embedding = nn.Embedding(config.vocab_size, config.embed_dim, padding_idx=0)
        if embeddings is not None:
            if tuple(embeddings.shape) != (config.vocab_size, config.embed_dim):
                raise ValueError(
                    f"embeddings must be [{config.vocab_size}, {config.embed_dim}], got {list(embeddings.shape)}"
                )
            with torch.no_grad():
                self.embedding.weight.copy_(embeddings)
                self.embedding.weight[0].zero_()
        self.encoder = ENCODERS[config.encoder](config.embed_dim, config.hidden_size)
        H = self.encoder.output_size
        self.attention = ATTENTIONS[config.attention](H, config.attention_dim or H // 2)
        self.decoder = nn.Linear(H, config.num_classes)

    def embed(self, tokens: Tensor) -> Tensor:
        """tokens [B, T] int64 -> embeddings [B, T, E]."""
        return self.embedding(tokens)

    def encode(self, embedded: Tensor, lengths: Tensor) -> Tensor:
        """embeddings [B, T, E], lengths [B] -> hidden states [B, T, H], zero on padding."""
        return self.encoder(embedded, lengths)

    def attend(self, hidden: Tensor, lengths: Tensor) -> Tensor:
        """hidden [B, T, H], lengths [B] -> attention [B, T]: sums to 1 over the real tokens,
        exactly 0 at ``<SOS>``, ``<EOS>`` and padding."""
        return self.attention(hidden, real_token_mask(lengths, hidden.shape[1], self.lead, self.trail))

    def forward(self, tokens: Tensor, lengths: Tensor, attention: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """tokens [B, T], lengths [B] -> (logits [B, C], attention [B, T]).

        ``attention`` [B, T], if given, is imposed instead of the model's own (uniform
        baselines, permutations, adversaries); it is returned as the attention used.
        """
        hidden = self.encode(self.embed(tokens), lengths)
        if attention is None:
            attention = self.attend(hidden, lengths)
        elif attention.shape != hidden.shape[:2]:
            raise ValueError(f"imposed attention must be [B, T] = {list(hidden.shape[:2])}, got {list(attention.shape)}")
        context = torch.bmm(attention.unsqueeze(1).to(hidden.dtype), hidden).squeeze(1)
        return self.decoder(context), attention

    def attention_parameters(self) -> list[nn.Parameter]:
        """The attention layer's parameters (J&W exempt them from weight decay)."""
        return list(self.attention.parameters())
