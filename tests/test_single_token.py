"""Tutek & Šnajder 2020's single-token-input test (sec. 4) against a plain loop (one forward per
token), and in the battery."""

import pytest
import scipy.stats
import torch

from attnmetrics.app.battery import collect, summarise
from attnmetrics.models.classifier import EncoderAttentionClassifier, ModelConfig
from attnmetrics.models.text import collate
from attnmetrics.outputs import decision, output_distribution
from attnmetrics.single_token import single_token_inputs, single_token_test
from tests.inputs import sentence_rows as ragged

torch.set_num_threads(1)
E, HID = 8, 8  # embedding size; hidden size per direction


def test_single_token_inputs_keep_the_rows_specials():
    tokens, lengths = collate([[2, 5, 6, 7, 3], [9, 8, 11, 3, 4], [2, 3]])
    inputs, rows, positions = single_token_inputs(tokens, lengths, lead=1, trail=1)
    assert inputs.tolist() == [[2, 5, 3], [2, 6, 3], [2, 7, 3], [9, 8, 4], [9, 11, 4], [9, 3, 4]]
    assert rows.tolist() == [0, 0, 0, 1, 1, 1] and positions.tolist() == [0, 1, 2] * 2
    inputs, _, _ = single_token_inputs(tokens, lengths, lead=2, trail=0)
    assert inputs[:, :2].tolist() == [[2, 5]] * 3 + [[9, 8]] * 3


@pytest.mark.parametrize("num_classes, encoder", [(1, "lstm"), (3, "cnn"), (2, "average")])
def test_single_token_matches_a_plain_loop(num_classes, encoder):
    torch.manual_seed(0)
    model = (
        EncoderAttentionClassifier(
            ModelConfig(30, embed_dim=E, hidden_size=8, encoder=encoder, num_classes=num_classes)
        )
        .double()
        .eval()
    )
    rows, tokens, lengths = ragged(4, rows=9)
    rows.append([2, 7, 3])  # one real token: tau undefined, agreement defined
    tokens, lengths = collate(rows)
    got = single_token_test(model, tokens, lengths, max_rows=7)  # several calls, rows split across them
    with torch.no_grad():
        for i, row in enumerate(rows):
            logits, attention = model(*collate([row]))
            y = int(decision(logits)[0])
            alone, alone_decisions = [], []
            for t in range(1, len(row) - 1):  # one forward per token
                lg, _ = model(*collate([[row[0], row[t], row[-1]]]))
                alone.append(float(output_distribution(lg)[0, y]))
                alone_decisions.append(int(decision(lg)[0]))
            L = len(alone)
            assert got.lengths[i] == L
            assert torch.allclose(got.alone[i, :L], torch.tensor(alone, dtype=torch.float64), atol=1e-12)
            att = attention[0, 1 : L + 1]
            top = int(torch.argmax(att))
            assert bool(got.top_agrees[i]) == (alone_decisions[top] == y)
            if L >= 2:
                ref = scipy.stats.kendalltau(att.numpy(), alone)
                assert float(got.tau[i]) == pytest.approx(ref.statistic, abs=1e-9)
                assert float(got.pvalue[i]) == pytest.approx(ref.pvalue, abs=1e-9)
            else:
                assert torch.isnan(got.tau[i])


def test_single_token_in_the_battery():
    torch.manual_seed(0)
    model = EncoderAttentionClassifier(ModelConfig(30, embed_dim=E, hidden_size=HID)).eval()
    _, tokens, lengths = ragged(5, rows=12)
    values, seconds = collect(model, [(0, tokens, lengths)], experiments=["single_token"], progress=False)
    summary, instances = summarise(values, seconds, ("neg", "pos"), experiments=["single_token"])
    s = summary["single_token"]
    assert s["n"] == 12 and 0 <= s["top_token_agreement"] <= 1
    assert {"mean", "std", "significant", "n"} <= set(s["tau"]) and -1 <= s["tau"]["mean"] <= 1
    direct = single_token_test(model, tokens, lengths)
    assert instances["single_token"]["top_token_agrees"] == direct.top_agrees.tolist()
    assert s["top_token_agreement"] == pytest.approx(direct.top_agrees.float().mean().item())
