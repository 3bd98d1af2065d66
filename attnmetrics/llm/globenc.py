"""GlobEnc (Modarressi et al. 2022) does not carry over to a pre-RMSNorm Llama-layout decoder: its reason."""

from __future__ import annotations

from torch import Tensor

#: why GlobEnc is refused on a pre-RMSNorm decoder (one line)
REASON = (
    "GlobEnc does not carry over to a pre-RMSNorm decoder: its N_Enc is the norm through the two LayerNorms that "
    "act on a post-LN layer's summed stream, which a pre-norm layer does not have, so what is left are norms of the "
    "unnormalised residual stream, whose raw product through the layers grows as its norm to the L-th power "
    "(1e67 to 1e72 on SmolLM2-135M's 30 layers, past float32's 3e38)"
)


def globenc(model, tokens: Tensor, lengths: Tensor, **kwargs) -> Tensor:
    """Refused: raises ValueError with :data:`REASON`.

    What carrying it over would give: per layer ``N[i, j] = ||sum_h A_h[i, j] f_h(x_j) + [i = j] x_i||``
    (both LayerNorm factors drop out: RMSNorm_1 acts on each token inside ``f_h``, RMSNorm_2 only on the
    MLP's input), which is Kobayashi et al. 2021's attention-plus-residual norm rather than GlobEnc,
    and GlobEnc's raw (unnormalised) rollout of it overflows on a real model (measured on
    SmolLM2-135M-Instruct, Q4_1 dequantised, through the sentiment-plain prompt: the deciding rows'
    products 3e67 to 3e72 in float64)."""
    raise ValueError(REASON)
