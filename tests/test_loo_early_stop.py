"""benchmarks/loo_early_stop.py, docs/speed.md's check that leave-one-out's runs cannot stop early:
it must see a masking that changes nothing as equal from its first step, and one that changes
a token as different there."""

import torch
from torch import nn

from benchmarks.loo_early_stop import first_match, forward_lstm


def test_forward_lstm_is_the_forward_direction():
    torch.manual_seed(0)
    bi = nn.LSTM(3, 4, batch_first=True, bidirectional=True)
    x = torch.randn(2, 5, 3)
    with torch.no_grad():
        assert torch.allclose(forward_lstm(bi)(x)[0], bi(x)[0][..., :4], atol=1e-6)


def test_first_match_sees_equal_and_changed_states():
    torch.manual_seed(0)
    rnn = forward_lstm(nn.LSTM(3, 4, batch_first=True, bidirectional=True))
    row = torch.randn(6, 3)
    row[2] = row[4]  # masking position 2 with row[4] changes it; masking 4 with row[4] does not
    with torch.no_grad():
        exact, near = first_match(rnn, row, row[4], tol=0.0)
    # maskings of positions 1..4; the steps after the mask until the states are the row's own
    assert exact[3] == 1 and near[3] == 1  # position 4: nothing changed
    assert exact[1] == 1  # position 2 holds the mask's embedding too
    assert exact[0] != 1 and exact[2] != 1  # positions 1 and 3 changed
