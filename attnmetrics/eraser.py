"""ERASER's comprehensiveness and sufficiency over any token importance (DeYoung et al. 2020,
sec. 4; docs/definitions.md §18), and ferret's variant of them.

For a row with L real tokens, a score per token and a fraction f, the rationale is the top
k tokens by score (ties to the lower index). Comprehensiveness is ``p(ŷ | x) - p(ŷ | x without
the rationale)``, sufficiency ``p(ŷ | x) - p(ŷ | the rationale alone)``, ŷ the model's decision
on the full row; AOPC is their mean over the fractions. The rationale is deleted (the row gets
shorter; the kept tokens stay in order between the row's special tokens) or, with
``mode="mask"``, the removed tokens are replaced by a mask token (Chrysostomou & Aletras).

Two published protocols are reproduced by options (issue 47): ALTI's (Ferrando et al. 2022)
AOPC, ``aopc="alti"`` (their bins ÷ 6 and a running minimum/maximum of the probability), and
DecompX's (Modarressi et al. 2023) Table 1, ``fractions=DECOMPX_FRACTIONS, rounding="decompx",
mode="mask"`` with the tokenizer's [MASK] (see :func:`comprehensiveness`' docstring).

Model-agnostic like :func:`attnmetrics.leave_one_out`: any :class:`attnmetrics.AttentionClassifier`
and token ids; every perturbed sequence of a block of rows and all its fractions is built at
once (two fractions of a row with the same rationale size perturb it identically and run
once), and the sequences run through the model grouped by length (no padding on the CPU; few
padded calls on a GPU), each call within the memory budget. :func:`full_rows` computes the
unperturbed rows' decisions once for several calls on the same rows. A model with the optional
``subset_logits`` capability (:class:`attnmetrics.protocol.EditsSubsets`) computes the perturbed
rows' logits itself: a causal decoder (a Hugging Face decoder classifier, a prompted model) runs
each block of rows once and recomputes each perturbed row only from its first changed token on
(``models/causal_subsets.py``; equal to the full recomputation up to rounding).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from attnmetrics._deferred import deferred
from attnmetrics._ops import ops
from attnmetrics._validation import DEFAULT_MEMORY_BUDGET
from attnmetrics.flip import removal_order
from attnmetrics.loo import (
    CPU_DELETION_CALL_BYTES,
    _check_loo_inputs,
    _checked_logits,
    _grouped_logits,
    _length_groups,
    call_budget,
)
from attnmetrics.outputs import decision, output_distribution
from attnmetrics.protocol import capability, edits_whole_texts, eval_mode

#: ERASER's fractions of the tokens in the rationale (DeYoung et al. 2020, sec. 4: "bins")
ERASER_FRACTIONS = (0.01, 0.05, 0.1, 0.2, 0.5)
#: ferret's (Attanasio et al. 2023) default fractions: 10 %, 20 %, ..., 100 %
FERRET_FRACTIONS = tuple(round(0.1 * i, 1) for i in range(1, 11))
#: how k follows from a fraction: ERASER ceil(f L); ferret floor(f L), positive scores only
VARIANTS = ("eraser", "ferret")
#: DecompX's (Modarressi et al. 2023) Table 1 masking ratios: mohsenfayyaz/DecompX@b6bddf0b,
#: experiments/notebooks/v3/analysis_v3.ipynb, ``MASKING_RATIOS = [0.0, 0.1, ..., 0.9]``; their 0.0
#: is the unmasked base, left out of the average (``np.mean(plot_y[1:])``), so not a fraction here
DECOMPX_FRACTIONS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
#: the fractions by the names the battery's ``--eraser-fractions`` takes
NAMED_FRACTIONS = {"eraser": ERASER_FRACTIONS, "decompx": DECOMPX_FRACTIONS}
#: the ERASER variant's rounding of f L (docs/definitions.md §18): ``"ceil"`` (this library's
#: definition, DESIGN §7), ``"floor"`` (ERASER's encode_attend.py sufficiency, k = 0 not counted) or
#: ``"decompx"`` (DecompX's ``int(np.floor(len(rank) * ratio))`` in IEEE doubles, k = 0 counted)
ROUNDINGS = ("ceil", "floor", "decompx")
#: how the per-fraction values make the AOPC: ``"eraser"`` their mean over the counted fractions;
#: ``"alti"`` ALTI's (Ferrando et al. 2022) running extreme over the bins, summed and divided by F + 1
AOPCS = ("eraser", "alti")


class EraserResult(NamedTuple):
    """Per-row outcome of :func:`comprehensiveness` or :func:`sufficiency`.

    values: ``[B, F]`` p(ŷ | x) - p(ŷ | perturbed x) per fraction (model dtype; NaN where a
        fraction does not count: ferret's skipped rationales, rows without real tokens).
    aopc: ``[B]`` the mean of ``values`` over the fractions that count (NaN if none); with
        ``aopc="alti"``, ALTI's AOPC of the row (:func:`alti_aopc`).
    k: ``[B, F]`` int64 size of each fraction's rationale (-1 where it does not count; 0, with
        ``rounding="decompx"``, where comprehensiveness masks nothing and it counts).
    probability: ``[B]`` p(ŷ | x) (NaN for rows without real tokens: never run).
    predicted: ``[B]`` int64 ŷ, the decision on the full row (-1 for rows without real tokens).
    """

    values: Tensor
    aopc: Tensor
    k: Tensor
    probability: Tensor
    predicted: Tensor


class FullRows(NamedTuple):
    """The unperturbed rows' decisions that :func:`comprehensiveness` and :func:`sufficiency`
    measure from (:func:`full_rows`). Computed once, they serve every ordering and both metrics
    of the same rows (the battery's ERASER step), which otherwise each run every row again.

    probability: ``[B]`` float64 p(ŷ | x) (NaN for rows without real tokens).
    predicted: ``[B]`` int64 ŷ (-1 for rows without real tokens).
    classes: C, the model's number of outputs.
    dtype: the model's float dtype.
    bytes_per_position: the activation bytes per position measured on the first call, which
        size every later call to the memory budget (None when no row has a real token).
    """

    probability: Tensor
    predicted: Tensor
    classes: int
    dtype: torch.dtype
    bytes_per_position: int | None


def full_rows(model, tokens: Tensor, lengths: Tensor, *, memory_budget: int = DEFAULT_MEMORY_BUDGET) -> FullRows:
    """The decisions on the unperturbed rows (:class:`FullRows`), to pass as ``full_rows`` to
    several :func:`comprehensiveness` / :func:`sufficiency` calls on the same ``tokens`` and
    ``lengths`` (any orderings, fractions and modes). Arguments and errors as theirs."""
    lengths, _ = _check_loo_inputs(model, tokens, lengths, "delete", None, memory_budget)
    return _full_rows(model, tokens, lengths, call_budget(tokens.device, memory_budget))


def _full_rows(model, tokens: Tensor, lengths: Tensor, budget: int) -> FullRows:
    batch, device = tokens.shape[0], tokens.device
    real = lengths - model.lead - model.trail
    predicted = torch.full((batch,), -1, dtype=torch.int64, device=device)
    probability = torch.full((batch,), math.nan, dtype=torch.float64, device=device)
    with eval_mode(model), torch.no_grad(), deferred():  # the logits' checks read once, at the end
        has = (real > 0).nonzero()[:, 0]  # rows without a real token have nothing to remove
        if not len(has):
            return FullRows(probability, predicted, 0, model.embed(tokens[:1, :1]).dtype, None)
        logits, per_position, dtype = _grouped_logits(model, tokens[has], lengths[has], None, budget, "the input rows")
    predicted[has] = decision(logits)
    probability[has] = output_distribution(logits).gather(1, predicted[has, None])[:, 0].to(torch.float64)
    return FullRows(probability, predicted, logits.shape[1], dtype, per_position)


def _check_full_rows(full: FullRows, batch: int, device: torch.device) -> FullRows:
    if not isinstance(full, FullRows):
        raise TypeError(
            f"full_rows must be an attnmetrics.eraser.FullRows (from full_rows()), got {type(full).__name__}"
        )
    for name in ("probability", "predicted"):
        t = getattr(full, name)
        if t.shape != (batch,) or t.device != device:
            raise ValueError(
                f"full_rows.{name} must be [{batch}] on {device} (the tokens' rows), got {list(t.shape)} on {t.device}"
            )
    return full


def _repeated_sizes(k: Tensor) -> Tensor:
    """``[B, F]`` index of the first fraction of each row with the same counted rationale size
    (itself where none comes earlier, or where the fraction does not count): two fractions of a
    row with one k perturb it identically (the same top-k tokens), so it runs once."""
    first = torch.arange(k.shape[1], device=k.device).expand_as(k).clone()
    for j in range(1, k.shape[1]):
        for i in range(j - 1, -1, -1):  # the earliest wins: assigned last
            same = (k[:, j] == k[:, i]) & (k[:, j] >= 0)
            first[:, j] = torch.where(same, i, first[:, j])
    return first


def _check_scores(scores, batch: int, real: Tensor) -> Tensor:
    """``scores`` [B, S] real-valued with S >= the longest row's real tokens, finite on them."""
    if not isinstance(scores, Tensor):
        raise TypeError(f"scores must be a torch.Tensor, got {type(scores).__name__}")
    if not scores.is_floating_point():
        raise ValueError(f"scores must be a floating-point tensor, got {scores.dtype}")
    longest = int(real.max())
    if scores.dim() != 2 or scores.shape[0] != batch or scores.shape[1] < longest:
        raise ValueError(
            f"scores must have shape [B, S] = [{batch}, >= {longest}] (one per real token), got {list(scores.shape)}"
        )
    if scores.device != real.device:
        raise ValueError(f"scores is on {scores.device}, tokens on {real.device}; they must match")
    valid = torch.arange(scores.shape[1], device=real.device) < real[:, None]
    bad = valid & ~torch.isfinite(scores)
    if bad.any():
        b, t = (int(i) for i in bad.nonzero()[0])
        raise ValueError(f"scores must be finite on the real tokens, got {scores[b, t].item()} at row {b}, token {t}")
    return scores


def _check_fractions(fractions) -> tuple[float, ...]:
    bad = ValueError(f"fractions must be a sequence of numbers in (0, 1], got {fractions!r}")
    if isinstance(fractions, (str, bytes)):  # "0.5" is not the fractions 0 . 5
        raise bad
    try:
        items = list(fractions)
    except TypeError:
        raise bad from None
    if any(isinstance(f, (bool, np.bool_, str, bytes)) for f in items):  # True is not the fraction 1.0
        raise bad
    try:
        out = tuple(float(f) for f in items)
    except (TypeError, ValueError):
        raise bad from None
    if not out or any(not 0 < f <= 1 for f in out):
        raise ValueError(f"fractions must be a non-empty sequence of numbers in (0, 1], got {fractions!r}")
    return out


def _check_rounding(rounding) -> str:
    if not isinstance(rounding, str) or rounding not in ROUNDINGS:
        raise ValueError(f"rounding must be one of {ROUNDINGS}, got {rounding!r}")
    return rounding


def _check_aopc(aopc, variant) -> str:
    if not isinstance(aopc, str) or aopc not in AOPCS:
        raise ValueError(f"aopc must be one of {AOPCS}, got {aopc!r}")
    if aopc == "alti" and variant != "eraser":
        raise ValueError(f"aopc='alti' applies to variant='eraser' only (ALTI's bins), got variant={variant!r}")
    return aopc


def alti_aopc(values: Tensor, empty: Tensor | None, keep_rationale: bool) -> Tensor:
    """``[B]`` ALTI's AOPC (Ferrando et al. 2022) from the per-fraction drops ``values`` ``[B, F]``
    (``p(ŷ | x) - p_j``, NaN where a fraction does not count) and, for sufficiency, ``empty`` ``[B]``
    ``= p(ŷ | x) - p(ŷ | the empty rationale)`` (the row's special tokens alone, or every real token
    masked).

    mt-upc/transformer-contributions@4f890398 ``aupc.py`` (lines 83-171, ``--bins``) runs bin 0
    (k = 0) and then each bin j of ``[0.01, 0.05, 0.1, 0.2, 0.5]`` (k_j = ceil(f_j L), L without
    [CLS] and [SEP]) and records a running extreme of the probability: comprehensiveness keeps
    ``min_prob`` (starting at 1: ``c_j = min(p(x), p_1, ..., p_j)``), sufficiency ``max_prob``
    (starting at 0, bin 0 the empty input: ``c_j = max(p_∅, p_1, ..., p_j)``). ``evaluation.ipynb``
    (cell 11, "Comprehesiveness/sufficiency") then takes ``sum_{j=1..5} (p(x) - c_j) / 6``, p(x) the
    comprehensiveness file's bin 0. In drops, with F fractions:

    - comprehensiveness: ``AOPC = sum_j max(0, v_1, ..., v_j) / (F + 1)``
    - sufficiency: ``AOPC = sum_j min(v_∅, v_1, ..., v_j) / (F + 1)``

    A fraction that does not count (NaN: ``rounding="floor"`` with k = 0) holds the running
    extreme, as ALTI's loop would on its k = 0 input. NaN for rows whose every value is NaN and
    whose ``empty`` is NaN (no real token)."""
    batch, count = values.shape
    work = values.to(torch.float64)
    if keep_rationale:
        if empty is None:
            raise ValueError("alti_aopc needs the empty rationale's drop for sufficiency")
        running = empty.to(torch.float64).clone()
        pick = torch.minimum
    else:
        running = torch.zeros(batch, dtype=torch.float64, device=values.device)
        pick = torch.maximum
    total = torch.zeros_like(running)
    for j in range(count):
        v = work[:, j]
        running = torch.where(torch.isnan(v), running, pick(running, v))
        total += running
    out = total / (count + 1)
    rows = ~torch.isnan(work).all(1)
    if keep_rationale:
        rows &= ~torch.isnan(empty)
    return torch.where(rows, out, torch.nan).to(values.dtype)


def rationale_sizes(
    scores: Tensor,
    real: Tensor,
    fractions: Sequence[float],
    variant: str = "eraser",
    rounding: str = "ceil",
    keep_rationale: bool = False,
) -> Tensor:
    """``[B, F]`` int64 size of each fraction's rationale; -1 where the fraction does not count.

    ERASER: ``k = ceil(f L)`` (``rounding="ceil"``, the default), or ``k = floor(f L)``
    (``rounding="floor"``, as ERASER's ``encode_attend.py`` sizes the rationale it keeps for
    sufficiency), where a fraction whose k is 0 does not count (the empty rationale: nothing
    deleted, or nothing left to run). DecompX (``rounding="decompx"``): ``k = floor(f L)`` of the
    IEEE product, not rounded first (mohsenfayyaz/DecompX@b6bddf0b,
    experiments/notebooks/v3/analysis_v3.ipynb, ``CheckpointToLogit.mask``: ``mask_count =
    int(np.floor(len(rank) * self.masking_ratio))``, so 90 · 0.7 = 62.99999999999999 gives 62), and a
    fraction with k = 0 counts (k = 0: the row unmasked). For sufficiency (``keep_rationale``)
    DecompX masks the least important ``floor(L K)`` tokens (their ``masking_strategy="min"``,
    Tables A.1-A.2), so the rationale kept at fraction f is ``k = L - floor(L (1 - f))`` (K = 1 - f,
    the decimal's double: 1 - 0.7 is 0.3), at least one token, and ``k = L`` (nothing masked)
    counts. ferret: ``k = floor(f L)`` tokens by score, of which only
    those with a positive score form the rationale; a fraction whose k is 0, whose rationale is
    empty (no positive score among its top k: ferret 0.4.2's ``_get_id_tokens_top_k`` gives None),
    or whose rationale equals the previous counted one, does not count (``rounding`` must be left
    at its default). Rows with L = 0 count nothing. ``f L`` is rounded to 9 decimals first, so
    0.1 · 30 is 3 under either rounding (not under ``"decompx"``, which rounds as DecompX does).

    Raises:
        ValueError: an unknown ``variant`` or ``rounding``, or a ``rounding`` other than ``"ceil"``
            with ferret (whose k is floor(f L) already).
    """
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    if _check_rounding(rounding) != "ceil" and variant != "eraser":
        raise ValueError(f"rounding applies to variant='eraser' only (ferret's k is floor(f L)), got {rounding!r}")
    f = torch.tensor(fractions, dtype=torch.float64, device=real.device)
    length = real.to(torch.float64)[:, None]
    # rounded first, so that f L = 3.0000000000000004 is 3, not 4
    if rounding == "decompx":  # DecompX: the IEEE product as numpy floors it; k = 0 counts
        if keep_rationale:  # the least important floor(L K) masked, K = 1 - f
            k = real[:, None] - torch.floor(torch.round(1 - f, decimals=9) * length).to(torch.int64)
        else:
            k = torch.floor(f * length).to(torch.int64).clamp(max=real[:, None])
        return torch.where(real[:, None] > 0, k, -1)
    exact = torch.round(f * length, decimals=9)
    if variant == "eraser":
        k = (torch.ceil if rounding == "ceil" else torch.floor)(exact).to(torch.int64).clamp(max=real[:, None])
        return torch.where((real[:, None] > 0) & (k > 0), k, -1)
    k = torch.floor(exact).to(torch.int64)
    valid = torch.arange(scores.shape[1], device=real.device) < real[:, None]
    positive = ((scores > 0) & valid).sum(1, keepdim=True)
    size = torch.where((k > 0) & (positive > 0), torch.minimum(k, positive), -1)
    counted = torch.full_like(size, -1)
    previous = torch.full_like(size[:, 0], -1)
    for j in range(size.shape[1]):  # "the previous" in the order the fractions are given
        take = (size[:, j] >= 0) & (size[:, j] != previous)
        counted[:, j] = torch.where(take, size[:, j], -1)
        previous = torch.where(size[:, j] >= 0, size[:, j], previous)
    return counted


class _Request(NamedTuple):
    """One metric of one ordering, planned: its rationale sizes ``k`` ``[B, F]``, each fraction's
    first fraction of the same size ``first``, each real token's place in the ordering ``rank``,
    ``host`` ``[B, 1 + F]`` (the lengths, then each fraction's k, -1 where it is not run), and
    ``values`` ``[B, F]`` to fill."""

    keep_rationale: bool
    k: Tensor
    first: Tensor
    rank: Tensor
    host: Tensor
    values: Tensor


def _effect(model, tokens, lengths, scores, fractions, keep_rationale, *args) -> EraserResult:
    """One ordering's comprehensiveness (``keep_rationale`` False) or sufficiency: :func:`_effects`."""
    return _effects(model, tokens, lengths, [(scores, keep_rationale)], fractions, *args)[0]


@deferred()  # every model call's checks read once, at the end
def _effects(
    model,
    tokens,
    lengths,
    requests,
    fractions,
    variant,
    mode,
    mask_token,
    memory_budget,
    rounding="ceil",
    full=None,
    aopc="eraser",
) -> list[EraserResult]:
    """The :class:`EraserResult` of each ``(scores, keep_rationale)`` of ``requests`` on the same
    rows: the inputs checked and the unperturbed rows run once; on a model with ``subset_logits``
    each block of rows prepared once for all of them, a perturbed row two requests share run once."""
    lengths, mask_token = _check_loo_inputs(model, tokens, lengths, mode, mask_token, memory_budget)
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    _check_aopc(aopc, variant)
    fractions = _check_fractions(fractions)
    lead, trail = model.lead, model.trail
    batch, width = tokens.shape
    device = tokens.device
    real = lengths - lead - trail
    checked = [(_check_scores(scores, batch, real), keep) for scores, keep in requests]
    empty_texts = edits_whole_texts(model, "subset_logits")
    budget = call_budget(tokens.device, memory_budget)
    full = _full_rows(model, tokens, lengths, budget) if full is None else _check_full_rows(full, batch, device)
    probability, predicted, dtype = full.probability, full.predicted, full.dtype
    planned = []
    for scores, keep_rationale in checked:
        k = rationale_sizes(scores, real, fractions, variant, rounding, keep_rationale)
        # nothing may be left to encode (a prompted decoder's subsets keep its template: they run it)
        if mode == "delete" and not keep_rationale and lead + trail == 0 and not empty_texts:
            whole = (k == real[:, None]) & (real[:, None] > 0)
            if whole.any():
                b, j = (int(i) for i in whole.nonzero()[0])
                raise ValueError(
                    f"comprehensiveness(mode='delete') on a model without special tokens (lead = trail = 0) "
                    f"would delete every token of row {b} (fraction {fractions[j]}: k = {int(k[b, j])} of "
                    f"{int(real[b])}), leaving an empty sequence, which no model can encode; use mode='mask' "
                    f"or leave rows that short out"
                )
        values = torch.full((batch, len(fractions)), math.nan, dtype=dtype, device=device)
        planned.append((scores, keep_rationale, k, values))
    if full.bytes_per_position is None:  # no row has a real token
        return [EraserResult(v, v[:, 0].clone(), k, probability.to(dtype), predicted) for _, _, k, v in planned]

    with eval_mode(model):
        with torch.no_grad():
            plans = []
            for scores, keep_rationale, k, values in planned:
                # rank[b, t]: place of real token t in the descending order (ties: lower index first)
                order = removal_order(scores.detach().to(torch.float64), real)
                places = torch.arange(order.shape[1], device=device).expand_as(order)
                rank = torch.empty_like(order).scatter_(1, order, places)
                if rank.shape[1] < width - lead:  # positions past the scores are padding: never ranked
                    rank = torch.cat([rank, rank.new_full((batch, width - lead - rank.shape[1]), width)], 1)
                # a fraction whose k an earlier fraction of the row has is not run again (copied below)
                first = _repeated_sizes(k)
                columns_all = torch.arange(len(fractions), device=device)
                # a perturbed row that is the row itself (DecompX's k = 0 masked, or all kept): not run, a drop of 0
                unchanged = k == (real[:, None] if keep_rationale else 0)
                run = k.masked_fill((first != columns_all) | unchanged, -1)
                host = torch.cat([lengths[:, None], run], 1).cpu()  # the one read; the calls plan from it
                plans.append(_Request(keep_rationale, k, first, rank, host, values.masked_fill(unchanged, 0)))
            subsets = capability(model, "subset_logits")
            if subsets is None:
                for r in plans:
                    args = (r.keep_rationale, mode, mask_token, full, budget, r.values)
                    _values_by_kernel(model, tokens, r.rank, r.host, *args)
            else:  # the model's own perturbed rows (a causal decoder: its prefix reused)
                cap = call_budget(device, memory_budget, CPU_DELETION_CALL_BYTES)
                _values_by_model(model, subsets, tokens, lengths, plans, mode, mask_token, full, budget, cap)
            # the empty rationale: p(ŷ | nothing kept) for ALTI's bin 0, run once
            empty = None
            if any(r.keep_rationale for r in plans) and aopc == "alti":
                empty = probability - _empty_rationale(model, tokens, lengths, real, mode, mask_token, full, budget)
            out = []
            for r in plans:
                values = r.values.gather(1, r.first)
                aopcs = values.nanmean(1) if aopc == "eraser" else alti_aopc(values, empty, r.keep_rationale)
                out.append(EraserResult(values, aopcs, r.k, probability.to(dtype), predicted))
    return out


def _values_by_kernel(model, tokens, rank, host, keep_rationale, mode, mask_token, full: FullRows, budget, values):
    """Write into ``values`` ``[B, F]`` the drop ``p(ŷ | x) - p(ŷ | perturbed x)`` of every counted
    fraction (``host`` ``[B, 1 + F]`` on the CPU: the lengths, then each fraction's k, -1 where it is
    not run), the perturbed rows built by the ``rationale_batch`` kernel and run whole through the
    model, grouped by length within the budget."""
    lead, trail = model.lead, model.trail
    batch, width = tokens.shape
    # Blocks of rows whose perturbed sequences (one per counted fraction) fit the budget,
    # their lengths known on the host (one read), so no block's calls read the device
    block = max(1, budget // ((host.shape[1] - 1) * width * 8 * 8))
    planned = _perturbed_lengths(host.tolist(), lead + trail, keep_rationale, mode)
    for b0 in range(0, batch, block):
        part = slice(b0, b0 + block)
        # every counted fraction's perturbed row at once (kernels/loo.h), row-major
        seqs, seq_lengths, rows, columns = ops.rationale_batch(
            tokens[part].contiguous(),
            host[part, 0].contiguous(),
            rank[part].contiguous(),
            host[part, 1:].contiguous(),
            lead,
            trail,
            keep_rationale,
            mask_token,
            0,
        )
        block_lengths = [n for row in planned[b0 : b0 + block] for n in row]
        if not block_lengths:
            continue
        rows += b0
        out, _, _ = _grouped_logits(
            model,
            seqs,
            seq_lengths,
            full.bytes_per_position,
            budget,
            "a perturbed row",
            full.classes,
            host_lengths=block_lengths,
        )
        p = output_distribution(out).gather(1, full.predicted[rows, None])[:, 0]
        values[rows, columns] = (full.probability[rows] - p.to(torch.float64)).to(values.dtype)


#: ERASER takes a model's ``subset_logits`` for a block of rows only where the prepared edits'
#: ``cost`` says they run fewer than this share of the positions a full recomputation runs (the
#: rows' own forward for the keys and values counted in); the other blocks run whole. On a
#: decoder classifier (no template before the text) sufficiency changes tokens near the text's
#: start and the rows' forward costs more than the reuse saves: a random Llama (d 256, 4 layers),
#: 32 rows of 70 tokens, on the CPU ran sufficiency in 1.00 s with the reuse and 0.38 s without
#: (counted: 2.1 times the positions), comprehensiveness in 1.94 s and 1.90 s (1.05 times)
SUBSET_REUSE_SHARE = 1.0


def _values_by_model(model, subsets, tokens, lengths, plans, mode, mask_token, full: FullRows, budget, cap):
    """:func:`_values_by_kernel` for every request of ``plans`` (:class:`_Request`) with the perturbed
    rows' logits from the model's ``subset_logits`` (``subsets``; a causal decoder reuses each row's
    keys and values before its first changed token): prepared once for a block of rows of about
    one length (within the ``cap``, at ``full.bytes_per_position``, as
    :func:`attnmetrics.leave_one_out` blocks its rows), then fed every request's perturbed rows of
    the block as ``changed`` masks, each distinct (row, mask) once (two orderings' or metrics'
    equal rationales perturb a row identically), sorted by their first changed position (a call's
    edits recompute about as many positions), each call within the ``cap`` at the prepared
    callable's ``position_bytes`` per position. A block whose edits' ``cost`` (when the prepared
    callable has one) is not below :data:`SUBSET_REUSE_SHARE` of a full recomputation's runs
    whole, by :func:`_values_by_kernel` within ``budget``."""
    lead, trail, device = model.lead, model.trail, tokens.device
    host_lengths = plans[0].host[:, 0]
    counted = [r.host[:, 1:] >= 0 for r in plans]
    rows = torch.stack([c.any(1) for c in counted]).any(0).nonzero()[:, 0]
    rows = rows[torch.argsort(host_lengths[rows], stable=True)]
    len_list = host_lengths[rows].tolist()
    for bs, be in _length_groups([1] * len(len_list), len_list, full.bytes_per_position, cap, padding=None):
        T = len_list[be - 1]
        block_rows = rows[bs:be]
        idx = block_rows.to(device)
        prepared = subsets(model.embed(tokens[idx, :T]), lengths[idx], mask_token)
        position_bytes = getattr(prepared, "position_bytes", full.bytes_per_position)
        if isinstance(position_bytes, bool) or not isinstance(position_bytes, int) or position_bytes <= 0:
            raise ValueError(
                f"model.subset_logits(...).position_bytes must be a positive int (bytes per position "
                f"of a call's edits), got {position_bytes!r}"
            )
        t = torch.arange(T - lead, device=device)
        edits = []  # per request: its edits' (local row, fraction column) and changed masks
        for r, c in zip(plans, counted):
            local, column = c[block_rows].nonzero(as_tuple=True)  # every run fraction of the block's rows
            k = r.host[block_rows, 1:][local, column].to(device)
            local, column = local.to(device), column.to(device)
            real = (lengths[idx] - lead - trail)[local]
            # the tokens each perturbed row changes: the rationale (comprehensiveness) or the rest
            changed = (t < real[:, None]) & ((r.rank[idx[local], : T - lead] < k[:, None]) != r.keep_rationale)
            edits.append((local, column, torch.cat([changed.new_zeros(len(local), lead), changed], 1)))
        every = torch.cat([torch.cat([e[0][:, None], e[2].long()], 1) for e in edits])  # [n, 1 + T]
        if not len(every):
            continue
        distinct, inverse = torch.unique(every, dim=0, return_inverse=True)
        local, changed = distinct[:, 0], distinct[:, 1:].bool()  # [protocol positions]
        cost = getattr(prepared, "cost", None)
        # a whole text deleted (no special tokens) runs only here: the protocol's forward has no position left
        whole_text = mode == "delete" and lead + trail == 0 and bool((changed.sum(1) == lengths[idx][local]).any())
        if cost is not None and not whole_text:
            reuse, whole = cost(local, changed)
            if reuse >= SUBSET_REUSE_SHARE * whole:  # the reuse would not save: the block runs whole
                block = full._replace(probability=full.probability[idx], predicted=full.predicted[idx])
                for r in plans:
                    block_values = r.values[idx]
                    args = (r.keep_rationale, mode, mask_token, block, budget, block_values)
                    _values_by_kernel(model, tokens[idx], r.rank[idx], r.host[block_rows], *args)
                    r.values[idx] = block_values
                continue
        first = torch.where(changed, torch.arange(T, device=device), T).min(1).values
        order = torch.argsort(first, stable=True)
        per_call = max(1, cap // max(1, T * position_bytes))
        p = torch.empty(len(local), dtype=torch.float64, device=device)
        for c in range(0, len(order), per_call):
            part = order[c : c + per_call]
            src = idx[local[part]]
            logits = _checked_logits(prepared(local[part], changed[part]), len(part), "a perturbed row", full.classes)
            p[part] = output_distribution(logits).gather(1, full.predicted[src, None])[:, 0].to(torch.float64)
        start = 0
        for r, (local_r, column, _) in zip(plans, edits):
            mine = inverse[start : start + len(local_r)]
            start += len(local_r)
            src = idx[local_r]
            r.values[src, column] = (full.probability[src] - p[mine]).to(r.values.dtype)


def _empty_rationale(model, tokens, lengths, real, mode, mask_token, full: FullRows, budget: int) -> Tensor:
    """``[B]`` float64 ``p(ŷ | the empty rationale)``: the row's special tokens alone (``mode="delete"``)
    or every real token replaced by ``mask_token`` (``"mask"``); NaN for rows without real tokens."""
    lead, trail = model.lead, model.trail
    out = torch.full(real.shape, math.nan, dtype=torch.float64, device=tokens.device)
    has = (real > 0).nonzero()[:, 0]
    if not len(has):
        return out
    rows, n = tokens[has], lengths[has]
    if mode == "mask":
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        seqs = rows.masked_fill((pos >= lead) & (pos < (n - trail)[:, None]), mask_token)
        seq_lengths = n
    elif lead + trail == 0 and edits_whole_texts(model, "subset_logits"):  # a prompt's template alone
        out[has] = _whole_texts_deleted(model, rows, n, full.predicted[has], full, budget)
        return out
    else:
        if lead + trail == 0:
            raise ValueError(
                "sufficiency(mode='delete') of the empty rationale (ALTI's bin 0, which aopc='alti' runs) "
                "on a model without special tokens (lead = trail = 0) would leave an empty "
                "sequence, which no model can encode; use mode='mask'"
            )
        ends = (n - trail)[:, None] + torch.arange(trail, device=tokens.device)
        seqs = torch.cat([rows[:, :lead], rows.gather(1, ends)], 1)
        seq_lengths = torch.full_like(n, lead + trail)
    logits, _, _ = _grouped_logits(
        model, seqs, seq_lengths, full.bytes_per_position, budget, "the empty rationale", full.classes
    )
    out[has] = output_distribution(logits).gather(1, full.predicted[has, None])[:, 0].to(torch.float64)
    return out


def _whole_texts_deleted(
    model, tokens: Tensor, lengths: Tensor, predicted: Tensor, full: FullRows, budget: int
) -> Tensor:
    """``[N]`` float64 ``p(predicted | every text token deleted)`` of rows ``tokens [N, T]`` (``lead =
    trail = 0``, ``lengths [N]`` >= 1) from the model's ``subset_logits`` (a prompt's template
    alone), blocks of rows of about one length within the ``budget``."""
    subsets = capability(model, "subset_logits")
    order = torch.argsort(lengths, stable=True)
    len_list = lengths[order].tolist()
    out = torch.empty(len(lengths), dtype=torch.float64, device=tokens.device)
    for bs, be in _length_groups([1] * len(len_list), len_list, full.bytes_per_position, budget, padding=None):
        idx = order[bs:be]
        T = len_list[be - 1]
        prepared = subsets(model.embed(tokens[idx, :T]), lengths[idx], None)
        changed = torch.arange(T, device=tokens.device) < lengths[idx][:, None]
        local = torch.arange(be - bs, device=tokens.device)
        logits = _checked_logits(prepared(local, changed), be - bs, "the empty rationale", full.classes)
        out[idx] = output_distribution(logits).gather(1, predicted[idx, None])[:, 0].to(torch.float64)
    return out


def _perturbed_lengths(rows: list[list[int]], specials: int, keep_rationale: bool, mode: str) -> list[list[int]]:
    """Per row ``[L, k_1, ..., k_F]`` (``k < 0``: no sequence), the lengths of the row's
    ``rationale_batch`` sequences in their order: L masked, the ``specials`` and the rationale
    alone (``keep_rationale``), or L - k without it."""
    if mode == "mask":
        return [[n] * sum(k >= 0 for k in ks) for n, *ks in rows]
    return [[specials + k if keep_rationale else n - k for k in ks if k >= 0] for n, *ks in rows]


_DOC = """

    Args:
        model: any :class:`attnmetrics.AttentionClassifier`; with ``subset_logits``, the perturbed
            rows come from it (a causal decoder reusing each row's prefix; the module's docstring).
        tokens: ``[B, T]`` int64 token ids, special tokens included, any strides.
        lengths: ``[B]`` integer positions per row, special tokens included, in ``[lead + trail, T]``.
        scores: ``[B, S]`` float importance of the real tokens (S at least the longest row's
            real tokens; entry ``[b, k]`` is real token ``lead + k``, as :func:`leave_one_out`
            and :func:`gradient_importance` return), finite on the real tokens; higher first.
        fractions: the fractions f in (0, 1] (default ERASER's 0.01, 0.05, 0.1, 0.2, 0.5; ferret:
            :data:`FERRET_FRACTIONS`).
        variant: ``"eraser"`` (k = ceil(f L), or floor with ``rounding``) or ``"ferret"`` (k =
            floor(f L) tokens, only the positive-scored among them; fractions with k = 0, an empty or the
            previous fraction's rationale do not count).
        rounding: the ERASER variant's k from f L: ``"ceil"`` (default; this library's
            definition, DESIGN §7: every fraction removes at least one token), ``"floor"``
            (the rationale size of ERASER's ``encode_attend.py``; a fraction with k = 0 does not
            count: NaN, ``k = -1``, left out of the AOPC) or ``"decompx"`` (DecompX's
            ``int(np.floor(L * f))`` of the IEEE product; a fraction with k = 0 counts, its value
            0; sufficiency keeps ``L - floor(L (1 - f))``, DecompX's least important tokens masked,
            and k = L, nothing masked, counts as 0; see :func:`rationale_sizes`).
            docs/definitions.md §18 has the source lines and why ceil is the default.
        aopc: how ``values`` make ``aopc``: ``"eraser"`` (default) their mean over the counted
            fractions; ``"alti"`` ALTI's: ``sum_j max(0, v_1..v_j) / (F + 1)`` for
            comprehensiveness, ``sum_j min(v_∅, v_1..v_j) / (F + 1)`` for sufficiency, v_∅ the
            empty rationale's drop (one more model call per row), :func:`alti_aopc`.
            ``values`` are the plain drops under either.
        mode: ``"delete"`` (ERASER) or ``"mask"`` (replace by ``mask_token``, length unchanged).
        mask_token: the replacing id with ``mode="mask"`` (required there, rejected otherwise).
        memory_budget: approximate bytes of activations per model call.
        full_rows: the unperturbed rows' decisions from :func:`full_rows` on the same tokens and
            lengths, shared by several calls (else computed here: one model call per row).

    Returns:
        :class:`EraserResult` (``values`` ``[B, F]``, ``aopc`` ``[B]``, unitless probability
        differences in [-1, 1], in the model's float dtype).

    Raises:
        TypeError: ``model`` does not implement the protocol; tokens, lengths or scores not tensors.
        ValueError: tokens, lengths or mode as :func:`leave_one_out` rejects them; scores not
            ``[B, >= L_max]`` floats on the tokens' device or not finite on a real token;
            fractions empty or outside (0, 1]; an unknown variant, rounding or aopc, or
            ``rounding`` other than ``"ceil"`` or ``aopc="alti"`` with ferret; the empty rationale
            deleted on a model without special tokens (sufficiency with ``aopc="alti"``); model
            outputs that are not finite ``[N, C]`` logits;
            ``full_rows`` of other rows or on another device (TypeError: not a :class:`FullRows`);
            comprehensiveness deleting a whole row on a model without special tokens (GPT-2:
            nothing would be left to encode; a prompted decoder, ``encodes_empty_text``, runs
            its template alone); a model's ``subset_logits(...).position_bytes`` that
            is not a positive int.
    """


def comprehensiveness(
    model,
    tokens: Tensor,
    lengths: Tensor,
    scores: Tensor,
    fractions: Sequence[float] = ERASER_FRACTIONS,
    *,
    variant: str = "eraser",
    rounding: str = "ceil",
    mode: str = "delete",
    mask_token: int | None = None,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    full_rows: FullRows | None = None,
    aopc: str = "eraser",
) -> EraserResult:
    """ERASER's comprehensiveness (DeYoung et al. 2020, sec. 4; docs/definitions.md §18):
    ``p(ŷ | x) - p(ŷ | x without its top-k tokens)`` per fraction, and their AOPC. High: the
    tokens the scores rank first are the ones the decision needs.

    Published protocols (issue 47):

    - ALTI (Ferrando et al. 2022; mt-upc/transformer-contributions@4f890398, ``aupc.py``
      ``--bins`` and ``evaluation.ipynb`` cell 11): the defaults (ERASER's fractions, k =
      ceil(f L) over the tokens between [CLS] and [SEP], deleted, ties to the lower index as
      their stable sort of ``rankdata`` ranks) with ``aopc="alti"`` (:func:`alti_aopc`).
    - DecompX Table 1 (Modarressi et al. 2023; mohsenfayyaz/DecompX@b6bddf0b,
      ``experiments/notebooks/v3/analysis_v3.ipynb``: ``CheckpointToLogit.mask`` with
      ``MASKING_STRATEGY = "max"``, ``compute_aopc``, ``plot_main_fig``): ``fractions=
      DECOMPX_FRACTIONS, rounding="decompx", mode="mask", mask_token=`` the tokenizer's [MASK]:
      the top ``int(np.floor(L * r))`` tokens (L without [CLS]/[SEP]) replaced by [MASK], the
      drop ``p(ŷ | x) - p(ŷ | masked)`` averaged over the instances per ratio, then over r = 0.1 ..
      0.9 (``np.mean(plot_y[1:])``; k = 0 counts as 0): with no NaN the same as the mean over
      rows of this ``aopc``. One difference left: their ``argsort`` (numpy's quicksort) breaks
      ties in the scores its own way; here ties go to the lower index. Their sufficiency (Tables
      A.1-A.2, ``MASKING_STRATEGY = "min"``: the least important ``int(np.floor(L * K))`` masked)
      is :func:`sufficiency` with the same arguments, the fraction f kept for K = 1 - f.

    On a pair task (J&W's question answering and inference model, ``models/pair.py``) the rationale is a
    set of passage words; the question stays in every input."""
    _check_rounding(rounding)
    _check_aopc(aopc, variant)
    return _effect(
        model,
        tokens,
        lengths,
        scores,
        fractions,
        False,
        variant,
        mode,
        mask_token,
        memory_budget,
        rounding,
        full_rows,
        aopc,
    )


def sufficiency(
    model,
    tokens: Tensor,
    lengths: Tensor,
    scores: Tensor,
    fractions: Sequence[float] = ERASER_FRACTIONS,
    *,
    variant: str = "eraser",
    rounding: str = "ceil",
    mode: str = "delete",
    mask_token: int | None = None,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    full_rows: FullRows | None = None,
    aopc: str = "eraser",
) -> EraserResult:
    """ERASER's sufficiency (DeYoung et al. 2020, sec. 4; docs/definitions.md §18):
    ``p(ŷ | x) - p(ŷ | only its top-k tokens)`` per fraction, and their AOPC. Low: the tokens
    the scores rank first suffice for the decision.

    On a pair task (J&W's question answering and inference model, ``models/pair.py``) the rationale is a
    set of passage words; the question stays in every input."""
    _check_rounding(rounding)
    _check_aopc(aopc, variant)
    return _effect(
        model,
        tokens,
        lengths,
        scores,
        fractions,
        True,
        variant,
        mode,
        mask_token,
        memory_budget,
        rounding,
        full_rows,
        aopc,
    )


def comprehensiveness_and_sufficiency(
    model,
    tokens: Tensor,
    lengths: Tensor,
    orderings: Mapping[str, Tensor],
    fractions: Sequence[float] = ERASER_FRACTIONS,
    *,
    variant: str = "eraser",
    rounding: str = "ceil",
    mode: str = "delete",
    mask_token: int | None = None,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    full_rows: FullRows | None = None,
    aopc: str = "eraser",
) -> dict[str, dict[str, EraserResult]]:
    """:func:`comprehensiveness` and :func:`sufficiency` of several orderings of the same rows at
    once: ``{name: {"comprehensiveness": EraserResult, "sufficiency": EraserResult}}``, each equal
    to its own call (same arguments, ``scores`` the ordering's ``[B, S]``). What it saves: the
    inputs are checked and the unperturbed rows run once; on a model with ``subset_logits`` (a
    causal decoder) each block of rows is run once for its cached keys and values for every
    ordering and metric, and a perturbed row that two orderings or metrics share (the same top
    tokens of a row) runs once. ``orderings`` must not be empty (ValueError); other errors as
    :func:`comprehensiveness`'."""
    _check_rounding(rounding)
    _check_aopc(aopc, variant)
    if not isinstance(orderings, Mapping) or not orderings:
        raise ValueError(f"orderings must be a non-empty mapping of names to [B, S] scores, got {orderings!r}")
    requests = [(scores, keep) for scores in orderings.values() for keep in (False, True)]
    args = (fractions, variant, mode, mask_token, memory_budget, rounding, full_rows, aopc)
    results = iter(_effects(model, tokens, lengths, requests, *args))
    return {name: {"comprehensiveness": next(results), "sufficiency": next(results)} for name in orderings}


comprehensiveness.__doc__ += _DOC
sufficiency.__doc__ += _DOC
