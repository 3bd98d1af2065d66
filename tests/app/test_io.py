"""Outputs are written atomically and run folders are never silently overwritten."""

import contextlib
import json
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attnmetrics.app.io import MARKER, is_run_folder, run_folder, write_json_atomic


def test_json_is_strict_with_nan_as_null(tmp_path):
    path = tmp_path / "r.json"
    write_json_atomic(path, {"a": math.nan, "b": [1.5, math.inf], "c": {"d": 2}})
    assert json.loads(path.read_text()) == {"a": None, "b": [1.5, None], "c": {"d": 2}}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # no temporary left behind


def test_run_folder_refuses_to_overwrite(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    with pytest.raises(FileExistsError, match="--overwrite"):
        with run_folder(out):
            pass
    assert (out / "keep.txt").read_text() == "precious"


def test_failed_run_leaves_existing_folder_untouched(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "results.json").write_text("{}")  # a run folder of this tool, so --overwrite may replace it
    with pytest.raises(RuntimeError):
        with run_folder(out, overwrite=True) as staging:
            (staging / "half.txt").write_text("x")
            raise RuntimeError("training crashed")
    assert sorted(p.name for p in out.iterdir()) == ["results.json"]


def test_overwrite_replaces_only_on_success(tmp_path):
    out = tmp_path / "run"
    with run_folder(out) as staging:
        (staging / "results.json").write_text("1")  # what makes it a run folder --overwrite may replace
    with run_folder(out, overwrite=True) as staging:
        (staging / "b.txt").write_text("2")
    assert sorted(p.name for p in out.iterdir()) == ["b.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_second_run_into_one_out_is_refused_at_its_start(tmp_path):
    out = tmp_path / "run"
    with run_folder(out) as first:
        for overwrite in (False, True):  # refused before any work, with or without --overwrite
            with pytest.raises(FileExistsError, match="another attnmetrics run|already exists"):
                with run_folder(out, overwrite=overwrite):
                    pytest.fail("the second run must not start")
        (first / "results.json").write_text('{"run": 1}')
    assert json.loads((out / "results.json").read_text()) == {"run": 1}
    with run_folder(out, overwrite=True) as second:  # done: now --overwrite may replace it
        (second / "results.json").write_text('{"run": 2}')
    assert json.loads((out / "results.json").read_text()) == {"run": 2}


def test_overwrite_never_replaces_what_is_not_a_run_folder(tmp_path):
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "thesis.tex").write_text("years of work")
    with pytest.raises(FileExistsError, match="not an attnmetrics run folder"):
        with run_folder(precious, overwrite=True):
            pytest.fail("must not start")
    assert sorted(p.name for p in precious.iterdir()) == ["thesis.tex"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["precious"]  # no staging folder left


@pytest.mark.parametrize("overwrite", [False, True])
def test_out_that_is_a_file_the_working_folder_or_a_protected_folder_is_refused(tmp_path, monkeypatch, overwrite):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("keep")
    model = tmp_path / "model_run"
    model.mkdir()
    (model / "results.json").write_text("{}")
    for out, protect, words in [
        ("notes.txt", (), "is a file"),
        (".", (), "working folder"),
        ("..", (), "working folder"),
        ("model_run", ("model_run",), "reads"),
        (".", ("model_run",), "working folder"),
        ("model_run/eval", ("model_run",), "reads"),
    ]:
        with pytest.raises(FileExistsError, match=words):
            with run_folder(out, overwrite, protect):
                pytest.fail(f"--out {out} must be refused")
    assert (tmp_path / "notes.txt").read_text() == "keep" and (model / "results.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model_run", "notes.txt"]


def test_failed_run_gives_its_claim_back_and_leaves_no_empty_staging(tmp_path):
    out = tmp_path / "run"
    with pytest.raises(RuntimeError):
        with run_folder(out):
            raise RuntimeError("crashed before writing anything")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(RuntimeError) as info:
        with run_folder(out) as staging:
            (staging / "half.txt").write_text("x")
            raise RuntimeError("crashed halfway")
    assert any("partial outputs kept in" in n for n in info.value.__notes__)
    assert [p.name for p in tmp_path.iterdir()] == [staging.name] and (staging / "half.txt").is_file()


CLAIM_AND_WAIT = """
import sys, time
from attnmetrics.app.io import run_folder
with run_folder(sys.argv[1]) as staging:
    print("claimed", flush=True)
    time.sleep(60)
"""


@contextlib.contextmanager
def _in_background(script: str, out, cwd, ready: str):
    """``script`` run on ``out`` in another process until it prints ``ready``; SIGKILLed on exit
    (no clean-up of its own runs, as after a real kill)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(out)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        assert proc.stdout.readline().strip() == ready
        yield proc
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)


def test_claim_of_a_killed_run_never_blocks_the_next(tmp_path):
    out = tmp_path / "run"
    with _in_background(CLAIM_AND_WAIT, out, tmp_path, "claimed"):  # then killed: its folder stays behind
        with pytest.raises(FileExistsError, match="another attnmetrics run"):  # alive: its claim holds
            with run_folder(out, overwrite=True):
                pytest.fail("must not start")
    assert [p.name for p in out.iterdir()] == [MARKER]
    deadline = time.time() + 10
    with run_folder(out) as staging:  # the dead run's lock went with it: taken over, no --overwrite
        (staging / "results.json").write_text("{}")
    assert time.time() < deadline and (out / "results.json").is_file()


def test_outputs_follow_the_umask(tmp_path):
    out = tmp_path / "run"
    with run_folder(out) as staging:
        write_json_atomic(staging / "results.json", {"a": 1})
    umask = os.umask(0)
    os.umask(umask)
    assert (out.stat().st_mode & 0o777) == 0o777 & ~umask  # not mkdtemp's 0700
    assert ((out / "results.json").stat().st_mode & 0o777) == 0o666 & ~umask  # not mkstemp's 0600


# A run that replaces OUT (--overwrite) or creates it, killed with SIGKILL at one step of making
# its staging folder OUT: io._swap_step is the test hook io.py calls between the steps.
SWAP_AND_DIE = """
import os, signal, sys
from attnmetrics.app import io
out, step, fallback = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
if fallback:  # as on a file system without renameat2's RENAME_EXCHANGE
    io._exchange = lambda a, b: False
def die(name):
    if name == step:
        os.kill(os.getpid(), signal.SIGKILL)
io._swap_step = die
with io.run_folder(out, overwrite=True) as staging:
    (staging / "results.json").write_text('{"run": "new"}')
"""


def _swap_and_die(tmp_path, out, step, fallback):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run(
        [sys.executable, "-c", SWAP_AND_DIE, str(out), step, "1" if fallback else "0"], cwd=tmp_path, env=env
    )
    assert proc.returncode == -signal.SIGKILL, f"the run was not killed at {step}"


@pytest.mark.parametrize(
    "fallback,step",
    [
        (False, "swap-locked"),
        (False, "exchanged"),
        (True, "swap-locked"),
        (True, "old-aside"),
        (True, "new-in"),
    ],
)
@pytest.mark.parametrize("name", ["run", "run.partial-x.old-y"])
def test_a_kill_at_any_step_of_the_overwrite_swap_loses_neither_run(tmp_path, capsys, fallback, step, name):
    out = tmp_path / name
    with run_folder(out) as staging:
        (staging / "results.json").write_text('{"run": "old"}')
    _swap_and_die(tmp_path, out, step, fallback)
    # the next claim finds OUT whole: a plain run is refused, not handed a fresh empty OUT
    with pytest.raises(FileExistsError, match="already exists"):
        with run_folder(out):
            pytest.fail("OUT holds a finished run")
    assert json.loads((out / "results.json").read_text())["run"] in ("old", "new")
    assert MARKER not in os.listdir(out)  # no stale claim left inside the finished run
    with run_folder(out, overwrite=True) as staging:
        (staging / "results.json").write_text('{"run": "third"}')
    assert json.loads((out / "results.json").read_text()) == {"run": "third"}
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]  # every leftover removed


@pytest.mark.parametrize("fallback,step", [(False, "swap-locked"), (False, "exchanged"), (True, "marker-unlinked")])
def test_a_kill_while_a_new_out_is_made_never_blocks_the_next_run(tmp_path, fallback, step):
    out = tmp_path / "run"
    _swap_and_die(tmp_path, out, step, fallback)
    if is_run_folder(out):  # the new run got there whole
        assert json.loads((out / "results.json").read_text()) == {"run": "new"}
    else:  # an empty OUT, or one holding only the dead run's claim: taken over without --overwrite
        with run_folder(out) as staging:
            (staging / "results.json").write_text('{"run": "next"}')
    assert MARKER not in os.listdir(out)
    with run_folder(out, overwrite=True) as staging:
        (staging / "results.json").write_text('{"run": "third"}')
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_an_empty_out_is_taken_over(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    with run_folder(out) as staging:
        (staging / "results.json").write_text("{}")
    assert sorted(p.name for p in out.iterdir()) == ["results.json"]


def test_the_next_claim_removes_leftovers_of_dead_runs_and_names_them(tmp_path, capsys):
    out = tmp_path / "run"
    with run_folder(out) as staging:
        (staging / "results.json").write_text('{"run": "old"}')
    killed = tmp_path / ".run.partial-killed"  # a run SIGKILLed while it trained
    (killed / "model").mkdir(parents=True)
    (killed / "model" / "weights.pt").write_bytes(b"x" * 100)
    (out / MARKER).write_text("")  # the claim of a killed --overwrite run, left in the old results
    with pytest.raises(RuntimeError) as failed:  # a failed run keeps its staging folder and names it
        with run_folder(out, overwrite=True) as kept:
            (kept / "model").mkdir()
            raise RuntimeError("the battery broke")
    assert f"partial outputs kept in {kept}" in failed.value.__notes__
    assert str(killed) in capsys.readouterr().err
    with pytest.raises(FileExistsError, match="already exists"):
        with run_folder(out):
            pytest.fail("OUT holds a finished run")
    err = capsys.readouterr().err
    assert f"{kept} was kept by a failed run" in err and len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["run", kept.name])  # named again, not removed
    assert sorted(p.name for p in out.iterdir()) == ["results.json"]


def test_leftovers_of_a_live_run_are_left_alone(tmp_path):
    out = tmp_path / "run"
    with _in_background(CLAIM_AND_WAIT, out, tmp_path, "claimed"):
        live = sorted(tmp_path.glob(".run.partial-*"))
        assert len(live) == 1
        with pytest.raises(FileExistsError, match="another attnmetrics run"):
            with run_folder(out, overwrite=True):
                pytest.fail("must not start")
        assert sorted(tmp_path.glob(".run.partial-*")) == live and (out / MARKER).is_file()


def test_the_clean_up_never_takes_a_sibling_for_a_leftover(tmp_path):
    sibling = tmp_path / ".run.partial-x.partial-abc123"  # the staging folder of a run into run.partial-x
    sibling.mkdir()
    odd = tmp_path / "run[1]"  # glob characters in a name match nothing else
    with run_folder(odd) as staging:
        (staging / "results.json").write_text("{}")
    with run_folder(tmp_path / "run") as staging:
        (staging / "results.json").write_text("{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["run", "run[1]", sibling.name])


SWAP_AND_PAUSE = """
import sys, time
from attnmetrics.app import io
io._exchange = lambda a, b: False  # the two renames' gap, where OUT is missing
def pause(name):
    if name == "old-aside":
        print("paused", flush=True)
        time.sleep(60)
io._swap_step = pause
with io.run_folder(sys.argv[1], overwrite=True) as staging:
    (staging / "results.json").write_text('{"run": "new"}')
"""


def test_no_run_takes_out_in_the_gap_of_a_swap(tmp_path, monkeypatch):
    import attnmetrics.app.io as io

    out = tmp_path / "run"
    with run_folder(out) as staging:
        (staging / "results.json").write_text('{"run": "old"}')
    with _in_background(SWAP_AND_PAUSE, out, tmp_path, "paused"):
        assert not out.exists()
        monkeypatch.setattr(io, "SWAP_WAIT_S", 0.5)
        with pytest.raises(FileExistsError, match="replacing"):  # waits for the swap, never a fresh OUT
            with run_folder(out):
                pytest.fail("must not start in the gap")
        assert not out.exists()
    with pytest.raises(FileExistsError, match="already exists"):  # the swap finished by the next claim
        with run_folder(out):
            pytest.fail("OUT holds a finished run")
    assert json.loads((out / "results.json").read_text()) == {"run": "new"}


#: every command that writes an --out
OUT_COMMANDS = ("run", "train", "evaluate", "report", "sweep", "pretrain")


def _inputs(folder):
    """Small inputs in ``folder`` that let each of :data:`OUT_COMMANDS` reach its --out checks: two
    run folders, a sweep config, a corpus."""
    from tests.inputs import SST_SAMPLE

    for name in ("a-run", "b-run"):
        (folder / name).mkdir(parents=True)
        (folder / name / "results.json").write_text('{"command": "run", "config": {}, "data": {"name": "sst"}}')
    (folder / "sweep.toml").write_text(
        f'[sweep]\ndata_dirs = {{ sst = "{SST_SAMPLE}" }}\n[defaults]\nlimit = 40\nepochs = 1\n'
        '[[grid]]\nname = "g"\ndatasets = ["sst"]\n'
    )
    (folder / "books").mkdir()
    for name in ("a.txt", "b.txt"):
        (folder / "books" / name).write_text("It was the best of times, it was the worst of times. " * 40)
    return folder


def _argv(command: str, inputs, out) -> list[str]:
    """``command``'s arguments writing into ``out``, on the :func:`_inputs` in ``inputs``."""
    from tests.inputs import QUICK_SST

    run = inputs / "a-run"
    return {
        "run": ["run", *QUICK_SST],
        "train": ["train", *QUICK_SST],
        "evaluate": ["evaluate", str(run)],
        "report": ["report", str(run), str(inputs / "b-run")],
        "sweep": ["sweep", str(inputs / "sweep.toml")],
        "pretrain": ["pretrain", "--corpus", str(inputs / "books"), "--held-out", "b.txt", "--steps", "1"],
    }[command] + ["--out", str(out)]


@pytest.mark.parametrize("command", OUT_COMMANDS)
def test_an_out_where_no_folder_can_be_is_refused_in_one_line(tmp_path, capsys, command):
    # issue 31, the remaining unclear --out errors: a name too long was an OSError traceback in
    # every command; report took a file or a link for a folder (a FileExistsError traceback);
    # sweep wrote through a link to nowhere and raised on a loop of links; a folder the system
    # refuses to make with ENOENT (in /proc, even to root) was that error, without --out
    from attnmetrics.app.cli import main

    inputs = _inputs(tmp_path / "inputs")
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
    (tmp_path / "loop").symlink_to("loop")
    notes, gone, loop, long = tmp_path / "notes.txt", tmp_path / "gone", tmp_path / "loop", "n" * 300
    before = sorted(p.name for p in tmp_path.iterdir())
    for out, expected in (
        (notes, f"--out {notes} is a file, not a folder"),
        (notes / "r", f"--out {notes / 'r'}: {notes} is a file, not a folder"),
        (gone, f"--out {gone} is a link to {tmp_path / 'nowhere'}, which does not exist"),
        (gone / "r", f"--out {gone / 'r'}: {gone} is a link to {tmp_path / 'nowhere'}, which does not exist"),
        (loop, f"--out {loop} is a link to loop, a loop of links"),
        (tmp_path / long, f"--out {tmp_path / long} cannot be written (File name too long: {tmp_path / long})"),
        (  # refused before the folders above the long name are made
            tmp_path / "new" / long / "r",
            f"--out {tmp_path / 'new' / long / 'r'} cannot be written (File name too long: {tmp_path / 'new' / long})",
        ),
        (Path("/proc/attnmetrics-new/r"), "--out /proc/attnmetrics-new/r cannot be written (No such file or directory"),
    ):
        assert main(_argv(command, inputs, out)) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and expected in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert notes.read_text() == "mine"


def test_an_out_on_a_read_only_file_system_is_refused_in_one_line_by_every_command(tmp_path):
    # issue 31, unclear errors: "OSError: [Errno 30] Read-only file system" as a traceback. A real
    # read-only mount, in a mount namespace of the test's own (needs unshare and mount rights)
    ro = tmp_path / "ro"
    ro.mkdir()
    mount = f"mount -t tmpfs -o ro,size=1m tmpfs {ro}"
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-m", "sh", "-c", mount]).returncode:
        pytest.skip("no private read-only mount here (unshare -m and mount)")
    outs = [(command, out) for command in OUT_COMMANDS for out in (ro / command, ro / "new" / command)]
    inputs = _inputs(tmp_path / "inputs")
    argvs = [_argv(command, inputs, out) for command, out in outs]
    code = f"import sys; from attnmetrics.app.cli import main; sys.exit(max([main(a) for a in {argvs!r}]))"
    done = subprocess.run(
        ["unshare", "-m", "sh", "-c", f"{mount} && exec {sys.executable} -c {shlex.quote(code)}"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == len(outs), done.stderr
    for (command, out), line in zip(outs, lines, strict=True):
        assert f"--out {out} cannot be written (Read-only file system: {ro}" in line, (command, line)
    assert list(ro.iterdir()) == []  # outside the namespace, the folder the mount covered
