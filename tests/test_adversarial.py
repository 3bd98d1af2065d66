"""Adversarial attention (J&W 2019, sec. 4.3): the batched search against the per-instance
reference, the reported constraints, chunking invariance and errors.

Few steps and a larger learning rate than J&W's keep the file fast while the logits still
move far from their start, so the comparisons exercise the gradient of every loss term.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import attnmetrics
from attnmetrics import AdversarialResult, adversarial_attention, jsd, tvd
from attnmetrics.outputs import output_distribution
from attnmetrics.testing.reference import adversarial_attention_reference

F64 = torch.float64
LN2 = math.log(2.0)
FAST = dict(steps=25, lr=0.1)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # The test machine is shared and oversubscribed: a tiny kernel that opens the OpenMP
    # pool (softmax) then waits milliseconds for a descheduled thread. Results do not
    # depend on it; restored afterwards.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_imports_this_checkout():
    assert Path(attnmetrics.__file__).resolve().is_relative_to(Path(__file__).resolve().parents[1])


# ---- inputs ---------------------------------------------------------------------------------


def batch(b=12, t=9, h=5, dtype=F64, seed=0, temperature=2.0, scale=1.0, min_len=0):
    """Ragged batch: softmax attention over each prefix (zero on padding), random values
    (times ``scale``: larger values make the output more sensitive to the attention)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_len, t + 1, (b,), generator=g)
    mask = torch.arange(t) < lengths[:, None]
    logits = torch.randn(b, t, generator=g, dtype=F64) * temperature
    att = torch.softmax(logits.masked_fill(~mask, -math.inf), 1).nan_to_num(0.0)
    values = torch.randn(b, t, h, generator=g, dtype=F64) * scale
    return att.to(dtype), values.to(dtype), lengths


def make_decoder(kind, h, c, dtype=F64, seed=1):
    torch.manual_seed(seed)
    if kind == "mlp":
        return nn.Sequential(nn.Linear(h, 8), nn.Tanh(), nn.Linear(8, c)).to(dtype).eval()
    lin = nn.Linear(h, c).to(dtype)
    return (lambda x: lin(x)) if kind == "lambda" else lin  # lambda: the general path


def seeded(seed=3):
    return torch.Generator().manual_seed(seed)


def assert_same(got: AdversarialResult, want: AdversarialResult, tol=1e-10):
    for name in AdversarialResult._fields:
        torch.testing.assert_close(getattr(got, name), getattr(want, name), rtol=tol, atol=tol, msg=name)


def context_tvd(att, values, decoder, original):
    """Output TVD of attention `att` against `original`, each through decoder(att @ values)."""
    with torch.no_grad():
        y = output_distribution(decoder(torch.einsum("bt,bth->bh", att, values)))
        y0 = output_distribution(decoder(torch.einsum("bt,bth->bh", original, values)))
    return tvd(y, y0)


# ---- parity with the per-instance reference ---------------------------------------------------


@pytest.mark.parametrize("kind", ["linear", "mlp", "lambda"])
@pytest.mark.parametrize("classes", [1, 3])
def test_matches_per_instance_reference(kind, classes):
    att, values, lengths = batch(seed=classes, scale=2.0)
    dec = make_decoder(kind, 5, classes)
    # a threshold below the margin the loss aims at: some rows keep the original
    opts = FAST | dict(tvd_threshold=0.006)
    got = adversarial_attention(att, values, dec, lengths, generator=seeded(), **opts)
    want = adversarial_attention_reference(att, values, dec, lengths, generator=seeded(), **opts)
    assert_same(got, want)
    # a meaningful comparison: some rows find an adversary, some keep the original (every
    # candidate moved the output too far), and the steps changed the answer
    real = lengths >= 2
    assert (got.max_jsd[real] > 0).any() and (got.max_jsd[real] == 0).any()
    start = adversarial_attention(att, values, dec, lengths, generator=seeded(), steps=0, tvd_threshold=1.0)
    assert (start.attention - got.attention).abs().max() > 1e-2


@pytest.mark.parametrize("kind", ["linear", "mlp"])
def test_float32_matches_reference(kind):
    att, values, lengths = batch(b=16, seed=7, dtype=torch.float32, scale=2.0)
    dec = make_decoder(kind, 5, 2, torch.float32)
    got = adversarial_attention(att, values, dec, lengths, generator=seeded(), **FAST)
    want = adversarial_attention_reference(att, values, dec, lengths, generator=seeded(), **FAST)
    assert all(f.dtype == torch.float32 for f in got)
    # same choice (adversary vs original) on all rows but one at most: float32 rounding
    # can move a candidate's output TVD across the threshold
    same = (got.max_jsd > 0) == (want.max_jsd > 0)
    assert same.sum() >= len(same) - 1
    assert_same(AdversarialResult(*(f[same] for f in got)), AdversarialResult(*(f[same] for f in want)), 2e-4)


def test_amsgrad_one_candidate_and_zero_steps_match_reference():
    att, values, lengths = batch(b=8, seed=11, scale=2.0)
    dec = make_decoder("mlp", 5, 2)
    for kw in (
        dict(amsgrad=True),
        dict(candidates=1),
        dict(steps=0),
        dict(candidates=3, tvd_penalty=0.0, init_std=0.5),
        dict(tvd_threshold=1.0, tvd_margin=0.1),
        dict(diversity_weight=1 / 6.25),  # J&W's code's weighting (--protocol jain-wallace)
        dict(diversity_weight=0.0, candidates=3),
    ):
        opts = FAST | kw
        got = adversarial_attention(att, values, dec, lengths, generator=seeded(), **opts)
        assert_same(got, adversarial_attention_reference(att, values, dec, lengths, generator=seeded(), **opts))
    with_ams = adversarial_attention(att, values, dec, lengths, generator=seeded(), amsgrad=True, **FAST)
    plain = adversarial_attention(att, values, dec, lengths, generator=seeded(), **FAST)
    assert not torch.equal(with_ams.attention, plain.attention)


@settings(max_examples=12, deadline=None)
@given(
    b=st.integers(1, 5),
    t=st.integers(0, 6),
    h=st.integers(1, 4),
    c=st.integers(1, 3),
    k=st.integers(1, 4),
    seed=st.integers(0, 10**6),
    kind=st.sampled_from(["linear", "mlp"]),
)
def test_properties_against_reference(b, t, h, c, k, seed, kind):
    att, values, lengths = batch(b, t, h, seed=seed, scale=2.0)
    dec = make_decoder(kind, h, c)
    opts = dict(candidates=k, steps=4, lr=0.2)
    got = adversarial_attention(att, values, dec, lengths, generator=seeded(seed), **opts)
    assert_same(got, adversarial_attention_reference(att, values, dec, lengths, generator=seeded(seed), **opts))
    assert got.max_jsd.shape == got.output_tvd.shape == (b,) and got.attention.shape == (b, t)


# ---- instances are independent: chunking, batching, paths ----------------------------------


@pytest.mark.parametrize("kind", ["linear", "lambda"])
def test_each_instance_alone_equals_batched(kind):
    # memory_budget=1: every instance is its own chunk, its own Adam, with no padding,
    # i.e. run alone with the same initial noise; other budgets batch them in one or more
    # chunks. Equal results need the loss to be a sum over instances (a mean would scale
    # each instance's gradient by the chunk size, which Adam's eps makes visible).
    att, values, lengths = batch(b=20, t=11, seed=13, scale=2.0)
    dec = make_decoder(kind, 5, 2)
    whole = adversarial_attention(att, values, dec, lengths, generator=seeded(), **FAST)
    for budget in (1, 20_000, 60_000):
        got = adversarial_attention(att, values, dec, lengths, generator=seeded(), memory_budget=budget, **FAST)
        assert_same(got, whole, 1e-12)


def test_decoder_calls_are_batched():
    att, values, lengths = batch(b=10, t=7, seed=17)
    lin = nn.Linear(5, 2).double()
    calls = []

    def dec(x):
        calls.append(x.shape[0])
        return lin(x)

    n = int((lengths >= 2).sum())
    adversarial_attention(att, values, dec, lengths, candidates=4, steps=6)
    # the original outputs, one call per step for all candidates of all rows, the final outputs
    assert calls == [n] + [4 * n] * 7
    calls.clear()
    adversarial_attention(att, values, dec, lengths, candidates=4, steps=6, memory_budget=1)
    assert len(calls) == 8 * n and max(calls) == 4


@pytest.mark.parametrize("classes", [1, 2, 4])
def test_linear_closed_form_equals_general_path(classes):
    att, values, lengths = batch(b=14, seed=19, scale=2.0)
    lin = make_decoder("linear", 5, classes)
    got = adversarial_attention(att, values, lin, lengths, generator=seeded(), **FAST)
    general = adversarial_attention(att, values, lambda x: lin(x), lengths, generator=seeded(), **FAST)
    assert_same(got, general)
    hooked = make_decoder("linear", 5, classes)
    hooked.register_forward_hook(lambda mod, inp, out: 3 * out)  # not a plain Linear any more
    tripled = adversarial_attention(att, values, hooked, lengths, generator=seeded(), **FAST)
    assert_same(tripled, adversarial_attention(att, values, lambda x: 3 * lin(x), lengths, generator=seeded(), **FAST))


def test_non_contiguous_and_padding_junk():
    att, values, lengths = batch(b=12, t=8, seed=23, scale=2.0)
    dec = make_decoder("linear", 5, 3)
    want = adversarial_attention(att, values, dec, lengths, generator=seeded(), **FAST)
    att_nc = att.t().contiguous().t()
    values_nc = values.transpose(1, 2).contiguous().transpose(1, 2)
    assert not att_nc.is_contiguous() and not values_nc.is_contiguous()
    for d in (dec, lambda x: dec(x)):
        assert_same(adversarial_attention(att_nc, values_nc, d, lengths, generator=seeded(), **FAST), want)
    # whatever lies on the padding (even NaN in values) is ignored
    pad = torch.arange(8) >= lengths[:, None]
    att_junk = att.masked_fill(pad, 0.3)
    values_junk = values.masked_fill(pad[..., None], math.nan)
    for d in (dec, lambda x: dec(x)):
        assert_same(adversarial_attention(att_junk, values_junk, d, lengths, generator=seeded(), **FAST), want)


# ---- what the result means -------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["linear", "mlp"])
@pytest.mark.parametrize("classes", [1, 3])
def test_constraints_hold(kind, classes):
    att, values, lengths = batch(b=24, t=10, seed=29, scale=1.5)
    lengths[:3] = torch.tensor([0, 1, 1])
    att[:3] = torch.eye(10, dtype=F64)[0]
    att[0] = 0.0
    dec = make_decoder(kind, 5, classes)
    res = adversarial_attention(att, values, dec, lengths, generator=seeded(), **FAST)
    valid = torch.arange(10) < lengths[:, None]
    real = lengths >= 2
    assert (res.output_tvd <= 0.05).all() and (res.output_tvd >= 0).all()
    assert (res.max_jsd >= 0).all() and (res.max_jsd <= LN2).all()
    assert (res.attention >= 0).all() and (res.attention[~valid] == 0).all()
    sums = res.attention.sum(1)
    torch.testing.assert_close(sums[lengths > 0], torch.ones_like(sums[lengths > 0]))
    # the reported numbers are those of the reported attention
    torch.testing.assert_close(jsd(res.attention, att), res.max_jsd, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(context_tvd(res.attention, values, dec, att), res.output_tvd, rtol=1e-10, atol=1e-14)
    # rows with L <= 1, and rows where no candidate kept the output: the original
    keep = res.max_jsd == 0
    assert keep[~real].all() and res.output_tvd[keep].eq(0).all()
    assert torch.equal(res.attention[keep], att[keep])
    assert (res.max_jsd[real] > 0.05).sum() >= 5  # the adversary does find something


@pytest.mark.parametrize("decoder", ["zero-linear", "detached", "differentiable"])
def test_context_blind_decoder_reaches_ln2(decoder):
    # The output cannot change, so only the distance matters: from a one-hot (zeros on the
    # valid prefix: the 0 log 0 case) or a peaked attention the adversary moves all the mass.
    t, h = 10, 4
    lengths = torch.tensor([10, 8, 6, 10, 3, 5])
    att = torch.zeros(6, t, dtype=F64)
    att[torch.arange(6), torch.tensor([0, 3, 5, 9, 1, 2])] = 1.0
    att[3:] = torch.where(torch.arange(t) < lengths[3:, None], 0.01, 0.0)
    att[3:, 0] = 1 - 0.01 * (lengths[3:] - 1)
    values = torch.randn(6, t, h, dtype=F64, generator=seeded(0))
    if decoder == "zero-linear":
        dec = nn.Linear(h, 2).double()
        with torch.no_grad():
            dec.weight.zero_()
    elif decoder == "detached":

        def dec(x):
            return torch.tensor([[0.3, -0.2]], dtype=F64).expand(x.shape[0], 2)
    else:

        def dec(x):
            return 0 * x[:, :1] + torch.tensor([[0.5]], dtype=F64)

    res = adversarial_attention(att, values, dec, lengths, generator=seeded())
    assert (res.output_tvd == 0).all()
    assert (res.max_jsd > 0.95 * LN2).all(), res.max_jsd
    assert res.attention.isfinite().all()
    # the peaked rows: their mass moved off the peak
    assert (res.attention[:, 0][3:] < 0.05).all()


def test_adversary_respects_a_sensitive_decoder():
    # the same peaked attention but values that decide the class: the output constraint now
    # binds, so the adversary reaches less than with a context-blind decoder
    t, h = 8, 2
    att = torch.full((4, t), 0.02, dtype=F64)
    att[:, 0] = 1 - 0.02 * (t - 1)
    values = torch.zeros(4, t, h, dtype=F64)
    values[:, 0, 0] = 20.0  # the peak token alone carries the evidence for class 0
    dec = nn.Linear(h, 2, bias=False).double()
    with torch.no_grad():
        dec.weight.copy_(torch.eye(2))
    res = adversarial_attention(att, values, dec, generator=seeded(), steps=200, lr=0.05)
    blind = adversarial_attention(att, values, lambda x: 0 * x, generator=seeded(), steps=200, lr=0.05)
    assert (res.output_tvd <= 0.05).all()
    assert (res.max_jsd < blind.max_jsd - 0.1).all()


def test_reproducible_from_the_generator():
    att, values, lengths = batch(b=8, seed=31, scale=2.0)
    dec = make_decoder("linear", 5, 2)
    one = adversarial_attention(att, values, dec, lengths, generator=seeded(5), **FAST)
    two = adversarial_attention(att, values, dec, lengths, generator=seeded(5), **FAST)
    for a, b in zip(one, two):
        assert torch.equal(a, b)
    other = adversarial_attention(att, values, dec, lengths, generator=seeded(6), **FAST)
    assert not torch.equal(one.attention, other.attention)
    torch.manual_seed(5)
    glob = adversarial_attention(att, values, dec, lengths, **FAST)  # the global generator
    assert torch.equal(glob.attention, one.attention)


def test_model_stays_frozen_and_grad_mode_is_irrelevant():
    att, values, lengths = batch(b=6, seed=37, scale=2.0)
    dec = make_decoder("mlp", 5, 2)
    before = [p.detach().clone() for p in dec.parameters()]
    want = adversarial_attention(att, values, dec, lengths, generator=seeded(), **FAST)
    assert all(p.grad is None for p in dec.parameters())
    assert all(torch.equal(p, q) for p, q in zip(dec.parameters(), before))
    with torch.no_grad():
        assert_same(adversarial_attention(att, values, dec, lengths, generator=seeded(), **FAST), want)
    leaf_values = values.clone().requires_grad_(True)
    got = adversarial_attention(att, leaf_values, dec, lengths, generator=seeded(), **FAST)
    assert_same(got, want)
    assert leaf_values.grad is None and not got.attention.requires_grad


# ---- errors -------------------------------------------------------------------------------


def test_clear_errors():
    att, values, lengths = batch(b=4, t=5, h=3, seed=41, min_len=2)
    dec = nn.Linear(3, 2).double()

    def call(**kw):
        a = dict(attention=att, values=values, decoder=dec, lengths=lengths, steps=1) | kw
        return adversarial_attention(a.pop("attention"), a.pop("values"), a.pop("decoder"), a.pop("lengths"), **a)

    unnormalised = att * 1.5
    cases = [
        (dict(attention=unnormalised), "attention rows must sum to 1"),
        (dict(attention=att[0]), r"attention must have shape \[B, T\]"),
        (dict(values=values[:, :4]), r"values must have shape \[B, T, H\]"),
        (dict(values=values.float()), "values dtype"),
        (dict(lengths=torch.tensor([1, 2, 3, 6])), "lengths must lie in"),
        (dict(lengths=lengths[:2]), "lengths must have shape"),
        (dict(decoder=nn.Linear(4, 2).double()), "in_features 4.*H = 3"),
        (dict(decoder=lambda x: x.sum(1)), r"logits \[N, C\]"),
        (dict(decoder=lambda x: x[:, :2] / 0), "NaN or infinite logits"),
        (dict(candidates=0), "candidates must be an int >= 1, got 0"),
        (dict(candidates=2.0), "candidates must be an int >= 1, got 2.0"),
        (dict(steps=-1), "steps must be an int >= 0, got -1"),
        (dict(steps=True), "steps must be an int >= 0, got True"),
        (dict(lr=0.0), r"lr must be a finite number > 0, got 0.0"),
        (dict(lr=math.nan), "lr must be a finite number > 0, got nan"),
        (dict(tvd_penalty=-1), "tvd_penalty must be a finite number >= 0, got -1"),
        (dict(tvd_margin="0.1"), "tvd_margin must be a finite number >= 0, got '0.1'"),
        (dict(tvd_threshold=math.inf), "tvd_threshold must be a finite number >= 0, got inf"),
        (dict(init_std=-3.0), "init_std must be a finite number >= 0, got -3.0"),
        (dict(amsgrad=1), "amsgrad must be a bool, got 1"),
        (dict(memory_budget=0), "memory_budget must be a positive int"),
    ]
    for kw, pattern in cases:
        with pytest.raises(ValueError, match=pattern):
            call(**kw)
    with pytest.raises(TypeError, match="decoder must be callable"):
        call(decoder=3)
    # the optimiser's steps skip the check that reads the device: a decoder finite on the
    # original contexts but NaN inside the search is still caught, on the candidates' outputs
    calls = []

    def nan_inside(x):
        calls.append(len(x))
        return x[:, :2] * (math.nan if len(calls) > 1 else 1.0)

    with pytest.raises(ValueError, match="NaN or infinite logits"):
        call(decoder=nan_inside)
    assert len(calls) > 2  # it did run the steps


def test_diversity_weight_changes_the_search_and_is_validated():
    att, values, lengths = batch(b=8, seed=11, scale=2.0)
    dec = make_decoder("mlp", 5, 2)
    runs = [
        adversarial_attention(att, values, dec, lengths, generator=seeded(), diversity_weight=w, **FAST).attention
        for w in (1.0, 0.16)
    ]
    assert (runs[0] - runs[1]).abs().max() > 1e-6
    with pytest.raises(ValueError, match="diversity_weight must be a finite number >= 0"):
        adversarial_attention(att, values, dec, lengths, diversity_weight=-1.0)


@pytest.mark.parametrize("heads", [1, 3])
@pytest.mark.parametrize("classes", [1, 3])
@pytest.mark.parametrize("decoder", ["linear", "mlp"])
@pytest.mark.parametrize("k, diversity", [(1, 1.0), (2, 0.0), (5, 1.0), (4, 0.16)])
def test_closed_form_gradient_equals_autograd_of_the_objective(heads, classes, decoder, k, diversity):
    # the objective written from the definition (docs/definitions.md §10) with the references'
    # JSD and TVD, per row, differentiated by autograd; margin 0.01 so some hinges are active
    from attnmetrics.adversarial import PADDING_LOGIT, _gradient, _outputs
    from attnmetrics.testing.reference import jsd_reference, tvd_reference

    g = seeded(3)
    n, width, hidden = 6, 7, 4
    lengths = torch.tensor([7, 2, 5, 3, 7, 4])
    valid = (torch.arange(width) < lengths[:, None])[:, None, None]  # [n, 1, 1, W]
    alpha = torch.randn(n, 1, heads, width, generator=g, dtype=F64).masked_fill(~valid, -math.inf).softmax(-1)
    values = torch.randn(n, heads, width, hidden, generator=g, dtype=F64).masked_fill(~valid[:, 0, :, :, None], 0)
    torch.manual_seed(0)
    if decoder == "linear":
        linear = nn.Linear(hidden, classes).double()
        feats, bias, dec = values @ linear.weight.T, linear.bias.detach(), None
        decode = lambda ctx: linear(ctx)
    else:
        dec = nn.Sequential(nn.Linear(hidden, 5), nn.Tanh(), nn.Linear(5, classes)).double()
        feats, bias, decode = values, None, dec
    z = torch.randn(n, k, heads, width, generator=g, dtype=F64).masked_fill(~valid, PADDING_LOGIT)
    y0 = _outputs(alpha, feats, dec, bias, [])
    got = _gradient(z, alpha, y0, feats, dec, bias, [], 500.0, 0.01, diversity)

    want = torch.zeros_like(z)
    for b in range(n):
        L = int(lengths[b])
        zb = z[b, :, :, :L].clone().requires_grad_(True)
        a = zb.softmax(-1)  # [K, heads, L]
        y = output_distribution(decode(torch.einsum("khl,hlf->kf", a, values[b, :, :L])))
        far = jsd_reference(a, alpha[b, :, :, :L]).mean(-1)
        loss = -far.mean() + 500.0 * torch.relu(tvd_reference(y, y0[b]) - 0.01).mean()
        if k > 1:
            pairs = jsd_reference(a[:, None], a[None]).mean(-1)  # ordered pairs: twice the i < j ones
            loss = loss - diversity * pairs.sum() / (k * (k - 1))
        (want[b, :, :, :L],) = torch.autograd.grad(loss, [zb])
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)
    assert (got[~valid.expand_as(got)] == 0).all()
