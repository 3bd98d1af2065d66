"""scripts/jw_published.py reads J&W's adversary histograms out of their SVGs: checked against
histograms drawn here the way their code draws them (common_code/plotting.py,
``plot_histogram_by_class``: 40 bins over [0, 0.7], each class's bars weighted to sum to 1) from
values whose shares numpy counts directly."""

from __future__ import annotations

import importlib.util
import io
from pathlib import Path

import numpy as np
import pytest

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")
from matplotlib.figure import Figure  # noqa: E402

_spec = importlib.util.spec_from_file_location(
    "jw_published", Path(__file__).resolve().parents[1] / "scripts" / "jw_published.py"
)
jw = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(jw)


def _svg(values: np.ndarray, predicted: np.ndarray) -> str:
    fig = Figure()
    ax = fig.subplots()
    for y in np.sort(np.unique(predicted)):
        v = values[predicted == y]
        ax.hist(v, bins=40, range=(0, 0.7), alpha=0.6, linewidth=0.5, edgecolor="k", weights=np.ones(len(v)) / len(v))
    out = io.StringIO()
    fig.savefig(out, format="svg")
    return out.getvalue()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_shares_match_the_values_drawn(seed):
    rng = np.random.default_rng(seed)
    n = rng.integers(200, 600)
    predicted = rng.integers(0, 2, n)
    values = np.clip(rng.beta(4 + 2 * predicted, 3, n) * np.log(2), 0, np.log(2))
    shares = jw.histogram_shares(_svg(values, predicted))
    assert set(shares) == {"0", "1"}
    edges = jw.HIST_EDGES
    for y in (0, 1):
        v = values[predicted == y]
        for t in jw.THRESHOLDS:
            i = np.searchsorted(edges, t, side="right") - 1  # the bin holding t
            without, with_ = shares[str(y)][f">={t}"]
            assert without == pytest.approx((v >= edges[i + 1]).mean(), abs=2e-4)
            assert with_ == pytest.approx((v >= edges[i]).mean(), abs=2e-4)
            assert without <= (v >= t).mean() <= with_  # the true share lies in the range
        assert shares[str(y)][">=0.665"] == pytest.approx((v >= 0.665).mean(), abs=2e-4)


def test_a_figure_without_two_classes_is_refused():
    values = np.linspace(0, 0.69, 50)
    with pytest.raises(ValueError, match="40 bars of each of 2 colours"):
        jw.histogram_shares(_svg(values, np.zeros(50, dtype=int)))
