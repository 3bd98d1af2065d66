"""Attention × value norm (Kobayashi et al. 2020)."""

from __future__ import annotations

import torch
from torch import Tensor

from attnmetrics._validation import DEFAULT_MEMORY_BUDGET
from attnmetrics.attributions.layers import _heads_out, _pooled, _run

# ---- the methods --------------------------------------------------------------------------------


def attention_value_norm(
    model, tokens: Tensor, lengths: Tensor, *, memory_budget: int = DEFAULT_MEMORY_BUDGET
) -> Tensor:
    """Attention × value norm (Kobayashi et al. 2020, EMNLP, "Attention is Not Only a Weight",
    sec. 3, eq. 6, "||Σαf(x)||") at the last layer, for the pooled position p (``[CLS]``; our GPT's
    ``<extract>``).

    ``score_j = || sum_h A_h[p, j] f_h(x_j) ||_2`` with ``f_h(x_j) = (x_j W_V^h + b_V^h) W_O^h``:
    the norm of what token j adds to p's multi-head attention output (the value bias ``b_V`` in
    ``f``, the output bias ``b_O`` left out, as the paper's sec. 3 and its code's
    ``transformed_layer``; no residual, no LayerNorm). ``x`` is the last layer's input.

    Args:
        model: a protocol model whose ``hf`` is a BERT-like ``BertForSequenceClassification``
            (e.g. ``attnmetrics.models.hf.HFClassifier``), or our ``GPTClassifier`` with the extract
            read-out; in eval mode for the call, and in float32 if it is float16 or bfloat16
            (the package docstring, Precision).
        tokens: ``[B, T]`` int64 ids, ``[CLS] ... [SEP]`` (``<start> ... <extract>``) then padding.
        lengths: ``[B]`` integer lengths, special tokens included, in ``[lead + trail, T]``.
        memory_budget: bytes a chunk of rows may hold (default 256 MiB).

    Returns:
        ``[B, T - lead]`` in the model's float dtype (float32 for a half precision model): each real
        token's norm, in the units of the hidden states (non-negative, not normalised), zero past
        each row's real tokens.

    Raises:
        TypeError: the model is neither our GPT classifier nor has a Hugging Face model
            (``model.hf``; e.g. the BiLSTM); tokens or lengths not tensors.
        ValueError: a Hugging Face model that is not BERT-like (GPT-2, ...), our GPT classifier with
            an attention head instead of the extract read-out, an attention implementation that
            returns no probabilities, the input checks of :func:`attnmetrics.gradient_importance`,
            a bad ``memory_budget``, or a score that is not finite.
    """

    def per_chunk(layers, tokens, lengths, trace, budget):
        layer, probs, v = layers[-1], trace.probs[-1], trace.v[-1]
        rows = torch.arange(tokens.shape[0], device=tokens.device)
        a = probs[rows, :, _pooled(model, lengths)]  # [b, H, T]
        f = _heads_out(layer, v)  # [b, H, T, d]
        return torch.einsum("bhj,bhjd->bjd", a, f).norm(dim=-1)

    return _run(model, tokens, lengths, memory_budget, "attention_value_norm", per_chunk)
