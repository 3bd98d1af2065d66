"""J&W's own adversarial-attention loop (attnmetrics.testing.jw_adversary, a transcription of their
``AdversaryMulti``) against ``attnmetrics.adversarial_attention`` under ``--protocol jain-wallace``
(``diversity_weight = 0.16``, AMSGrad; docs/definitions.md §10, §13), on one small J&W classifier.

- exact: their loss is K times our objective (value and gradient, the latter from the search's own
  closed form), and from the same initial log-attentions the two 500-step searches end at the same
  candidates and statistic (up to Adam's eps, which their factor K rescales, and their 1e-10s);
- statistical: from independent noise, the per-instance statistic has the same mean;
- the selection: their ``plot_multi_adversarial`` and our report agree on constructed candidates.
"""

from __future__ import annotations

import math
from functools import cache
from typing import NamedTuple

import pytest
import torch
from torch import Tensor, nn

from attnmetrics import adversarial_attention, jsd, tvd
from attnmetrics.adversarial import PADDING_LOGIT, _gradient, _outputs
from attnmetrics.keyed import KeyedRows
from attnmetrics.models.classifier import EncoderAttentionClassifier, ModelConfig
from attnmetrics.protocol import forward
from attnmetrics.testing.jw_adversary import (
    jw_adversarial_reference,
    jw_emax_jsd,
    jw_loss,
    jw_masks,
    jw_output_diff,
)

F64 = torch.float64
K = 5
JAIN_WALLACE = dict(diversity_weight=1 / 6.25, amsgrad=True)  # app/recipes.py PRESETS["jain-wallace"]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class Setup(NamedTuple):
    model: EncoderAttentionClassifier
    lengths: Tensor  # [B] with <SOS>/<EOS>
    attention: Tensor  # [B, T] the model's, 0 at the specials
    hidden: Tensor  # [B, T, H]
    real: object  # attnmetrics.protocol.Forward: real tokens only (what the battery passes ours)


@cache
def setup(replicas: int = 1) -> Setup:
    """A J&W BiLSTM + tanh attention + one sigmoid logit, seed 0, float64; its decoder scaled by 10 so the
    output constraint binds (untrained, the output hardly moves with attention). Six ragged rows of 2 to 7
    real tokens, each repeated ``replicas`` times (independent noise per repeat)."""
    torch.manual_seed(0)
    model = EncoderAttentionClassifier(ModelConfig(vocab_size=20, embed_dim=8, hidden_size=8, num_classes=1))
    model = model.double().eval()
    with torch.no_grad():
        model.decoder.weight.mul_(10.0)
    lengths = torch.tensor([9, 7, 5, 8, 4, 6])
    width = int(lengths.max())
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(1, 20, (len(lengths), width), generator=g) * (torch.arange(width) < lengths[:, None])
    tokens, lengths = tokens.repeat(replicas, 1), lengths.repeat(replicas)
    with torch.no_grad():
        hidden = model.encode(model.embed(tokens), lengths)
        attention = model.attend(hidden, lengths)
    return Setup(model, lengths, attention, hidden, forward(model, tokens, lengths))


def ours(s: Setup, seed: int, **opts):
    r = s.real
    return adversarial_attention(
        r.attention,
        r.hidden,
        s.model.decoder,
        r.lengths,
        generator=torch.Generator().manual_seed(seed),
        **JAIN_WALLACE | opts,
    )


def our_noise(s: Setup, seed: int) -> Tensor:
    """The noise ``adversarial_attention`` draws from ``Generator().manual_seed(seed)`` ([B, K, T_real]),
    placed on the real tokens of the full rows (J&W's noise covers the specials too; masked)."""
    real = torch.randn(
        s.real.attention.shape[:1] + (K,) + s.real.attention.shape[1:],
        generator=torch.Generator().manual_seed(seed),
        dtype=F64,
    )
    noise = torch.zeros(s.attention.shape[0], K, s.attention.shape[1], dtype=F64)
    noise[:, :, 1 : 1 + real.shape[2]] = real
    return noise


def theirs(s: Setup, *, seed: int | None = None, noise: Tensor | None = None, **opts):
    g = None if seed is None else torch.Generator().manual_seed(seed)
    adv = jw_adversarial_reference(
        s.attention, s.hidden, s.model.decoder, s.lengths, 1, 1, generator=g, noise=noise, **opts
    )
    stat = jw_emax_jsd(adv.attention, adv.outputs, s.attention, torch.sigmoid(s.real.logits), s.lengths)
    return adv, stat


def real_part(s: Setup, full: Tensor) -> Tensor:
    """[..., T] full rows -> [..., T_real] the real tokens (zero past each row's)."""
    return full[..., 1 : 1 + s.real.attention.shape[1]]


# ---- (a) exact: the loss, its gradient, the same start ------------------------------------------------


def our_objective(s: Setup, z: Tensor, diversity: float) -> Tensor:
    """docs/definitions.md §10, summed over rows, from attnmetrics.jsd / tvd: candidates a = softmax of
    the real tokens' logits z [B, K, T_real]."""
    r = s.real
    valid = torch.arange(z.shape[-1]) < r.lengths[:, None]
    a = torch.softmax(z.masked_fill(~valid[:, None], -math.inf), -1)
    y0 = torch.sigmoid(r.logits)[:, None]
    y = torch.sigmoid(s.model.decoder(torch.einsum("bkt,bth->bkh", a, r.hidden)))
    change = tvd(torch.cat([1 - y, y], -1), torch.cat([1 - y0, y0], -1).expand(-1, K, -1))
    far = jsd(a, r.attention[:, None].expand_as(a))
    i, j = torch.triu_indices(K, K, 1)
    apart = jsd(a[:, i], a[:, j]).mean(1)
    return (-far.mean(1) + 500 * torch.relu(change - 0.01).mean(1) - diversity * apart).sum()


def our_gradient(s: Setup, z: Tensor, diversity: float) -> Tensor:
    """The search's own step gradient (adversarial._gradient, the nn.Linear path) at logits z [B, K, T_real]."""
    r, dec = s.real, s.model.decoder
    valid = torch.arange(z.shape[-1]) < r.lengths[:, None]
    feats = (r.hidden @ dec.weight.T).masked_fill(~valid[..., None], 0.0)[:, None]  # [B, 1, T, 1]
    alpha = r.attention[:, None, None]  # [B, 1, 1, T]
    bias, classes = dec.bias.detach(), []
    with torch.no_grad():
        y0 = _outputs(alpha, feats, None, bias, classes)
        z4 = z.masked_fill(~valid[:, None], PADDING_LOGIT)[:, :, None]
        return _gradient(z4, alpha, y0, feats, None, bias, classes, 500.0, 0.01, diversity)[:, :, 0]


@pytest.mark.parametrize("moved", [False, True])
def test_their_loss_is_k_times_our_objective(moved):
    s = setup()
    z = (torch.log(1 / s.lengths.double())[:, None, None] + 3 * our_noise(s, 0)).expand(-1, K, -1).clone()
    if moved:  # after 5 of their steps at lr 0.1: another point
        z = theirs(s, noise=our_noise(s, 0), steps=5, lr=0.1)[0].log_attention.clone()
    masks = jw_masks(s.lengths, z.shape[-1])
    z.requires_grad_(True)
    loss = jw_loss(z, s.attention, s.hidden, s.model.decoder, masks, s.real.logits)
    (grad,) = torch.autograd.grad(loss, [z])
    zr = real_part(s, z.detach())
    with torch.no_grad():
        a = torch.softmax(z.detach().masked_fill(masks[:, None], -math.inf), -1)
        hinge = (
            jw_output_diff(s.model.decoder(torch.einsum("bkt,bth->bkh", a, s.hidden)), s.real.logits[:, None]) > 0.01
        )
    assert hinge.any() and (~hinge).any()  # both sides of the output hinge are exercised
    # the value: their sums and K x K mean are K times our means with diversity (K - 1) / K^2 = 0.16
    assert (K - 1) / K**2 == JAIN_WALLACE["diversity_weight"]
    want = K * our_objective(s, zr, JAIN_WALLACE["diversity_weight"])
    torch.testing.assert_close(loss.detach(), want, rtol=0, atol=1e-7)  # their 1e-10s: ~1e-9 here
    # the gradient: K times the search's own, on the real tokens; none on <SOS>, <EOS> and padding
    ours_grad = our_gradient(s, zr, JAIN_WALLACE["diversity_weight"])
    valid = ~real_part(s, masks)[:, None].expand_as(ours_grad)
    torch.testing.assert_close(real_part(s, grad)[valid], K * ours_grad[valid], rtol=1e-6, atol=1e-9)
    assert (grad.masked_select(masks[:, None].expand_as(grad)) == 0).all()


def test_same_start_same_search():
    """From our noise, their 500 AMSGrad steps at lr 0.01 reach our candidates: the kept attention to 1e-5
    and the statistic to 1e-6 (measured: 1.7e-6 and 8e-7; Adam's eps = 1e-8 on their K-times-larger
    gradient acts as eps / K on ours, and their 1e-10s, over 500 steps)."""
    s = setup()
    for steps in (1, 500):
        got = ours(s, 3, steps=steps)
        _, stat = theirs(s, noise=our_noise(s, 3), steps=steps)
        torch.testing.assert_close(stat.emax_jsd, got.max_jsd, rtol=0, atol=1e-6)
        torch.testing.assert_close(real_part(s, stat.attention), got.attention, rtol=0, atol=1e-5)
        torch.testing.assert_close(stat.output_change, got.output_tvd, rtol=0, atol=1e-6)  # |Δp| is our TVD
        assert (stat.position < K).all()  # an adversary found for every row: the comparison is not vacuous
    start = ours(s, 3, steps=0, tvd_threshold=1.0)
    assert (start.attention - got.attention).abs().max() > 0.1  # the steps moved the candidates


# ---- (b) statistical: independent noise ----------------------------------------------------------------


def test_same_statistic_distribution_from_independent_noise():
    """Each of six instances 32 times (independent noise per copy): ours from one generator, theirs from
    another, 200 steps (not 500, for time: the claim, that the two searches are the same random procedure,
    holds at any step count, and the 500-step trajectories coincide in test_same_start_same_search; at 200
    the statistic still depends on the start, which is what could differ: noise scale, layout, masking).
    Per instance, the mean of J&W's statistic agrees within 4 standard errors of the difference (estimated
    from the 2 x 32 draws; a false alarm ~1e-4 per instance), and within 0.05 absolute. Means, not
    medians: per instance the statistic is bimodal over starts (a median moved 0.05 between seeds here).
    Power: their loop with init std 1 instead of 3 is 4.5 to 13 standard errors off on every instance."""
    replicas, rows = 32, 6
    s = setup(replicas)
    opts = dict(steps=200)
    got = ours(s, 10, **opts).max_jsd.view(replicas, rows)
    want = theirs(s, seed=20, **opts)[1].emax_jsd.view(replicas, rows)
    se = (got.var(0) / replicas + want.var(0) / replicas).sqrt()
    diff = (got.mean(0) - want.mean(0)).abs()
    assert (diff <= 4 * se).all(), (got.mean(0), want.mean(0), se)
    assert (diff <= 0.05).all()
    assert (se < 0.03).all()  # enough draws that 4 SE is a sharp test
    # what is compared varies: instances differ, and draws within an instance differ
    assert got.mean(0).max() - got.mean(0).min() > 0.1 and (got.std(0) > 1e-3).any()


# ---- (c) the selection rule -----------------------------------------------------------------------------


class GivenNoise(KeyedRows):
    """A generator whose draw is the given tensor: with ``init_std = 1`` and ``steps = 0`` the candidates
    are ``softmax(log(1 / L) + noise)``; noise = log(c) makes them exactly c."""

    def normal(self, batch, shape, dtype=F64, device=None):  # noqa: ARG002
        return self.__dict__["noise"].to(dtype).reshape(batch, *shape)


def test_selection_rule_on_constructed_candidates():
    """Rows of 4 real tokens (plus <SOS>/<EOS>), one hidden unit, p = sigmoid(h . a + b): the output moves
    only with the weight on the last token (h = [0, 0, 0, 3]). Per row: which candidate J&W keep (their
    ``plot_multi_adversarial``: change <= 0.05, first maximum, the original as K + 1) and what ours reports."""
    base = torch.tensor([0.7, 0.1, 0.1, 0.1], dtype=F64)  # the original attention
    h_last, b0 = 3.0, -0.5
    p0 = torch.sigmoid(torch.tensor(h_last * 0.1 + b0, dtype=F64))

    def weight_for(change):  # the last token's weight whose output change is `change` (up)
        return float((torch.logit(p0 + change) - b0) / h_last)

    def cand(last, big):  # `last` on the last token, 80% of the rest on token `big`, the others share
        c = torch.full((4,), 0.1 * (1 - last), dtype=F64)
        c[3], c[big] = last, 0.8 * (1 - last)
        return c

    far_unfit = torch.tensor([0.1, 0.1, 0.1, 0.7], dtype=F64)  # the largest JSD, output moved far
    fit = cand(0.1, 1)  # output unchanged, large JSD
    rows = [
        # 0: the far one is excluded, `fit` kept; its duplicate later loses the tie (first maximum)
        ([far_unfit, fit, base, fit, cand(0.1, 2) * 0.5 + base * 0.5], 1),
        # 1: every candidate moves the output too far: the original (position K), JSD 0
        ([far_unfit, cand(0.5, 1), cand(0.45, 2), cand(0.5, 0), cand(0.4, 1)], K),
        # 2: the threshold: change 0.049 kept, 0.051 excluded though farther
        ([cand(weight_for(0.051), 1), cand(weight_for(0.049), 2), base, base, base], 1),
        # 3: all candidates the original: J&W keep candidate 0 (first maximum, JSD 0), ours the original
        ([base] * K, 0),
    ]
    cands = torch.stack([torch.stack(c) for c, _ in rows])  # [B, K, 4]
    expected = torch.tensor([pos for _, pos in rows])
    b = cands.shape[0]
    lengths = torch.full((b,), 6)
    full = torch.zeros(b, K, 6, dtype=F64)
    full[:, :, 1:5] = cands
    attention = torch.zeros(b, 6, dtype=F64)
    attention[:, 1:5] = base
    values = torch.zeros(b, 6, 1, dtype=F64)
    values[:, 4, 0] = h_last
    dec = nn.Linear(1, 1).double()
    with torch.no_grad():
        dec.weight.fill_(1.0)
        dec.bias.fill_(b0)
    with torch.no_grad():
        outputs = torch.sigmoid(dec((full[..., None] * values[:, None]).sum(2)))
        original = torch.sigmoid(dec((attention[..., None] * values).sum(1)))
    stat = jw_emax_jsd(full, outputs, attention, original, lengths)
    assert stat.position.tolist() == expected.tolist()
    # rows 2's threshold cases are what they claim to be
    torch.testing.assert_close((outputs[2, :2, 0] - original[2, 0]).abs(), torch.tensor([0.051, 0.049], dtype=F64))

    noise = GivenNoise(0, 0)
    noise.__dict__["noise"] = torch.log(cands)
    got = adversarial_attention(
        attention[:, 1:5], values[:, 1:5], dec, lengths - 2, steps=0, init_std=1.0, generator=noise, **JAIN_WALLACE
    )
    torch.testing.assert_close(got.attention, stat.attention[:, 1:5], rtol=0, atol=1e-12)
    torch.testing.assert_close(got.max_jsd, stat.emax_jsd, rtol=0, atol=1e-8)  # their 1e-10s
    torch.testing.assert_close(got.output_tvd, stat.output_change, rtol=0, atol=1e-12)
    assert float(stat.emax_jsd[0]) > 0.2 and float(stat.emax_jsd[2]) > 0.1
    assert stat.emax_jsd[1] == 0 and stat.emax_jsd[3] == 0
