"""The Python examples of docs/usage.md, run as written on a run folder of a tiny fine-tuned BERT."""

from __future__ import annotations

import re

import pytest
import torch

pytest.importorskip("transformers")

from attnmetrics.app.cli import main  # noqa: E402
from tests.app.test_hf_run import FLAGS, tiny_bert  # noqa: E402
from tests.inputs import ROOT  # noqa: E402


def _python_blocks(doc: str, heading: str) -> list[str]:
    """The ```python blocks of ``doc``'s section ``heading`` (up to the next heading)."""
    text = (ROOT / doc).read_text()
    section = text.split(heading, 1)[1]
    section = re.split(r"\n#{2,3} ", section, maxsplit=1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def test_the_attributions_from_python_example_runs_on_a_run_folder(tmp_path):
    (code,) = _python_blocks("docs/usage.md", "### The attributions from Python")
    checkpoint = tiny_bert(tmp_path / "tiny-bert")
    run = tmp_path / "run"
    assert main(["train", *FLAGS, "--model", f"hf:{checkpoint}", "--epochs", "1", "--out", str(run)]) == 0
    assert 'run = "runs/sst-minilm"' in code
    scope: dict = {}
    exec(code.replace('run = "runs/sst-minilm"', f"run = {str(run)!r}"), scope)  # noqa: S102
    shares, lengths, model, tokens = scope["shares"], scope["lengths"], scope["model"], scope["tokens"]
    assert set(shares) == {"alti", "globenc", "value_zeroing", "decompx"}
    real = torch.arange(tokens.shape[1] - model.lead) < (lengths - model.lead - model.trail)[:, None]
    for name, s in shares.items():
        assert s.shape == real.shape and s.dtype == torch.float32, name
        assert torch.isfinite(s).all() and (s[~real] == 0).all() and (s[real] != 0).any(), name
    assert len(scope["words"]) == int(lengths[0]) - model.lead - model.trail
