"""Attention × value norm (Kobayashi et al. 2020) on a pre-RMSNorm Llama-layout decoder."""

from __future__ import annotations

import torch
from torch import Tensor

from attnmetrics.llm.layers import DEFAULT_MEMORY_BUDGET, heads_out, run


def attention_value_norm(
    model, tokens: Tensor, lengths: Tensor, *, memory_budget: int = DEFAULT_MEMORY_BUDGET
) -> Tensor:
    """Attention × value norm (Kobayashi et al. 2020, EMNLP, "Attention is Not Only a Weight",
    sec. 3, "||Σαf(x)||") at the last layer, for the deciding position p (a fine-tuned decoder's last
    real token; a prompted model's answer position), as :func:`attnmetrics.attention_value_norm`
    defines it for BERT.

    ``score_j = || sum_h A_h[p, j] f_h(x_j) ||_2`` with ``f_h(x_j) = (RMSNorm_1(x_j) W_V^{g(h)} +
    b_V^{g(h)}) W_O^h``: the norm of what token j adds to p's attention output, summed over the query
    heads, each head h reading its key/value head ``g(h) = h // (H / H_kv)``'s values (grouped-query
    attention); ``b_V`` (Qwen2) in ``f``, ``b_O`` left out, no residual. ``x`` is the last layer's
    input.

    What the pre-norm changes: the values are computed from ``RMSNorm_1(x_j) = gamma_1 * x_j /
    rms(x_j)``, each token's residual stream rescaled by its own ``1 / rms``, so the score weighs the
    token's direction (and gamma), not the size of its residual stream (which grows with depth in a
    pre-norm model and is never normalised on the residual path); in post-LN BERT the layer's input
    is itself a LayerNorm's output, so there the two coincide. The vector ``sum_h A_h[p, j] f_h(x_j)``
    is still exactly token j's share of the attention output that is added to p's residual stream.

    Args:
        model: a Llama-layout decoder on the protocol: ``HFClassifier`` of family ``"llama"``
            (Llama, Qwen2, Mistral ``...ForSequenceClassification``), or a ``PromptedLM``.
        tokens: ``[B, T]`` int64 item ids (a fine-tuned decoder's text ids; a prompted model's
            text ids, the template added by the model), right-padded.
        lengths: ``[B]`` lengths, at least 1.
        memory_budget: bytes a chunk of rows may hold (default 256 MiB).

    Returns:
        ``[B, T]`` in the model's float dtype: each item's norm (units of the hidden states), zero
        past each row's length.

    Raises:
        TypeError: not a Llama-layout decoder on the protocol.
        ValueError: bad inputs, an attention implementation that hands over no probabilities, a
            score that is not finite.
    """

    def per_chunk(layers, trace, budget):
        f = heads_out(layers[-1], trace.v[-1])  # [b, H, w, d]
        return torch.einsum("bhj,bhjd->bjd", trace.pooled_row(-1), f).norm(dim=-1)

    return run(model, tokens, lengths, memory_budget, "attention_value_norm", per_chunk)
