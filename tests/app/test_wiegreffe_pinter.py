"""Wiegreffe & Pinter 2019: uniform attention, imposed attention in training, the
model-consistent adversary and the diagnostic MLPs, on a tiny slice of the real SST; and the
command line with all of it (plus T&Š's tying regulariser and --split-seed)."""

import json

import numpy as np
import pytest
import scipy.stats
import torch

from attnmetrics.app.cli import main
from attnmetrics.app.consistent_adversary import ConsistentAdversary, attention_kl, consistent_adversaries
from attnmetrics.app.diagnostic_mlps import attention_of, diagnostic_mlps
from attnmetrics.data import load_sst
from attnmetrics.models.classifier import ATTENTIONS, EncoderAttentionClassifier, ModelConfig
from attnmetrics.models.text import Vocabulary, collate
from attnmetrics.models.training import TrainConfig, load_checkpoint, make_optimizer, predict, seed_everything, train
from attnmetrics.outputs import decision
from attnmetrics.protocol import token_mask
from attnmetrics.testing.reference import jsd_reference
from tests.inputs import FAST_BATTERY, QUICK_SST, SST_DIR

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def sst():
    assert SST_DIR is not None, "a test using the sst fixture must carry the sst mark"
    splits = load_sst(SST_DIR)
    rows = {"train": splits.train[::20][:400], "dev": splits.dev[::10][:80], "test": splits.test[::20][:100]}
    vocab = Vocabulary.build(t for t, _ in rows["train"])
    return vocab, *(vocab.encode_split(r) for r in rows.values())


def make(cfg: ModelConfig) -> EncoderAttentionClassifier:
    torch.manual_seed(0)
    return EncoderAttentionClassifier(cfg)


RECIPE = TrainConfig(epochs=3, progress=False, lr=3e-3)


@pytest.fixture(scope="module")
def base(sst):
    vocab, tr, dv, _ = sst
    model = make(ModelConfig(len(vocab), embed_dim=32, hidden_size=16))
    train(model, tr, dv, RECIPE)
    return model.eval()


def uniform_over_real(tokens, lengths):
    real = token_mask(lengths, tokens.shape[1], 1, 1).float()
    return real / real.sum(1, keepdim=True)


@pytest.mark.sst
def test_uniform_attention_is_parameter_free_and_stays_uniform(sst):
    assert "uniform" in ATTENTIONS
    vocab, tr, dv, te = sst
    model = make(ModelConfig(len(vocab), embed_dim=16, hidden_size=8, attention="uniform"))
    assert model.attention_parameters() == []
    groups = make_optimizer(model, TrainConfig()).param_groups
    assert groups[1]["params"] == [] and len(groups[0]["params"]) == len(list(model.parameters()))
    before = predict(model, te).logits
    train(model, tr, dv, TrainConfig(epochs=1, progress=False))
    p = predict(model, te)
    assert not torch.equal(p.logits, before)  # the rest of the model did train
    for tokens, lengths in [collate(tr.ids[:64]), collate(te.ids)]:
        _, attention = model(tokens, lengths)
        assert torch.equal(attention, uniform_over_real(tokens, lengths))  # exactly 1/L, exactly 0 at specials


@pytest.mark.sst
def test_imposed_attention_is_used_in_training_and_prediction(sst, base):
    vocab, tr, dv, te = sst
    mlp = ModelConfig(len(vocab), embed_dim=32, hidden_size=16, encoder="average", attention="uniform")
    from_base = attention_of(base)
    # Prediction: the imposed weights decide the context (checked against the sum written out).
    model = make(mlp).eval()
    tokens, lengths = collate(te.ids[:20])
    p = predict(model, [next(te.subset(20).batches(20))], attention_source=from_base)
    alpha = base(tokens, lengths)[1]
    hidden = model.encode(model.embed(tokens), lengths)
    expected = model.decoder((alpha.unsqueeze(-1) * hidden).sum(1))
    assert torch.allclose(p.logits, expected, atol=1e-6)
    assert torch.allclose(p.attention[:, : alpha.shape[1]], alpha)
    other = predict(model, te.subset(20), attention_source=uniform_over_real)
    assert not torch.allclose(other.logits, p.logits)  # changing the imposed weights changes the output
    # Training: the same recipe with different imposed attention gives different models.
    a, b = make(mlp), make(mlp)
    train(a, tr, dv, TrainConfig(epochs=1, progress=False), attention_source=from_base)
    train(b, tr, dv, TrainConfig(epochs=1, progress=False))  # its own (uniform) attention
    assert not torch.allclose(a.decoder.weight, b.decoder.weight)


def test_attention_kl_matches_scipy():
    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([3, 5, 2, 7])
    real = token_mask(lengths, 7, 1, 1)
    p = torch.softmax(torch.randn(4, 7, generator=g, dtype=torch.float64).masked_fill(~real, -torch.inf), 1)
    q = torch.softmax(torch.randn(4, 7, generator=g, dtype=torch.float64).masked_fill(~real, -torch.inf), 1)
    kl = attention_kl(p.nan_to_num(0), q.nan_to_num(0))
    for i in range(4):
        m = real[i]
        assert kl[i].item() == pytest.approx(scipy.stats.entropy(p[i, m].numpy(), q[i, m].numpy()), rel=1e-12)


class _Fixed(torch.nn.Module):
    """A model whose outputs are given: (logits [B, C], attention [B, T]) whatever the input."""

    def __init__(self, logits, attention):
        super().__init__()
        self.logits, self.attention = logits, attention
        self.unused = torch.nn.Parameter(torch.zeros(1))  # a device to run on

    def forward(self, tokens, lengths):
        return self.logits, self.attention


@pytest.mark.parametrize("classes", [1, 2, 3])
def test_consistent_adversary_loss_has_wiegreffe_pinters_tvd_scale(classes):
    # W&P's loss term (sarahwie/attention common_code/metrics.py:12-13 on the positive class's sigmoid,
    # model/Binary_Classification.py:126): sum over the batch of 1/2 |p_adv - p_base|, written out in numpy
    g = torch.Generator().manual_seed(classes)
    b, t, lam = 7, 5, 0.3
    z_adv, z_base = (torch.randn(b, classes, generator=g, dtype=torch.float64) for _ in range(2))
    a_adv, a_base = (torch.softmax(torch.randn(b, t, generator=g, dtype=torch.float64), 1) for _ in range(2))
    base, adv = _Fixed(z_base, a_base), _Fixed(z_adv, a_adv)
    batch = type("Batch", (), {"tokens": torch.zeros(b, t, dtype=torch.long), "lengths": torch.full((b,), t)})
    if classes == 1:
        p, q = (1 / (1 + np.exp(-z.numpy()[:, 0])) for z in (z_adv, z_base))
        wp_tvd = 0.5 * np.abs(p - q)  # theirs: the positive class only
        tvd = 0.5 * (np.abs(p - q) + np.abs((1 - p) - (1 - q)))  # the two-class distribution's TVD
    else:
        p, q = (np.exp(z.numpy()) / np.exp(z.numpy()).sum(1, keepdims=True) for z in (z_adv, z_base))
        tvd = 0.5 * np.abs(p - q).sum(1)
        wp_tvd = 0.5 * tvd  # their code has one sigmoid output; for C > 2 the same 1/2 factor
    pa, pb = a_adv.numpy(), a_base.numpy()
    kl = (pa * np.log(pa / pb)).sum(1)
    assert np.allclose(wp_tvd, tvd / 2)  # their TVD is half the TVD
    default = ConsistentAdversary(base, lam).loss(adv, batch, None).item()
    assert default == pytest.approx((wp_tvd - lam * kl).sum(), rel=1e-12)
    standard = ConsistentAdversary(base, lam, tvd_scale="standard").loss(adv, batch, None).item()
    assert standard == pytest.approx((tvd - lam * kl).sum(), rel=1e-12)
    # the dev objective that picks the epoch is on the same scale; its "tvd" is the TVD itself
    dev = type("Dev", (), {"batches": lambda self, n: [batch]})()
    _, record = ConsistentAdversary(base, lam).select(adv, dev, None, 32)
    assert record["objective"] == pytest.approx((wp_tvd - lam * kl).mean(), rel=1e-12)
    assert record["tvd"] == pytest.approx(tvd.mean(), rel=1e-12)
    with pytest.raises(ValueError, match="tvd_scale must be one of"):
        ConsistentAdversary(base, lam, tvd_scale="half")


@pytest.mark.sst
def test_consistent_adversary(sst, base):
    vocab, tr, dv, te = sst
    with pytest.raises(ValueError, match="lambda"):
        ConsistentAdversary(base, -1.0)
    summary, instances, models = consistent_adversaries(base, make, tr, dv, te, [0.001, 1.0], RECIPE)
    assert summary["tvd_scale"] == "wiegreffe-pinter"
    small, large = summary["per_lambda"]
    for r in (small, large):
        losses = [h["train_loss"] for h in r["history"]]
        assert losses[-1] < losses[0]  # the objective goes down in training
        assert r["tvd_mean"] < 0.1  # predictions stay close to the base's ...
        assert 0 <= r["accuracy"] <= 1 and 0 <= r["macro_f1"] <= 1
        best = max(r["history"], key=lambda h: -h["dev_objective"])  # lowest dev objective kept
        assert r["best_epoch"] == best["epoch"]
    assert large["jsd_mean"] > small["jsd_mean"] + 0.1  # ... while the attention moves away with λ
    # Per-instance arrays agree with a direct computation from the returned models.
    ref = predict(base, te)
    p = predict(models[1], te)
    jsd = np.array(instances["jsd"][1])
    assert len(jsd) == len(te) and jsd.mean() == pytest.approx(large["jsd_mean"])
    assert np.allclose(jsd, jsd_reference(p.attention.double(), ref.attention.double()).numpy(), atol=1e-5)


@pytest.mark.sst
def test_diagnostic_mlps(sst, base):
    vocab, tr, dv, te = sst
    summary, instances = diagnostic_mlps(base, make, tr, dv, te, TrainConfig(epochs=2, progress=False, lr=3e-3))
    assert set(summary) == {"uniform", "trained", "base"}
    for name, s in summary.items():
        assert 0 <= s["accuracy"] <= 1 and 0 <= s["macro_f1"] <= 1
        assert len(instances[name]["predicted"]) == len(te)
    # The base variant's test predictions are those of an MLP run with the base's attention.
    seed_everything(0)
    cfg = ModelConfig(len(vocab), embed_dim=32, hidden_size=16, encoder="average", attention="uniform")
    again = make(cfg)
    train(again, tr, dv, TrainConfig(epochs=2, progress=False, lr=3e-3), attention_source=attention_of(base))
    assert (
        decision(predict(again, te, attention_source=attention_of(base)).logits).tolist()
        == instances["base"]["predicted"]
    )


def test_cli_with_uniform_tying_adversary_and_diagnostic(tmp_path):
    quick = [*QUICK_SST, *FAST_BATTERY]
    out = tmp_path / "run"
    assert (
        main(
            [
                "run",
                *quick,
                "--attention",
                "uniform",
                "--regulariser",
                "tying",
                "--tying-weight",
                "0.5",
                "--split-seed",
                "3",
                "--consistent-adversary",
                "0.01",
                "0.1",
                "--diagnostic",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    r = json.loads((out / "results.json").read_text())
    assert r["model"]["attention"] == "uniform" and r["model"]["regulariser"] == "tying"
    assert r["model"]["tying_weight"] == 0.5 and r["split_seed"] == 3 and r["config"]["split_seed"] == 3
    assert {"tau", "top_token_agreement", "n"} <= set(r["single_token"]) and r["single_token"]["n"] == 160
    assert len(r["instances"]["single_token"]["tau"]) == 160
    per = r["consistent_adversary"]["per_lambda"]
    assert [x["lambda"] for x in per] == [0.01, 0.1]
    for x in per:
        assert {"lambda", "tvd_mean", "jsd_mean", "accuracy", "macro_f1"} <= set(x)
        assert x["jsd_mean"] == pytest.approx(0, abs=1e-6)  # uniform attention cannot move
    assert set(r["consistent_adversary"]["jain_wallace"]) == {"tvd_mean", "jsd_mean"}
    assert len(r["instances"]["consistent_adversary"]["tvd"]) == 2
    assert set(r["diagnostic"]) == {"uniform", "trained", "base", "adversary"}
    assert {"accuracy", "macro_f1"} <= set(r["diagnostic"]["adversary"])
    assert "consistent_adversary" in r["conventions"] and (out / "consistent_adversary.png").is_file()
    report = (out / "report.md").read_text()
    for section in ("Single-token inputs", "Model-consistent adversary", "Diagnostic MLP"):
        assert section in report
    assert load_checkpoint(out / "model").extra["split_seed"] == 3
    # evaluate reloads the same split; single_token can be skipped
    ev = tmp_path / "eval"
    assert (
        main(
            [
                "evaluate",
                str(out),
                "--out",
                str(ev),
                "--no-progress",
                "--threads",
                "1",
                "--limit",
                "160",
                "--skip",
                "single_token",
                "flip",
                "kendall",
                "loo",
                "permutation",
                "adversarial",
            ]
        )
        == 0
    )
    e = json.loads((ev / "results.json").read_text())
    assert e["split_seed"] == 3 and "single_token" not in e and e["test"] == r["test"]
