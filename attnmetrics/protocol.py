"""The small protocol that any attention classifier implements for the procedures.

embed -> encode -> attend -> decode (J&W 2019, sec. 2). ``lengths`` counts every
position of a row, special tokens included; ``attend`` returns attention that is
zero outside the real tokens. Procedures that work per token take the real-token
slice ``[lead : lengths - trail]`` where ``lead``/``trail`` are the numbers of
special positions (``<SOS>``/``<EOS>``) at each end.
"""

from __future__ import annotations

from typing import Callable, Protocol, runtime_checkable

from torch import Tensor


@runtime_checkable
class AttentionClassifier(Protocol):
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
    #   position of its deletions, by which leave_one_out sizes the calls to its memory budget.
