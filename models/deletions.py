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
row. Each direction's runs are sorted by length and run in groups of about one length
(:data:`RUN_SLACK`), so the RNN calls carry little padding; their states land in one
flat table per direction (:class:`Runs`), from which a splice builds each deletion's
``lengths[row] - 1`` positions.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

#: Runs of one RNN call differ in length by at most this share of the shortest (the
#: padding a call may carry): a few large calls beat many exact ones, up to a point.
RUN_SLACK = 1 / 8


def kept_positions(lengths: Tensor, positions: Tensor, width: int) -> tuple[Tensor, Tensor, Tensor]:
    """For deletions with row lengths ``lengths [N]`` and deleted ``positions [N]``:
    ``source [N, width - 1]``, the original position that each new position holds
    (clamped into range past the end), ``before`` (new position < deleted one) and
    ``valid`` (new position < length - 1), both bool ``[N, width - 1]``."""
    j = torch.arange(width - 1, device=positions.device)
    before = j < positions[:, None]
    valid = j < (lengths - 1)[:, None]
    source = torch.where(before, j, j + 1).clamp(max=width - 1)
    return source, before, valid


def delete_positions(x: Tensor, lengths: Tensor, rows: Tensor, positions: Tensor) -> Tensor:
    """x [G, T, D] -> [N, W - 1, D] (W the longest of the chosen rows): row ``rows[i]`` of
    ``x`` without position ``positions[i]``, zero past its ``lengths[rows[i]] - 1`` positions."""
    width = int(lengths[rows].max())
    source, _, valid = kept_positions(lengths[rows], positions, width)
    return x[rows[:, None], source] * valid.unsqueeze(-1).to(x.dtype)


def linear(x: Tensor, weight: Tensor) -> Tensor:
    """``x [K, in] @ weight[out, in].T``. On the CPU in float32 through oneDNN (torch's own
    fused-linear op, as torch.compile uses it), which ran these tall, narrow products 2-3x
    faster than torch's default BLAS on our AMD EPYC machines; elsewhere ``F.linear``."""
    if x.device.type == "cpu" and x.dtype == torch.float32 and _ONEDNN_LINEAR is not None:
        # contiguous: a strided weight took oneDNN seconds, not milliseconds
        return _ONEDNN_LINEAR(x.contiguous(), weight.contiguous(), None, "none", [], "")
    return F.linear(x, weight)


_ONEDNN_LINEAR = getattr(getattr(torch.ops, "mkldnn", None), "_linear_pointwise", None) \
    if torch.backends.mkldnn.is_available() else None


def tanh_by_sigmoid(x: Tensor) -> Tensor:
    """tanh(x) = 2·sigmoid(2x) - 1, equal up to rounding (about 2e-7 in float32, 4e-16 in float64).
    torch.tanh runs through MKL on the CPU, which took 2.2 ns per float32 element on our AMD
    EPYC machines against 0.7 ns for this form."""
    return torch.sigmoid(x * 2).mul_(2).sub_(1)


def _weights(rnn: nn.RNNBase, reverse: bool) -> list[Tensor]:
    """One direction's parameters of a one-layer ``rnn``, in the order torch's RNN ops take."""
    names = ("weight_ih", "weight_hh", "bias_ih", "bias_hh") if rnn.bias else ("weight_ih", "weight_hh")
    return [getattr(rnn, f"{n}_l0{'_reverse' if reverse else ''}") for n in names]


def _run(rnn: nn.RNNBase, weights: list[Tensor], x: Tensor, h0: Tensor, c0: Tensor | None) -> Tensor:
    """One direction of ``rnn`` (its ``weights``) over x [L, N, E] (sequence first) from the
    states h0 (and c0, an LSTM's) [N, hidden]: outputs [L, N, hidden], contiguous. torch's
    fused RNN ops take uniform lengths only (oneDNN's LSTM on the CPU)."""
    if c0 is not None:
        return torch.lstm(x, (h0[None], c0[None]), weights, rnn.bias, 1, 0.0, False, False, False)[0]
    return torch.gru(x, h0[None], weights, rnn.bias, 1, 0.0, False, False, False)[0]


def _row_states(rnn: nn.RNNBase, embedded: Tensor, lengths: Tensor, reverse: bool) -> tuple[Tensor, Tensor | None]:
    """One direction over the rows x [G, T, E]: (h, c), each [G, T, hidden], the states after
    each position, in position order (the backward direction runs from each row's last
    position); c is None for a GRU. Past a row's length the values are meaningless.

    The hidden states come from one fused call; an LSTM's cell states, which it does not
    return, follow from them: with every h_{s-1} known, all gates are one matmul, and
    c_s = σ(f_s) c_{s-1} + σ(i_s) tanh(g_s) is a scan of one fused op per step.
    """
    G, T, _ = embedded.shape
    steps = torch.arange(T, device=embedded.device)
    # Step s reads position s, or, backwards, position length - 1 - s of each row.
    order = (lengths[:, None] - 1 - steps).clamp(min=0) if reverse else steps.expand(G, T)
    x = embedded[torch.arange(G, device=embedded.device)[None], order.t()]  # [T, G, E]
    weights = _weights(rnn, reverse)
    zeros = x.new_zeros(G, rnn.hidden_size)
    is_lstm = isinstance(rnn, nn.LSTM)
    h = _run(rnn, weights, x, zeros, zeros if is_lstm else None)  # [T, G, hidden]
    c = None
    if is_lstm:
        h_prev = torch.cat([zeros[None], h[:-1]])
        gates = torch.mm(x.reshape(T * G, -1), weights[0].t()).addmm_(h_prev.reshape(T * G, -1), weights[1].t())
        if rnn.bias:
            gates += weights[2] + weights[3]
        i, f, g, _ = gates.view(T, G, -1).chunk(4, dim=-1)  # torch's gate order i, f, g, o
        u = torch.sigmoid(i) * torch.tanh(g)
        f = torch.sigmoid(f)
        c = torch.empty_like(h)
        prev = zeros
        for s in range(T):
            prev = torch.addcmul(u[s], f[s], prev, out=c[s])
    if reverse:  # back to position order: position p < length is step length - 1 - p (the same map)
        index = order.t().unsqueeze(-1).expand_as(h)
        h, c = h.gather(0, index), None if c is None else c.gather(0, index)
    return h.transpose(0, 1).contiguous(), None if c is None else c.transpose(0, 1).contiguous()


class Runs(NamedTuple):
    """One direction's recomputed states for N deletions: step s of deletion i is row
    ``start[i] + s * stride[i]`` of ``states [S, hidden]``."""

    states: Tensor
    start: Tensor  # [N] int64
    stride: Tensor  # [N] int64


def _run_groups(counts: list[int]) -> list[tuple[int, int]]:
    """Consecutive groups [s, e) of ascending run lengths ``counts``, each at most
    :data:`RUN_SLACK` of its shortest above it; runs of length 0 are left out."""
    groups, start = [], 0
    while start < len(counts) and counts[start] == 0:
        start += 1
    for i in range(start, len(counts)):
        if counts[i] > counts[start] * (1 + RUN_SLACK):
            groups.append((start, i))
            start = i
    return groups + [(start, len(counts))] if start < len(counts) else groups


class BiRNNDeletions:
    """The deletions of a block of rows through a one-layer bidirectional ``nn.LSTM``/``nn.GRU``
    (batch_first): ``BiRNNDeletions(rnn, embedded [G, T, E], lengths [G])`` keeps the rows'
    states; calling it with ``rows [N]``, ``positions [N]`` gives the hidden states
    ``[N, W - 1, 2·hidden]`` of those deletions (W the longest of their rows), equal to
    running ``rnn`` on the shortened rows, zero past each one's length.
    """

    def __init__(self, rnn: nn.RNNBase, embedded: Tensor, lengths: Tensor):
        if not (rnn.bidirectional and rnn.num_layers == 1 and rnn.batch_first):
            raise ValueError("BiRNNDeletions needs a one-layer, bidirectional, batch_first RNN")
        self.rnn, self.embedded, self.lengths = rnn, embedded, lengths
        (self.hf, self.cf), (self.hb, self.cb) = (_row_states(rnn, embedded, lengths, r) for r in (False, True))
        self.weights = [_weights(rnn, r) for r in (False, True)]

    def _start(self, h: Tensor, c: Tensor | None, rows: Tensor, at: Tensor) -> tuple[Tensor, Tensor | None]:
        """States [N, hidden] after position ``at`` of each row; zero where ``at`` is outside the row."""
        inside = ((at >= 0) & (at < self.lengths[rows])).unsqueeze(-1).to(h.dtype)
        at = at.clamp(0, h.shape[1] - 1)
        return h[rows, at] * inside, None if c is None else c[rows, at] * inside

    def _runs(self, backward: bool, rows: Tensor, first: Tensor, count: Tensor, h0: Tensor, c0: Tensor | None) -> Runs:
        """One direction over ``count[i]`` positions of row ``rows[i]`` from ``first[i]`` (read
        backwards if ``backward``), from the states h0, c0, in calls of runs of about one length."""
        n = rows.shape[0]
        order = torch.argsort(count, stable=True)
        counts = count[order].tolist()
        start = torch.zeros(n, dtype=torch.int64, device=rows.device)
        stride = torch.zeros_like(start)
        tables, base = [], 0
        for s, e in _run_groups(counts):
            idx, steps = order[s:e], torch.arange(counts[e - 1], device=rows.device)
            at = first[idx][None] - steps[:, None] if backward else first[idx][None] + steps[:, None]
            x = self.embedded[rows[idx][None], at.clamp(0, self.embedded.shape[1] - 1)]  # [L, n_g, E]
            out = _run(self.rnn, self.weights[backward], x, h0[idx], None if c0 is None else c0[idx])
            tables.append(out.view(-1, out.shape[-1]))
            start[idx] = base + torch.arange(e - s, device=rows.device)
            stride[idx] = e - s
            base += out.shape[0] * out.shape[1]
        states = torch.cat(tables) if tables else self.hf.new_zeros(1, self.rnn.hidden_size)
        return Runs(states, start, stride)

    def runs(self, rows: Tensor, positions: Tensor) -> tuple[Runs, Runs]:
        """The recomputed parts of deletions ``rows [N]``, ``positions [N]``: the forward
        direction over the suffix after the deleted position, from the state before it, and
        the backward direction over the prefix before it (read in reverse), from the state
        after it."""
        n = self.lengths[rows]
        fwd = self._runs(False, rows, positions + 1, n - 1 - positions, *self._start(self.hf, self.cf, rows, positions - 1))
        bwd = self._runs(True, rows, positions - 1, positions, *self._start(self.hb, self.cb, rows, positions + 1))
        return fwd, bwd

    def row_features(self, forward_map: Tensor, backward_map: Tensor) -> Tensor:
        """Features of the rows' own states for features that add over the two halves of a
        state (a linear map ``W h = W_f h_f + W_b h_b``; maps [D, hidden]): ``[G·T·2, D]``,
        row ``(g·T + p)·2`` the forward half at position p of row g, ``+ 1`` the backward one."""
        halves = [linear(h.reshape(-1, h.shape[-1]), m) for h, m in ((self.hf, forward_map), (self.hb, backward_map))]
        return torch.stack(halves, dim=1).flatten(0, 1)

    @staticmethod
    def run_features(fwd: Runs, bwd: Runs, forward_map: Tensor, backward_map: Tensor) -> Tensor:
        """The same features of :meth:`runs`' states: ``[S_f + S_b, D]``, the forward table first."""
        return torch.cat([linear(fwd.states, forward_map), linear(bwd.states, backward_map)])

    def splice_index(self, fwd: Runs, bwd: Runs, rows: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """Where each new position of the deletions finds its two halves: indices
        ``[N·(W - 1)]`` into :meth:`row_features` and into :meth:`run_features` (clamped into
        range past each deletion's length, which the caller masks).

        Each new position j holds one reused and one recomputed state: before the deleted
        position t, the old forward state at j and the new backward one (step t - 1 - j);
        from t on, the new forward state (step j - t) and the old backward one at j + 1.
        """
        n = self.lengths[rows]
        source, before, _ = kept_positions(n, positions, int(n.max()))
        j = torch.arange(source.shape[1], device=rows.device)
        t, T, sf = positions[:, None], self.embedded.shape[1], fwd.states.shape[0]
        old = (rows[:, None] * T + source) * 2 + (~before).long()
        back = sf + bwd.start[:, None] + (t - 1 - j).clamp(min=0) * bwd.stride[:, None]
        ahead = fwd.start[:, None] + (j - t).clamp(min=0) * fwd.stride[:, None]
        new = torch.where(before, back, ahead).clamp_(max=sf + bwd.states.shape[0] - 1)
        return old.reshape(-1), new.reshape(-1)

    def __call__(self, rows: Tensor, positions: Tensor) -> Tensor:
        fwd, bwd = self.runs(rows, positions)
        # The hidden state is forward ⊕ backward: as features, each half through a padded identity.
        hd = self.rnn.hidden_size
        eye = torch.eye(hd, dtype=self.hf.dtype, device=self.hf.device)
        forward_map, backward_map = F.pad(eye, (0, 0, 0, hd)), F.pad(eye, (0, 0, hd, 0))
        old_index, new_index = self.splice_index(fwd, bwd, rows, positions)
        out = splice(self.row_features(forward_map, backward_map), self.run_features(fwd, bwd, forward_map, backward_map),
                     old_index, new_index).view(rows.shape[0], -1, 2 * hd)
        valid = torch.arange(out.shape[1], device=rows.device) < (self.lengths[rows] - 1)[:, None]
        return out * valid.unsqueeze(-1).to(out.dtype)


def splice(old: Tensor, new: Tensor, old_index: Tensor, new_index: Tensor) -> Tensor:
    """``old[old_index] + new[new_index]``: [K, D] from tables [*, D] and indices [K]."""
    return old.index_select(0, old_index).add_(new.index_select(0, new_index))
