"""Re-encoding every one-token deletion of a row while reusing what the deletion leaves
unchanged (leave-one-out, J&W 2019 sec. 4.1).

Deleting position t from a row leaves a bidirectional RNN's forward states before t and
its backward states after t exactly as they were: only the forward direction over the
suffix after t (started from the state at t - 1) and the backward direction over the
prefix before t (started from the state at t + 1) need running again. Per deletion that
is one direction over n - 1 positions instead of both: half the recurrent work of
re-encoding the shortened row from scratch, with the same result.

A deletion is a pair (row, position); ``rows [N]`` index the rows of ``embedded`` and
``positions [N]`` the deleted position in that row. Outputs are ``[N, T - 1, H]``, each
deletion's hidden states for its ``lengths[row] - 1`` positions, zero beyond.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.func import functional_call
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence


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
    """x [G, T, D] -> [N, T - 1, D]: row ``rows[i]`` of ``x`` without position ``positions[i]``,
    zero past its ``lengths[rows[i]] - 1`` positions."""
    source, _, valid = kept_positions(lengths[rows], positions, x.shape[1])
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
    if reverse:  # back from step order to position order
        index = order.unsqueeze(-1).expand_as(h)
        h, c = torch.empty_like(h).scatter_(1, index, h), torch.empty_like(c).scatter_(1, index, c)
    return h, c


def _run_direction(rnn: nn.RNNBase, reverse: bool, x: Tensor, lengths: Tensor, h0: Tensor,
                   c0: Tensor | None) -> Tensor:
    """One direction of ``rnn`` (its own weights) over x [N, L, E] with lengths [N] >= 1 from
    the initial states h0 (and c0 for an LSTM), each [N, hidden] -> outputs [N, L, hidden]."""
    suffix = "_reverse" if reverse else ""
    # A unidirectional twin built on the meta device: functional_call lends it rnn's weights.
    with torch.device("meta"):
        twin = type(rnn)(rnn.input_size, rnn.hidden_size, batch_first=True)
    params = {f"{n}_l0": getattr(rnn, f"{n}_l0{suffix}") for n in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")}
    packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
    hx = h0.unsqueeze(0) if c0 is None else (h0.unsqueeze(0), c0.unsqueeze(0))
    out, _ = functional_call(twin, params, (packed, hx))
    return pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])[0]


def _states(rnn: nn.RNNBase, x: Tensor, lengths: Tensor, outputs: Tensor | None) -> list[tuple[Tensor, Tensor | None]]:
    """(h, c) per direction [G, T, hidden] (c None for a GRU, whose state is its output)."""
    if isinstance(rnn, nn.LSTM):
        return [_lstm_states(rnn, x, lengths, reverse) for reverse in (False, True)]
    return [(half, None) for half in outputs.chunk(2, dim=-1)]


def birnn_deletions(rnn: nn.RNNBase, embedded: Tensor, lengths: Tensor, rows: Tensor, positions: Tensor,
                    outputs: Tensor | None = None) -> Tensor:
    """Hidden states [N, T - 1, 2·hidden] of a one-layer bidirectional ``nn.LSTM``/``nn.GRU``
    (batch_first) on each deletion, equal to running it on the shortened rows.

    ``embedded [G, T, E]``, ``lengths [G]``; ``outputs [G, T, 2·hidden]``, the rnn's outputs on
    the rows, is needed for a GRU (its states) and ignored for an LSTM (whose cell states are
    recomputed). Both directions of a deletion reuse the untouched states and run once over
    the part the deletion changed.
    """
    if not (rnn.bidirectional and rnn.num_layers == 1 and rnn.batch_first):
        raise ValueError("birnn_deletions needs a one-layer, bidirectional, batch_first RNN")
    G, T, _ = embedded.shape
    N, hidden = rows.shape[0], rnn.hidden_size
    (hf, cf), (hb, cb) = _states(rnn, embedded, lengths, outputs)
    n = lengths[rows]
    source, before, valid = kept_positions(n, positions, T)

    def start(h: Tensor, c: Tensor | None, at: Tensor) -> tuple[Tensor, Tensor | None]:
        """States after position ``at`` of each deletion's row; zero where ``at`` is outside it."""
        inside = ((at >= 0) & (at < n)).unsqueeze(-1).to(h.dtype)
        at = at.clamp(0, T - 1)
        return h[rows, at] * inside, None if c is None else c[rows, at] * inside

    # Forward over the suffix after the deleted position, from the state before it.
    fwd = embedded.new_zeros(N, T - 1, hidden)
    run = n - 1 - positions
    some = run > 0
    if some.any():
        steps = torch.arange(T - 1, device=embedded.device)
        suffix = (positions[some, None] + 1 + steps).clamp(max=T - 1)
        x = embedded[rows[some, None], suffix]
        fwd[some] = _run_direction(rnn, False, x, run[some], *_subset(start(hf, cf, positions - 1), some))
    # Backward over the prefix before it (read in reverse), from the state after it.
    bwd = embedded.new_zeros(N, T - 1, hidden)
    some = positions > 0
    if some.any():
        steps = torch.arange(T - 1, device=embedded.device)
        prefix = (positions[some, None] - 1 - steps).clamp(min=0)
        x = embedded[rows[some, None], prefix]
        bwd[some] = _run_direction(rnn, True, x, positions[some], *_subset(start(hb, cb, positions + 1), some))
    # Assemble: before the deletion, the old forward states and the new backward ones (which
    # ran from position t - 1 down, so new position j is step t - 1 - j); after it, the
    # new forward states (step j - t) and the old backward ones.
    j = torch.arange(T - 1, device=embedded.device)
    t = positions[:, None]
    new_fwd = fwd.gather(1, (j - t).clamp(min=0).unsqueeze(-1).expand(N, T - 1, hidden))
    new_bwd = bwd.gather(1, (t - 1 - j).clamp(min=0).unsqueeze(-1).expand(N, T - 1, hidden))
    old_fwd, old_bwd = hf[rows[:, None], source], hb[rows[:, None], source]
    b = before.unsqueeze(-1)
    out = torch.cat([torch.where(b, old_fwd, new_fwd), torch.where(b, new_bwd, old_bwd)], dim=-1)
    return out * valid.unsqueeze(-1).to(out.dtype)


def _subset(states: tuple[Tensor, Tensor | None], some: Tensor) -> tuple[Tensor, Tensor | None]:
    h, c = states
    return h[some], None if c is None else c[some]
