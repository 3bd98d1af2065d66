"""The small protocol that any attention classifier implements for the procedures, and one
forward pass through it.

embed -> encode -> attend -> decode (J&W 2019, sec. 2). ``lengths`` counts every
position of a row, special tokens included; ``attend`` returns attention that is
zero outside the real tokens. Procedures that work per token take the real-token
slice ``[lead : lengths - trail]`` where ``lead``/``trail`` are the numbers of
special positions (``<SOS>``/``<EOS>``) at each end.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import NamedTuple, Protocol

import torch
from torch import Tensor


class AttentionClassifier(Protocol):
    """What the procedures need of a model (typing only: check an object with
    :func:`is_attention_classifier`, not ``isinstance``, which Python >= 3.12 answers wrongly
    for an ``nn.Module`` whose ``decoder`` is a submodule)."""

    #: maps contexts [N, H] to logits [N, C]; an ``nn.Linear`` enables the closed-form kernels
    decoder: Callable[[Tensor], Tensor]
    #: special positions at the start and end of every row (``<SOS>``, ``<EOS>``)
    lead: int
    trail: int

    def embed(self, tokens: Tensor) -> Tensor:
        """tokens [B, T] int64 -> embeddings [B, T, E]."""

    def encode(self, embedded: Tensor, lengths: Tensor) -> Tensor:
        """embeddings [B, T, E], lengths [B] -> hidden states [B, T, H] (zero on padding)."""

    def attend(self, hidden: Tensor, lengths: Tensor) -> Tensor:
        """hidden [B, T, H] -> attention [B, T], summing to 1 over the real tokens."""

    # Optional, not part of the runtime check: leave_one_out uses it when present.
    # deletion_logits(embedded [G, T, E], lengths [G]) -> logits(rows [N], positions [N] int64)
    #   -> [N, C]: the logits on row ``rows[i]`` with position ``positions[i]`` deleted (length
    #   ``lengths[rows[i]] - 1``); lets a model reuse the work a deletion leaves unchanged.
    #   The returned callable may carry ``position_bytes`` (int): about what a call holds per
    #   position of its deletions, by which leave_one_out sizes the calls to its memory budget,
    #   and ``unedited_logits``, a callable () -> [G, C]: the logits of the rows themselves (as
    #   the model gives them, up to rounding), which leave_one_out then takes as the original
    #   outputs instead of running the model on the rows (the reuse has their states already).
    # masking_logits(embedded [G, T, E], lengths [G], mask_token: int) -> logits(rows, positions)
    #   -> [N, C]: the same with position ``positions[i]`` replaced by ``mask_token`` (the
    #   length unchanged), for leave_one_out(mode="mask").


#: the members every AttentionClassifier has: callables, then plain attributes
CALLABLE_MEMBERS = ("embed", "encode", "attend", "decoder")
ATTRIBUTE_MEMBERS = ("lead", "trail")


def missing_members(obj: object) -> list[str]:
    """The :class:`AttentionClassifier` members ``obj`` lacks (a callable member that is not
    callable counts as missing), in the protocol's order; ``[]`` when it implements the protocol.

    Looked up with ``getattr``, which sees an ``nn.Module``'s submodules and parameters (held in
    ``_modules``/``_parameters``). ``isinstance`` against a runtime-checkable Protocol does not
    since Python 3.12 (it uses ``inspect.getattr_static``), which is why the protocol is not
    runtime-checkable and this function exists.
    """
    missing = [name for name in CALLABLE_MEMBERS if not callable(getattr(obj, name, None))]
    return missing + [name for name in ATTRIBUTE_MEMBERS if not hasattr(obj, name)]


def is_attention_classifier(obj: object) -> bool:
    """True when ``obj`` has every member of :class:`AttentionClassifier` (``embed``,
    ``encode``, ``attend`` and ``decoder`` callable; ``lead`` and ``trail`` present), the same
    answer on every supported Python (see :func:`missing_members`)."""
    return not missing_members(obj)


@contextlib.contextmanager
def eval_mode(model: object) -> Iterator[object]:
    """``model.eval()`` for the block, its ``training`` flag restored after (also when the block
    raises): every procedure tests the model as it predicts, without dropout. An object without
    ``eval``/``train`` (a plain protocol object) is left alone."""
    was_training = getattr(model, "training", False)
    if hasattr(model, "eval"):
        model.eval()
    try:
        yield model
    finally:
        if was_training and hasattr(model, "train"):
            model.train()


def token_mask(lengths: Tensor, width: int, lead: int = 0, trail: int = 0) -> Tensor:
    """The one mask helper: lengths [B] -> [B, T] bool, True at ``lead <= t < lengths - trail``.

    With the defaults, each row's valid prefix; with a model's ``lead``/``trail``, its real
    tokens (special positions excluded).
    """
    t = torch.arange(width, device=lengths.device)
    if not lead:
        return t < (lengths - trail)[:, None]
    return (t >= lead) & (t < (lengths - trail)[:, None])


class Forward(NamedTuple):
    """One forward pass over the real tokens; per-token tensors are [B, T_real]."""

    attention: Tensor  # [B, T_real], sums to 1 over each row's real tokens
    hidden: Tensor  # [B, T_real, H], the vectors attention averages
    lengths: Tensor  # [B] int64, number of real tokens
    logits: Tensor  # [B, C]


class TestedAttention(NamedTuple):
    """A transformer's own attention, decomposed for the procedures (docs/definitions.md §15):
    the last layer's attention row of the pooled position over the real tokens, per head, and
    what makes ``decoder(sum_h sum_t attention[b, h, t] * values[b, h, t])`` the model's logits."""

    attention: Tensor  # [B, heads, T_real]: each head's row over the real tokens, summing to 1
    values: Tensor  # [B, heads, T_real, H]: the heads' values, special tokens and residual folded in
    lengths: Tensor  # [B] int64, number of real tokens
    logits: Tensor  # [B, C], the model's
    decoder: Callable[[Tensor], Tensor]  # the network after the attention: contexts [N, H] -> logits [N, C]


def real_tokens(x: Tensor, lengths: Tensor, model: AttentionClassifier) -> tuple[Tensor, Tensor]:
    """Slice ``x`` [B, T, ...] to the real tokens: ``x[:, lead:]`` with ``lengths - lead - trail``."""
    return x[:, model.lead :], lengths - model.lead - model.trail


@torch.no_grad()
def forward(model: AttentionClassifier, tokens: Tensor, lengths: Tensor) -> Forward:
    """Run the model once and return what the faithfulness tests need, real tokens only."""
    hidden = model.encode(model.embed(tokens), lengths)
    attention = model.attend(hidden, lengths)
    context = torch.einsum("bt,bth->bh", attention, hidden)
    logits = model.decoder(context)
    attention, real = real_tokens(attention, lengths, model)
    hidden, _ = real_tokens(hidden, lengths, model)
    return Forward(attention.contiguous(), hidden.contiguous(), real, logits)
