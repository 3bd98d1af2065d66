"""Removal with renormalisation and the decision-flip search (S&S 2019, sec. 4; docs/definitions.md §4).

Items of each row's attention are removed one at a time in the order of a score,
the remaining weights renormalised to sum to 1, and the layers after attention
(the *decoder*) re-run, until the decision changes. The kernels do it without a
per-step loop: a linear decoder gets a closed form on projected values
(``flip_search_linear``), any other decoder gets every renormalised context of a
row in one batched call (``renormalised_contexts``).

No token is re-encoded: on a Hugging Face decoder or a prompted model (``models/prompted.py``)
the items are the last layer's tested attention row (``tested_attention``, docs/definitions.md
§15), whose weights are zeroed and renormalised, and the decoder is the network after that
attention (``after_attention``: the output projection, residual, MLP, final norm and head), run
on the new contexts. The causal prefix reuse of leave-one-out and ERASER
(``models/causal_edits.py``, ``models/causal_subsets.py``), which saves re-encoding the positions
before an edited token, has nothing to save here.
"""

from __future__ import annotations

import math
import numbers
from typing import NamedTuple, Union

import torch
from torch import Tensor

from attnmetrics._decoder import (
    Decoder,
    check_values_finite,
    is_plain_linear,
    non_finite_parameter,
    project,
    rows_per_chunk,
)
from attnmetrics._deferred import defer, deferred
from attnmetrics._ops import ops
from attnmetrics._validation import (
    DEFAULT_MEMORY_BUDGET,
    check_budget,
    check_decoder,
    check_generator,
    check_inputs,
    check_lengths,
    check_logits,
    nonfinite_logits,
)
from attnmetrics.keyed import KeyedRows
from attnmetrics.outputs import decision, output_distribution
from attnmetrics.protocol import token_mask

Order = Union[str, Tensor]

#: order names accepted by :func:`flip_fraction` (or pass a [B, T] score tensor)
ORDERS = ("attention", "reverse", "random", "gradient", "attn_grad", "sign_grad_attn")


class FlipResult(NamedTuple):
    """Per-row outcome of a flip search; each field is ``[B]`` (``[samples, B]`` for
    ``order="random"`` with ``samples > 1``).

    removed: int64, items removed when the decision first changes; -1 if it never does.
    fraction: ``removed / L`` in the attention dtype; ``never_flipped`` (NaN) if it never does.
    flipped: bool, whether the decision changed within L - 1 removals.
    mass: attention mass removed at the flip (sum of the removed weights); NaN if never.
    """

    removed: Tensor
    fraction: Tensor
    flipped: Tensor
    mass: Tensor


# ---- orders -------------------------------------------------------------------------------


def removal_order(scores: Tensor, lengths: Tensor | None = None) -> Tensor:
    """Removal order of each row: positions by descending score, ties to the lower index.

    Args:
        scores: ``[B, T]`` real scores (higher is removed first); NaN is rejected on the
            valid prefix.
        lengths: ``[B]`` integer valid-prefix lengths in ``[0, T]`` (default: all ``T``).

    Returns:
        ``[B, T]`` int64: the first ``lengths[b]`` entries of row b are a permutation of
        ``0 .. lengths[b] - 1``; the padding positions follow in index order.

    Example:
        >>> removal_order(torch.tensor([[0.2, 0.5, 0.2, 9.0]]), torch.tensor([3]))
        tensor([[1, 0, 2, 3]])
    """
    if not isinstance(scores, Tensor) or scores.dim() != 2:
        got = list(scores.shape) if isinstance(scores, Tensor) else type(scores).__name__
        raise ValueError(f"scores must be a [B, T] tensor, got {got}")
    if scores.is_complex() or scores.dtype == torch.bool:
        raise ValueError(f"scores must be real numbers, got {scores.dtype}")
    batch, width = scores.shape
    lengths = check_lengths(lengths, batch, width, scores.device)
    mask = token_mask(lengths, width)
    if scores.is_floating_point() and torch.isnan(scores).logical_and(mask).any():
        raise ValueError("scores contain NaN on a row's valid prefix")
    # A stable descending sort keeps equal scores in index order. Padding gets the lowest
    # value: a valid score equal to it still sorts first, its index being below L.
    lowest = -math.inf if scores.is_floating_point() else torch.iinfo(scores.dtype).min
    return torch.sort(scores.masked_fill(~mask, lowest), dim=1, descending=True, stable=True).indices


def random_scores(
    batch: int,
    width: int,
    generator: torch.Generator | KeyedRows | None = None,
    device: torch.device | str | None = None,
    sample: int = 0,
) -> Tensor:
    """``[B, T]`` float64 scores whose removal order is a uniform random permutation per row.

    ``order="random"`` draws sample s as the s-th call of ``torch.rand((B, T))`` on a
    ``torch.Generator``, or from a :class:`attnmetrics.KeyedRows` as draws ``s * T`` to
    ``(s + 1) * T - 1`` of each row's own stream; either way a result can be reproduced (or
    checked) from the seed.
    """
    if isinstance(generator, KeyedRows):
        return generator.uniform(batch, (width,), device, start=sample * width)
    return torch.rand((batch, width), generator=generator, dtype=torch.float64, device=device)


def attention_gradient(
    attention: Tensor,
    values: Tensor,
    decoder: Decoder,
    lengths: Tensor | None = None,
    *,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
) -> Tensor:
    """Gradient of the predicted class's probability w.r.t. each attention weight.

    S&S 2019 (sec. 4, "gradient" ordering; docs/definitions.md §4): with the context
    ``c = sum_t alpha_t h_t`` and ``y`` the predicted class,
    ``d p_y / d alpha_t = (d p_y / d c) . h_t``. Autograd runs on ``c`` only, so
    ``decoder`` can be any callable mapping contexts ``[N, H]`` to logits ``[N, C]``
    that treats rows independently (e.g. a model head in eval mode). ``C == 1`` is a
    sigmoid output whose distribution is ``(1 - p, p)``.

    Multi-head attention ``[B, heads, T]`` with values ``[B, heads, T, H]``: the context is
    ``c = sum_h sum_t alpha_ht h_ht`` and the result is ``d p_y / d alpha_ht`` per head.

    Args:
        attention: ``[B, T]`` (or ``[B, heads, T]``) float32/float64, each row summing to 1
            over its prefix.
        values: ``[B, T, H]`` (or ``[B, heads, T, H]``), same dtype and device: the vectors
            attention averages.
        decoder: ``[N, H] -> [N, C]`` logits.
        lengths: ``[B]`` integer valid-prefix lengths (default: all ``T``).
        memory_budget: rough bytes per chunk of rows (rows are processed in chunks).

    Returns:
        Attention's shape (``[B, T]`` or ``[B, heads, T]``) in its dtype (probability per
        unit of attention weight), zero on padding.

    Raises:
        ValueError: invalid attention/values/lengths (see :func:`flip_fraction`); values
            not finite on a valid prefix (named ``values``, with the row); a decoder
            parameter that is not finite (named, e.g. ``decoder.weight``); a context
            ``sum_t alpha_t h_t``, a gradient or a product ``grad . h_t`` that overflowed
            the dtype (said so, with the row); decoder output that is not ``[N, C]``, not
            float32/float64, not finite on finite contexts, or not differentiable in the
            context.
        TypeError: ``decoder`` not callable.

    Example:
        >>> dec = torch.nn.Linear(4, 2).double()
        >>> att = torch.full((3, 5), 0.2, dtype=torch.float64)
        >>> attention_gradient(att, torch.randn(3, 5, 4, dtype=torch.float64), dec).shape
        torch.Size([3, 5])
    """
    lengths = check_inputs(attention, values, lengths)
    check_decoder(decoder, values)
    budget = check_budget(memory_budget)
    multi = attention.dim() == 3
    width, hidden = values.shape[-2:]
    # Single head: alpha [n, T], h [n, T, H]; multi-head: alpha [n, heads, T], h [n, heads, T, H].
    to_context, to_scores = ("bht,bhtd->bd", "bd,bhtd->bht") if multi else ("bt,btd->bd", "bd,btd->bt")
    mask = token_mask(lengths, width)
    if multi:
        mask = mask[:, None, :]
    out = torch.zeros_like(attention, memory_format=torch.contiguous_format)
    row_bytes = attention[:1].numel() * hidden * values.element_size()
    rows = rows_per_chunk(row_bytes, budget)
    check_values_finite(values, lengths)  # a NaN context would be blamed on the decoder
    with deferred():  # the chunks' checks read the device once, at the end
        for s in range(0, attention.shape[0], rows):
            e = min(attention.shape[0], s + rows)
            alpha = attention[s:e].masked_fill(~mask[s:e], 0)
            h = values[s:e].masked_fill(~mask[s:e, ..., None], 0)  # padding is never read, NaN there too
            with torch.no_grad():
                context = torch.einsum(to_context, alpha, h)
            _check_finite_rows(context, s, f"the context sum_t alpha_t h_t overflowed {h.dtype}")
            context.requires_grad_(True)
            with torch.enable_grad():
                logits = decoder(context)
                if isinstance(logits, Tensor):  # name the cause of logits that are not finite
                    defer(torch.isfinite(logits).all(), lambda: _nonfinite_logits(decoder, values.dtype))
                logits = check_logits(logits, e - s, dtype=attention.dtype)
                predicted = decision(logits.detach())
                p = output_distribution(logits).gather(1, predicted[:, None]).sum()
                if not p.requires_grad:
                    raise ValueError("decoder output does not depend differentiably on the context")
                # Rows are independent, so the gradient of the sum is each row's own gradient.
                (grad,) = torch.autograd.grad(p, context)
            _check_finite_rows(
                grad, s, "the decoder's gradient d p_y / d context is not finite (finite contexts and logits)"
            )
            with torch.no_grad():
                out[s:e] = torch.einsum(to_scores, grad.to(h.dtype), h).masked_fill(~mask[s:e], 0)
            _check_finite_rows(out[s:e], s, f"the gradient times values (d p_y / d c) . h_t overflowed {h.dtype}")
    return out


def _nonfinite_logits(decoder, dtype: torch.dtype) -> ValueError:
    """The error for a decoder's logits that are not finite on finite contexts, naming the cause."""
    name = non_finite_parameter(decoder)
    if name is not None:
        return ValueError(f"{name} must be finite, got NaN or infinite entries (the logits are not finite)")
    return nonfinite_logits(hint=f" on finite contexts (the decoder's output overflowed {dtype}, or it produces NaN)")


def _check_finite_rows(x: Tensor, offset: int, what: str) -> None:
    """ValueError ``what`` and the first row (``offset`` + index) of ``x`` [n, ...] holding NaN or
    inf (deferred inside a :func:`~attnmetrics._deferred.deferred` scope)."""
    bad = ~torch.isfinite(x.detach()).flatten(1).all(1)
    defer(~bad.any(), lambda: ValueError(f"{what} in row {offset + int(bad.nonzero()[0])}"))


def _order_scores(
    order: Order, attention: Tensor, values: Tensor, decoder: Decoder, lengths: Tensor, memory_budget: int
) -> Tensor | None:
    """Scores of a deterministic order ([B, T]); None for "random" (drawn per sample).

    Multi-head attention [B, heads, T] orders tokens by the head mean of each per-head score
    (attention, and the gradient orders computed per head)."""
    shape = [attention.shape[0], attention.shape[-1]]
    if isinstance(order, Tensor):
        if list(order.shape) != shape:
            raise ValueError(
                f"order as a score tensor must have shape [B, T] = {shape} (one score per token), "
                f"got {list(order.shape)}"
            )
        if order.device != attention.device:
            raise ValueError(f"order is on {order.device}, attention on {attention.device}")
        if order.is_complex() or order.dtype == torch.bool:
            raise ValueError(f"order as a score tensor must be real, got {order.dtype}")
        if order.is_floating_point() and torch.isnan(order).logical_and(token_mask(lengths, order.shape[1])).any():
            raise ValueError("order (score tensor) contains NaN on a row's valid prefix")
        return order
    if not isinstance(order, str) or order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS} or a [B, T] score tensor, got {order!r}")
    if order == "random":
        return None
    if order in ("attention", "reverse"):
        scores = attention
    else:
        grad = attention_gradient(attention, values, decoder, lengths, memory_budget=memory_budget)
        if order == "gradient":
            scores = grad
        elif order == "attn_grad":
            scores = attention * grad
        else:
            scores = torch.sign(grad) * attention  # sign_grad_attn
    if attention.dim() == 3:
        scores = scores.mean(1)
    return -scores if order == "reverse" else scores


# ---- search -------------------------------------------------------------------------------


def _first_flip(decisions: Tensor, lengths: Tensor) -> Tensor:
    """decisions [sum(L)] (row b's block k = decision after k removals) -> removed [n]."""
    n, total = lengths.shape[0], decisions.shape[0]
    offsets = torch.cumsum(lengths, 0) - lengths
    # output_size and a `never` known on the host: no device -> host read here
    row = torch.repeat_interleave(torch.arange(n, device=lengths.device), lengths, output_size=total)
    start = offsets[row]
    step = torch.arange(total, device=lengths.device) - start
    never = total + 1  # above any step (each step < its row's length <= total)
    candidate = torch.where((decisions != decisions[start]) & (step >= 1), step, never)
    first = torch.full((n,), never, dtype=torch.int64, device=lengths.device)
    first.scatter_reduce_(0, row, candidate, reduce="amin")
    return torch.where(first == never, -1, first)


def _removed_mass(attention: Tensor, order: Tensor, removed: Tensor) -> Tensor:
    """Sum of the first ``removed`` weights in order (double accumulation); NaN if -1."""
    if attention.shape[1] == 0:  # nothing to remove: no row flips
        return attention.new_full(removed.shape, math.nan)
    cum = torch.cumsum(attention.gather(1, order), 1, dtype=torch.float64)
    at = cum.gather(1, (removed - 1).clamp(min=0)[:, None]).squeeze(1)
    return torch.where(removed > 0, at, math.nan).to(attention.dtype)


def _search_general(
    attention: Tensor,
    values: Tensor,
    decoder: Decoder,
    lengths: Tensor,
    len_list: list[int],
    order: Tensor,
    budget: int,
    classes: list[int],
) -> tuple[Tensor, Tensor]:
    """Flip search with any decoder: all renormalised contexts of a chunk of rows, decided
    in batched decoder calls. ``classes`` carries C across calls (checked for consistency).
    The chunks are planned from ``len_list`` (the lengths on the host) and the values were
    checked finite by the caller: nothing here reads the device (the logits' checks wait for
    the caller's :func:`~attnmetrics._deferred.deferred` scope), but on CUDA the
    ``renormalised_contexts`` op reads back its row checks and output size once a chunk.

    Multi-head attention [B, heads, T] (values [B, heads, T, H]): each head's contexts come
    from the same kernel on the rows flattened to [B * heads, T], with the row's order in every
    head, and the decoder gets their sum over heads."""
    multi = attention.dim() == 3
    heads = attention.shape[1] if multi else 1
    batch, width, hidden = attention.shape[0], values.shape[-2], values.shape[-1]
    item = values.element_size()
    # Contexts of a chunk take about half the budget; the decoder is fed slices of an
    # eighth, leaving room for its own activations (a few times its input).
    ctx_budget, call_rows = budget // 2, max(1, budget // (8 * hidden * item))
    row_bytes = heads * hidden * item
    copy_bytes = 0 if values.is_contiguous() else heads * width * hidden * item  # the chunk's contiguous copy
    removed = torch.empty(batch, dtype=torch.int64, device=values.device)
    mass = attention.new_empty(batch)
    head_mean = attention.mean(1) if multi else attention
    s = 0
    while s < batch:
        e, used = s, 0
        while e < batch and (e == s or used + len_list[e] * row_bytes + copy_bytes <= ctx_budget):
            used += len_list[e] * row_bytes + copy_bytes
            e += 1
        lens = lengths[s:e]
        total = sum(len_list[s:e])
        ord_ = order[s:e].contiguous()
        offsets = torch.cumsum(lens, 0) - lens
        if multi:
            flat_lens = lens.repeat_interleave(heads)
            contexts = ops.renormalised_contexts(
                attention[s:e].flatten(0, 1).contiguous(),
                values[s:e].flatten(0, 1).contiguous(),
                ord_.repeat_interleave(heads, 0),
                flat_lens,
                torch.cumsum(flat_lens, 0) - flat_lens,
            )
            # Row b's heads hold consecutive blocks of L_b contexts: block k of each head adds
            # into context offsets[b] + k.
            within = torch.arange(heads * total, device=lens.device) - torch.repeat_interleave(
                torch.cumsum(flat_lens, 0) - flat_lens, flat_lens, output_size=heads * total
            )
            target = torch.repeat_interleave(offsets.repeat_interleave(heads), flat_lens, output_size=heads * total)
            contexts = contexts.new_zeros(total, hidden).index_add_(0, target + within, contexts)
        else:
            contexts = ops.renormalised_contexts(
                attention[s:e].contiguous(), values[s:e].contiguous(), ord_, lens, offsets
            )
        decisions = torch.empty(contexts.shape[0], dtype=torch.int64, device=values.device)
        for c in range(0, contexts.shape[0], call_rows):
            part = contexts[c : c + call_rows]
            logits = check_logits(decoder(part), part.shape[0], classes[0] if classes else None, dtype=attention.dtype)
            classes[:] = [logits.shape[1]]
            decisions[c : c + call_rows] = decision(logits)
        removed[s:e] = _first_flip(decisions, lens)
        mass[s:e] = _removed_mass(head_mean[s:e], ord_, removed[s:e])
        s = e
    return removed, mass


def _search_linear_heads(
    attention: Tensor, values: Tensor, weight: Tensor, bias: Tensor, lengths: Tensor, order: Tensor, budget: int
) -> tuple[Tensor, Tensor]:
    """Flip search of multi-head attention [B, heads, T] with a linear decoder, in closed form:
    after removing the first k tokens of the order, the logits are
    ``b + sum_h (sum_{j >= k} alpha_hj P_hj) / (sum_{j >= k} alpha_hj)`` over the order's
    positions j, P = values @ W.T (a head with no mass left adds 0). Suffix sums in float64
    of a chunk of rows at a time; no context is built."""
    batch, heads, width, hidden = values.shape
    classes = weight.shape[0]
    removed = torch.empty(batch, dtype=torch.int64, device=values.device)
    # Per row: the chunk's values copy, the projection and its float64 suffix sums.
    row_bytes = heads * width * (hidden * values.element_size() + classes * (values.element_size() + 16) + 16)
    rows = rows_per_chunk(row_bytes, budget)
    step = torch.arange(width, device=values.device)
    for s in range(0, batch, rows):
        e = min(batch, s + rows)
        lens = lengths[s:e]
        flat_lens = lens.repeat_interleave(heads)
        projected = project(values[s:e].flatten(0, 1), weight, flat_lens, budget).view(e - s, heads, width, classes)
        index = order[s:e, None, :].expand(-1, heads, -1)
        valid = (step < lens[:, None])[:, None, :]
        alpha = attention[s:e].gather(2, index).masked_fill(~valid, 0).double()  # in removal order
        terms = alpha[..., None] * projected.gather(2, index[..., None].expand(-1, -1, -1, classes)).double()
        numerator = terms.flip(2).cumsum(2).flip(2)  # [n, heads, T, C]: what is left after k removals
        mass_left = alpha.flip(2).cumsum(2).flip(2)[..., None]
        heads_out = torch.where(mass_left > 0, numerator / mass_left.clamp(min=torch.finfo(torch.float64).tiny), 0.0)
        logits = heads_out.sum(1) + bias.double()  # [n, T, C]
        decisions = decision(logits.flatten(0, 1)).view(e - s, width)
        changed = (decisions != decisions[:, :1]) & (step >= 1) & (step < lens[:, None])
        first = torch.where(changed, step, width).amin(1)
        removed[s:e] = torch.where(first == width, -1, first)
    mass = _removed_mass(attention.mean(1), order, removed)
    return removed, mass


def flip_fraction(
    attention: Tensor,
    values: Tensor,
    decoder: Decoder,
    lengths: Tensor | None = None,
    order: Order = "attention",
    *,
    samples: int = 1,
    generator: torch.Generator | KeyedRows | None = None,
    never_flipped: float = math.nan,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
) -> FlipResult:
    """How many attention items must be removed before the decision flips (S&S 2019, sec. 4).

    On a pair task (J&W's question answering and inference model, ``models/pair.py``) the items are the
    passage's words; the question's state rides in every passage state (``[h_t ; q]``) and is never
    removed.

    Definition (docs/definitions.md §4): order each row's valid prefix (length L) by a score,
    descending, ties to the lower index. Remove items one at a time: zero the weight,
    renormalise the rest to sum to 1 (a zero vector if nothing is left), and re-run
    ``decoder`` on the context ``sum_t alpha'_t h_t``. ``removed`` is the smallest
    k >= 1 whose decision differs from the decision at k = 0 (the renormalised full
    context); at most L - 1 items are removed, so rows with L <= 1 never flip.
    Decisions are the argmax of the logits, ties to the lower class; with C == 1 the
    output is a sigmoid and the decision is ``logit > 0``.

    An ``nn.Linear`` decoder takes a closed form on the projected values ``values @ W.T``
    (no contexts are built, accumulation in double). Any other decoder gets every
    renormalised context of a chunk of rows (at most about ``memory_budget`` bytes) in
    batched calls. The decoder must treat rows independently (put models in eval mode).
    Runs under ``torch.no_grad()`` except for the gradient orderings.

    Multi-head attention (a transformer's, docs/definitions.md §15): with ``attention``
    ``[B, heads, T]`` and ``values`` ``[B, heads, T, H]`` the items are tokens. Removing a
    token zeros it in every head and renormalises each head's row on its own; the context is
    the sum over heads of each head's renormalised context; the named orders rank tokens by
    the head mean of their per-head scores (attention, or the gradient orders computed per
    head); ``mass`` is the head-mean attention removed. A linear decoder takes a closed form
    per head (float64 suffix sums of the projected values, no contexts built).

    Args:
        attention: ``[B, T]`` (or ``[B, heads, T]``) float32/float64; each row (each head's
            row) non-negative, finite and summing to 1 over its first ``lengths[b]`` items
            (rejected otherwise, not renormalised). Any strides.
        values: ``[B, T, H]`` (or ``[B, heads, T, H]``), same dtype and device: the vectors
            attention averages.
        decoder: callable mapping contexts ``[N, H]`` to logits ``[N, C]``, C >= 1.
        lengths: ``[B]`` integer valid-prefix lengths in ``[0, T]`` (default: all T).
        order: score to remove by, highest first: ``"attention"``, ``"reverse"``
            (lowest attention first), ``"random"`` (uniform permutations, see
            :func:`random_scores`), ``"gradient"`` (d p_y / d alpha_t, see
            :func:`attention_gradient`), ``"attn_grad"`` (alpha_t * gradient),
            ``"sign_grad_attn"`` (sign(gradient) * alpha_t), or a ``[B, T]`` score tensor.
        samples: number of random permutations for ``order="random"`` (>= 1); the other
            orders are deterministic and ignore it.
        generator: ``torch.Generator`` on the inputs' device for ``order="random"``, or a
            :class:`attnmetrics.KeyedRows` (each row's draws keyed by its instance index).
        never_flipped: ``fraction`` of rows that never flip: NaN (default, S&S) or e.g.
            1.0 (as Mohankumar et al. 2020 count them).
        memory_budget: approximate bytes of working memory per chunk of rows (a single
            row whose L * H contexts exceed it is still processed whole).

    Returns:
        :class:`FlipResult` of ``[B]`` tensors (``[samples, B]`` for ``order="random"``
        with ``samples > 1``): ``removed`` int64 (-1: never), ``fraction`` (removed / L,
        unitless, attention dtype), ``flipped`` bool, ``mass`` (attention mass removed,
        attention dtype; NaN: never).

    Raises:
        ValueError: attention or values on the ``meta`` device; NaN/infinite, negative or
            non-normalised attention; an empty batch; values not ``[B, T, H]`` with H >= 1,
            of another dtype/device, or not finite on a valid prefix (named ``values``, with
            the row, whatever the decoder); bad lengths; an unknown order name or a score
            tensor of the wrong shape or with NaN; ``samples < 1``;
            an ``nn.Linear`` whose ``in_features != H``, whose ``out_features < 1`` or
            whose weight or bias is not finite (``decoder.weight``/``decoder.bias``);
            decoder output not ``[N, C]``, not float32/float64 or not finite; a
            ``generator`` on another device than the inputs.
        TypeError: ``decoder`` not callable; ``generator`` not a ``torch.Generator`` (or None);
            ``never_flipped`` not a real number (a str, a bool, None, ...).

    Example:
        The top item alone pulls the context to class 1; removing it flips the decision.

        >>> att = torch.tensor([[0.6, 0.3, 0.1]], dtype=torch.float64)
        >>> values = torch.tensor([[[0.0, 5.0], [1.0, 0.0], [1.0, 0.0]]], dtype=torch.float64)
        >>> dec = torch.nn.Linear(2, 2, bias=False).double()
        >>> _ = dec.weight.data.copy_(torch.eye(2))
        >>> res = flip_fraction(att, values, dec)
        >>> res.removed, res.fraction, res.mass
        (tensor([1]), tensor([0.3333], dtype=torch.float64), tensor([0.6000], dtype=torch.float64))
    """
    lengths = check_inputs(attention, values, lengths)
    check_decoder(decoder, values)
    budget = check_budget(memory_budget)
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise ValueError(f"samples must be an int >= 1, got {samples!r}")
    check_generator(generator, attention.device)
    if isinstance(never_flipped, bool) or not isinstance(never_flipped, numbers.Real):
        raise TypeError(
            f"never_flipped must be a float (NaN, or e.g. 1.0), got {type(never_flipped).__name__} {never_flipped!r}"
        )
    never_flipped = float(never_flipped)
    scores = _order_scores(order, attention, values, decoder, lengths, budget)
    n_samples = samples if scores is None else 1
    multi = attention.dim() == 3
    batch, width = attention.shape[0], attention.shape[-1]

    with torch.no_grad(), deferred():  # the decoder's logits checked once, at the end
        linear = is_plain_linear(decoder)
        if not linear:  # the general search's contexts: NaN values would be decided silently
            check_values_finite(values, lengths)
            len_list = lengths.tolist()  # its chunks are planned on the host
        if linear:
            bias = decoder.bias.detach() if decoder.bias is not None else values.new_zeros(decoder.weight.shape[0])
            if not multi:
                projected = project(values, decoder.weight, lengths, budget)
                att = attention.contiguous()
        removed, mass = [], []
        classes: list[int] = []
        for i in range(n_samples):
            s = scores if scores is not None else random_scores(batch, width, generator, attention.device, i)
            order_ = removal_order(s, lengths)
            if linear and multi:
                r, m = _search_linear_heads(attention, values, decoder.weight.detach(), bias, lengths, order_, budget)
            elif linear:
                r, m = ops.flip_search_linear(att, projected, bias.contiguous(), order_, lengths)
            else:
                r, m = _search_general(attention, values, decoder, lengths, len_list, order_, budget, classes)
            removed.append(r)
            mass.append(m)
        removed_t = torch.stack(removed)
        mass_t = torch.stack(mass)
        flipped = removed_t >= 0
        fraction = torch.where(flipped, removed_t.to(attention.dtype) / lengths.to(attention.dtype), never_flipped)
    if n_samples == 1:
        return FlipResult(removed_t[0], fraction[0], flipped[0], mass_t[0])
    return FlipResult(removed_t, fraction, flipped, mass_t)
