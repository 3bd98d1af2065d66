"""Single-weight removal (S&S 2019, sec. 3; docs/definitions.md §5).

Zero one attention weight of each row (the highest, the second highest, the lowest,
or a random one), renormalise the rest to sum to 1 (L1), re-run the layers after
attention (the *decoder*) and compare the output with the original: the JSD between
the two output distributions and whether the decision changed. S&S compare removing
the top weight with removing a random one on the same instances
(:func:`attnmetrics.stats.mcnemar` tests the paired flips).

Lives beside :mod:`attnmetrics.flip` (the flip search), whose validation and
projection it reuses; it needs no kernel: one closed form on projected values for a
plain ``nn.Linear`` decoder, one batched decoder call per chunk of rows otherwise.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from attnmetrics._decoder import Decoder, check_values_finite, is_plain_linear, project, rows_per_chunk
from attnmetrics._deferred import deferred
from attnmetrics._ops import ops
from attnmetrics._validation import (
    DEFAULT_MEMORY_BUDGET,
    check_budget,
    check_decoder,
    check_generator,
    check_inputs,
    check_logits,
)
from attnmetrics.flip import removal_order
from attnmetrics.keyed import KeyedRows
from attnmetrics.outputs import decision, output_distribution
from attnmetrics.protocol import token_mask

#: weights :func:`single_removal` can remove
WHICH = ("top", "second", "lowest", "random")
#: the items ``which="random"`` draws among (docs/definitions.md §5): ``"non_top"`` every real
#: token but the top one (S&S 2019, the default), ``"all"`` every real token, ``"not_first"``
#: every real token but the first (S&S's ``test_model.py`` as it runs: it indexes the weights
#: with the drawn rank)
RANDOM_AMONG = ("non_top", "all", "not_first")


class SingleRemovalResult(NamedTuple):
    """Per-row outcome of :func:`single_removal`; each field is ``[B]``.

    jsd: JSD between the original and the new output distribution, nats, in
        ``[0, ln 2]`` (attention dtype); NaN for rows with L <= 1.
    flipped: bool, whether the decision changed; False for rows with L <= 1.
    removed_index: int64 position of the removed weight; -1 for rows with L <= 1.
    removed_weight: the removed weight (attention dtype); NaN for rows with L <= 1.
    """

    jsd: Tensor
    flipped: Tensor
    removed_index: Tensor
    removed_weight: Tensor


def removed_positions(
    attention: Tensor,
    lengths: Tensor,
    which: str,
    generator: torch.Generator | KeyedRows | None = None,
    random_among: str = "non_top",
) -> Tensor:
    """``[B]`` int64 position each row removes (-1 where L <= 1); inputs already validated.

    ``top``: the highest weight; ``second``: the next one in the same order; ``lowest``:
    the lowest weight (ties always to the lower index); ``random``: one integer ``d`` per row,
    ``torch.randint(0, 2**62, (B,), generator=generator)`` (rows with L <= 1 included, so the
    draw does not depend on lengths; from a :class:`attnmetrics.KeyedRows`, the first output
    of each row's stream, >> 2), then by ``random_among``: ``"non_top"`` the item of rank
    ``1 + d % (L - 1)`` in the descending order (ties to the lower index; rank 0 is the top),
    S&S's ``random.randint(1, L - 1)`` over their sorted order; ``"all"`` position ``d % L``;
    ``"not_first"`` position ``1 + d % (L - 1)``.
    """
    batch, width = attention.shape
    short = lengths <= 1
    if which == "random":
        if isinstance(generator, KeyedRows):
            draw = generator.integers(batch, attention.device)
        else:
            draw = torch.randint(0, 2**62, (batch,), generator=generator, device=attention.device)
        if random_among == "all":
            return torch.where(short, -1, draw % lengths.clamp(min=1))
        rank = 1 + draw % (lengths - 1).clamp(min=1)  # in [1, L - 1]
        if random_among == "not_first" or width == 0:
            return torch.where(short, -1, rank)
        order = removal_order(attention, lengths)  # descending, ties to the lower index
        return torch.where(short, -1, order.gather(1, rank.clamp(max=width - 1)[:, None])[:, 0])
    if width == 0:
        return torch.full((batch,), -1, dtype=torch.int64, device=attention.device)
    mask = token_mask(lengths, width)
    if which == "lowest":
        index = attention.masked_fill(~mask, math.inf).argmin(1)  # first minimum
    else:
        real = attention.masked_fill(~mask, -math.inf)
        index = real.argmax(1)  # first maximum: ties to the lower index
        if which == "second":
            index = real.scatter(1, index[:, None], -math.inf).argmax(1)
    return torch.where(short, -1, index)


def single_removal(
    attention: Tensor,
    values: Tensor,
    decoder: Decoder,
    lengths: Tensor | None = None,
    which: str = "top",
    *,
    random_among: str = "non_top",
    generator: torch.Generator | KeyedRows | None = None,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
) -> SingleRemovalResult:
    """Output JSD and decision flip when one attention weight is removed (S&S 2019, sec. 3).

    On a pair task (J&W's question answering and inference model, ``models/pair.py``) the weights are
    the passage's; the question's state rides in every passage state (``[h_t ; q]``) and is never
    removed.

    Definition (docs/definitions.md §5): for each row with valid prefix length L >= 2, zero the weight
    chosen by ``which``, renormalise the others to sum to 1 (L1; the zero vector if they
    sum to exactly 0), decode the context ``sum_t alpha'_t h_t`` and compare with the
    decoded original context ``sum_t alpha_t h_t / sum_t alpha_t`` (the renormalised full
    row, as in :func:`attnmetrics.flip_fraction` at k = 0). ``jsd`` is the JSD between the
    two output distributions (natural log; softmax for C >= 2 logits, ``(1 - p, p)`` with
    ``p = sigmoid`` for C == 1, computed in float64); ``flipped`` whether the decisions
    (argmax, ties to the lower class; ``logit > 0`` for C == 1) differ. Rows with L <= 1
    have nothing to remove: NaN jsd, not flipped, index -1.

    A plain ``nn.Linear`` decoder takes a closed form on the projected values
    ``values @ W.T`` (float64 accumulation, no contexts); any other decoder gets the
    original and the new context of a chunk of rows (about ``memory_budget`` bytes) in
    one batched call, and must treat rows independently. Runs under ``torch.no_grad()``.

    Multi-head attention ``[B, heads, T]`` with values ``[B, heads, T, H]`` (a transformer's;
    docs/definitions.md §15): ``which`` picks a token by the head-mean attention, the token
    is zeroed in every head and each head renormalised on its own, the contexts are summed
    over heads, and ``removed_weight`` is the token's head-mean weight.

    Args:
        attention: ``[B, T]`` (or ``[B, heads, T]``) float32/float64; each row (each head's
            row) non-negative, finite and summing to 1 over its first ``lengths[b]`` items
            (rejected otherwise). Any strides.
        values: ``[B, T, H]`` (or ``[B, heads, T, H]``), same dtype and device: the vectors
            attention averages.
        decoder: callable mapping contexts ``[N, H]`` to logits ``[N, C]``, C >= 1.
        lengths: ``[B]`` integer valid-prefix lengths in ``[0, T]`` (default: all T).
        which: ``"top"`` (highest weight, ties to the lower index), ``"second"`` (second
            in that order), ``"lowest"`` (lowest weight, ties to the lower index) or
            ``"random"`` (uniform among the real tokens that ``random_among`` allows; see
            :func:`removed_positions`).
        random_among: the tokens ``which="random"`` draws among: ``"non_top"`` (default) every
            real token but the top one (highest weight, ties to the lower index), as S&S 2019
            compare the top weight with a random other one (their ``test_model.py``:
            ``random.randint(1, len - 1)`` over the descending order); ``"all"`` every real
            token (this library's choice before); ``"not_first"`` every real token but the
            first, which is what S&S's code removes as it runs (it zeroes the weight at the
            drawn rank's *position*; docs/definitions.md §5). Rows with L <= 1 have no token
            to draw under any choice (NaN jsd, index -1); with L = 2 ``"non_top"`` removes the
            second-highest weight.
        generator: ``torch.Generator`` on the inputs' device for ``which="random"``, or a
            :class:`attnmetrics.KeyedRows` (the draw keyed by instance).
        memory_budget: approximate bytes of working memory per chunk of rows.

    Returns:
        :class:`SingleRemovalResult` of ``[B]`` tensors: ``jsd`` (nats, attention dtype),
        ``flipped`` (bool), ``removed_index`` (int64), ``removed_weight`` (attention dtype).

    Raises:
        ValueError: attention or values on the ``meta`` device; NaN/infinite, negative or
            non-normalised attention; an empty batch;
            values not ``[B, T, H]`` with H >= 1, of another dtype/device or not finite on a valid
            prefix; bad lengths; an unknown ``which`` or ``random_among``; a generator on another device; a
            bad ``memory_budget``; an ``nn.Linear`` whose ``in_features != H``, whose
            ``out_features < 1`` or whose weight or bias is not finite
            (``decoder.weight``/``decoder.bias``); decoder output not ``[N, C]``, not
            float32/float64 or not finite.
        TypeError: ``decoder`` not callable; ``generator`` not a ``torch.Generator`` (or None).

    Example:
        Removing the top weight leaves only the class-0 item: the decision flips.

        >>> att = torch.tensor([[0.7, 0.3]], dtype=torch.float64)
        >>> values = torch.tensor([[[0.0, 4.0], [1.0, 0.0]]], dtype=torch.float64)
        >>> dec = torch.nn.Linear(2, 2, bias=False).double()
        >>> _ = dec.weight.data.copy_(torch.eye(2))
        >>> res = single_removal(att, values, dec)
        >>> res.flipped.tolist(), res.removed_index.tolist(), res.removed_weight.tolist()
        ([True], [0], [0.7])
    """
    lengths = check_inputs(attention, values, lengths)
    check_decoder(decoder, values)
    budget = check_budget(memory_budget)
    if not isinstance(which, str) or which not in WHICH:
        raise ValueError(f"which must be one of {WHICH}, got {which!r}")
    if not isinstance(random_among, str) or random_among not in RANDOM_AMONG:
        raise ValueError(f"random_among must be one of {RANDOM_AMONG}, got {random_among!r}")
    check_generator(generator, attention.device)
    # One code path: a single-head call is the multi-head one with one head.
    multi = attention.dim() == 3
    att = attention if multi else attention[:, None]  # [B, heads, T]
    vals = values if multi else values[:, None]  # [B, heads, T, H]
    batch, heads, width, hidden = vals.shape
    dtype, device = attention.dtype, attention.device

    with torch.no_grad(), deferred():  # the decoder's logits checked once, at the end
        head_mean = att.mean(1) if multi else attention
        index = removed_positions(head_mean, lengths, which, generator, random_among)
        ok = index >= 0
        removed_weight = torch.full((batch,), math.nan, dtype=dtype, device=device)
        divergence = torch.full((batch,), math.nan, dtype=torch.float64, device=device)
        flipped = torch.zeros(batch, dtype=torch.bool, device=device)
        if not ok.any():
            return SingleRemovalResult(divergence.to(dtype), flipped, index, removed_weight)
        removed_weight[ok] = head_mean[ok].gather(1, index[ok, None]).squeeze(1)

        linear = is_plain_linear(decoder)
        if linear:
            flat_lengths = lengths.repeat_interleave(heads)
            projected = project(vals.flatten(0, 1), decoder.weight, flat_lengths, budget)
            n_classes = projected.shape[2]
            projected = projected.view(batch, heads, width, n_classes)
            bias = (
                decoder.bias.detach().to(torch.float64)
                if decoder.bias is not None
                else torch.zeros(n_classes, dtype=torch.float64, device=device)
            )
            row_bytes = heads * width * (n_classes + 2) * 8
        else:  # a copy of the chunk's values, two float64 weight rows per head, two contexts
            item = values.element_size()
            row_bytes = heads * width * (hidden * item + 16) + 2 * hidden * item
        rows = rows_per_chunk(row_bytes, budget)
        classes: list[int] = []  # C of the first decoder call, checked on later ones
        kept = ok.nonzero().squeeze(1)  # rows with something to remove (one read)
        if not linear:  # else NaN contexts, blamed on the decoder; names the row
            check_values_finite(values, torch.where(ok, lengths, 0))
        for s in range(0, kept.shape[0], rows):
            keep = kept[s : s + rows]
            mask = token_mask(lengths[keep], width)[:, None, :]  # [n, 1, T]
            alpha = att[keep].to(torch.float64).masked_fill(~mask, 0)
            # The token goes from every head; each head is renormalised on its own.
            rest = alpha.scatter(2, index[keep, None, None].expand(-1, heads, 1), 0.0)
            total, left = alpha.sum(2, keepdim=True), rest.sum(2, keepdim=True)
            before = alpha / total  # rows sum to 1 within sum_tolerance (<= 0.5): total > 0
            after = torch.where(left > 0, rest / torch.where(left > 0, left, 1), 0)
            weights = torch.stack([before, after], 1)  # [n, 2, heads, T]
            if linear:
                proj = projected[keep].to(torch.float64).masked_fill(~mask[..., None], 0)
                z = torch.einsum("nkht,nhtc->nkc", weights, proj) + bias  # [n, 2, C]
            else:
                h = vals[keep]  # advanced indexing: a contiguous copy
                h.masked_fill_(~mask[..., None], 0)  # padding never enters a context
                contexts = torch.einsum("nkht,nhtd->nkd", weights.to(h.dtype), h)  # summed over heads
                n = keep.numel()
                z = check_logits(
                    decoder(contexts.reshape(2 * n, hidden)), 2 * n, classes[0] if classes else None, dtype=dtype
                )
                classes[:] = [z.shape[1]]
                z = z.view(n, 2, -1)
            dist = output_distribution(z.reshape(-1, z.shape[2]).to(torch.float64))
            dist = dist.view(z.shape[0], 2, -1)
            # distributions of checked logits (deferred) or projections: the unchecked kernel
            divergence[keep] = ops.jsd(dist[:, 0].contiguous(), dist[:, 1].contiguous())
            flipped[keep] = decision(z[:, 0]) != decision(z[:, 1])
    return SingleRemovalResult(divergence.to(dtype), flipped, index, removed_weight)
