"""GPT-1 fine-tuned as an attention classifier (Radford et al. 2018, sec. 3.2-3.3).

Implements ``attnmetrics.protocol.AttentionClassifier`` on top of a :class:`~attnmetrics.models.gpt.GPT`:

- input transformation ``<start> text <extract>`` (the BPE tokenizer's ids 1 and 3, ``<pad>`` = 0),
  so ``lead = trail = 1``;
- ``embed``: token + position embeddings (and the GPT's embedding dropout);
- ``encode``: the transformer blocks under the causal + padding mask, the last block's states
  ``[B, T, d]``, exactly zero on padding;
- ``attend``: one of models/classifier.py's attention heads (:data:`ATTENTIONS`: ``tanh``,
  ``dot``, ``uniform``) over the real tokens ``lead .. length - trail - 1``. GPT-1 itself
  classifies from the ``<extract>`` state alone; the attention head replaces that read-out so
  the procedures have an attention distribution to test;
- ``decoder = nn.Linear(d, C)`` on the attention's context (C = 1: one sigmoid logit).

:meth:`GPTClassifier.auxiliary_loss` is GPT-1's auxiliary language-model objective
(sec. 3.2, L3 = L2 + λ·L1): ``lm_weight`` times the next-token cross-entropy through the tied
output layer. :meth:`GPTClassifier.from_pretrained` transfers the embeddings and the first
``transfer_layers`` blocks of a pre-trained GPT (the Figure 2 ablation); the constructor alone
is the no-pre-training ablation.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnmetrics.models.classifier import ATTENTIONS, AttentionForward
from attnmetrics.models.gpt import GPT, GPTConfig, causal_mask
from attnmetrics.protocol import token_mask

#: GPT-1's input transformation for classification: ``<start> text <extract>`` (models/bpe.py)
PAD, START, EXTRACT = 0, 1, 3


class GPTClassifier(AttentionForward, nn.Module):
    """A GPT's transformer -> attention head -> ``decoder = nn.Linear(d, C)``.

    ``forward(tokens [B, T], lengths [B], attention=None)`` -> ``(logits [B, C], attention [B, T])``;
    ``lengths`` count ``<start>`` and ``<extract>``. ``lm_weight`` (λ, GPT-1: 0.5) scales the
    auxiliary language-model loss; 0 turns it off.
    """

    lead = 1
    trail = 1

    def __init__(self, config: GPTConfig, num_classes: int = 1, attention: str = "tanh", lm_weight: float = 0.5):
        super().__init__()
        if attention not in ATTENTIONS:
            raise ValueError(f"unknown attention {attention!r}; choose from {sorted(ATTENTIONS)}")
        if num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {num_classes}")
        if lm_weight < 0:
            raise ValueError(f"lm_weight must be >= 0, got {lm_weight}")
        self.num_classes = num_classes
        self.attention_name = attention
        self.lm_weight = float(lm_weight)
        self.gpt = GPT(config)
        d = config.d_model
        self.attention = ATTENTIONS[attention](d, d // 2)
        self.decoder = nn.Linear(d, num_classes)

    @property
    def config(self) -> GPTConfig:
        return self.gpt.config

    @classmethod
    def from_pretrained(
        cls,
        pretrained_gpt,
        num_classes: int = 1,
        attention: str = "tanh",
        lm_weight: float = 0.5,
        transfer_layers: int | None = None,
    ) -> GPTClassifier:
        """A classifier whose embeddings and first ``transfer_layers`` blocks (None: all) are
        copies of ``pretrained_gpt``'s (a :class:`GPT` or ``load_gpt``'s ``Pretrained``); the
        other blocks, the attention head and the decoder are freshly initialised. The source
        model is left untouched (the copies share no storage with it)."""
        gpt = getattr(pretrained_gpt, "model", pretrained_gpt)
        if not isinstance(gpt, GPT):
            raise TypeError(f"expected a GPT or a Pretrained, got {type(pretrained_gpt).__name__}")
        n = gpt.config.n_layer
        k = n if transfer_layers is None else transfer_layers
        if not 0 <= k <= n:
            raise ValueError(f"transfer_layers must lie in [0, {n}], got {transfer_layers}")
        model = cls(copy.deepcopy(gpt.config), num_classes, attention, lm_weight)
        device = next(gpt.parameters()).device
        model.to(device=device, dtype=gpt.tokens.weight.dtype)
        with torch.no_grad():
            model.gpt.tokens.weight.copy_(gpt.tokens.weight)  # also the tied output layer
            model.gpt.positions.weight.copy_(gpt.positions.weight)
            for i in range(k):
                model.gpt.blocks[i].load_state_dict(gpt.blocks[i].state_dict())
        return model

    def embed(self, tokens: Tensor) -> Tensor:
        """tokens [B, T] int64 -> token + position embeddings [B, T, d] (embedding dropout applied).
        ValueError for ids outside the vocabulary or T beyond the context."""
        T = tokens.shape[1]
        if T > self.config.context:
            raise ValueError(f"sequence length {T} exceeds the model's context {self.config.context}")
        if tokens.numel():
            low, high = torch.aminmax(tokens)
            if low < 0 or high >= self.config.vocab_size:
                raise ValueError(
                    f"tokens must be ids in [0, vocab_size) = [0, {self.config.vocab_size}), got min {int(low)}, "
                    f"max {int(high)}"
                )
        pos = torch.arange(T, device=tokens.device)
        return self.gpt.dropout(self.gpt.tokens(tokens) + self.gpt.positions(pos))

    def encode(self, embedded: Tensor, lengths: Tensor) -> Tensor:
        """embeddings [B, T, d], lengths [B] -> the last block's states [B, T, d], zero on padding."""
        T = embedded.shape[1]
        mask = causal_mask(lengths, T)
        x = embedded
        for block in self.gpt.blocks:
            x, _ = block(x, mask)
        return x * token_mask(lengths, T).unsqueeze(-1).to(x.dtype)

    def attend(self, hidden: Tensor, lengths: Tensor) -> Tensor:
        """hidden [B, T, d], lengths [B] -> attention [B, T]: sums to 1 over the real tokens,
        exactly 0 at ``<start>``, ``<extract>`` and padding."""
        return self.attention(hidden, token_mask(lengths, hidden.shape[1], self.lead, self.trail))

    def lm_loss(self, tokens: Tensor, lengths: Tensor, hidden: Tensor) -> Tensor:
        """GPT-1's L1 (unweighted): mean next-token cross-entropy, position t predicting token
        t + 1 through the tied output layer, over every row's positions ``0 .. length - 2``."""
        T = tokens.shape[1]
        valid = token_mask(lengths - 1, T - 1)  # [B, T - 1]: t + 1 < length
        logits = self.gpt.lm_head(hidden[:, :-1][valid])  # [N, V]
        return F.cross_entropy(logits, tokens[:, 1:][valid])

    def auxiliary_loss(self, tokens: Tensor, lengths: Tensor, embedded: Tensor, hidden: Tensor) -> Tensor | None:
        """``lm_weight`` · :meth:`lm_loss` (GPT-1 sec. 3.2's λ·L1), or None when ``lm_weight`` is 0.
        ``embedded`` is unused (kept for the objective's common signature)."""
        if self.lm_weight == 0:
            return None
        if bool((lengths < 2).all()):
            return hidden.sum() * 0.0  # no position has a next token
        return self.lm_weight * self.lm_loss(tokens, lengths, hidden)

    def attention_parameters(self) -> list[nn.Parameter]:
        """The attention head's parameters (exempt from weight decay, as for J&W's classifier)."""
        return list(self.attention.parameters())
