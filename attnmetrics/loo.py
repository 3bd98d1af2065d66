"""Leave-one-out token importance (J&W 2019, sec. 4.1): delete (or mask) each real token,
re-encode, and score the output TVD from the original.

Model-agnostic: it takes any :class:`attnmetrics.AttentionClassifier` and a batch of token
ids, never a concrete model. Per-token results cover the real tokens only: the ``lead``
special positions (``<SOS>``) are sliced off the front and the ``trail`` ones (``<EOS>``)
fall beyond the shortened lengths (docs/definitions.md, "Special tokens").
"""

from __future__ import annotations

import operator

import torch
from torch import Tensor

from attnmetrics._deferred import deferred
from attnmetrics._ops import ops
from attnmetrics._validation import DEFAULT_MEMORY_BUDGET, check_budget, check_logits, check_model_inputs
from attnmetrics.outputs import output_distribution
from attnmetrics.protocol import AttentionClassifier, capability, edits_whole_texts, eval_mode

#: leave_one_out modes: delete the token (J&W) or replace it with a mask token
LOO_MODES = ("delete", "mask")

#: On CPU, leave_one_out's calls hold at most this much (estimated) even when the budget
#: allows more: with J&W's BiLSTM on a 2-core machine, calls of ~4k positions (~32 MiB)
#: ran about twice as fast per token as calls of ~30k, whose activations leave the cache.
CPU_CALL_BYTES = 32 * 2**20

#: The cap for calls to a model's ``deletion_logits``, sized by the ``position_bytes`` the
#: model gives (else by the full-forward estimate): with J&W's BiLSTM (models/deletions.py,
#: 532 bytes per position) on a 2-core machine, SST-like rows at E 300 ran in 8.1-9.0 s at
#: 10-14 MiB against 10-11.5 s at 20-32 and 13.6 s at 64 (the recurrence's products leave the
#: cache); IMDB-like rows in 19.8 s at 12 MiB, 18.2-18.9 at 16-24, 22.5 at 4.
CPU_DELETION_CALL_BYTES = 12 * 2**20

_ONLY_SPECIALS = (
    "; after deleting the only real token of a row only the special tokens are left, which the "
    "model must accept (e.g. a zero context when no position gets attention)"
)


def _cuda_kernels() -> bool:
    from attnmetrics import _ops as loader

    return loader.CUDA_KERNELS


def _check_loo_inputs(model, tokens, lengths, mode, mask_token, memory_budget) -> tuple[Tensor, int | None]:
    """Validate leave_one_out's arguments; return lengths as int64 and mask_token as int or None."""
    lengths = check_model_inputs(model, tokens, lengths)
    if not isinstance(mode, str) or mode not in LOO_MODES:
        raise ValueError(f"mode must be one of {LOO_MODES}, got {mode!r}")
    if mode == "delete":
        if mask_token is not None:
            raise ValueError(
                f"mask_token is only used with mode='mask', got mask_token={mask_token!r} with mode='delete'"
            )
    else:
        if mask_token is None or isinstance(mask_token, bool):
            raise ValueError(f"mode='mask' needs mask_token, a non-negative int token id, got {mask_token!r}")
        try:
            mask_token = operator.index(mask_token)
        except TypeError:
            raise ValueError(f"mask_token must be a non-negative int token id, got {mask_token!r}") from None
        if mask_token < 0:
            raise ValueError(f"mask_token must be a non-negative int token id, got {mask_token}")
    check_budget(memory_budget)
    return lengths, mask_token


def _model_logits(
    model, tokens: Tensor, lengths: Tensor, what: str, classes: int | None
) -> tuple[Tensor, int, torch.dtype]:
    """embed -> encode -> attend -> decoder on one batch; returns logits [N, C], the
    estimated bytes per position, and the embeddings' dtype.

    The byte estimate is what one position of this call held: its embedding and about eight
    hidden-sized vectors (an LSTM's four gates per direction, its output before and after
    padding, the attention layer's projection), a conservative bound on the activations.
    """
    embedded = model.embed(tokens)
    hidden = model.encode(embedded, lengths)
    logits = _head_logits(model, hidden, lengths, what, classes)
    per_position = (embedded.shape[-1] + 8 * hidden.shape[-1]) * hidden.element_size()
    return logits, per_position, embedded.dtype


def _head_logits(model, hidden: Tensor, lengths: Tensor, what: str, classes: int | None) -> Tensor:
    """attend -> decoder on hidden states [N, T, H]; checks the logits are finite [N, C]."""
    attention = model.attend(hidden, lengths)
    logits = model.decoder(torch.einsum("bt,bth->bh", attention, hidden))
    return _checked_logits(logits, hidden.shape[0], what, classes)


def _checked_logits(logits, n: int, what: str, classes: int | None) -> Tensor:
    """``logits`` if they are finite [n, C] (C = ``classes`` when given), else ValueError (the
    finiteness read deferred inside a procedure: :mod:`attnmetrics._deferred`)."""
    return check_logits(logits, n, classes, source="model", inputs=what, on=f" on {what}", hint=_ONLY_SPECIALS)


#: On the CPU a call holds rows of one length (no padding is computed), except that a call of
#: fewer than CPU_SMALL_CALL real positions takes rows of the next lengths while its padding
#: stays within CPU_PADDING of its real positions: many lengths with few rows each would make
#: many small matrix products, which a transformer runs far below its multiply-add rate
#: (benchmarks/test_bench_eraser.py); calls with more rows keep exact lengths (a BiLSTM's ERASER
#: ran 15 % slower with every call padded up to an eighth)
CPU_SMALL_CALL = 512
CPU_PADDING = 0.125


def _length_groups(
    counts: list[int],
    widths: list[int],
    per_position: int,
    budget: int,
    padding: float | None = 0.0,
    small: int = 0,
) -> list[tuple[int, int]]:
    """Consecutive groups [s, e) of rows sorted by width, holding at most ``budget`` bytes
    of ``count * width * per_position`` (``width`` the group's widest). ``padding=None``: any
    widths; else a group takes a wider row only while it holds fewer than ``small`` real
    positions and its padded positions stay within ``padding`` of its real ones (the defaults:
    rows of one width only). A row that alone exceeds the budget forms its own group."""
    groups, start, count, real = [], 0, 0, 0
    for i, (c, w) in enumerate(zip(counts, widths)):
        # a new width starts a group unless this one is small and stays little padded
        new_width = padding is not None and i > start and w != widths[i - 1]
        split = new_width and (real >= small or (count + c) * w > (1 + padding) * (real + c * w))
        if i > start and (split or (count + c) * w * per_position > budget):
            groups.append((start, i))
            start, count, real = i, 0, 0
        count += c
        real += c * w
    if start < len(counts):
        groups.append((start, len(counts)))
    return groups


def padded_calls(device: torch.device) -> bool:
    """Whether model calls on ``device`` pad rows of different lengths into one call.

    On the CPU a call's cost follows its positions, so rows run grouped by exact length (no
    padding is computed; a call of few positions takes the next lengths' rows, little padded:
    :data:`CPU_SMALL_CALL`). On a GPU a call's cost is mostly its launch: few large padded calls
    (sorted by length, so little padding), with no device read between them, keep it busy.
    """
    return device.type != "cpu"


def call_budget(device: torch.device, memory_budget: int, cpu_cap: int | None = None) -> int:
    """Bytes a model call may hold on ``device``: the budget, capped at ``cpu_cap`` (default
    :data:`CPU_CALL_BYTES`) where calls run the CPU's plan (:func:`padded_calls`)."""
    if padded_calls(device):
        return memory_budget
    return min(memory_budget, CPU_CALL_BYTES if cpu_cap is None else cpu_cap)


def _grouped_logits(model, seqs, seq_lengths, per_position, budget, what, classes=None, padded=None, host_lengths=None):
    """Logits [N, C] of sequences ``seqs`` [N, T] in their order, run sorted by length, each
    call within ``budget`` bytes at ``per_position`` bytes per position (measured on a first
    one-row call when None); also returns per_position and the model's dtype. ``padded``
    (default :func:`padded_calls` of the sequences' device): calls hold rows of several lengths,
    padded to their longest; else every call holds rows of one length (no padding). The models
    mask padding, so both give the same logits up to rounding. ``host_lengths``: ``seq_lengths``
    as a list, when the caller knows them (else read here)."""
    if not len(seq_lengths):
        return None, per_position, None
    padded = padded_calls(seqs.device) if padded is None else padded
    order = torch.argsort(seq_lengths, stable=True)
    len_list = seq_lengths[order].tolist() if host_lengths is None else sorted(host_lengths)
    parts, dtype, start = [], None, 0
    if per_position is None:
        first, per_position, dtype = _model_logits(
            model, seqs[order[:1], : len_list[0]], seq_lengths[order[:1]], what, classes
        )
        parts, start, classes = [first], 1, first.shape[1]
    groups = _length_groups(
        [1] * (len(len_list) - start),
        len_list[start:],
        per_position,
        budget,
        padding=None if padded else CPU_PADDING,
        small=CPU_SMALL_CALL,
    )
    for s, e in groups:
        idx = order[start + s : start + e]
        logits, _, dtype = _model_logits(model, seqs[idx, : len_list[start + e - 1]], seq_lengths[idx], what, classes)
        parts.append(logits)
    out = torch.empty(len(len_list), parts[0].shape[1], dtype=parts[0].dtype, device=parts[0].device)
    out[order] = torch.cat(parts)
    return out, per_position, dtype


def leave_one_out(
    model: AttentionClassifier,
    tokens: Tensor,
    lengths: Tensor,
    *,
    mode: str = "delete",
    mask_token: int | None = None,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
) -> Tensor:
    """Leave-one-out token importance of Jain & Wallace 2019 (sec. 4.1; docs/definitions.md §7).

    On a pair task (J&W's question answering and inference model, ``models/pair.py``) the real tokens
    are the passage's: each edit deletes or masks one passage word, and the question, the row's fixed
    ``trail`` part, is never edited.

    For every real token t of a row, the total variation distance
    ``TVD(y, y_{-t}) = 1/2 sum_c |y_c - y_{-t,c}|`` between the model's output
    distribution ``y`` on the full row and ``y_{-t}`` on the row with token t deleted:
    the sequence gets one position shorter and is re-encoded from scratch
    (``mode="delete"``, J&W). With ``mode="mask"`` the token is replaced by
    ``mask_token`` instead (the length is unchanged). Distributions follow
    :func:`attnmetrics.output_distribution` (``C == 1``: a sigmoid, ``(1 - p, p)``).

    A row with a single real token leaves only its special tokens when that token is
    deleted; that is still run through the model as it is. A model following the
    protocol (attention zero outside the real tokens) then has no position to attend to:
    J&W's classifier gives the zero context, so the output is the decoder's bias. A
    model returning NaN there (e.g. a softmax over no position) raises ValueError. If
    ``lead == trail == 0`` that input is empty (length 0), which is refused, unless the model's
    ``deletion_logits`` keeps positions around the text (``encodes_empty_text``: a prompted
    decoder, whose template remains, docs/definitions.md §15).

    The model runs under ``torch.no_grad()`` in eval mode (its training mode is
    restored afterwards): once on the rows, then on every deletion of every row, built
    by the ``attnmetrics::leave_one_out_batch`` kernel for a group of rows at once. A
    model with the optional protocol method ``deletion_logits`` (see
    :class:`attnmetrics.AttentionClassifier`) computes the deletions' logits itself with
    ``mode="delete"``, and one with ``masking_logits`` the maskings' with ``mode="mask"``, so
    it can reuse what the edit leaves unchanged (J&W's BiLSTM: the forward states before
    the token and the backward states after it; GPT-1: the states before it). When the
    callable it returns has ``unedited_logits``, the rows' original logits come from it
    (J&W's BiLSTM: from the states it ran for the reuse) and the model is not run on the
    rows themselves, except on one row that sizes the calls.
    Rows are grouped by length, so each call holds sequences of a single length and
    carries no padding (packed RNNs then also take their faster uniform-length path).
    Each call holds at most about ``memory_budget`` bytes, estimated as
    ``sequences * width * (E + 8 H) * element_size`` with E and H the embedding and
    hidden sizes measured on the first call (a single row's deletions are split
    across calls if they exceed it, and then built one call at a time, so its
    ``L·(L−1)`` token ids never exist at once), or, for ``deletion_logits`` and
    ``masking_logits``, as ``sequences * width * position_bytes`` when the callable they
    return has that attribute; on CPU calls are also capped at :data:`CPU_CALL_BYTES`
    (32 MiB; 12 MiB, :data:`CPU_DELETION_CALL_BYTES`, for the model's own), which ran faster per
    token than larger ones. The model must treat rows independently.

    Args:
        model: any :class:`attnmetrics.AttentionClassifier`.
        tokens: ``[B, T]`` int64 token ids, special tokens included, any strides.
        lengths: ``[B]`` integer positions per row, special tokens included, in
            ``[lead + trail, T]``.
        mode: ``"delete"`` (J&W) or ``"mask"``.
        mask_token: the id that replaces each token with ``mode="mask"`` (required
            there, rejected with ``"delete"``).
        memory_budget: approximate bytes of activations per model call.

    Returns:
        ``[B, T - lead]`` TVD (unitless, in [0, 1]) in the model's float dtype (that of
        its embeddings), laid out like :func:`gradient_importance`: entry ``[b, k]`` is
        real token ``lead + k`` of row b; zero past each row's ``lengths - lead - trail``
        real tokens.

    Raises:
        TypeError: ``model`` does not implement the protocol; tokens/lengths not tensors.
        ValueError: tokens not ``[B, T]`` int64 or with negative ids, an empty batch,
            lengths not ``[B]`` integers in ``[lead + trail, T]`` or on another device, an
            unknown mode, a missing, negative or superfluous mask_token, a non-positive
            memory_budget, or model outputs that are not finite ``[N, C]`` logits; deletion
            of a one-token row on a model without special tokens and without
            ``encodes_empty_text`` (nothing would be left).

    Example (``attnmetrics.models`` holds J&W's classifier; any protocol model works)::

        from attnmetrics.models.classifier import EncoderAttentionClassifier, ModelConfig
        model = EncoderAttentionClassifier(ModelConfig(vocab_size=50, embed_dim=8, hidden_size=6))
        tokens = torch.tensor([[2, 7, 8, 9, 3], [2, 11, 12, 3, 0]])  # <SOS>=2 ... <EOS>=3
        leave_one_out(model, tokens, torch.tensor([5, 4]))  # [2, 4]; row 1: 2 values, then 0
    """
    lengths, mask_token = _check_loo_inputs(model, tokens, lengths, mode, mask_token, memory_budget)
    lead, trail = model.lead, model.trail
    batch, width = tokens.shape
    device = tokens.device
    budget = call_budget(device, memory_budget)
    real = lengths - lead - trail
    # Rows without a real token have nothing to delete; sorted by length, rows of one
    # length are consecutive and form the groups of the model calls.
    rows = torch.nonzero(real > 0).squeeze(1)
    rows = rows[torch.argsort(lengths[rows], stable=True)]
    row_list, len_list = rows.tolist(), lengths[rows].tolist()
    # sorted: the shortest first; a prompted decoder's deletions keep its template (nothing is empty)
    empty_texts = edits_whole_texts(model, "deletion_logits")
    if mode == "delete" and lead + trail == 0 and len_list and len_list[0] == 1 and not empty_texts:
        raise ValueError(
            f"leave_one_out(mode='delete') needs rows of at least 2 tokens on a model without special "
            f"tokens (lead = trail = 0): deleting the only token of row {row_list[0]} leaves an empty "
            f"sequence, which no model can encode; use mode='mask' or leave such rows out"
        )

    with eval_mode(model), torch.no_grad(), deferred():  # the logits' checks read once, at the end
        if not row_list:
            return torch.zeros(batch, width - lead, dtype=model.embed(tokens[:1, :1]).dtype, device=device)
        reuse = _reuse(model, mode, mask_token)
        if reuse is not None:
            # A one-row call measures the bytes per position that size the blocks; the rows'
            # output distributions come block by block, from the model's reuse when it gives them.
            first, per_position, dtype = _model_logits(
                model, tokens[rows[:1], : len_list[0]], lengths[rows[:1]], "the input rows", None
            )
            original = first.new_empty(len(row_list), max(first.shape[1], 2))
            cap = call_budget(device, memory_budget, CPU_DELETION_CALL_BYTES)
            parts = _deletions_by_model(
                model, tokens, lengths, rows, len_list, reuse, mode, per_position, cap, first.shape[1], original
            )
        else:
            # The rows' original logits, in `rows` order. The first call (one row)
            # measures the bytes per position that size every later call.
            own, per_position, dtype = _grouped_logits(
                model, tokens[rows], lengths[rows], None, budget, "the input rows"
            )
            original = output_distribution(own)
            parts = _deletions_by_kernel(
                model, tokens, lengths, rows, len_list, mode, mask_token, per_position, budget, own.shape[1]
            )
        out = torch.zeros(batch, width - lead, dtype=dtype, device=device)
        for src, position, logits in parts:  # src indexes `rows`, position the row's real tokens
            p = original[src].contiguous()
            q = output_distribution(logits).to(p.dtype).contiguous()
            out[rows[src], position] = ops.tvd(p, q).to(dtype)
    return out


def _deletions_by_kernel(model, tokens, lengths, rows, len_list, mode, mask_token, per_position, budget, classes):
    """Yield (src, position, logits) for every deletion (or masking) of ``rows``, the token
    sequences built by the ``leave_one_out_batch`` kernel for a group of rows at a time and run
    through the whole model (on the CPU a group holds rows of one length; where calls are padded,
    :func:`padded_calls`, rows of ascending lengths up to the budget); ``src`` indexes ``rows``,
    ``position`` the row's real tokens. A row whose deletions exceed the budget alone has its sequences
    built one call's chunk of positions at a time, so its L·(L−1) ids never exist at once."""
    lead, trail, device = model.lead, model.trail, tokens.device
    real = lengths[rows] - lead - trail
    real_list = [n - lead - trail for n in len_list]
    seq_widths = [length if mode == "mask" else length - 1 for length in len_list]
    # The kernel runs where the tokens are when it has a CUDA build, else on the CPU
    # (the token ids are small next to the model's work).
    on = device if device.type == "cpu" or _cuda_kernels() else torch.device("cpu")
    padding = None if padded_calls(device) else 0.0
    for s, e in _length_groups(real_list, seq_widths, per_position, budget, padding=padding):
        idx = rows[s:e]
        group_tokens = tokens[idx, : len_list[e - 1]].to(on).contiguous()
        # the lengths from the host: the op plans there and never waits for the device
        group_lengths = torch.tensor(len_list[s:e], dtype=torch.int64)
        # Calls of at most per_call sequences. A group of several rows fits in one call (see
        # _length_groups); on the CPU its sequences have one length, so no call carries padding.
        per_call = max(1, budget // max(1, seq_widths[e - 1] * per_position))
        if e - s == 1 and real_list[s] > per_call:
            # One row over the budget: positions [k0, k1) are the real tokens of the same row
            # with lead + k0 leading and L - lead - k1 trailing special positions.
            for k0 in range(0, real_list[s], per_call):
                k1 = min(real_list[s], k0 + per_call)
                seqs, seq_lengths, _ = ops.leave_one_out_batch(
                    group_tokens, group_lengths, lead + k0, len_list[s] - lead - k1, mask_token, 0
                )
                logits, _, _ = _model_logits(
                    model, seqs.to(device), seq_lengths.to(device), "the deletion batch", classes
                )
                src = torch.full((k1 - k0,), s, dtype=torch.int64, device=device)
                yield src, torch.arange(k0, k1, device=device), logits
            continue
        seqs, seq_lengths, source = ops.leave_one_out_batch(group_tokens, group_lengths, lead, trail, mask_token, 0)
        source = source.to(device)
        counts = real[s:e]
        position = torch.arange(source.shape[0], device=device) - (torch.cumsum(counts, 0) - counts)[source]
        for c in range(0, source.shape[0], per_call):
            part = slice(c, c + per_call)
            logits, _, _ = _model_logits(
                model, seqs[part].to(device), seq_lengths[part].to(device), "the deletion batch", classes
            )
            yield source[part] + s, position[part], logits


def _reuse(model, mode: str, mask_token: int | None):
    """The model's preparation of its deletions (``deletion_logits``) or maskings
    (``masking_logits`` with the mask token) as a callable (embedded, lengths) -> logits(rows,
    positions), or None when the model has no such method for ``mode``."""
    if mode == "delete":
        return capability(model, "deletion_logits")
    method = capability(model, "masking_logits")
    return (lambda embedded, lengths: method(embedded, lengths, mask_token)) if method else None


def _deletions_by_model(model, tokens, lengths, rows, len_list, reuse, mode, per_position, budget, classes, original):
    """Yield what :func:`_deletions_by_kernel` does, with the logits from the model's
    ``deletion_logits`` (``masking_logits`` in mask mode; ``reuse``, from :func:`_reuse`):
    prepared once for a block of rows (within the budget), then fed
    the deletions of rows of about one length (within :data:`DELETION_BAND`) position by
    position, so the positions of one call are close together (what a deletion changes,
    and a reusing model recomputes, depends on where it is) and its rows pad little.

    Before a block's first yield, the output distributions of its rows' original logits ([·,
    ``classes``]) are written to ``original`` ([len(rows), max(classes, 2)], in ``rows`` order):
    from the prepared callable's ``unedited_logits()`` when it has one (the states it already
    ran), else from the model run on the block's rows."""
    lead, trail, device = model.lead, model.trail, tokens.device
    method = "deletion_logits" if mode == "delete" else "masking_logits"
    for bs, be in _length_groups([1] * len(len_list), len_list, per_position, budget, padding=None):
        idx = rows[bs:be]
        block_lengths = lengths[idx]
        block_tokens = tokens[idx, : len_list[be - 1]]
        deletions = reuse(model.embed(block_tokens), block_lengths)
        position_bytes = getattr(deletions, "position_bytes", per_position)
        if isinstance(position_bytes, bool) or not isinstance(position_bytes, int) or position_bytes <= 0:
            raise ValueError(
                f"model.{method}(...).position_bytes must be a positive int (bytes per "
                f"position of a call's deletions), got {position_bytes!r}"
            )
        unedited = getattr(deletions, "unedited_logits", None)
        if unedited is not None:
            if not callable(unedited):
                raise ValueError(
                    f"model.{method}(...).unedited_logits must be a callable () -> [G, C] logits "
                    f"of the rows themselves, got {type(unedited).__name__}"
                )
            logits = _checked_logits(unedited(), be - bs, "the input rows", classes)
        else:
            logits, _, _ = _grouped_logits(
                model, block_tokens, block_lengths, per_position, budget, "the input rows", classes
            )
        original[bs:be] = output_distribution(logits)
        for s, e in _bands(len_list[bs:be]):
            real = block_lengths[s:e] - lead - trail
            local = torch.repeat_interleave(torch.arange(s, e, device=device), real)
            position = torch.arange(local.shape[0], device=device) - (torch.cumsum(real, 0) - real)[local - s]
            order = torch.argsort(position * (e - s) + local - s)  # position-major
            local, position = local[order], position[order]
            seq_width = len_list[bs + e - 1] - (mode == "delete")
            per_call = max(1, budget // max(1, seq_width * position_bytes))
            for c in range(0, local.shape[0], per_call):
                r, k = local[c : c + per_call], position[c : c + per_call]
                logits = _checked_logits(deletions(r, k + lead), r.shape[0], "the deletion batch", classes)
                yield r + bs, k, logits


#: rows whose lengths differ by at most this share deletion calls
DELETION_BAND = 8


def _bands(widths: list[int]) -> list[tuple[int, int]]:
    """Consecutive groups [s, e) of ascending ``widths`` at most :data:`DELETION_BAND` above the first."""
    bands, start = [], 0
    for i, w in enumerate(widths):
        if w > widths[start] + DELETION_BAND:
            bands.append((start, i))
            start = i
    return bands + [(start, len(widths))] if widths else bands
