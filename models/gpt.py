"""GPT-1's language model (Radford et al. 2018, "Improving Language Understanding by Generative
Pre-Training", sec. 3.1 and 4.1), in plain torch.

A decoder-only transformer: token + learned position embeddings, ``n_layer`` blocks of causal
multi-head self-attention and a GELU feed-forward of width 4·d, each wrapped in a POST-layer-norm
residual as in GPT-1 (``x = LN(x + attn(x))``, ``x = LN(x + mlp(x))``; GPT-2 later moved the norm
in front), dropout 0.1 on the embeddings, the attention probabilities and each residual branch,
and an output layer tied to the token embedding (its weight *is* the embedding's tensor).

Every attention probability comes from one function, :func:`attention` (called through
:meth:`CausalSelfAttention.attention`), so later work can intervene in it in one place.

Padding: ``forward(tokens [B, T], lengths [B])`` treats each row as if it were alone: a position
sees only positions at or before it (causal) and within its row's length; padding is never
attended, and padding positions attend to nothing (their probabilities are exactly 0).
"""

from __future__ import annotations

import numbers
from dataclasses import asdict, dataclass, fields, replace
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnmetrics.protocol import causal_mask

#: Named sizes (``GPTConfig.named``). ``gpt1`` is the paper's (sec. 4.1: 12 layers, d = 768,
#: 12 heads, 512 positions; 117M parameters with its 40k vocabulary). ``small`` is the default:
#: 4 layers, d = 256, 4 heads, 128 positions — 3.2M parameters in the blocks plus 2.1M in the
#: 8,192-token embedding (5.3M in all). Measured on one CPU thread (torch 2.13, float32, a training
#: step of 16 × 128 tokens with backward and AdamW) it runs at 1,435 tokens/s (800 when the other
#: core is busy too), so the default 600-step pre-training run (1.2M tokens, about 0.4 passes over
#: the Gutenberg training books; models/pretraining.py) takes some 15 minutes on one free core.
CONFIGS: dict[str, dict] = {
    "gpt1": {"n_layer": 12, "d_model": 768, "n_head": 12, "context": 512},
    "small": {"n_layer": 4, "d_model": 256, "n_head": 4, "context": 128},
}

#: the largest value of each size field: far past any model this toolkit trains (GPT-1: 12
#: layers, 12 heads, width 768, context 512, 40,478 ids), and small enough that a corrupt or
#: hostile config (``"n_layer": 1000000``) is refused before a module is built
MAX_SIZES: dict[str, int] = {"vocab_size": 1 << 20, "n_layer": 256, "d_model": 16384, "n_head": 256, "context": 16384}


@dataclass
class GPTConfig:
    """Everything needed to rebuild a :class:`GPT` (saved as JSON beside its weights).
    The defaults are the ``small`` configuration; ``dropout`` (0.1 in GPT-1) applies to the
    embeddings, the attention probabilities and both residual branches."""

    vocab_size: int
    n_layer: int = 4
    d_model: int = 256
    n_head: int = 4
    context: int = 128
    dropout: float = 0.1

    def __post_init__(self):
        for name, most in MAX_SIZES.items():
            value = getattr(self, name)
            if not isinstance(value, numbers.Integral) or isinstance(value, bool):
                raise ValueError(f"{name} must be an integer, got {value!r}")
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
            if value > most:
                raise ValueError(f"{name} must be <= {most} (the largest size this toolkit builds), got {value}")
        if self.d_model % self.n_head:
            raise ValueError(f"d_model ({self.d_model}) must be a multiple of n_head ({self.n_head})")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"dropout must lie in [0, 1), got {self.dropout}")

    @classmethod
    def named(cls, name: str, vocab_size: int, **overrides) -> GPTConfig:
        """One of :data:`CONFIGS` for a vocabulary, with any field overridden."""
        if name not in CONFIGS:
            raise ValueError(f"unknown GPT config {name!r}; choose from {sorted(CONFIGS)}")
        return cls(vocab_size=vocab_size, **{**CONFIGS[name], **overrides})

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> GPTConfig:
        unknown = set(d) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown GPT config keys: {sorted(unknown)}")
        return cls(**d)

    def replace(self, **changes) -> GPTConfig:
        return replace(self, **changes)


def attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Scaled dot-product attention (Vaswani et al. 2017, eq. 1).

    q, k, v ``[B, H, T, D]``; mask ``[B, 1, T, T]`` (or anything broadcasting to
    ``[B, H, T, T]``) bool, True where query t may see key s. Returns ``(out [B, H, T, D],
    probs [B, H, T, T])``: each row of ``probs`` is a softmax over its visible keys, exactly 0
    on the others; a row with no visible key (a padding query) is all 0 and its output 0.
    """
    scores = (q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5)
    # A finite fill, not -inf: a row with no visible key then gives no NaN, in the forward
    # pass or the backward, and is zeroed below.
    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    probs = torch.softmax(scores, dim=-1).masked_fill(~mask, 0.0)
    return probs @ v, probs


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention: [B, T, d], mask -> ([B, T, d], probs [B, heads, T, T])."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.n_head = config.n_head
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.proj = nn.Linear(config.d_model, config.d_model)
        self.attn_dropout = nn.Dropout(config.dropout)
        self.resid_dropout = nn.Dropout(config.dropout)

    def attention(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        """The one place probabilities are made (:func:`attention`); patch this (on the class or
        one layer) to intervene. Dropout hits the values' weights, never the returned probs."""
        _, probs = attention(q, k, v, mask)
        return self.attn_dropout(probs) @ v, probs

    def heads(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """[B, T, d] -> queries, keys, values, each [B, heads, T, d / heads]."""
        return self._split(self.qkv(x))

    def _split(self, qkv: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        B, T, three_d = qkv.shape
        q, k, v = qkv.view(B, T, 3, self.n_head, three_d // (3 * self.n_head)).permute(2, 0, 3, 1, 4)
        return q, k, v

    def forward(
        self, x: Tensor, mask: Tensor, past: tuple[Tensor, Tensor] | None = None, where: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """``past``: the keys and values ``[B, heads, P, d / heads]`` of ``P`` positions before
        ``x``'s (a cached prefix); ``mask`` is then ``[B, 1, T, P + T]``. ``where`` (bool
        ``[B, T]``): ``x`` is ``[M, d]``, the states of those positions only (packed, no padding),
        and so is the output; the position-wise maps then skip the padding."""
        qkv = self.qkv(x)
        if where is not None:  # lay the packed positions out for the attention
            qkv = qkv.new_zeros(*where.shape, qkv.shape[-1]).index_put_((where,), qkv)
        q, k, v = self._split(qkv)
        if past is not None:
            k, v = torch.cat([past[0], k], 2), torch.cat([past[1], v], 2)
        out, probs = self.attention(q, k, v, mask)
        out = out.transpose(1, 2).flatten(2)
        return self.resid_dropout(self.proj(out if where is None else out[where])), probs


class MLP(nn.Module):
    """Position-wise feed-forward: d -> 4·d -> GELU -> d (GPT-1 sec. 4.1), dropout on the output."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(config.d_model, 4 * config.d_model)
        self.proj = nn.Linear(4 * config.d_model, config.d_model)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        # GPT-1's GELU is the tanh approximation (Hendrycks & Gimpel 2016)
        return self.dropout(self.proj(F.gelu(self.fc(x), approximate="tanh")))


class Block(nn.Module):
    """One post-LN transformer block: x = LN(x + attn(x)); x = LN(x + mlp(x))."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.attn = CausalSelfAttention(config)
        self.ln_1 = nn.LayerNorm(config.d_model)
        self.mlp = MLP(config)
        self.ln_2 = nn.LayerNorm(config.d_model)

    def forward(
        self, x: Tensor, mask: Tensor, past: tuple[Tensor, Tensor] | None = None, where: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """``past`` (a cached prefix's keys and values) and ``where`` (packed positions): as in
        :meth:`CausalSelfAttention.forward`; everything after the attention is position-wise."""
        a, probs = self.attn(x, mask, past, where)
        x = self.ln_1(x + a)
        return self.ln_2(x + self.mlp(x)), probs


class GPTOutput(NamedTuple):
    """logits [B, T, V] (position t predicts token t + 1), hidden [B, T, d] (the last block's
    output), attentions: one probs [B, heads, T, T] per layer, or None when not asked for."""

    logits: Tensor
    hidden: Tensor
    attentions: tuple[Tensor, ...] | None


class GPT(nn.Module):
    """GPT-1's decoder: ``forward(tokens [B, T] int64, lengths [B] | None)`` -> :class:`GPTOutput`.

    ``lengths`` (int64, 1 <= length <= T) marks right padding; None means every row is full.
    Outputs at padding positions are finite but meaningless. ``T`` may not exceed ``context``.
    """

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.tokens = nn.Embedding(config.vocab_size, config.d_model)
        self.positions = nn.Embedding(config.context, config.d_model)
        self.dropout = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.lm_head.weight = self.tokens.weight  # tied (GPT-1's W_e, sec. 3.1)
        self.apply(self._init)

    @staticmethod
    def _init(module: nn.Module) -> None:
        # GPT-1 sec. 4.1: "weight initialization of N(0, 0.02) was sufficient"; zero biases.
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, 0.0, 0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, tokens: Tensor, lengths: Tensor | None = None, return_attention: bool = False) -> GPTOutput:
        """Raises ValueError for a sequence longer than the context or lengths outside [1, T]."""
        B, T = tokens.shape
        if T > self.config.context:
            raise ValueError(f"sequence length {T} exceeds the model's context {self.config.context}")
        if lengths is None:
            lengths = torch.full((B,), T, dtype=torch.int64, device=tokens.device)
        elif lengths.shape != (B,) or bool(((lengths < 1) | (lengths > T)).any()):
            raise ValueError(f"lengths must be [B] = [{B}] with values in [1, {T}], got {lengths.tolist()}")
        mask = causal_mask(lengths, T)
        pos = torch.arange(T, device=tokens.device)
        x = self.dropout(self.tokens(tokens) + self.positions(pos))
        attentions = []
        for block in self.blocks:
            x, probs = block(x, mask)
            attentions.append(probs)
        return GPTOutput(self.lm_head(x), x, tuple(attentions) if return_attention else None)

    def num_parameters(self) -> int:
        """Distinct parameters (the tied output weight counted once)."""
        return sum(p.numel() for p in self.parameters())
