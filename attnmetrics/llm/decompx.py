"""DecompX (Modarressi et al. 2023) does not carry over to a Llama-layout decoder: its reason."""

from __future__ import annotations

from torch import Tensor

#: why DecompX is refused on a Llama-layout decoder (one line)
REASON = (
    "DecompX does not carry over to a Llama-layout decoder: its gated MLP down(act(gate(u)) * up(u)) multiplies "
    "two linear maps of the decomposed state, so the token components' cross terms have no place in DecompX's "
    "rules (eqs. 9-11 decompose one activation of one linear map); any split of them would be a new method"
)


def decompx(model, tokens: Tensor, lengths: Tensor, **kwargs) -> Tensor:
    """Refused: raises ValueError with :data:`REASON`."""
    raise ValueError(REASON)
