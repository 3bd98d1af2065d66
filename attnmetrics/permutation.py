"""Permutation test (J&W 2019, sec. 4.2; docs/definitions.md §9).

Encode once; shuffle each row's attention weights among its real tokens while the
hidden states stay in place (context ``sum_t alpha_{pi(t)} h_t``), re-run the layers
after attention (the *decoder*), and score the output TVD from the original output;
per instance, the median over the permutations.

Permutations come from a counter-based generator in the kernels
(``attnmetrics::attention_permutations``, algorithm in ``csrc/kernels/permutation.h``):
permutation p of row r is a pure function of (seed, r, p), with one seed drawn per
call from a ``torch.Generator``. A row's permutations therefore do not depend on the
other rows, on chunking or on the decoder path, but they do depend on its index r.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from attnmetrics._decoder import Decoder, check_values_finite, is_plain_linear, project, rows_per_chunk
from attnmetrics._deferred import defer, deferred
from attnmetrics._ops import ops
from attnmetrics._validation import (
    DEFAULT_MEMORY_BUDGET,
    check_budget,
    check_decoder,
    check_generator,
    check_inputs,
    check_int,
    check_lengths,
    check_logits,
)
from attnmetrics.keyed import KeyedRows
from attnmetrics.outputs import output_distribution
from attnmetrics.protocol import token_mask


class PermutationResult(NamedTuple):
    """Per-row outcome of :func:`permutation_test`.

    median_tvd: ``[B]``, median over the permutations of the output TVD (attention dtype).
    max_attention: ``[B]``, the row's largest attention weight (J&W plot ``median_tvd``
        against it); NaN for rows with L = 0.
    tvd: ``[B, P]``, every permutation's output TVD, or ``None`` unless ``return_all``.
    """

    median_tvd: Tensor
    max_attention: Tensor
    tvd: Tensor | None


def draw_seed(generator: torch.Generator | KeyedRows | None = None) -> int:
    """The seed a call draws: one non-negative int64, ``Tensor.random_(generator=generator)``
    on the generator's device (the default CPU generator when ``None``)."""
    device = generator.device if generator is not None else "cpu"
    return int(torch.empty((), dtype=torch.int64, device=device).random_(generator=generator))


def attention_permutations(
    lengths: Tensor, width: int, permutations: int, seed: int, *, row_offset: int = 0, permutation_offset: int = 0
) -> Tensor:
    """The random permutations a permutation test with ``seed`` applies.

    Args:
        lengths: ``[B]`` integer valid-prefix lengths in ``[0, width]``.
        width: T, the padded row width (``< 2**32``).
        permutations: P >= 1, permutations per row.
        seed: int64 (see :func:`draw_seed`).
        row_offset: global index of row 0 (a row's permutations depend on its index).
        permutation_offset: global index of permutation 0.

    Returns:
        ``[B, P, T]`` int64: entry ``[b, p, :L]`` is a uniformly random permutation of
        ``0 .. L-1`` (L = ``lengths[b]``), permutation ``permutation_offset + p`` of row
        ``row_offset + b``; ``[b, p, L:]`` is the identity. The permuted attention is
        ``attention.gather(1, perm)``.

    Raises:
        ValueError: bad lengths, ``permutations < 1`` or negative offsets.
    """
    check_int("width", width, 0)
    if width >= 2**32:
        raise ValueError(f"width must be < 2**32, got {width}")
    check_int("permutations", permutations, 1)
    check_int("row_offset", row_offset, 0)
    check_int("permutation_offset", permutation_offset, 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or not -(2**63) <= seed < 2**63:
        raise ValueError(f"seed must be an int64, got {seed!r}")
    if not isinstance(lengths, Tensor) or lengths.dim() != 1:
        got = list(lengths.shape) if isinstance(lengths, Tensor) else type(lengths).__name__
        raise ValueError(f"lengths must be a [B] integer tensor, got {got}")
    lengths = check_lengths(lengths, lengths.shape[0], width, lengths.device)
    return ops.attention_permutations(lengths, width, permutations, seed, row_offset, permutation_offset)


def _median(x: Tensor) -> Tensor:
    """numpy's median along dim 1 (mean of the two middle values for even n), in float64."""
    s = x.to(torch.float64).sort(dim=1).values
    n = x.shape[1]
    return (s[:, (n - 1) // 2] + s[:, n // 2]) / 2


def _general(
    attention: Tensor,
    values: Tensor,
    decoder: Decoder,
    lengths: Tensor,
    permutations: int,
    seed: int,
    budget: int,
    first: int = 0,
) -> Tensor:
    """Output TVD [B, P] (float64) with any decoder. Per chunk of rows: the permutations
    (kernel), the permuted weights by gather, the original and every permuted context of a
    row in one batched matmul (row b: ``[P + 1, T] @ [T, H]``, per head and summed over the
    heads for multi-head attention ``[B, heads, T]``), decoded in batched calls. The values are
    checked before the loop and the contexts' and logits' finiteness once after it
    (:mod:`attnmetrics._deferred`): no device read per chunk (issue 32's orchestration for the GPU)."""
    att = attention if attention.dim() == 3 else attention[:, None]  # [B, heads, T]
    vals = values if values.dim() == 4 else values[:, None]  # [B, heads, T, H]
    batch, heads, width, hidden = vals.shape
    item = values.element_size()
    p1 = permutations + 1
    # A chunk (permutations, weights, a zero-padded copy of its values, contexts) takes
    # about half the budget; the decoder is fed slices of an eighth, leaving room for its
    # own activations (a few times its input).
    row_bytes = p1 * width * (8 + heads * item) + heads * width * hidden * item + p1 * hidden * item
    rows = rows_per_chunk(row_bytes, budget // 2)
    call_rows = max(1, budget // (8 * hidden * item))
    classes: list[int] = []
    result = torch.empty(batch, permutations, dtype=torch.float64, device=values.device)
    check_values_finite(values, lengths)  # names the batch's row; the loop reads the device no more
    with deferred():  # the contexts' and logits' checks read once, at the end
        for s in range(0, batch, rows):
            e = min(batch, s + rows)
            n, lens = e - s, lengths[s:e]
            mask = token_mask(lens, width)[:, None, :]
            alpha = att[s:e].masked_fill(~mask, 0)
            h = vals[s:e].masked_fill(~mask[..., None], 0)  # padding never enters a context
            perms = ops.attention_permutations(lens, width, permutations, seed, first + s, 0)
            # The same permutation of a row's tokens in every head.
            permuted = alpha.gather(2, perms.view(n, 1, -1).expand(-1, heads, -1)).view(n, heads, permutations, width)
            weights = torch.cat([alpha[:, :, None], permuted], 2)  # [n, heads, P + 1, T]
            # Row b: original, then permuted contexts, summed over heads.
            contexts = torch.einsum("nhpt,nhtd->npd", weights, h).reshape(n * p1, hidden)
            defer(  # finite values whose context overflowed?
                torch.isfinite(contexts[::p1]).all(),
                lambda s=s, e=e: ValueError(
                    f"a context sum_t alpha_t h_t of rows {s}..{e - 1} overflowed {values.dtype}"
                ),
            )
            dists = []
            for c in range(0, n * p1, call_rows):
                part = contexts[c : c + call_rows]
                logits = check_logits(
                    decoder(part), part.shape[0], classes[0] if classes else None, dtype=attention.dtype
                )
                classes[:] = [logits.shape[1]]
                dists.append(output_distribution(logits.to(torch.float64)))
            dist = torch.cat(dists).view(n, p1, -1)
            # distributions of the decoder's outputs: the unchecked kernel (checked with the logits)
            result[s:e] = ops.tvd(dist[:, 1:].contiguous(), dist[:, :1].expand(-1, permutations, -1).contiguous())
    return result


def permutation_test(
    attention: Tensor,
    values: Tensor,
    decoder: Decoder,
    lengths: Tensor | None = None,
    *,
    permutations: int = 100,
    generator: torch.Generator | KeyedRows | None = None,
    return_all: bool = False,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
) -> PermutationResult:
    """Median output TVD over random permutations of the attention (J&W 2019, sec. 4.2).

    On a pair task (J&W's question answering and inference model, ``models/pair.py``) the attention is
    over the passage's words and each passage state carries the question's (``[h_t ; q]``), so a
    permutation mixes the passage's states with the question held fixed (J&W's ``permute_attn``).

    Definition (docs/definitions.md §9): the hidden states are encoded once; for each row (valid
    prefix of length L) and each of ``permutations`` uniformly random permutations pi
    of ``0 .. L-1``, the context ``sum_t alpha_{pi(t)} h_t`` is decoded and the output
    distribution compared with the original one (the unpermuted context
    ``sum_t alpha_t h_t``) by ``TVD = ½ Σ |p - q|``. ``median_tvd`` is the median over the
    permutations with numpy's definition (J&W used ``np.median``): for even P the mean
    of the two middle values (``torch.median`` would return the lower one). Rows with
    L <= 1 have TVD 0. Output distributions: softmax for C >= 2 logits, ``(1 - p, p)``
    with ``p = sigmoid(logit)`` for C == 1.

    Permutation p of row b is ``attention_permutations(lengths, T, P, seed)[b, p]``
    with ``seed = draw_seed(generator)`` (one int64 per call): it depends on
    (seed, b, p) only, so the result does not depend on ``memory_budget`` or on the
    other rows, but a row's permutations depend on its index b. With a
    :class:`attnmetrics.KeyedRows` ``(seed, offset)`` they are
    ``attention_permutations(lengths, T, P, seed, row_offset=offset)[b, p]``: keyed by the
    instance index ``offset + b``, whatever batch the row is in.

    An ``nn.Linear`` decoder (a plain one: no hooks, no overridden forward) runs the
    whole test in one kernel on the projected values ``values @ W.T`` (``[B, T, C]``,
    projected by a kernel that reads only the valid prefixes; no context is formed;
    double accumulation over tokens). Any other decoder gets the original and permuted
    contexts of a chunk of rows (about ``memory_budget`` bytes; one batched matmul in the
    inputs' dtype) in batched calls; it must treat rows independently (put models in
    eval mode). The two paths agree up to rounding. Runs under ``torch.no_grad()``.

    Multi-head attention ``[B, heads, T]`` with values ``[B, heads, T, H]`` (a transformer's;
    docs/definitions.md §15): a permutation moves the tokens alike in every head
    (``alpha'_ht = alpha_{h, pi(t)}``), the context is the sum over heads, and
    ``max_attention`` is the largest head-mean weight. A linear decoder then decodes the
    heads' projected values (``values @ W.T``) through the batched path.

    Args:
        attention: ``[B, T]`` (or ``[B, heads, T]``) float32/float64; each row (each head's
            row) non-negative, finite and summing to 1 over its first ``lengths[b]`` items
            (rejected otherwise). Any strides.
        values: ``[B, T, H]`` (or ``[B, heads, T, H]``), same dtype and device: the vectors
            attention averages.
        decoder: callable mapping contexts ``[N, H]`` to logits ``[N, C]``, C >= 1.
        lengths: ``[B]`` integer valid-prefix lengths in ``[0, T]`` (default: all T).
        permutations: P >= 1 (J&W: 100).
        generator: ``torch.Generator`` the seed is drawn from (default: torch's global one),
            or a :class:`attnmetrics.KeyedRows`.
        return_all: also return every TVD, ``[B, P]``.
        memory_budget: approximate bytes of working memory per chunk of rows (one row's
            P contexts are processed whole even when they exceed it).

    Returns:
        :class:`PermutationResult`: ``median_tvd`` ``[B]`` (unitless, in [0, 1],
        attention dtype), ``max_attention`` ``[B]`` (NaN where L = 0), ``tvd`` ``[B, P]``
        or ``None``.

    Raises:
        ValueError: attention or values on the ``meta`` device; NaN/infinite, negative or
            non-normalised attention; an empty batch;
            values not ``[B, T, H]`` with H >= 1 or of another dtype/device, or not finite on a valid
            prefix; bad lengths; ``permutations`` not an int >= 1; a bad
            ``memory_budget``; an ``nn.Linear`` whose ``in_features != H``, whose
            ``out_features < 1`` or whose weight (``decoder.weight``) or bias
            (``decoder.bias``) is not finite; decoder output not ``[N, C]``,
            not float32/float64 or not finite.
        TypeError: ``decoder`` not callable; ``generator`` not a ``torch.Generator`` (or None).

    Example:
        >>> att = torch.tensor([[0.9, 0.1], [1.0, 0.0]], dtype=torch.float64)
        >>> values = torch.tensor([[[4.0], [-4.0]], [[1.0], [2.0]]], dtype=torch.float64)
        >>> dec = torch.nn.Linear(1, 1, bias=False).double()
        >>> _ = dec.weight.data.fill_(1.0)
        >>> res = permutation_test(att, values, dec, torch.tensor([2, 1]), permutations=3,
        ...                        generator=torch.Generator().manual_seed(0))
        >>> res.median_tvd.shape, res.median_tvd[1].item(), res.max_attention.tolist()
        (torch.Size([2]), 0.0, [0.9, 1.0])
    """
    lengths = check_inputs(attention, values, lengths)
    check_decoder(decoder, values)
    budget = check_budget(memory_budget)
    permutations = check_int("permutations", permutations, 1)
    if not isinstance(return_all, bool):
        raise ValueError(f"return_all must be a bool, got {return_all!r}")
    check_generator(generator)  # any device: the seed is drawn on the generator's
    keyed = isinstance(generator, KeyedRows)
    seed, first = (generator.seed, generator.offset) if keyed else (draw_seed(generator), 0)
    multi = attention.dim() == 3
    batch, width = attention.shape[0], attention.shape[-1]

    with torch.no_grad():
        linear = is_plain_linear(decoder)
        if linear:
            heads = attention.shape[1] if multi else 1
            projected = project(
                values.flatten(0, 1) if multi else values, decoder.weight, lengths.repeat_interleave(heads), budget
            )
            if decoder.bias is None:
                bias = projected.new_zeros(projected.shape[2])
            else:
                bias = decoder.bias.detach().contiguous()  # finite: check_decoder
        if linear and not multi:
            median, tvds = ops.permutation_tvd_linear(
                attention.contiguous(), projected, bias, lengths, permutations, seed, first
            )
        else:
            if linear:  # multi-head: the heads' projected values are the values of a bias-only decoder
                values, decoder = projected.view(batch, heads, width, -1), lambda z: z + bias
            tvds = _general(attention, values, decoder, lengths, permutations, seed, budget, first)
            tvds[lengths <= 1] = 0  # equal contexts; a batched decoder call may round them apart
            median = _median(tvds).to(attention.dtype)
            tvds = tvds.to(attention.dtype)
        if width:
            head_mean = attention.mean(1) if multi else attention
            real = head_mean.masked_fill(~token_mask(lengths, width), -torch.inf)
            top = torch.where(lengths > 0, real.amax(1), torch.nan)
        else:
            top = attention.new_full((batch,), torch.nan)
    return PermutationResult(median, top, tvds if return_all else None)
