"""Causal prefix reuse for edits of many tokens at once: ERASER's perturbed rows (DESIGN §8).

ERASER (:mod:`attnmetrics.eraser`) deletes or masks a SET of a row's tokens: comprehensiveness
its rationale, sufficiency everything else. On a causal model every position before the first
changed token is the same in the edited input as in the row, in every layer, so
:func:`prepare_subsets` runs the rows once keeping every layer's keys and values
(:func:`~attnmetrics.models.causal_edits.cache_rows`) and an edit recomputes only the positions
from its first changed token on: for a deletion, the kept tokens after it at their NEW places
(rotary or learned positions), then the rest of the input (a prompt's suffix template); for a
masking, the mask tokens and what follows at their own places. The layers are
:func:`~attnmetrics.models.causal_edits.run_layers`', as for the one-token edits of
:func:`~attnmetrics.models.causal_edits.prepare_edits` (a one-token edit is the special case of
a set of one). Equal to a full recomputation up to rounding (tests/models/test_causal_subsets.py:
float64 to 1e-10, float32 to 1e-5). :func:`subset_counts` counts the positions it recomputes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import Tensor

from attnmetrics.models.causal_edits import (
    EDIT_MODES,
    CachedRows,
    CausalDecoder,
    EditCounts,
    cache_rows,
    position_bytes,
    recompute,
)


def prepare_subsets(
    decoder: CausalDecoder,
    readout: Callable[[Tensor], Tensor],
    inputs: Tensor,
    full: Tensor,
    first: Tensor,
    lengths: Tensor,
    replacement: Tensor | None = None,
    prefix: list[tuple[Tensor, Tensor]] | None = None,
) -> Callable[[Tensor, Tensor], Tensor]:
    """Prepare the many-token edits of G rows; returns a
    :class:`~attnmetrics.protocol.PreparedSubsets`: ``edits(rows [N] int64, changed [N, T]
    bool)`` -> logits ``[N, C]`` of row ``rows[i]`` with every text position t where
    ``changed[i, t]`` deleted (``replacement`` None: the kept tokens close up) or replaced by the
    word embedding ``replacement [d]``. An edit that changes nothing gives the row's own logits.

    The first call (or ``edits.unedited_logits()``, the rows' own logits) runs the rows once,
    every layer's keys and values kept; each call then recomputes, per edit, the positions from
    its first changed one on (at least the last position, which is read out).
    ``edits.cost(rows, changed)``: the positions the edits would run, ``(reuse, full)`` host ints:
    with the reuse (their recomputed positions, and the rows' own forward while it has not run),
    and by a full recomputation (the edited inputs whole), without running anything (by which
    ERASER chooses). ``edits.position_bytes``: about what a call holds per text position of its
    edits (by which ERASER sizes its calls); ``edits.recomputed``: the positions its calls have
    run so far (:func:`subset_counts`' ``recomputed``).

    Args:
        decoder: the model's layers (:func:`~attnmetrics.models.causal_edits.decoder_of`).
        readout: the final-normed state at the last position ``[N, d]`` -> logits ``[N, C]``.
        inputs: ``[G, Tf, d]`` the whole inputs' word embeddings (a template around the text),
            right-padded.
        full: ``[G]`` int64, their lengths (>= 1); the last position is read out.
        first: ``[G]`` int64, each row's first text position (text position t is ``first + t``).
        lengths: ``[G]`` int64, each row's text length (the protocol's; ``changed`` is False past it).
        prefix: the keys and values of the positions before every row's first text position, shared
            by every row (``cache_rows``' ``prefix``: the rows' own forward starts after them), or None.

    Calls (and ``cost``) raise ValueError (naming ``changed``) for a ``changed`` that is not
    ``[N, T]`` bool with N >= 1 on the inputs' device (any T), that marks a position past its
    row's text, or whose deletion leaves no position to read out; ``rows`` must be ``[N]`` int64
    indices of the G rows.
    """
    G, Tf, _ = inputs.shape
    device = inputs.device
    masked = replacement is not None
    if masked:
        replacement = replacement.to(inputs.dtype)
    width = int(lengths.max()) if G else 0
    rows_run: list[CachedRows] = []  # the rows' own forward, run at the first call that needs it
    shared = 0 if prefix is None else prefix[0][0].shape[2]  # positions the rows' forward does not run

    def cached() -> CachedRows:
        if not rows_run:
            rows_run.append(cache_rows(decoder, readout, inputs, full, prefix))
        return rows_run[0]

    def plan(rows: Tensor, changed: Tensor):
        """Each edit's changed whole positions ``hit [N, Tf]``, new length, first recomputed
        position and recomputed count, and (host ints) their widest count, latest start, total and
        the edited inputs' total length; the one read of a call."""
        N = rows.shape[0]
        if not isinstance(changed, Tensor) or changed.dtype != torch.bool or changed.dim() != 2:
            got = f"{changed.dtype} {list(changed.shape)}" if isinstance(changed, Tensor) else type(changed).__name__
            raise ValueError(f"changed must be an [N, T] bool tensor (one row per edit), got {got}")
        if changed.shape[0] != N or changed.device != device or N == 0:
            raise ValueError(
                f"changed must be [{N}, T] (one row per edit of rows, N >= 1) on {device}, "
                f"got {list(changed.shape)} on {changed.device}"
            )
        changed = torch.cat([changed, changed.new_zeros(N, 1)], 1)  # a last column of False: never empty
        T = changed.shape[1]
        j = torch.arange(Tf, device=device)
        text = (j[None] - first[rows][:, None]).clamp(0, T - 1)  # [N, Tf]: each whole position's text position
        hit = (j[None] >= first[rows][:, None]) & changed.gather(1, text)  # the changed whole positions
        stray = changed & (torch.arange(T, device=device)[None] >= lengths[rows][:, None])
        new_length = full[rows] - (0 if masked else hit.sum(1))
        edit = torch.where(hit, j, Tf).min(1).values  # the first changed position (Tf: none)
        start = torch.minimum(edit, new_length - 1)  # at least the last position
        count = new_length - start
        W, S, total, whole, bad, empty = torch.stack(
            [count.max(), start.max(), count.sum(), new_length.sum(), stray.any(), (new_length < 1).any()]
        ).tolist()
        if bad:
            r = int(stray.any(1).nonzero()[0])
            raise ValueError(
                f"changed marks text position {int(stray[r].nonzero()[0])} of edit {r} (row {int(rows[r])}), "
                f"past the row's {int(lengths[rows[r]])} text tokens"
            )
        if empty:
            r = int((new_length < 1).nonzero()[0])
            raise ValueError(
                f"changed deletes every position of edit {r} (row {int(rows[r])}): nothing is left to read out"
            )
        return hit, new_length, start, count, W, S, total, whole

    def edits(rows: Tensor, changed: Tensor) -> Tensor:
        hit, new_length, start, count, W, S, total, _ = plan(rows, changed)
        edits.recomputed += total
        at = start[:, None] + torch.arange(W, device=device)  # [N, W] the new positions
        if masked:
            words = inputs[rows[:, None], at.clamp(max=Tf - 1)]
            replaced = hit.gather(1, at.clamp(max=Tf - 1))[..., None]
            words = torch.where(replaced, replacement, words)
        else:
            j = torch.arange(Tf, device=device)
            kept = (j[None] < full[rows][:, None]) & ~hit
            order = torch.argsort((~kept).to(torch.int8), dim=1, stable=True)  # kept positions first, in order
            src = order.gather(1, at.clamp(max=Tf - 1))  # where each new position's token was
            words = inputs[rows[:, None], src]
        return recompute(decoder, readout, cached().cache, rows, start, words, count, W, S)

    def cost(rows: Tensor, changed: Tensor) -> tuple[int, int]:
        _, _, _, _, _, _, total, whole = plan(rows, changed)
        return total + (0 if rows_run else int(full.sum()) - G * shared), whole

    edits.recomputed = 0
    edits.unedited_logits = lambda: cached().logits
    edits.cost = cost
    edits.position_bytes = position_bytes(decoder, inputs, full, first, max(1, width))
    return edits


def subset_counts(rows: Iterable, prefix: int = 0, suffix: int = 0, mode: str = "delete") -> EditCounts:
    """:class:`~attnmetrics.models.causal_edits.EditCounts` of many-token edits: ``recomputed``
    the positions :func:`prepare_subsets` runs (each edit from its first changed position on, at
    least the last one), ``full`` those of a full recomputation (each edited input whole), ``rows``
    the rows' own forward (the reuse's cache; a full recomputation's original outputs).

    Args:
        rows: per row, ``(length, edits)``: its text length (an int >= 0) and its edits, each an
            iterable of the changed text positions (ints in ``[0, length)``).
        prefix, suffix: the template's tokens around the text (0, 0 for a decoder classifier).
        mode: ``"delete"`` or ``"mask"``.

    Raises:
        ValueError: an unknown ``mode``, a changed position outside its row's text, or a deletion
            that leaves nothing.

    For ERASER's fractions (0.01, 0.05, 0.1, 0.2, 0.5: k = 1, 2, 3, 5, 12 of 23) on texts of 23
    tokens in SmolLM2's chat template (prefix 41, suffix 6), with the rationale the top k of a
    uniformly random order, the reuse recomputes per row (mean of 2000 orders) 94.5 of the 327
    positions a full recomputation runs for comprehensiveness' deletions (0.29; 0.50 with the 70
    of the row's own forward for the cache), 51.5 of 258 for sufficiency's (0.20; 0.47), 117.5 and
    143.5 of 350 for the maskings (0.34, 0.41; 0.54, 0.61): the prefix template is never run again,
    but sufficiency masks (and comprehensiveness deletes at a fraction of 0.5) from near the text's
    start.
    """
    if mode not in EDIT_MODES:
        raise ValueError(f"mode must be one of {EDIT_MODES}, got {mode!r}")
    recomputed = full = whole_rows = 0
    for length, edits in rows:
        n = int(length)
        whole = prefix + n + suffix
        whole_rows += whole
        for changed in edits:
            changed = sorted({int(t) for t in changed})
            if changed and not 0 <= changed[0] <= changed[-1] < n:
                raise ValueError(f"rows: changed positions {changed} outside a text of {n} tokens")
            new = whole - (len(changed) if mode == "delete" else 0)
            if new < 1:
                raise ValueError(f"rows: deleting {changed} leaves nothing of a row of {whole} positions")
            start = min(prefix + changed[0], new - 1) if changed else new - 1
            recomputed += new - start
            full += new
    return EditCounts(recomputed, full, whole_rows)
