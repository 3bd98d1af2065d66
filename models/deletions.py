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
row. Outputs are ``[N, W - 1, H]`` with ``W`` the longest of the chunk's rows, each
deletion's hidden states for its ``lengths[row] - 1`` positions, zero beyond. The
recomputed runs are padded to the chunk's longest run, so a chunk of nearby positions
(as ``attnmetrics.leave_one_out`` sends them) wastes little.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call


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


def _lstm_states(rnn: nn.LSTM, x: Tensor, lengths: Tensor, reverse: bool) -> tuple[Tensor, Tensor]:
    """One direction of a one-layer LSTM over x [G, T, E]: (h, c), each [G, T, hidden], the
    states after each position (the backward direction runs from each row's last position).

    nn.LSTM returns the hidden states but not the cell states the reuse needs, so the
    recurrence runs here, one step over all rows at a time, in torch's gate order i, f, g, o.
    """
    suffix = "_reverse" if reverse else ""
    w_ih, w_hh = getattr(rnn, f"weight_ih_l0{suffix}"), getattr(rnn, f"weight_hh_l0{suffix}")
    bias = getattr(rnn, f"bias_ih_l0{suffix}") + getattr(rnn, f"bias_hh_l0{suffix}")
    G, T, _ = x.shape
    steps = torch.arange(T, device=x.device)
    # Step s reads position s, or, backwards, position length - 1 - s of each row.
    order = ((lengths[:, None] - 1 - steps).clamp(min=0) if reverse else steps.expand(G, T))
    gates_x = torch.addmm(bias, x.reshape(G * T, -1), w_ih.t()).reshape(G, T, -1)
    gates_x = gates_x.gather(1, order.unsqueeze(-1).expand_as(gates_x))
    h = x.new_zeros(G, rnn.hidden_size)
    c = x.new_zeros(G, rnn.hidden_size)
    hs, cs = [], []
    for s in range(T):
        i, f, g, o = torch.addmm(gates_x[:, s], h, w_hh.t()).chunk(4, dim=1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        hs.append(h)
        cs.append(c)
    h, c = torch.stack(hs, 1), torch.stack(cs, 1)
    if reverse:  # back to position order: position p < length is step length - 1 - p
        index = order.unsqueeze(-1).expand_as(h)
        h, c = h.gather(1, index), c.gather(1, index)
    return h, c


class BiRNNDeletions:
    """The deletions of a block of rows through a one-layer bidirectional ``nn.LSTM``/``nn.GRU``
    (batch_first): ``BiRNNDeletions(rnn, embedded [G, T, E], lengths [G], outputs)`` keeps the
    rows' states; calling it with ``rows [N]``, ``positions [N]`` gives the hidden states
    ``[N, W - 1, 2·hidden]`` of those deletions, equal to running ``rnn`` on the shortened rows.

    ``outputs [G, T, 2·hidden]``, the rnn's outputs on the rows, are a GRU's states (needed);
    an LSTM's cell states are not among its outputs, so they are recomputed (ignored).
    """

    def __init__(self, rnn: nn.RNNBase, embedded: Tensor, lengths: Tensor, outputs: Tensor | None = None):
        if not (rnn.bidirectional and rnn.num_layers == 1 and rnn.batch_first):
            raise ValueError("BiRNNDeletions needs a one-layer, bidirectional, batch_first RNN")
        self.rnn, self.embedded, self.lengths = rnn, embedded, lengths
        if isinstance(rnn, nn.LSTM):
            (self.hf, self.cf), (self.hb, self.cb) = (_lstm_states(rnn, embedded, lengths, r) for r in (False, True))
        else:
            self.hf, self.hb = outputs.chunk(2, dim=-1)
            self.cf = self.cb = None
        # Unidirectional twins built on the meta device: functional_call lends them rnn's weights.
        with torch.device("meta"):
            self.twin = type(rnn)(rnn.input_size, rnn.hidden_size, batch_first=True)
        names = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
        self.weights = [{f"{n}_l0": getattr(rnn, f"{n}_l0{d}") for n in names} for d in ("", "_reverse")]

    def _start(self, h: Tensor, c: Tensor | None, rows: Tensor, at: Tensor):
        """States after position ``at`` of each row; zero where ``at`` is outside the row."""
        inside = ((at >= 0) & (at < self.lengths[rows])).unsqueeze(0).unsqueeze(-1).to(h.dtype)
        at = at.clamp(0, h.shape[1] - 1)
        h0 = h[rows, at].unsqueeze(0) * inside
        return h0 if c is None else (h0, c[rows, at].unsqueeze(0) * inside)

    def _run(self, backward: bool, rows: Tensor, start: Tensor, run: Tensor, hx) -> Tensor:
        """One direction over ``run[i]`` positions of row ``rows[i]`` from ``start[i]`` (read
        backwards if ``backward``), from the states ``hx``: outputs [N, max(run), hidden].
        Padded, not packed: a run's outputs never depend on what follows it, and torch's
        fused kernels only take uniform lengths."""
        steps = torch.arange(max(int(run.max()), 1), device=rows.device)
        at = start[:, None] - steps if backward else start[:, None] + steps
        x = self.embedded[rows[:, None], at.clamp(0, self.embedded.shape[1] - 1)]
        out, _ = functional_call(self.twin, self.weights[backward], (x, hx))
        return out

    def runs(self, rows: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """The recomputed parts of deletions ``rows [N]``, ``positions [N]``: the forward
        direction over the suffix after the deleted position, from the state before it, and
        the backward direction over the prefix before it (read in reverse), from the state
        after it; ``[N, L, hidden]`` each, in step order."""
        n = self.lengths[rows]
        fwd = self._run(False, rows, positions + 1, n - 1 - positions, self._start(self.hf, self.cf, rows, positions - 1))
        bwd = self._run(True, rows, positions - 1, positions, self._start(self.hb, self.cb, rows, positions + 1))
        return fwd, bwd

    def splice(self, old: Tensor, new_fwd: Tensor, new_bwd: Tensor, rows: Tensor, positions: Tensor) -> Tensor:
        """Per-position features of the deletions, for features that add over the two halves
        of a state (any linear map of it): ``old [G, T, 2, D]``, the features of the rows' own
        forward (``[:, :, 0]``) and backward (``[:, :, 1]``) states; ``new_* [N, L, D]``, those
        of :meth:`runs`' outputs -> ``[N, W - 1, D]``, not zeroed past each deletion's length.

        Each new position j holds one reused and one recomputed state: before the deleted
        position t, the old forward state at j and the new backward one (step t - 1 - j);
        from t on, the new forward state (step j - t) and the old backward one at j + 1.
        Two row gathers, one from each table, and an add build it.
        """
        n = self.lengths[rows]
        source, before, _ = kept_positions(n, positions, int(n.max()))
        N, (Lf, D), Lb, T = rows.shape[0], new_fwd.shape[1:], new_bwd.shape[1], old.shape[1]
        j = torch.arange(source.shape[1], device=rows.device)
        t, i = positions[:, None], torch.arange(N, device=rows.device)[:, None]
        old_index = (rows[:, None] * T + source) * 2 + (~before).long()
        new_index = torch.where(before, N * Lf + i * Lb + (t - 1 - j).clamp(0, Lb - 1), i * Lf + (j - t).clamp(0, Lf - 1))
        new = torch.cat([new_fwd.reshape(-1, D), new_bwd.reshape(-1, D)])
        out = old.reshape(-1, D).index_select(0, old_index.reshape(-1))
        return out.add_(new.index_select(0, new_index.reshape(-1))).view(N, -1, D)

    def __call__(self, rows: Tensor, positions: Tensor) -> Tensor:
        fwd, bwd = self.runs(rows, positions)
        # The hidden state is forward ⊕ backward: as features, each half padded by zeros.
        hd = fwd.shape[-1]
        old = torch.stack([F.pad(self.hf, (0, hd)), F.pad(self.hb, (hd, 0))], dim=2)
        out = self.splice(old, F.pad(fwd, (0, hd)), F.pad(bwd, (hd, 0)), rows, positions)
        valid = torch.arange(out.shape[1], device=rows.device) < (self.lengths[rows] - 1)[:, None]
        return out * valid.unsqueeze(-1).to(out.dtype)
