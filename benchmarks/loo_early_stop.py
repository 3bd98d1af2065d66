"""Could leave-one-out stop a masking's runs early? How close a masked row's forward LSTM states
come to the row's own, step by step (docs/speed.md: why the runs are not stopped early).

Masking token t changes the forward states from t on. If they came back to the row's own bit
for bit, the rest of the run could be skipped with the same answer. Each masking's forward run
is stepped through the model's own ``nn.LSTM`` (float32, one step per call, the same call for
the row's own states), and the first step where the states match, exactly and within a
tolerance, is counted.

Run: ``python -m benchmarks.loo_early_stop`` (the benchmarks' random-weight model on 60
SST-like rows) or ``python -m benchmarks.loo_early_stop --run runs/sst --data-dir
path/to/sst`` (a trained model from ``attnmetrics run``, on the first 60 test sentences).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torch import nn

from attnmetrics.data import load_sst
from attnmetrics.models.text import collate
from attnmetrics.models.training import load_checkpoint
from benchmarks.jw_inputs import CASES, make_batch, make_model

MASK = 1  # <UNK>, leave-one-out's default mask token


def forward_lstm(rnn: nn.LSTM) -> nn.LSTM:
    """The forward direction of a bidirectional ``rnn``, as a one-direction LSTM of its own."""
    one = nn.LSTM(rnn.input_size, rnn.hidden_size, batch_first=True)
    one.load_state_dict({k: v for k, v in rnn.state_dict().items() if not k.endswith("_reverse")})
    return one


def first_match(rnn, embedded, mask, tol):
    """Per masking of the real tokens of one row ``embedded [n, E]``: the steps after the mask
    until the forward states equal the row's own bit for bit, and until they are within ``tol``
    (None where they never are before the row ends)."""

    def step(x, state):  # one LSTM step from state (None: zeros) -> the new (h, c)
        return rnn(x[None, None], state)[1]

    own, state = [], None
    for x in embedded:
        state = step(x, state)
        own.append(state)
    exact, near = [], []
    for t in range(1, len(embedded) - 1):  # <SOS> and <EOS> are not masked
        state, e, a = step(mask, own[t - 1]), None, None
        for s in range(t + 1, len(embedded)):
            state = step(embedded[s], state)
            gap = max(float((x - y).abs().max()) for x, y in zip(state, own[s]))
            a = s - t if a is None and gap <= tol else a
            if gap == 0:
                e = s - t
                break
        exact.append(e)
        near.append(a)
    return exact, near


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, help="a run folder of 'attnmetrics run' (default: random weights)")
    parser.add_argument("--data-dir", type=Path, help="the SST folder (with --run)")
    parser.add_argument("--rows", type=int, default=60)
    parser.add_argument("--tol", type=float, default=1e-7, help="largest |state difference| counted as close")
    parser.add_argument("--embed-dim", type=int, default=50, help="the random-weight model's E")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.run is None:
        model = make_model(embed_dim=args.embed_dim)
        tokens, lengths = make_batch(args.rows, *CASES["sst"][1:])
    else:
        ckpt = load_checkpoint(args.run / "model")
        model = ckpt.model.eval()
        test = load_sst(args.data_dir).test[: args.rows]
        tokens, lengths = collate(ckpt.vocab.encode(text for text, _ in test))
    exact, near = [], []
    with torch.no_grad():
        embedded, mask = model.embed(tokens), model.embed(torch.tensor([[MASK]]))[0, 0]
        rnn = forward_lstm(model.encoder.rnn)
        for row, n in zip(embedded, lengths.tolist()):
            e, a = first_match(rnn, row[:n], mask, args.tol)
            exact += e
            near += a
    found = [k for k in near if k is not None]
    print(f"{len(exact)} maskings; states equal bit for bit: {sum(k is not None for k in exact)}")
    print(f"within {args.tol:g}: {len(found)}" + (f", median {sorted(found)[len(found) // 2]} steps" if found else ""))


if __name__ == "__main__":
    main()
