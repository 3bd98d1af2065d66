"""GlobEnc (Modarressi et al. 2022) carried over to a pre-RMSNorm Llama-layout decoder."""

from __future__ import annotations

from torch import Tensor

from attnmetrics.attributions import _rollout_row
from attnmetrics.llm.layers import DEFAULT_MEMORY_BUDGET, mixing, per_query, run


def _norm_layer(probs, f, x, mid, queries, valid) -> Tensor:
    """One layer's ``||T_i(x_j)||_2`` ``[n, Q, w]`` (padded keys 0)."""
    return mixing(probs, f, x, queries).norm(dim=-1) * valid[:, None].to(x.dtype)


def globenc(model, tokens: Tensor, lengths: Tensor, *, memory_budget: int = DEFAULT_MEMORY_BUDGET) -> Tensor:
    """GlobEnc (Modarressi et al. 2022, NAACL, sec. 3) carried over to a pre-RMSNorm decoder: per layer
    ``N[i, j] = ||T_i(x_j)||_2`` with ``T_i(x_j) = sum_h A_h[i, j] f_h(x_j) + [i = j] x_i`` (ALTI's
    vectors, :func:`attnmetrics.llm.alti`), the raw norms multiplied through the layers (no residual
    added, no renormalisation) and the deciding position's row read, as
    :func:`attnmetrics.globenc`.

    How it carries over: GlobEnc's ``N_Enc`` is the norm of z_ij through the two LayerNorms that act
    on the summed stream of a post-LN layer (``LN_1`` after attention plus residual, ``LN_2`` after
    the FFN plus residual, the FFN entering only through ``LN_2``'s scale). A pre-norm layer has no
    norm on the summed stream: RMSNorm_1 acts on each token before its values (inside ``f_h``,
    exactly, at the token's own scale) and RMSNorm_2 only on the MLP's input, so both factors drop
    out and ``N_Enc`` is the norm of what token j (and, for j = i, the residual) adds to i's residual
    stream; the MLP enters nowhere. The residual stream's norm grows with depth, so the raw product
    weighs later layers' residual more than BERT's (the product is taken in float64).

    Args, Raises: as :func:`attnmetrics.llm.attention_value_norm`.

    Returns:
        ``[B, T]`` in the model's float dtype: each item's score (non-negative, a product of norms,
        not normalised), zero past each row's length.
    """

    def per_chunk(layers, trace, budget):
        last = len(layers) - 1
        return _rollout_row(
            [per_query(layers, trace, index, index == last, budget, _norm_layer) for index in range(len(layers))]
        )

    return run(model, tokens, lengths, memory_budget, "globenc", per_chunk)
