"""The published evaluation protocols that attnmetrics.eraser reproduces (issue 47), each against a
plain loop written from the authors' code:

- ALTI (Ferrando et al. 2022; mt-upc/transformer-contributions@4f890398, ``aupc.py`` with ``--bins``
  and ``evaluation.ipynb`` cell 11): bins 0, 1, 5, 10, 20, 50 % (k = ceil(f L)), a running minimum
  (comprehensiveness) or maximum (sufficiency) of the probability, the drops summed and divided by 6.
- DecompX Table 1 (Modarressi et al. 2023; mohsenfayyaz/DecompX@b6bddf0b,
  ``experiments/notebooks/v3/analysis_v3.ipynb``): the top ``int(np.floor(len(rank) * ratio))``
  tokens replaced by [MASK], ratios 0.1 .. 0.9, the drop averaged over instances then ratios.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attnmetrics.eraser import (
    AOPCS,
    DECOMPX_FRACTIONS,
    ERASER_FRACTIONS,
    NAMED_FRACTIONS,
    alti_aopc,
    comprehensiveness,
    rationale_sizes,
    sufficiency,
)
from attnmetrics.outputs import decision
from tests.test_eraser import check, model_probabilities, reference
from tests.test_loo import MASK, ragged, real_model

F64 = torch.float64
ALTI_BINS = [0.01, 0.05, 0.1, 0.2, 0.5]  # aupc.py: "following DeYoung et al., 2019"


def alti_loop(model, tokens, lengths, scores, fidelity_type, mask_token=None):
    """ALTI's aupc.py (``--bins``) and evaluation.ipynb's AOPC, row by row: the tokens ordered by
    score (Python's stable sort, so ties to the lower index), bin 0 then ceil(n * bin) for each bin,
    comprehensiveness keeping ``order[j:]``, sufficiency ``order[:j]`` (between the special tokens;
    ``mask_token``: the others masked instead of deleted), the probability of the full row's class
    recorded as a running minimum (``<= min_prob``, from 1) or maximum (``> max_prob``, from 0); the
    AOPC ``sum over bins 1.. of (p(x) - curve[bin]) / 6``."""
    lead, trail = model.lead, model.trail
    out = []
    for b in range(tokens.shape[0]):
        row = tokens[b, : int(lengths[b])].tolist()
        real = row[lead : len(row) - trail]
        n = len(real)
        if n == 0:
            out.append(math.nan)
            continue
        with torch.no_grad():
            full = model_probabilities(model, row)
        y = int(decision(full[None].log())[0])
        order = sorted(range(n), key=lambda t: float(scores[b, t]), reverse=True)  # stable
        min_prob, max_prob, curve = 1.0, 0.0, []
        for j in [0] + [math.ceil(n * f) for f in ALTI_BINS]:
            kept = set(order[j:] if fidelity_type == "comp" else order[:j])
            if mask_token is None:
                middle = [real[t] for t in range(n) if t in kept]
            else:
                middle = [real[t] if t in kept else mask_token for t in range(n)]
            with torch.no_grad():
                p = float(model_probabilities(model, row[:lead] + middle + row[len(row) - trail :])[y])
            if fidelity_type == "comp":
                if p <= min_prob:
                    min_prob = p
                curve.append(min_prob)
            else:
                if p > max_prob:
                    max_prob = p
                curve.append(max_prob)
        original = float(full[y])  # the comprehensiveness file's bin 0: the full row
        out.append(sum(original - curve[j] for j in range(1, len(curve))) / 6)
    return out


@pytest.mark.parametrize("mode", ["delete", "mask"])
@pytest.mark.parametrize("metric", ["comprehensiveness", "sufficiency"])
@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_alti_aopc_against_their_loop(metric, mode, dtype):
    model = real_model(3, dtype).eval()
    tokens, lengths = ragged(rows=12, width=30, seed=11)
    lengths[2] = 2  # no real token: NaN
    lengths[3] = 4  # two real tokens
    scores = torch.randn(12, 28, generator=torch.Generator().manual_seed(3), dtype=dtype)
    scores[4] = scores[4].round()  # ties: the lower index first, as their stable sort
    fn = comprehensiveness if metric == "comprehensiveness" else sufficiency
    mask = MASK if mode == "mask" else None
    got = fn(model, tokens, lengths, scores, aopc="alti", mode=mode, mask_token=mask)
    want = alti_loop(model, tokens, lengths, scores, "comp" if metric == "comprehensiveness" else "suff", mask)
    atol = 1e-5 if dtype == torch.float32 else 1e-10
    for b, w in enumerate(want):
        if math.isnan(w):
            assert got.aopc[b].isnan(), b
        else:
            assert float(got.aopc[b]) == pytest.approx(w, abs=atol), b
    # the per-fraction values stay the plain drops (ERASER's), and the default AOPC their mean
    plain = fn(model, tokens, lengths, scores, mode=mode, mask_token=mask)
    torch.testing.assert_close(got.values, plain.values, equal_nan=True, rtol=0, atol=0)
    assert not torch.allclose(got.aopc[lengths > 2], plain.aopc[lengths > 2])


def test_alti_aopc_on_hand_computed_probabilities():
    # comprehensiveness: p(x) = 0.9, the bins' p = 0.95, 0.7, 0.8, 0.5, 0.2: running min from p(x)
    # 0.9, 0.7, 0.7, 0.5, 0.2 -> drops 0, 0.2, 0.2, 0.4, 0.7 -> 1.5 / 6
    p = torch.tensor([[0.95, 0.7, 0.8, 0.5, 0.2]], dtype=F64)
    assert float(alti_aopc(0.9 - p, None, False)[0]) == pytest.approx(1.5 / 6, abs=1e-15)
    # sufficiency: p(x) = 0.9, p(empty) = 0.3, the bins' p = 0.2, 0.5, 0.4, 0.85, 0.8: running max from
    # p(empty) 0.3, 0.5, 0.5, 0.85, 0.85 -> drops 0.6, 0.4, 0.4, 0.05, 0.05 -> 1.5 / 6
    p = torch.tensor([[0.2, 0.5, 0.4, 0.85, 0.8]], dtype=F64)
    empty = torch.tensor([0.9 - 0.3], dtype=F64)
    assert float(alti_aopc(0.9 - p, empty, True)[0]) == pytest.approx(1.5 / 6, abs=1e-15)
    # a fraction that does not count (NaN) holds the running extreme; every one NaN: NaN
    v = torch.tensor([[math.nan, 0.3, math.nan], [math.nan] * 3], dtype=F64)
    out = alti_aopc(v, None, False)
    assert float(out[0]) == pytest.approx(0.6 / 4) and out[1].isnan()
    out = alti_aopc(v, torch.tensor([0.5, math.nan], dtype=F64), True)
    assert float(out[0]) == pytest.approx((0.5 + 0.3 + 0.3) / 4) and out[1].isnan()
    with pytest.raises(ValueError, match="empty rationale"):
        alti_aopc(v, None, True)


def decompx_loop(model, tokens, lengths, scores, mask_token, strategy="max"):
    """DecompX's CheckpointToLogit.mask (top_k_masking) and compute_aopc, row by row: ``rank`` the
    argsort of the real tokens' scores (here without ties), ``mask_count = int(np.floor(len(rank) *
    ratio))`` for ratio in MASKING_RATIOS, ``rank[-mask_count:]`` (strategy "max", Table 1) replaced by
    [MASK] (none when mask_count is 0), the drop of the unmasked row's class. Returns [B][9] drops."""
    lead, trail = model.lead, model.trail
    ratios = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]  # their MASKING_RATIOS, literally
    out = []
    for b in range(tokens.shape[0]):
        row = tokens[b, : int(lengths[b])].tolist()
        n = len(row) - lead - trail
        rank = np.asarray(scores[b, :n].tolist()).argsort()
        probs = []
        for ratio in ratios:
            mask_count = int(np.floor(len(rank) * ratio))
            masks = [] if mask_count == 0 else (rank[-mask_count:] if strategy == "max" else rank[:mask_count])
            masked = set(int(t) + lead for t in masks)
            ids = [mask_token if j in masked else row[j] for j in range(len(row))]
            with torch.no_grad():
                probs.append(model_probabilities(model, ids))
        y = int(probs[0].argmax())  # p_hat_idx: the unmasked (ratio 0.0) row's argmax
        out.append([float(probs[0][y] - p[y]) for p in probs[1:]])  # plot_y[1:]: the 0.0 ratio left out
    return out


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_decompx_table1_against_their_loop(dtype):
    model = real_model(3, dtype).eval()
    tokens, lengths = ragged(rows=8, width=95, seed=2)
    lengths[0] = 92  # 90 real tokens: 90 * 0.7 = 62.99999999999999, which their np.floor makes 62
    lengths[2] = 5  # 3 real tokens: k = 0 up to 30 %
    lengths[3] = 3  # 1 real token: k = 0 everywhere (counts as a drop of 0)
    scores = torch.randn(8, 93, generator=torch.Generator().manual_seed(5), dtype=F64).to(dtype)
    got = comprehensiveness(
        model, tokens, lengths, scores, DECOMPX_FRACTIONS, rounding="decompx", mode="mask", mask_token=MASK
    )
    want = decompx_loop(model, tokens, lengths, scores, MASK)
    atol = 1e-5 if dtype == torch.float32 else 1e-10
    check(got, want, atol)  # every fraction counts; the AOPC is their mean
    assert int(got.k[0, 6]) == 62 and got.k[3].tolist() == [0] * 9 and (got.values[3] == 0).all()
    # their table's number: the mean over instances per ratio, then over the ratios
    table = np.mean(np.mean(np.asarray(want), axis=0))
    assert float(got.aopc.to(F64).mean()) == pytest.approx(table, abs=atol)


def test_decompx_sizes_are_their_floor_of_the_float_product():
    real = torch.arange(0, 130)
    k = rationale_sizes(torch.zeros(130, 130), real, DECOMPX_FRACTIONS, rounding="decompx")
    for n in range(130):
        want = [int(np.floor(n * r)) if n else -1 for r in DECOMPX_FRACTIONS]
        assert k[n].tolist() == want, n
    assert int(k[90, 6]) == 62  # not 63: the library's own floor rounds f L to 9 decimals first
    assert int(rationale_sizes(torch.zeros(1, 90), torch.tensor([90]), [0.7], rounding="floor")[0, 0]) == 63
    assert NAMED_FRACTIONS == {"eraser": ERASER_FRACTIONS, "decompx": DECOMPX_FRACTIONS}


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_decompx_sufficiency_against_their_least_important_masking_loop(dtype):
    """Their Tables A.1-A.2 (``MASKING_STRATEGY = "min"``): the least important floor(L K) masked;
    ours keeps the top L - floor(L (1 - f)), so fraction f is their ratio K = 1 - f."""
    model = real_model(3, dtype).eval()
    tokens, lengths = ragged(rows=8, width=95, seed=4)
    lengths[0] = 92  # 90 real tokens: 90 * 0.7 = 62.99999999999999 (their K = 0.7 is our f = 0.3)
    lengths[2] = 5  # 3 real tokens: nothing masked up to K = 30 % (a drop of 0)
    lengths[3] = 3  # 1 real token: nothing ever masked
    scores = torch.randn(8, 93, generator=torch.Generator().manual_seed(6), dtype=F64).to(dtype)
    got = sufficiency(
        model, tokens, lengths, scores, DECOMPX_FRACTIONS, rounding="decompx", mode="mask", mask_token=MASK
    )
    want = decompx_loop(model, tokens, lengths, scores, MASK, strategy="min")  # by their K = 0.1 .. 0.9
    atol = 1e-5 if dtype == torch.float32 else 1e-10
    check(got, [row[::-1] for row in want], atol)  # our f = 0.1 .. 0.9 is their K = 0.9 .. 0.1
    assert int(got.k[0, 2]) == 90 - 62 and got.k[3].tolist() == [1] * 9 and (got.values[3] == 0).all()
    assert got.k[2].tolist() == [1, 1, 1, 2, 2, 2, 3, 3, 3] and (got.values[2, 6:] == 0).all()
    table = np.mean(np.mean(np.asarray(want), axis=0))  # their number: over instances, then ratios
    assert float(got.aopc.to(F64).mean()) == pytest.approx(table, abs=atol)


def test_decompx_sufficiency_sizes_mask_their_floor_of_the_float_product():
    real = torch.arange(0, 130)
    k = rationale_sizes(torch.zeros(130, 130), real, DECOMPX_FRACTIONS, rounding="decompx", keep_rationale=True)
    for n in range(130):
        want = [n - int(np.floor(n * r)) if n else -1 for r in (0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1)]
        assert k[n].tolist() == want, n


def test_defaults_are_unchanged():
    """aopc="eraser" is the default and is today's AOPC, bit for bit (the mean of the counted
    fractions); the values follow ERASER's plain loop as before."""
    model = real_model(2, torch.float32).eval()
    tokens, lengths = ragged(rows=10, width=14, seed=4)
    scores = torch.randn(10, 12, generator=torch.Generator().manual_seed(2))
    for fn, keep in ((comprehensiveness, False), (sufficiency, True)):
        for rounding in ("ceil", "floor"):
            a = fn(model, tokens, lengths, scores, rounding=rounding)
            b = fn(model, tokens, lengths, scores, rounding=rounding, aopc="eraser")
            for x, y in zip(a, b):
                assert torch.equal(x.nan_to_num(-7), y.nan_to_num(-7))
            assert torch.equal(a.aopc.nan_to_num(-7), a.values.nanmean(1).nan_to_num(-7))
            want = reference(model, tokens, lengths, scores, ERASER_FRACTIONS, keep, rounding=rounding)
            check(a, want, 1e-5)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"aopc": "mean"}, r"aopc must be one of \('eraser', 'alti'\), got 'mean'"),
        ({"aopc": None}, "aopc must be one of"),
        ({"aopc": "alti", "variant": "ferret"}, "aopc='alti' applies to variant='eraser' only"),
        ({"rounding": "decompx", "variant": "ferret"}, "rounding applies to variant='eraser' only"),
        ({"rounding": "round"}, r"rounding must be one of \('ceil', 'floor', 'decompx'\), got 'round'"),
    ],
)
def test_bad_arguments_are_named(kwargs, match):
    model = real_model(2).eval()
    tokens, lengths = ragged(rows=3, width=8)
    scores = torch.randn(3, 6)
    for fn in (comprehensiveness, sufficiency):
        with pytest.raises(ValueError, match=match):
            fn(model, tokens, lengths, scores, **kwargs)
    assert AOPCS == ("eraser", "alti")


def test_the_empty_rationale_deleted_without_special_tokens_is_named():
    pytest.importorskip("transformers", reason="transformers is optional")
    from tests.models import test_hf

    model = test_hf.tiny("gpt2")
    tokens, lengths = test_hf.ragged("gpt2", 4, 11, 4)
    scores = torch.randn(4, 11, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="empty rationale .* without special tokens"):
        sufficiency(model, tokens, lengths, scores, aopc="alti")
    assert sufficiency(model, tokens, lengths, scores, mode="mask", mask_token=3, aopc="alti").aopc.isfinite().all()
    # DecompX's sufficiency keeps at least one token: deleting the rest leaves something to encode
    assert sufficiency(model, tokens, lengths, scores, rounding="decompx").aopc.isfinite().all()


# ---- the battery's flags ------------------------------------------------------------------


def test_battery_flags_reach_the_config_and_the_conventions():
    from attnmetrics.app.battery.eraser import _conventions
    from attnmetrics.app.battery.runner import BatteryConfig
    from attnmetrics.app.config import RunConfig
    from attnmetrics.app.faithfulness import importance_options, importance_settings
    from attnmetrics.app.parser import build_parser

    argv = ["run", "--dataset", "sst", "--eraser-aopc", "alti", "--eraser-fractions", "decompx"]
    argv += ["--eraser-rounding", "decompx", "--eraser-mask-token", "103", "--attribution-aggregation", "l2"]
    config = RunConfig.from_namespace(build_parser().parse_args(argv))
    assert (config.eraser_aopc, config.eraser_fractions, config.eraser_mask_token) == ("alti", "decompx", 103)
    assert config.attribution_aggregation == "l2" and "attribution_aggregation" not in config.importance_options
    assert importance_settings(config).options["attribution_aggregation"] == "l2"
    assert config.to_dict()["attribution_aggregation"] == "l2" and config.to_dict()["eraser_aopc"] == "alti"
    battery = BatteryConfig(
        eraser_rounding="decompx",
        eraser_aopc="alti",
        eraser_fractions="decompx",
        eraser_mask_token=103,
        options=importance_options(config),
    )
    assert battery.settings.options["attribution_aggregation"] == "l2"
    text = _conventions(battery)
    assert "replaced by token id 103" in text["eraser"] and "0.1, 0.2, 0.3" in text["eraser"]
    assert "ALTI" in text["eraser"] and "int(np.floor(len(rank)" in text["eraser"]
    assert "L2 norm" in text["attribution_aggregation"]
    # the defaults: the conventions as before these options (no aggregation entry)
    default = RunConfig.from_namespace(build_parser().parse_args(["run", "--dataset", "sst"]))
    assert default.attribution_aggregation == "sum" and default.eraser_mask_token is None
    assert importance_options(default) == dict(default.importance_options)  # the default adds nothing
    assert _conventions(BatteryConfig()) == {
        "eraser": "DeYoung et al. 2020: comprehensiveness p(y|x) - p(y|x without the top k), sufficiency p(y|x) - "
        "p(y|the top k alone), top k real tokens by score (ties to the lower index), deleted; AOPC = mean over "
        "f in 0.01, 0.05, 0.1, 0.2, 0.5; k = ceil(f L) (this library's definition: every fraction removes at "
        "least one token; ERASER's encode_attend.py removes ceil(f L) for comprehensiveness but keeps floor(f L) "
        "for sufficiency)"
    }
    for field, value, match in (
        ("eraser_aopc", "mean", "eraser_aopc must be one of"),
        ("eraser_fractions", "ferret", "eraser_fractions must be one of"),
    ):
        with pytest.raises(ValueError, match=match):
            BatteryConfig(**{field: value})
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--dataset", "sst", "--attribution-aggregation", "l1"])


def test_the_battery_step_uses_the_flags(monkeypatch):
    """The ERASER step calls the metrics with the run's fractions, AOPC, rounding and mask token."""
    import attnmetrics.app.battery.eraser as battery_eraser
    from attnmetrics.app.battery.runner import BatteryConfig

    calls = []

    def spy(model, tokens, lengths, orderings, fractions, **kwargs):
        calls.append((tuple(orderings), tuple(fractions), kwargs))
        n = tokens.shape[0]
        r = type("R", (), {"aopc": torch.zeros(n), "values": torch.zeros(n, len(fractions))})()
        return {name: {"comprehensiveness": r, "sufficiency": r} for name in orderings}

    monkeypatch.setattr(battery_eraser, "comprehensiveness_and_sufficiency", spy)
    config = BatteryConfig(
        eraser_aopc="alti", eraser_fractions="decompx", eraser_rounding="decompx", eraser_mask_token=7
    )
    kept = {}

    class Block:
        out = type("O", (), {"attention": torch.ones(2, 5)})()
        keyed = {"eraser": type("K", (), {"uniform": staticmethod(lambda n, shape: torch.rand(n, *shape))})()}
        scores: dict = {}
        model, tokens, lengths = None, torch.zeros(2, 7, dtype=torch.long), torch.tensor([7, 7])

        def keep(self, key, value):
            kept[key] = value

        def lap(self, name):
            pass

    Block.config = config
    battery_eraser.step(Block())
    assert len(calls) == 1 and calls[0][0] == ("attention", "random") and "eraser/random/sufficiency/aopc" in kept
    for _, fractions, kwargs in calls:
        assert fractions == DECOMPX_FRACTIONS
        assert kwargs["aopc"] == "alti" and kwargs["rounding"] == "decompx"
        assert kwargs["mode"] == "mask" and kwargs["mask_token"] == 7
