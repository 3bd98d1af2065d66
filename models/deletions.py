"""Re-encoding every one-token deletion of a row while reusing what the deletion leaves
unchanged (leave-one-out, J&W 2019 sec. 4.1).

Deleting position t from a row leaves a bidirectional RNN's forward states before t and
its backward states after t exactly as they were: only the forward direction over the
suffix after t (started from the state at t - 1) and the backward direction over the
prefix before t (started from the state at t + 1) need running again. Per deletion that
is one direction over n - 1 positions instead of both: half the recurrent work of
re-encoding the shortened row from scratch, with the same result.

The states are computed once for a block of rows (:class:`BiRNNDeletions`), then any
chunk of their deletions is encoded from them: a deletion is a pair (row, position);
``rows [N]`` index the block's rows and ``positions [N]`` the deleted position in that
row. What the caller needs of their states (any linear map: for J&W's classifier the
attention projection and the decoder) lands in one table after that of the rows' own
states, and each of a deletion's ``lengths[row] - 1`` positions is the sum of two table rows
(:meth:`BiRNNDeletions.spliced` gives the pairs, which J&W's classifier hands to the compiled
``attnmetrics::spliced_attention``; :meth:`BiRNNDeletions.features` adds them).

An LSTM's runs read their inputs' gates (``W_ih x + b``) from a table computed once per row
position (:func:`_gate_tables`): every run of an edit reads only the row's own tokens (and a
mask token), so a step is left with the recurrent product. All runs of a direction go in one
pass longest first through the compiled ``attnmetrics::lstm_runs`` (one product per step for
the gates and the features, then one fused pass over the cells), and no step of a finished
run is computed.
A GRU's runs are sorted by length and go through torch's fused RNN in calls of runs of
about one length and of a few shapes (:func:`_run_pieces`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnmetrics._ops import ops
from attnmetrics.protocol import token_mask

#: Runs of one RNN call differ in length by at most this share of the shortest (the
#: padding a call may carry): a few large calls beat many exact ones, up to a point.
RUN_SLACK = 1 / 8
#: Runs per RNN call on the CPU (elsewhere a call takes every run of about one length), and
#: the multiple that a length's last, smaller call is padded to.
RUN_BATCH, RUN_ROUND = 64, 16
#: ... unless the padding runs more steps than this: a new call shape cost oneDNN about as
#: much as 500 LSTM steps of one run (0.5 ms on our 2-core AMD EPYC).
ROUND_CELLS = 512


def kept_positions(
    lengths: Tensor, positions: Tensor, width: int, masked: bool = False
) -> tuple[Tensor, Tensor, Tensor]:
    """For deletions with row lengths ``lengths [N]`` and deleted ``positions [N]``:
    ``source [N, width - 1]``, the original position that each new position holds
    (clamped into range past the end), ``before`` (new position < deleted one) and
    ``valid`` (new position < length - 1), both bool ``[N, width - 1]``. With ``masked``
    the position is replaced, not deleted: ``width`` columns, each its own source, valid
    below the length."""
    keep = width if masked else width - 1
    j = torch.arange(keep, device=positions.device)
    before = j < positions[:, None]
    valid = j < (lengths - (0 if masked else 1))[:, None]
    source = j.expand_as(before) if masked else torch.where(before, j, j + 1).clamp(max=width - 1)
    return source, before, valid


def delete_positions(x: Tensor, lengths: Tensor, rows: Tensor, positions: Tensor) -> Tensor:
    """x [G, T, D] -> [N, W - 1, D] (W the longest of the chosen rows): row ``rows[i]`` of
    ``x`` without position ``positions[i]``, zero past its ``lengths[rows[i]] - 1`` positions."""
    width = int(lengths[rows].max())
    source, _, valid = kept_positions(lengths[rows], positions, width)
    return x[rows[:, None], source] * valid.unsqueeze(-1).to(x.dtype)


def mask_positions(x: Tensor, lengths: Tensor, replacement: Tensor, rows: Tensor, positions: Tensor) -> Tensor:
    """x [G, T, D] -> [N, W, D] (W the longest of the chosen rows): row ``rows[i]`` of ``x``
    with position ``positions[i]`` set to ``replacement [D]``, zero past its ``lengths[rows[i]]``."""
    width = int(lengths[rows].max())
    out = x[rows, :width] * token_mask(lengths[rows], width).unsqueeze(-1).to(x.dtype)
    out[torch.arange(rows.shape[0], device=rows.device), positions] = replacement
    return out


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``x [K, in] @ weight[out, in].T (+ bias [out])``. On the CPU in float32 through oneDNN
    (torch's own fused-linear op, as torch.compile uses it), which ran these tall, narrow
    products 2-3x faster than torch's default BLAS on our AMD EPYC machines; elsewhere
    ``F.linear``."""
    if x.device.type == "cpu" and x.dtype == torch.float32 and _ONEDNN_LINEAR is not None:
        # contiguous: a strided weight took oneDNN seconds, not milliseconds
        return _ONEDNN_LINEAR(x.contiguous(), weight.contiguous(), bias, "none", [], "")
    return F.linear(x, weight, bias)


_ONEDNN_LINEAR = (
    getattr(getattr(torch.ops, "mkldnn", None), "_linear_pointwise", None)
    if torch.backends.mkldnn.is_available()
    else None
)


def _weights(rnn: nn.RNNBase, reverse: bool) -> list[Tensor]:
    """One direction's parameters of a one-layer ``rnn``, in the order torch's RNN ops take."""
    names = ("weight_ih", "weight_hh", "bias_ih", "bias_hh") if rnn.bias else ("weight_ih", "weight_hh")
    return [getattr(rnn, f"{n}_l0{'_reverse' if reverse else ''}") for n in names]


def _gru(rnn: nn.GRU, weights: list[Tensor], x: Tensor, h0: Tensor) -> Tensor:
    """One direction of ``rnn`` (its ``weights``) over x [L, N, E] (sequence first) from the
    states h0 [N, hidden]: outputs [L, N, hidden], contiguous. torch's fused GRU takes uniform
    lengths only."""
    return torch.gru(x, h0[None], weights, rnn.bias, 1, 0.0, False, False, False)[0]


def _row_states(rnn: nn.GRU, embedded: Tensor, lengths: Tensor, reverse: bool) -> tuple[Tensor, None]:
    """One direction of a GRU over the rows x [G, T, E] in one fused call: (h [G, T, hidden],
    None), the states after each position, in position order (the backward direction runs
    from each row's last position). Past a row's length the values are meaningless. (An
    LSTM's rows run through :meth:`BiRNNDeletions._own_lstm`.)"""
    G, T, _ = embedded.shape
    steps = torch.arange(T, device=embedded.device)
    # Step s reads position s, or, backwards, position length - 1 - s of each row.
    order = (lengths[:, None] - 1 - steps).clamp(min=0) if reverse else steps.expand(G, T)
    x = embedded[torch.arange(G, device=embedded.device)[None], order.t()]  # [T, G, E]
    h = _gru(rnn, _weights(rnn, reverse), x, x.new_zeros(G, rnn.hidden_size))  # [T, G, hidden]
    if reverse:  # back to position order: position p < length is step length - 1 - p (the same map)
        h = h.gather(0, order.t().unsqueeze(-1).expand_as(h))
    return h.transpose(0, 1).contiguous(), None


def _run_pieces(counts: list[int], batch: int) -> list[tuple[int, int, int]]:
    """RNN calls (s, e, width) over ascending run lengths ``counts``: runs [s, e), padded to
    ``width`` runs. Runs of one call differ in length by at most :data:`RUN_SLACK` of the
    shortest; a call holds ``batch`` runs, or, the last of a length group, a multiple of
    :data:`RUN_ROUND` (unless that pads more than :data:`ROUND_CELLS` steps), so that calls
    come in few shapes: on the CPU oneDNN builds a primitive for each new shape, which costs
    as much as a call. Runs of length 0 are left out."""
    pieces, start = [], 0
    while start < len(counts) and counts[start] == 0:
        start += 1
    while start < len(counts):
        end = start
        while end < len(counts) and end - start < batch and counts[end] <= counts[start] * (1 + RUN_SLACK):
            end += 1
        width = -(-(end - start) // RUN_ROUND) * RUN_ROUND
        if (width - (end - start)) * counts[end - 1] > ROUND_CELLS:  # long runs: padding costs more
            width = end - start
        pieces.append((start, end, width))
        start = end
    return pieces


def _gate_tables(rnn: nn.LSTM, embedded: Tensor, replacement: Tensor | None) -> list[Tensor]:
    """Per direction of a one-layer bidirectional ``rnn``: the input gates ``W_ih x + b_ih +
    b_hh`` of every position of the rows embedded [G, T, E] (row g·T + t), then of the
    ``replacement`` [E] if given (row G·T): [G·T (+ 1), 4·hidden], as ``lstm_runs`` reads them."""
    x = embedded.reshape(-1, embedded.shape[-1])
    if replacement is not None:
        x = torch.cat([x, replacement[None].to(x.dtype)])
    weights = [_weights(rnn, r) for r in (False, True)]
    return [linear(x, w[0], w[2] + w[3] if rnn.bias else None) for w in weights]


class BiRNNDeletions:
    """The deletions of a block of rows through a one-layer bidirectional ``nn.LSTM``/``nn.GRU``
    (batch_first), as features of their hidden states h: ``W h + bias``.

    ``BiRNNDeletions(rnn, embedded [G, T, E], lengths [G], feature_map, bias)`` keeps the
    rows' states; calling it with ``rows [N]``, ``positions [N]`` gives ``[N, W - 1, D]`` for
    those deletions (W the longest of their rows): ``feature_map [D, 2·hidden] @ h + bias [D]``
    with h the states of ``rnn`` run on the shortened rows, equal to that up to rounding;
    zero past each deletion's ``lengths[row] - 1`` positions (:meth:`features` leaves that
    padding as it is). Without ``feature_map``, the hidden states themselves (D = 2·hidden).

    A state's features are the sum of its halves', ``W h = W_f h_f + W_b h_b``, so each state
    is mapped once: the rows' own when the block is prepared, a deletion's recomputed ones as
    they are run. Both land in one table, and a deletion's features at each position are the
    sum of two of its rows.

    With ``replacement [E]`` (an embedded mask token) each position is replaced by it instead of
    deleted (leave-one-out's mask mode): the same reuse, the rows keep their lengths, and the
    results are ``[N, W, D]``, zero past ``lengths[row]``.
    """

    def __init__(
        self,
        rnn: nn.RNNBase,
        embedded: Tensor,
        lengths: Tensor,
        feature_map: Tensor | None = None,
        bias: Tensor | None = None,
        replacement: Tensor | None = None,
    ):
        if not (rnn.bidirectional and rnn.num_layers == 1 and rnn.batch_first):
            raise ValueError("BiRNNDeletions needs a one-layer, bidirectional, batch_first RNN")
        self.rnn, self.embedded, self.lengths, self.replacement = rnn, embedded, lengths, replacement
        if feature_map is None:
            feature_map = torch.eye(2 * rnn.hidden_size, dtype=embedded.dtype, device=embedded.device)
        self.maps = [half.contiguous() for half in feature_map.chunk(2, dim=1)]  # W_f, W_b
        self.weights = [_weights(rnn, r) for r in (False, True)]
        # An LSTM's runs (the rows' own too) read their inputs' gates from a table (a masking's
        # first step, the replacement's) and, per step, multiply h by W_hh.T and the feature
        # map at once (attnmetrics::lstm_runs); a GRU's go through torch's fused GRU.
        self.gates, self.recurrent = None, None
        if isinstance(rnn, nn.LSTM):
            self.gates = _gate_tables(rnn, embedded, replacement)
            self.recurrent = [torch.cat([w[1].t(), m.t()], 1).contiguous() for w, m in zip(self.weights, self.maps)]
            (self.hf, self.cf, forward), (self.hb, self.cb, backward) = (self._own_lstm(r) for r in (0, 1))
            halves = [forward.flatten(0, 1), backward.flatten(0, 1)]
        else:
            (self.hf, self.cf), (self.hb, self.cb) = (_row_states(rnn, embedded, lengths, r) for r in (False, True))
            halves = [linear(h.view(-1, h.shape[-1]), m) for h, m in zip((self.hf, self.hb), self.maps)]
        # the table: row (g·T + p)·2 holds the forward half's features at position p of row g,
        # + 1 the backward half's (with the bias: each position sums one old half and one new,
        # but for a masked position's two new ones, whose backward step 0 gets the bias);
        # a call's recomputed states follow
        self.table = torch.stack(halves, dim=1).flatten(0, 1)
        if bias is not None:
            self.table += bias
        self.bias = bias
        self.reused = self.table.shape[0]

    def own_features(self) -> Tensor:
        """The rows' own (unedited) features ``[G, T, D]``: ``feature_map @ h + bias`` of the
        states of ``rnn`` on the rows themselves, from the table (one position's two halves
        each hold the bias once, so it is taken off one of them); zero past each row's length."""
        (G, T, _), D = self.embedded.shape, self.table.shape[1]
        halves = self.table[: self.reused].view(G, T, 2, D)
        own = halves[:, :, 0] + (halves[:, :, 1] if self.bias is None else halves[:, :, 1] - self.bias)
        inside = torch.arange(T, device=own.device) < self.lengths[:, None]
        return own * inside.unsqueeze(-1).to(own.dtype)

    def _own_lstm(self, backward: int) -> tuple[Tensor, Tensor, Tensor]:
        """One LSTM direction over the rows themselves, each a run from zero states through
        ``attnmetrics::lstm_runs``: (h, c, features), each [G, T, ·] in position order, zero
        past each row's length."""
        (G, T, _), device = self.embedded.shape, self.embedded.device
        order = torch.argsort(self.lengths, descending=True, stable=True)
        counts = self.lengths[order]
        steps = torch.arange(int(counts[0]) if G else 0, device=device)[:, None]
        # step s of run k reads (and its states belong to) position at[s, k] of row order[k]
        at = (counts - 1 - steps).clamp(min=0) if backward else steps.expand(-1, G)
        zeros = self.embedded.new_zeros(G, self.rnn.hidden_size)
        out = self.embedded.new_empty(steps.shape[0], G, self.maps[backward].shape[0])
        states = self.embedded.new_empty(2, *out.shape[:2], self.rnn.hidden_size)
        ops.lstm_runs(self.gates[backward], order * T + at, counts, zeros, zeros, self.recurrent[backward], out, states)
        inside = steps < counts
        rows, at = order.expand_as(at)[inside], at[inside]
        placed = []
        for x in (states[0], states[1], out):
            y = x.new_zeros(G, T, x.shape[-1])
            y[rows, at] = x[inside]
            placed.append(y)
        return tuple(placed)

    def _room(self, rows: int) -> Tensor:
        """The table with room for ``rows`` recomputed rows after the reused ones (the room grown
        1.5x at a time, so calls of slowly growing size copy the reused rows a few times only)."""
        room = self.table.shape[0] - self.reused
        if room < rows:
            table = self.table.new_empty(self.reused + max(rows, room * 3 // 2), self.table.shape[1])
            table[: self.reused] = self.table[: self.reused]
            self.table = table
        return self.table

    def _start(self, h: Tensor, c: Tensor | None, rows: Tensor, at: Tensor) -> list[Tensor | None]:
        """States [N, hidden] after position ``at`` of each row; zero where ``at`` is outside the row."""
        inside = ((at >= 0) & (at < self.lengths[rows])).unsqueeze(-1).to(h.dtype)
        at = at.clamp(0, h.shape[1] - 1)
        return [h[rows, at] * inside, None if c is None else c[rows, at] * inside]

    def _runs(self, rows: Tensor, positions: Tensor) -> tuple[list[tuple], int]:
        """The recomputed runs of deletions ``rows [N]``, ``positions [N]``, per direction
        (first position read, length, start states, the RNN calls), and the table rows needed.
        A deletion's runs start beside the deleted position, a masking's at it (its first
        step reads the replacement)."""
        n = self.lengths[rows]
        gap = 0 if self.replacement is not None else 1  # how far from the position each run starts
        runs = [
            (positions + gap, n - positions - gap, self._start(self.hf, self.cf, rows, positions - 1)),
            (positions - gap, positions + 1 - gap, self._start(self.hb, self.cb, rows, positions + 1)),
        ]
        plans, size = [], 0
        for first, count, states in runs:
            if self.gates is not None:  # one lstm_runs pass over every run, longest first
                order = torch.argsort(count, descending=True, stable=True)
                counts = count[order].tolist()
                plans.append((first, states, order, counts, None))
                size += (counts[0] if counts else 0) * len(counts)
                continue
            order = torch.argsort(count, stable=True)
            counts = count[order].tolist()
            pieces = _run_pieces(counts, RUN_BATCH if rows.device.type == "cpu" else len(counts))
            plans.append((first, states, order, counts, pieces))
            size += sum(counts[e - 1] * width for _, e, width in pieces)
        return plans, size

    def _lstm_pass(self, table, base, backward, rows, first, states, order, counts) -> None:
        """One direction's runs (``order``, longest first, ``counts`` steps each) through
        ``attnmetrics::lstm_runs``, their features into ``table[base : base + steps * n]``,
        step s of the k-th run at row base + s·n + k."""
        n, steps, width = len(counts), counts[0], self.embedded.shape[1]
        at = first[order][None] + torch.arange(steps, device=rows.device)[:, None] * (-1 if backward else 1)
        index = rows[order][None] * width + at.clamp(0, width - 1)  # [steps, n]
        if self.replacement is not None:
            index[0] = self.gates[backward].shape[0] - 1  # every run starts at the masked position
        h0, c0 = (x[order].contiguous() for x in states)
        region = table[base : base + steps * n].view(steps, n, -1)
        count = torch.tensor(counts, dtype=torch.int64, device=rows.device)
        ops.lstm_runs(self.gates[backward], index, count, h0, c0, self.recurrent[backward], region)
        if backward and self.replacement is not None and self.bias is not None:
            table[base : base + n] += self.bias  # step 0 (the masked position's two new halves)

    def features(self, rows: Tensor, positions: Tensor) -> Tensor:
        """The deletions' features ``[N, W - 1, D]`` (maskings': ``[N, W, D]``), not zeroed past
        each one's length: the sums of the pairs of :meth:`spliced`."""
        table, pairs = self.spliced(rows, positions)
        out = F.embedding_bag(pairs.view(-1, 2), table, mode="sum")  # a fused gather-and-add
        return out.view(*pairs.shape[:2], table.shape[1])

    def spliced(self, rows: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """The deletions' features as pairs of table rows: ``(table [R, D], pairs [N, W - 1, 2]``
        int64, maskings' ``[N, W, 2]``); position j of deletion i has the features
        ``table[pairs[i, j, 0]] + table[pairs[i, j, 1]]`` (past its length, any two rows). The
        table is valid until the next call.

        Only the forward direction over the suffix after the deleted position t (from the
        state before it) and the backward direction over the prefix before it (read in
        reverse, from the state after it) are run, in calls of runs of about one length.
        Each new position j then holds one reused and one recomputed state: before t, the
        old forward state at j and the new backward one (step t - 1 - j); from t on, the new
        forward state (step j - t) and the old backward one at j + 1. A masking keeps every
        position: before t the new backward state is step t - j, after it the old backward
        one is at j, and position t itself holds the two new states of step 0.
        """
        device, width = rows.device, self.embedded.shape[1]
        plans, size = self._runs(rows, positions)
        table = self._room(size)
        base = self.reused
        start, stride = [], []  # per direction: step s of deletion i is table row start[i] + s·stride[i]
        for backward, (first, states, order, counts, pieces) in enumerate(plans):
            start.append(torch.zeros(rows.shape[0], dtype=torch.int64, device=device))
            stride.append(torch.zeros_like(start[-1]))
            if pieces is None:  # an LSTM: every run at once over the gate table
                if counts and counts[0]:
                    self._lstm_pass(table, base, backward, rows, first, states, order, counts)
                    start[-1][order] = base + torch.arange(len(counts), device=device)
                    stride[-1][order] = len(counts)
                    base += counts[0] * len(counts)
                continue
            for s, e, n in pieces:
                idx = order[torch.arange(s, s + n, device=device).clamp_(max=e - 1)]  # padded with the last run
                steps = torch.arange(counts[e - 1], device=device)[:, None]
                at = first[idx][None] - steps if backward else first[idx][None] + steps
                x = self.embedded[rows[idx][None], at.clamp(0, width - 1)]  # [L, n, E]
                if self.replacement is not None:
                    x[0] = self.replacement  # every run starts at the masked position
                out = _gru(self.rnn, self.weights[backward], x, states[0][idx])
                table[base : base + out.shape[0] * n] = linear(out.view(-1, out.shape[-1]), self.maps[backward])
                if backward and self.replacement is not None and self.bias is not None:
                    table[base : base + n] += self.bias  # step 0 (the masked position's two new halves)
                start[-1][idx[: e - s]] = base + torch.arange(e - s, device=device)
                stride[-1][idx[: e - s]] = n
                base += out.shape[0] * n
        n, masked = self.lengths[rows], self.replacement is not None
        source, before, _ = kept_positions(n, positions, int(n.max()), masked)
        j = torch.arange(source.shape[1], device=device)
        t = positions[:, None]
        old = (rows[:, None] * width + source) * 2 + (~before).long()
        ahead = start[0][:, None] + (j - t).clamp(min=0) * stride[0][:, None]
        back = start[1][:, None] + (t - 1 + masked - j).clamp(min=0) * stride[1][:, None]
        if masked:  # the masked position: both its states are new
            old = torch.where(j == t, back, old)
        new = torch.where(before, back, ahead).clamp_(max=max(base - 1, 0))  # past the end: any row
        return table, torch.stack([old, new], -1)

    def __call__(self, rows: Tensor, positions: Tensor) -> Tensor:
        out = self.features(rows, positions)
        kept = self.lengths[rows] - (0 if self.replacement is not None else 1)
        valid = torch.arange(out.shape[1], device=rows.device) < kept[:, None]
        return out * valid.unsqueeze(-1).to(out.dtype)
