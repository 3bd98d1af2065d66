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


# ---- optional capabilities ------------------------------------------------------------------
# A model may offer any of these besides the protocol; the procedures look each one up with
# :func:`capability` and use it when it is there (typing only, like AttentionClassifier).


class PreparedEdits(Protocol):
    """What ``deletion_logits``/``masking_logits`` return: ``(rows [N], positions [N] int64) ->
    logits [N, C]``, the logits of row ``rows[i]`` with real position ``positions[i]`` edited."""

    #: optional: about what a call holds per position of its edits (bytes), by which
    #: leave_one_out sizes the calls to its memory budget
    position_bytes: int

    def __call__(self, rows: Tensor, positions: Tensor) -> Tensor: ...

    def unedited_logits(self) -> Tensor:
        """Optional: ``[G, C]``, the rows' own logits (as the model gives them, up to rounding),
        which leave_one_out then takes as the original outputs instead of running the rows."""


class DeletesTokens(Protocol):
    """``deletion_logits(embedded [G, T, E], lengths [G]) -> PreparedEdits``: the logits with
    one token deleted (length ``lengths[row] - 1``), reusing the work a deletion leaves
    unchanged (J&W's BiLSTM: the states before and after it; GPT-1: its causal prefix);
    :func:`attnmetrics.leave_one_out` in ``"delete"`` mode uses it."""

    def deletion_logits(self, embedded: Tensor, lengths: Tensor) -> PreparedEdits: ...


class MasksTokens(Protocol):
    """``masking_logits(embedded, lengths, mask_token) -> PreparedEdits``: the same with the
    token replaced by ``mask_token`` (the length unchanged), for ``mode="mask"``."""

    def masking_logits(self, embedded: Tensor, lengths: Tensor, mask_token: int) -> PreparedEdits: ...


class PreparedSubsets(Protocol):
    """What ``subset_logits`` returns: ``(rows [N] int64, changed [N, T] bool) -> logits [N, C]``,
    the logits of row ``rows[i]`` with every position t where ``changed[i, t]`` edited (deleted,
    the rest closing up, or masked), ``position_bytes`` as :class:`PreparedEdits`'."""

    #: optional: about what a call holds per position of its edits (bytes)
    position_bytes: int

    def __call__(self, rows: Tensor, changed: Tensor) -> Tensor: ...

    def cost(self, rows: Tensor, changed: Tensor) -> tuple[int, int]:
        """Optional: the positions the edits would run, ``(with the reuse, by a full
        recomputation)``, counted without running them; ERASER runs a block of rows whole where
        the first is not the smaller."""


class EditsSubsets(Protocol):
    """``subset_logits(embedded [G, T, E], lengths [G], mask_token: int | None) -> PreparedSubsets``:
    the logits with a set of tokens deleted (``mask_token`` None) or replaced by ``mask_token``,
    reusing what the edit leaves unchanged (a causal decoder: every position before its first
    changed token); :func:`attnmetrics.comprehensiveness` and :func:`attnmetrics.sufficiency` use it."""

    def subset_logits(self, embedded: Tensor, lengths: Tensor, mask_token: int | None) -> PreparedSubsets: ...


class OwnAttention(Protocol):
    """``tested_attention(tokens, lengths) -> TestedAttention | None``: the attention the battery
    tests when it is not the attention head's (a transformer's own, docs/definitions.md §15);
    None where the head's is the tested one."""

    def tested_attention(self, tokens: Tensor, lengths: Tensor) -> TestedAttention | None: ...


class RollsOut(Protocol):
    """``rollout(tokens, lengths) -> [B, T - lead]``: attention rollout's importance of each
    real token for the pooled position (Abnar & Zuidema 2020), a battery importance."""

    def rollout(self, tokens: Tensor, lengths: Tensor) -> Tensor: ...


#: the optional capabilities, by the method that offers each
CAPABILITIES = {
    "deletion_logits": DeletesTokens,
    "masking_logits": MasksTokens,
    "subset_logits": EditsSubsets,
    "tested_attention": OwnAttention,
    "rollout": RollsOut,
}


def capability(model: object, name: str) -> Callable | None:
    """``model``'s optional capability ``name`` (a key of :data:`CAPABILITIES`) as a callable, or
    None when the model does not offer it (looked up with ``getattr``, like the protocol)."""
    if name not in CAPABILITIES:
        raise ValueError(f"unknown capability {name!r}; expected one of {sorted(CAPABILITIES)}")
    method = getattr(model, name, None)
    return method if callable(method) else None


def edits_whole_texts(model: object, name: str) -> bool:
    """Whether ``model``'s capability ``name`` (``"deletion_logits"`` or ``"subset_logits"``) is
    there and may delete every real token of a row: the model's optional attribute
    ``encodes_empty_text`` (default False) says that its input keeps positions around the text
    that no edit removes (a prompted decoder's template: docs/definitions.md §15), so a deletion
    of the whole text leaves something to read out. A model without it (``lead = trail = 0`` and
    nothing around the text: a decoder classifier, GPT-2) would be left an empty input, which the
    procedures refuse."""
    return capability(model, name) is not None and bool(getattr(model, "encodes_empty_text", False))


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


def causal_mask(lengths: Tensor, T: int) -> Tensor:
    """lengths [B] -> mask [B, 1, T, T] bool: query t sees key s iff s <= t and both lie
    within the row's length (so padding neither attends nor is attended): a causal
    transformer's attention mask (our GPT's, ``models/gpt.py``)."""
    real = token_mask(lengths, T)
    causal = torch.ones(T, T, dtype=torch.bool, device=lengths.device).tril()
    return (causal & real[:, None, :] & real[:, :, None]).unsqueeze(1)


#: GPT-1's own read-out (Radford et al. 2018, sec. 3.3): a GPT classifier's ``attention_name``
#: when it classifies the final state of ``<extract>`` alone, no attention over tokens
EXTRACT_READOUT = "extract"


class Forward(NamedTuple):
    """One forward pass over the real tokens; per-token tensors are [B, T_real]."""

    attention: Tensor  # [B, T_real], sums to 1 over each row's real tokens
    hidden: Tensor  # [B, T_real, H], the vectors attention averages
    lengths: Tensor  # [B] int64, number of real tokens
    logits: Tensor  # [B, C]


class FactoredValues(NamedTuple):
    """Multi-head values in the form a transformer computes them: each head's own vectors
    (``d / heads`` wide) through its slice of the output projection, plus a vector per row
    and head that every token shares (docs/definitions.md §15)::

        values[b, h, t] = per_head[b, h, t] @ projection[h] + offset[b, h]

    For a distribution ``a`` over a row's tokens (summing to 1), ``sum_t a[t] values[b, h, t]
    = (sum_t a[t] per_head[b, h, t]) @ projection[h] + offset[b, h]``: a procedure that mixes
    values once per step reads ``per_head`` (``heads`` times smaller than the dense values) and
    applies ``projection`` to the mixed vectors, the same arithmetic up to rounding. Accepted
    as ``values`` by :func:`attnmetrics.adversarial_attention`.

    per_head: ``[B, heads, T, E]``, zero past each row's length.
    projection: ``[heads, E, H]``.
    offset: ``[B, heads, H]``.
    """

    per_head: Tensor
    projection: Tensor
    offset: Tensor

    def dense(self, lengths: Tensor | None = None) -> Tensor:
        """The values ``[B, heads, T, H]`` themselves; zero past each row's ``lengths`` [B] if given."""
        values = torch.einsum("bhte,heo->bhto", self.per_head, self.projection) + self.offset[:, :, None]
        if lengths is None:
            return values
        return values * token_mask(lengths, values.shape[2])[:, None, :, None]


class TestedAttention(NamedTuple):
    """A transformer's own attention, decomposed for the procedures (docs/definitions.md §15):
    the last layer's attention row of the pooled position over the real tokens, per head, and
    what makes ``decoder(sum_h sum_t attention[b, h, t] * values[b, h, t])`` the model's logits."""

    attention: Tensor  # [B, heads, T_real]: each head's row over the real tokens, summing to 1
    values: Tensor  # [B, heads, T_real, H]: the heads' values, special tokens and residual folded in
    lengths: Tensor  # [B] int64, number of real tokens
    logits: Tensor  # [B, C], the model's
    decoder: Callable[[Tensor], Tensor]  # the network after the attention: contexts [N, H] -> logits [N, C]
    factored: FactoredValues | None = None  # the same values factored (values = factored.dense(lengths))


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
