"""report.html: every token escaped, and the page rendered by a real browser (headless Chromium,
skipped where it is not installed) shows the first example's tokens."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
from PIL import Image

from attnmetrics.app.token_view import COLOURS, render_token_view

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def results(tokens: list[str]) -> dict:
    n = len(tokens)
    scores = {
        "attention": [1.0 if t == 0 else 0.1 for t in range(n)],  # the first token: full shade
        "gradient": [0.5] * n,
        "loo": [float(t) for t in range(n)],
    }
    example = {
        "instance": 3,
        "why": "a random instance",
        "tokens": tokens,
        "label": "positive",
        "predicted": "negative",
        "probability": 0.71,
        "scores": scores,
        "flip_removed": 1,
        "removed_first": [0],
        "stats": {"tau attention vs gradient": 0.25},
    }
    return {"config": {"dataset": "sst"}, "model": {"encoder": "lstm", "attention": "tanh"}, "examples": [example]}


def test_tokens_are_escaped(tmp_path):
    path = render_token_view(results(["fine", "<script>alert(1)</script>", '"&']), tmp_path)
    html = path.read_text()
    assert "<script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "&#34;&amp;" in html
    assert "Instance 3" in html and "predicted <b>negative</b>" in html


def test_no_examples_no_page(tmp_path):
    assert render_token_view({"examples": []}, tmp_path) is None
    assert not (tmp_path / "report.html").exists()


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium not installed (.ci/run installs Debian's chromium)")
def test_chromium_renders_the_first_examples_tokens(tmp_path):
    tokens = ["masterfully", "acted", "film", "zyzzyva"]
    page = render_token_view(results(tokens), tmp_path).as_uri()
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--user-data-dir={tmp_path / 'p'}"]
    shot = tmp_path / "shot.png"
    subprocess.run(
        [CHROMIUM, *flags, f"--screenshot={shot}", "--window-size=900,500", page],
        check=True,
        capture_output=True,
        timeout=120,
    )
    pixels = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    assert pixels.std() > 10  # not blank
    # the first token's attention cell is shaded at full opacity in the attention colour
    distance = np.abs(pixels - np.array(COLOURS["attention"])).sum(-1)
    assert (distance <= 6).sum() > 200
    dom = subprocess.run(
        [CHROMIUM, *flags, "--dump-dom", page], check=True, capture_output=True, text=True, timeout=120
    ).stdout
    for token in tokens:  # laid out by the browser as text
        assert f">{token}</span>" in dom
