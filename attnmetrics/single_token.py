"""Tutek & Šnajder 2020's single-token-input test (sec. 4).

If hidden states "stay true" to their words, the attention over a sentence should rank its
tokens as the model ranks them alone: each real token t is fed on its own, between the row's
own special tokens (``lead`` tokens + t + ``trail`` tokens, so any model of the protocol
works), and its alone-probability of the full input's predicted class is compared with the
attention (Kendall τ-b); and the top-attention token alone should give the full input's
decision. A procedure over the protocol, like :func:`attnmetrics.leave_one_out`. (T&Š's
regularisers themselves are ``ModelConfig.regulariser`` options of
:mod:`attnmetrics.models.classifier`.)
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from attnmetrics._deferred import deferred
from attnmetrics.kendall import kendall_tau
from attnmetrics.outputs import decision, output_distribution
from attnmetrics.protocol import AttentionClassifier, Forward, forward

#: single-token inputs per model call (all have length lead + 1 + trail, so this bounds memory)
MAX_ROWS_PER_CALL = 8192


class SingleTokenResult(NamedTuple):
    """Per instance: ``alone`` [B, T_real] probability of the full input's predicted class
    with each real token alone (0 past the row's length); ``tau``/``pvalue`` [B] Kendall τ-b
    between attention and ``alone`` (NaN with fewer than 2 tokens or a tied row);
    ``top_agrees`` [B] bool, the top-attention token alone gives the full decision
    (False for rows without real tokens); ``lengths`` [B] real tokens per row."""

    alone: Tensor
    tau: Tensor
    pvalue: Tensor
    top_agrees: Tensor
    lengths: Tensor


def single_token_inputs(tokens: Tensor, lengths: Tensor, lead: int, trail: int) -> tuple[Tensor, Tensor, Tensor]:
    """Every real token of every row as its own input between the row's special tokens.

    Args: tokens [B, T] int64, lengths [B] int64 (specials included).
    Returns: (inputs [N, lead + 1 + trail] int64, rows [N] int64, positions [N] int64) with N
    the number of real tokens, in row-major order; ``positions`` index the real tokens (0 =
    the first after the ``lead`` specials).
    """
    real = lengths - lead - trail
    if (real < 0).any():
        raise ValueError(f"lengths must be >= lead + trail = {lead + trail}, got min {int(lengths.min())}")
    width = int(real.max()) if real.numel() else 0
    rows, positions = (torch.arange(width, device=tokens.device) < real[:, None]).nonzero(as_tuple=True)
    lead_cols = torch.arange(lead, device=tokens.device).expand(len(rows), lead)
    trail_cols = (lengths[rows, None] - trail) + torch.arange(trail, device=tokens.device)
    cols = torch.cat([lead_cols, (positions + lead)[:, None], trail_cols], 1)
    return tokens[rows[:, None], cols], rows, positions


@torch.no_grad()
@deferred()  # every model call's checks read once, at the end
def single_token_test(
    model: AttentionClassifier,
    tokens: Tensor,
    lengths: Tensor,
    max_rows: int = MAX_ROWS_PER_CALL,
    full: Forward | None = None,
) -> SingleTokenResult:
    """T&Š 2020 (sec. 4) single-token-input test on one batch.

    On a pair task (J&W's question answering and inference model, ``models/pair.py``) each input is one
    passage word with the whole question.

    Args:
        model: any :class:`attnmetrics.AttentionClassifier` (``lead``/``trail`` special tokens).
        tokens: [B, T] int64, lengths: [B] int64, special tokens included.
        max_rows: single-token inputs per model call (they all have one length, so every
            call is one dense batch; never one call per token).
        full: :func:`attnmetrics.protocol.forward` on these rows, if the caller has it.

    Returns: :class:`SingleTokenResult`. Raises ValueError for lengths below lead + trail.
    """
    full = forward(model, tokens, lengths) if full is None else full
    predicted = decision(full.logits)  # [B]
    inputs, rows, positions = single_token_inputs(tokens, lengths, model.lead, model.trail)
    width = full.attention.shape[1]
    alone = torch.zeros(len(lengths), width, dtype=full.attention.dtype, device=tokens.device)
    alone_decision = torch.full_like(alone, -1, dtype=torch.int64)
    # The same token between the same specials is the same input: each distinct one runs once
    # (a sentence corpus repeats its frequent words; SST's test set: 31,864 inputs, 6,777 distinct).
    distinct, which = torch.unique(inputs, dim=0, return_inverse=True)
    one = torch.full((max_rows,), inputs.shape[1], dtype=torch.int64, device=tokens.device)
    parts = []
    for start in range(0, len(distinct), max_rows):
        chunk = distinct[start : start + max_rows]
        parts.append(forward(model, chunk, one[: len(chunk)]).logits)
    if parts:
        logits = torch.cat(parts)[which]
        alone[rows, positions] = output_distribution(logits).gather(1, predicted[rows, None])[:, 0].to(alone.dtype)
        alone_decision[rows, positions] = decision(logits)
    kt = kendall_tau(full.attention, alone, full.lengths)
    has_tokens = full.lengths > 0
    top = full.attention.argmax(1)  # ties: the lower index
    top_agrees = has_tokens & (alone_decision.gather(1, top[:, None])[:, 0] == predicted)
    return SingleTokenResult(alone, kt.tau, kt.pvalue, top_agrees, full.lengths)
