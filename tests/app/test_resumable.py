"""``--resumable``: a battery cut off after some blocks continues from them when started again, to the
values of a run never cut off, in one process or under torchrun; a folder of another run is refused."""

from __future__ import annotations

import json

import pytest
import torch

from attnmetrics.app import faithfulness
from attnmetrics.app.cli import main
from attnmetrics.app.resumable import BatteryBlocks, blocks_folder, fingerprints
from tests.app.test_distributed import EVALUATE, same, torchrun
from tests.inputs import QUICK_SST

#: 100 test instances: blocks of 32, 32, 32 and 4 on the CPU
RESUMABLE = ["--limit", "100", *EVALUATE[2:], "--resumable"]
#: what a resumed run records beside an uninterrupted one
RESUME_ONLY = {"resumable"}


class CutOff(Exception):
    """The machine's time ran out."""


@pytest.fixture(scope="module")
def model_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "model"
    assert main(["train", *QUICK_SST, "--out", str(out)]) == 0
    return out


def cut_after(monkeypatch, blocks: int) -> list[int]:
    """Make the battery stop (raise :class:`CutOff`) once ``blocks`` blocks are kept; the firsts saved."""
    saved: list[int] = []
    keep = BatteryBlocks.save

    def save(self, first, values, seconds):
        keep(self, first, values, seconds)
        saved.append(first)
        if len(saved) == blocks:
            raise CutOff

    monkeypatch.setattr(BatteryBlocks, "save", save)
    return saved


def count_blocks(monkeypatch) -> list[int]:
    """The firsts of the blocks the battery runs (not those it reads back)."""
    ran: list[int] = []
    collect = faithfulness.collect

    def counted(model, batches, **kw):
        batches = list(batches)
        ran.extend(first for first, _, _ in batches)
        return collect(model, batches, **kw)

    monkeypatch.setattr(faithfulness, "collect", counted)
    return ran


def results(folder):
    return json.loads((folder / "results.json").read_text())


def test_a_cut_off_battery_continues_from_its_blocks_to_the_uninterrupted_values(model_run, tmp_path, monkeypatch):
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    assert main(["evaluate", str(model_run), "--out", str(whole), *RESUMABLE]) == 0
    assert not blocks_folder(whole).exists()  # removed once the run folder is written
    a = results(whole)
    assert a["resumable"]["blocks"] == 4 and a["resumable"]["resumed_blocks"] == 0

    saved = cut_after(monkeypatch, 2)
    with pytest.raises(CutOff):
        main(["evaluate", str(model_run), "--out", str(cut), *RESUMABLE])
    assert not cut.exists()  # no run folder
    kept = blocks_folder(cut)
    assert sorted(p.name for p in kept.glob("block-*.npz")) == [f"block-{f:09d}.npz" for f in sorted(saved)]
    monkeypatch.undo()

    ran = count_blocks(monkeypatch)
    assert main(["evaluate", str(model_run), "--out", str(cut), *RESUMABLE]) == 0
    b = results(cut)
    assert sorted(ran) == [f for f in (0, 32, 64, 96) if f not in saved]  # only the blocks not kept ran
    assert b["resumable"]["resumed_blocks"] == 2 and b["resumable"]["blocks"] == 4
    assert b["resumable"]["commits"] == a["resumable"]["commits"]
    assert [d for d in same(a, b) if d.strip("/").split("/")[0] not in RESUME_ONLY] == []
    assert not kept.exists()
    # the seconds of the blocks read back count in the experiments' times
    assert set(b["wall_time_s"]["per_experiment"]) == set(a["wall_time_s"]["per_experiment"])


def test_blocks_kept_by_one_process_are_continued_by_two_ranks(model_run, tmp_path, monkeypatch):
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    assert main(["evaluate", str(model_run), "--out", str(whole), *RESUMABLE]) == 0
    cut_after(monkeypatch, 1)
    with pytest.raises(CutOff):
        main(["evaluate", str(model_run), "--out", str(cut), *RESUMABLE])
    proc = torchrun("attnmetrics", "evaluate", model_run, "--out", cut, *RESUMABLE)
    assert proc.returncode == 0, proc.stderr[-3000:]
    b = results(cut)
    assert b["resumable"]["resumed_blocks"] == 1 and sum(b["distributed"]["instances"]) == 100 - 32
    assert [d for d in same(results(whole), b) if d.strip("/").split("/")[0] not in RESUME_ONLY] == []
    assert not blocks_folder(cut).exists()


def test_blocks_of_another_run_are_refused_and_left_as_they_are(model_run, tmp_path, monkeypatch, capsys):
    cut = tmp_path / "cut"
    cut_after(monkeypatch, 1)
    with pytest.raises(CutOff):
        main(["evaluate", str(model_run), "--out", str(cut), *RESUMABLE])
    monkeypatch.undo()
    kept = blocks_folder(cut)
    before = {p.name: p.read_bytes() for p in kept.iterdir()}
    other = [*RESUMABLE]
    other[other.index("--permutations") + 1] = "21"
    assert main(["evaluate", str(model_run), "--out", str(cut), *other]) == 2
    err = capsys.readouterr().err
    assert f"--resumable: {kept} holds battery blocks of another run" in err
    assert "the run's flags and battery settings differ" in err and "Traceback" not in err
    assert {p.name: p.read_bytes() for p in kept.iterdir()} == before and not cut.exists()
    # flags that change no value (the threads, the examples shown) continue it
    assert main(["evaluate", str(model_run), "--out", str(cut), *RESUMABLE, "--threads", "2", "--examples", "1"]) == 0
    assert results(cut)["resumable"]["resumed_blocks"] == 1


def test_fingerprints_see_the_weights_the_instances_and_the_flags_but_not_where_or_how_fast():
    """Nor where the data was read from: its instances are hashed, so a copy elsewhere continues."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    batches = [
        (0, torch.tensor([[2, 5, 3], [2, 3, 0]]), torch.tensor([3, 2])),
        (2, torch.tensor([[2, 7, 3]]), torch.tensor([3])),
    ]
    config = {"seed": 0, "permutations": 100, "out": "a", "threads": 1, "data_dir": "/data/sst"}
    settings = {"experiments": ["flip"], "options": {}}
    base = fingerprints(config, settings, model, batches)
    assert fingerprints({**config, "out": "b", "threads": 2}, settings, model, batches) == base
    assert fingerprints({**config, "data_dir": "/elsewhere/sst"}, settings, model, batches) == base

    def differs(prints):
        return {k for k in base if prints[k] != base[k]}

    assert differs(fingerprints({**config, "permutations": 99}, settings, model, batches)) == {"flags"}
    assert differs(fingerprints(config, {**settings, "options": {"integrated_gradients": 8}}, model, batches)) == {
        "flags"
    }
    changed = [(f, t.clone(), n) for f, t, n in batches]
    changed[1][1][0, 1] = 8
    assert differs(fingerprints(config, settings, model, changed)) == {"instances"}
    regrouped = [(0, batches[0][1][:1], batches[0][2][:1]), (1, batches[0][1][1:], batches[0][2][1:]), batches[1]]
    assert differs(fingerprints(config, settings, model, regrouped)) == {"instances"}
    with torch.no_grad():
        model[0].weight[1, 2] += 1e-7
    assert differs(fingerprints(config, settings, model, batches)) == {"model"}
    weights = fingerprints(config, settings, model, batches)["model"]
    model[1].running_mean += 1  # a buffer
    assert fingerprints(config, settings, model, batches)["model"] != weights


def test_an_unreadable_folder_or_block_is_named(tmp_path):
    prints = {"flags": "f", "model": "m", "instances": "i"}
    kept = BatteryBlocks.open(tmp_path / "b", prints, 2, 32, "abc")
    assert json.loads((tmp_path / "b" / "blocks.json").read_text())["fingerprints"] == prints
    assert BatteryBlocks.open(tmp_path / "b", prints, 2, 32, "def").done([0, 32]) == []
    kept.save(32, {"instance": torch.arange(32, 40).numpy()}, {"forward": 1.5})
    assert kept.done([0, 32]) == [32]
    values, seconds, commit = kept.load(32)
    assert values["instance"].tolist() == list(range(32, 40)) and seconds == {"forward": 1.5} and commit == "abc"
    (tmp_path / "b" / f"block-{0:09d}.npz").write_bytes(b"not a block")
    with pytest.raises(ValueError, match=r"block-000000000.npz cannot be read as a battery block"):
        kept.load(0)
    (tmp_path / "b" / "blocks.json").write_text("{")
    with pytest.raises(ValueError, match=r"blocks.json cannot be read .*; remove .* or run without --resumable"):
        BatteryBlocks.open(tmp_path / "b", prints, 2, 32, "abc")
