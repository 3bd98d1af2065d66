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
import os
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, fields

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnmetrics._validation import checked_ids
from attnmetrics.models.bpe import EXTRACT, PAD, START, BPETokenizer
from attnmetrics.models.classifier import ATTENTIONS, AttentionForward
from attnmetrics.models.gpt import GPT, GPTConfig, causal_mask
from attnmetrics.models.own_attention import extract_attention
from attnmetrics.models.text import TextEncoder
from attnmetrics.protocol import EXTRACT_READOUT, TestedAttention, token_mask

__all__ = ["PAD", "START", "EXTRACT", "GPTClassifier", "GPTClassifierConfig", "GPTInputs"]


@dataclass
class GPTClassifierConfig:
    """Everything that rebuilds a :class:`GPTClassifier` (a checkpoint's ``model.json``);
    ``encoder = "gpt"`` tells it apart from the BiLSTM family's ``ModelConfig``."""

    gpt: GPTConfig
    num_classes: int = 1
    attention: str = "tanh"
    lm_weight: float = 0.5
    encoder: str = "gpt"

    def to_dict(self) -> dict:
        return {**asdict(self), "gpt": self.gpt.to_dict()}

    @classmethod
    def from_dict(cls, d: dict) -> GPTClassifierConfig:
        unknown = set(d) - {f.name for f in fields(cls)}
        if unknown or d.get("encoder") != "gpt":
            raise ValueError(
                f"not a GPT classifier config (encoder {d.get('encoder')!r}, unknown keys {sorted(unknown)})"
            )
        return cls(**{**d, "gpt": GPTConfig.from_dict(d["gpt"])})


class GPTInputs(TextEncoder):
    """GPT-1's input transformation for classification (sec. 3.3): a text becomes
    ``[<start>] + BPE ids + [<extract>]``, its BPE ids cut to the first ``context - 2`` so the
    row fits the model. Plays the part the word :class:`~attnmetrics.models.text.Vocabulary`
    plays for the BiLSTM family (``encode_split``, ``save``, ``len``)."""

    filename = "tokenizer.json"

    def __init__(self, tokenizer: BPETokenizer, context: int):
        if context < 3:
            raise ValueError(f"context must be >= 3 (<start>, one token, <extract>), got {context}")
        self.tokenizer, self.context = tokenizer, context

    def __len__(self) -> int:
        return self.tokenizer.vocab_size

    def encode(self, texts: Iterable[str]) -> list[list[int]]:
        """Texts -> id lists ``[START, ids[: context - 2]..., EXTRACT]``."""
        keep = self.context - 2
        return [[START, *ids[:keep], EXTRACT] for ids in self.tokenizer.encode_batch(list(texts))]

    def decode(self, ids: Iterable[int]) -> list[str]:
        """Each id's text on its own (byte-level BPE: a word's first piece carries its space)."""
        return [self.tokenizer.decode([i], skip_special_tokens=False) for i in ids]

    def save(self, path: str | os.PathLike) -> None:
        self.tokenizer.save(path)


READOUTS = (*ATTENTIONS, EXTRACT_READOUT)


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
        if attention not in READOUTS:
            raise ValueError(f"unknown attention {attention!r}; choose from {sorted(READOUTS)}")
        if num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {num_classes}")
        if lm_weight < 0:
            raise ValueError(f"lm_weight must be >= 0, got {lm_weight}")
        self.num_classes = num_classes
        self.attention_name = attention
        self.lm_weight = float(lm_weight)
        self.gpt = GPT(config)
        d = config.d_model
        # GPT-1's own read-out has no attention layer (see attend)
        self.attention = None if attention == EXTRACT_READOUT else ATTENTIONS[attention](d, d // 2)
        self.context_dropout = nn.Dropout(config.dropout)  # GPT-1: 0.1 on the classifier's input
        self.decoder = nn.Linear(d, num_classes)

    @property
    def config(self) -> GPTClassifierConfig:
        return GPTClassifierConfig(self.gpt.config, self.num_classes, self.attention_name, self.lm_weight)

    @classmethod
    def from_config(cls, config: GPTClassifierConfig) -> GPTClassifier:
        return cls(config.gpt, config.num_classes, config.attention, config.lm_weight)

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
        T, config = tokens.shape[1], self.gpt.config
        if T > config.context:
            raise ValueError(f"sequence length {T} exceeds the model's context {config.context}")
        tokens = checked_ids(tokens, config.vocab_size)  # deferred inside a procedure (attnmetrics._deferred)
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
        exactly 0 at ``<start>``, ``<extract>`` and padding.

        With ``attention="extract"`` (GPT-1's read-out, sec. 3.3) all the weight is on each row's
        ``<extract>`` (its last position), so the decoder sees that state alone; no real token
        is weighed here, and the procedures test the model's own attention instead
        (:meth:`tested_attention`).
        """
        if self.attention is None:
            return F.one_hot(lengths - 1, hidden.shape[1]).to(hidden.dtype)
        return self.attention(hidden, token_mask(lengths, hidden.shape[1], self.lead, self.trail))

    def tested_attention(self, tokens: Tensor, lengths: Tensor) -> TestedAttention | None:
        """The attention the procedures test when it is not the head's: GPT-1's own, the last
        layer's ``<extract>`` row per head (models/own_attention.py), for ``attention="extract"``;
        None for a model with an attention head (its head's attention is the tested one)."""
        return None if self.attention is not None else extract_attention(self, tokens, lengths)

    def pooled(self, lengths: Tensor) -> Tensor:
        """[B] int64: the position whose final state GPT-1 classifies from, each row's
        ``<extract>`` (its last position); rollout's and attention flow's pooled row."""
        return lengths - 1

    def layer_attentions(self, tokens: Tensor, lengths: Tensor) -> Tensor:
        """Every block's causal self-attention probabilities ``[B, layers, heads, T, T]`` (query ×
        key, zero on later and padded keys), first to last: what :meth:`rollout` rolls out and
        :func:`attnmetrics.attention_flow` takes as its graph. The blocks alone (no language-model
        head); call in eval mode (no dropout). ValueError for lengths outside ``[1, T]``."""
        B, T = tokens.shape
        if lengths.shape != (B,) or bool(((lengths < 1) | (lengths > T)).any()):
            raise ValueError(f"lengths must be [B] = [{B}] with values in [1, {T}], got {lengths.tolist()}")
        mask = causal_mask(lengths, T)
        x, probs = self.embed(tokens), []
        for block in self.gpt.blocks:
            x, p = block(x, mask)
            probs.append(p)
        return torch.stack(probs, 1)

    @torch.no_grad()
    def rollout(self, tokens: Tensor, lengths: Tensor, residual: float = 0.5) -> Tensor:
        """Attention rollout's importance (Abnar & Zuidema 2020; docs/definitions.md §17): the
        ``<extract>`` row (:meth:`pooled`, each row's last position) of
        :func:`attnmetrics.attention_rollout` over every block's self-attention
        (:meth:`layer_attentions`), at the real tokens: ``[B, T - lead]``, zero past each row's.
        Call in eval mode (no dropout)."""
        from attnmetrics.rollout import attention_rollout

        B, T = tokens.shape
        rolled = attention_rollout(self.layer_attentions(tokens, lengths), lengths, residual)  # [B, T, T]
        row = rolled[torch.arange(B, device=tokens.device), self.pooled(lengths)]
        return (row * token_mask(lengths, T, self.lead, self.trail))[:, self.lead :]

    def deletion_logits(self, embedded: Tensor, lengths: Tensor) -> Callable[[Tensor, Tensor], Tensor]:
        """Prepare the one-token deletions of rows ``embedded [G, T, d]`` (:meth:`embed`'s),
        ``lengths [G]``; returns ``logits(rows [N], positions [N])`` (int64) -> ``[N, C]``, the
        logits on row ``rows[i]`` with position ``positions[i]`` deleted, as ``forward`` gives
        them on the shortened rows. Used by ``attnmetrics.leave_one_out`` (J&W sec. 4.1).

        The model is causal, so deleting position p leaves every state before p unchanged, in
        every layer: the rows' keys and values are computed once here, and a call recomputes
        only its deletions' suffixes (from its smallest position on; the tokens after p move one
        position left, so they get the position embeddings of their new places), each layer's
        queries attending to the cached prefix keys and values. In eval mode (no dropout).
        """
        return self._one_token_logits(embedded, lengths, None)

    def masking_logits(self, embedded: Tensor, lengths: Tensor, mask_token: int) -> Callable[[Tensor, Tensor], Tensor]:
        """:meth:`deletion_logits` with position ``positions[i]`` replaced by ``mask_token``
        instead of deleted (``leave_one_out(mode="mask")``): the same prefix reuse; the tokens
        after p keep their positions."""
        if not 0 <= mask_token < self.gpt.config.vocab_size:
            raise ValueError(f"mask_token must be an id in [0, {self.gpt.config.vocab_size}), got {mask_token}")
        replacement = self.gpt.tokens(torch.tensor(mask_token, device=embedded.device)).to(embedded.dtype)
        return self._one_token_logits(embedded, lengths, replacement)

    def _one_token_logits(
        self, embedded: Tensor, lengths: Tensor, replacement: Tensor | None
    ) -> Callable[[Tensor, Tensor], Tensor]:
        """deletion_logits (``replacement`` None) or masking_logits (``replacement [d]``, the mask
        token's word embedding)."""
        G, T, _ = embedded.shape
        blocks, positions_weight = self.gpt.blocks, self.gpt.positions.weight
        word = embedded - positions_weight[:T]  # embed added the position embeddings: take them off
        mask = causal_mask(lengths, T)
        cache, x = [], embedded
        for block in blocks:
            cache.append(block.attn.heads(x)[1:])  # this layer's keys and values [G, H, T, d/H]
            x, _ = block(x, mask)
        hidden = x * token_mask(lengths, T).unsqueeze(-1).to(x.dtype)

        masked = replacement is not None
        kept = lengths if masked else lengths - 1  # each result's length

        def logits(rows: Tensor, positions: Tensor) -> Tensor:
            start = int(positions.min())  # the states of every deletion before it are cached
            short = kept[rows]
            W = int(short.max())
            new = torch.arange(start, W, device=rows.device)  # recomputed positions of the edited rows
            # the shortened row's position j holds the original token j, or j + 1 from the deleted
            # one on; a masked row's holds token j
            at = new.unsqueeze(0) >= positions.unsqueeze(1)
            old = (new.unsqueeze(0) + (0 if masked else at)).clamp(max=T - 1)
            # packed: the suffixes' real positions only, so the position-wise maps skip the padding
            where = token_mask(short - start, W - start)  # [N, W - start]
            words = word[rows.unsqueeze(1), old]
            if masked:
                words[new.unsqueeze(0) == positions.unsqueeze(1)] = replacement
            x = (words + positions_weight[start:W])[where]  # [M, d]
            suffix_mask = causal_mask(short, W)[:, :, start:]  # [N, 1, W - start, W]
            for block, (k, v) in zip(blocks, cache):
                x, _ = block(x, suffix_mask, (k[rows, :, :start], v[rows, :, :start]), where)
            suffix = x.new_zeros(*where.shape, x.shape[-1]).index_put_((where,), x)
            h = torch.cat([hidden[rows, :start], suffix], 1)  # zero on padding
            attention = self.attend(h, short)
            return self.decoder(torch.bmm(attention.unsqueeze(1).to(h.dtype), h).squeeze(1))

        # what a call holds per position of its deletions: about 16·d activations (queries, keys,
        # values, the feed-forward's 4·d twice, residuals) and the heads' scores and probabilities
        config = self.gpt.config
        logits.position_bytes = (16 * config.d_model + 2 * config.n_head * T) * embedded.element_size()
        return logits

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
        return [] if self.attention is None else list(self.attention.parameters())
