"""The extension's build cache: keyed by what changes the binary, shared by checkouts of the same
sources, never evicted by a different build; a lock file left by a killed build never hangs it."""

import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from attnmetrics import _ops
from tests.inputs import ROOT


def _import(cwd: Path, pythonpath: Path | None = None, **env_extra: str) -> subprocess.CompletedProcess:
    """``import attnmetrics`` in a fresh process: its stdout names the module file and the build it loaded."""
    env = dict(os.environ, **env_extra)
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    code = "import attnmetrics, attnmetrics._ops as o; print(o.__file__); print(o.BUILD_DIR)"
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def _this_work_dir() -> Path:
    base = "attnmetrics_C_cuda" if _ops.CUDA_KERNELS else "attnmetrics_C"
    return _ops._work_dir(_ops.BUILD_DIR.parent, base, _ops.build_key(_ops.CUDA_KERNELS)[1])


def _checkout_copy(tmp_path: Path) -> Path:
    """A second checkout of this one: the package, its csrc and models links resolved into copies."""
    copy = tmp_path / "checkout"
    shutil.copytree(ROOT / "attnmetrics", copy / "attnmetrics", ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def test_stale_torch_lock_never_hangs_a_build(tmp_path):
    # torch's own lock file, as a build killed midway (kill -9, OOM) leaves it: before the flock
    # around the build, every later import waited on it forever without a word. A copy of this
    # checkout's work folder under a new root: the key has no build there, so the import builds,
    # and ninja finds every object up to date.
    work = _this_work_dir()
    if not (work / "build.ninja").is_file():
        pytest.skip(f"this process loaded a build made elsewhere: no work folder {work}")
    root = tmp_path / "extensions"
    shutil.copytree(work, root / work.name, ignore=shutil.ignore_patterns("lock"))
    objects = {p.name: p.stat().st_mtime_ns for p in (root / work.name).glob("*.o")}
    stale = root / work.name / "lock"
    stale.touch()
    proc = _import(ROOT, TORCH_EXTENSIONS_DIR=str(root))
    assert proc.returncode == 0, proc.stderr
    assert f"removing the stale build lock {stale}" in proc.stderr
    assert {p.name: p.stat().st_mtime_ns for p in (root / work.name).glob("*.o")} == objects  # nothing recompiled
    built = Path(proc.stdout.split()[-1])
    assert built.parent == root and _ops._built(built, _ops.build_key(_ops.CUDA_KERNELS)[0]) is not None


def test_a_second_checkout_of_the_same_sources_loads_the_build_without_compiling(tmp_path):
    copy = _checkout_copy(tmp_path)
    proc = _import(copy, pythonpath=copy)
    assert proc.returncode == 0, proc.stderr
    module, build_dir = proc.stdout.split()[-2:]
    assert Path(module).is_relative_to(copy)  # the copy was imported, with its own csrc
    assert Path(build_dir) == _ops.BUILD_DIR  # ... and loaded this checkout's build
    assert "compiling" not in proc.stderr and "waiting" not in proc.stderr, proc.stderr
    # and in turn this checkout again: still its build, nothing rebuilt
    proc = _import(ROOT)
    assert proc.returncode == 0, proc.stderr
    assert Path(proc.stdout.split()[-1]) == _ops.BUILD_DIR and "compiling" not in proc.stderr, proc.stderr


def test_build_key_follows_what_changes_the_binary(tmp_path, monkeypatch):
    key = _ops.build_key()[0]
    csrc = _checkout_copy(tmp_path) / "attnmetrics" / "csrc"
    monkeypatch.setattr(_ops, "_CSRC", csrc)
    assert _ops.build_key()[0] == key  # the sources' path is not part of it
    with open(csrc / "cpu" / "lstm.cpp", "a") as f:
        f.write("// edited\n")
    edited = _ops.build_key()[0]
    assert edited != key
    (csrc / "cuda" / "lstm.cu").write_text("// only the CUDA build reads csrc/cuda\n")
    assert _ops.build_key()[0] == edited
    assert _ops.build_key(with_cuda=False)[0] == edited
    monkeypatch.setattr(_ops, "CXX_FLAGS", [*_ops.CXX_FLAGS, "-march=native"])
    flags = _ops.build_key()[0]
    monkeypatch.undo()
    monkeypatch.setenv("CXX", "clang++")
    assert len({key, edited, flags, _ops.build_key()[0]}) == 4


def test_only_a_stamped_whole_build_is_loaded(tmp_path):
    key = "a" * 64
    assert _ops._built(tmp_path, key) is None  # nothing there
    library = tmp_path / "attnmetrics_C.so"
    library.write_bytes(b"a library")
    assert _ops._built(tmp_path, key) is None  # a build that died before its stamp
    keyed = tmp_path / "keyed"
    keyed.mkdir()
    assert _ops._publish(library, keyed, key, {}) == keyed / library.name
    assert _ops._built(keyed, key) == keyed / library.name
    assert (keyed / library.name).read_bytes() == b"a library"
    assert _ops._built(keyed, "b" * 64) is None  # another key's stamp
    (keyed / library.name).unlink()
    assert _ops._built(keyed, key) is None  # a stamp without its library
    assert [p.name for p in keyed.iterdir()] == [_ops.STAMP]  # no temporaries left


def test_unused_build_folders_are_pruned_and_others_kept(tmp_path):
    old, recent, kept = (tmp_path / f"attnmetrics_C_{n}" for n in ("old", "recent", "kept"))
    other = tmp_path / "someone_else"
    long_ago = time.time() - (_ops.STALE_DAYS + 1) * 86400
    for folder in (old, recent, kept, other):
        folder.mkdir()
        (folder / _ops.STAMP).write_text("{}")
        if folder is not recent:
            os.utime(folder / _ops.STAMP, (long_ago, long_ago))
            os.utime(folder, (long_ago, long_ago))
    _ops._prune(tmp_path, keep=(kept,))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["attnmetrics_C_kept", "attnmetrics_C_recent", "someone_else"]


def test_the_build_runs_the_ninja_beside_this_python(monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    with _ops._ninja_beside_python():
        assert shutil.which("ninja") == str(Path(sys.executable).parent / "ninja")
    assert os.environ["PATH"] == "/usr/bin:/bin"


def test_build_lock_is_released_with_its_holder(tmp_path):
    work = tmp_path / "attnmetrics_C-work-x"
    with _ops._build_lock(work):
        assert (tmp_path / "attnmetrics_C-work-x.build-lock").is_file()
    with _ops._build_lock(work):  # free again: a second holder would wait forever otherwise
        pass


def test_build_progress_counts_the_object_files_written(tmp_path, capsys):
    (tmp_path / "old.o").touch()
    os.utime(tmp_path / "old.o", (0, 0))  # from an earlier build: not counted
    with _ops._build_progress(tmp_path, 3, every=0.05):
        (tmp_path / "ops.o").touch()
        time.sleep(0.3)
    err = capsys.readouterr().err
    assert "attnmetrics: compiling: 1/3 files" in err and "attnmetrics: compiled " in err
    with pytest.raises(RuntimeError), _ops._build_progress(tmp_path, 3, every=10):
        raise RuntimeError("the compiler failed")
    assert "attnmetrics: build failed after " in capsys.readouterr().err


def test_torch_no_cuda_runtime_notice_is_dropped_and_nothing_else():
    logger = logging.getLogger("torch.utils.cpp_extension")

    def shown(message: str) -> bool:
        record = logging.LogRecord(logger.name, logging.WARNING, __file__, 1, message, ("/usr/local",), None)
        return all(f.filter(record) for f in logger.filters)

    assert not shown("No CUDA runtime is found, using CUDA_HOME='%s'")
    assert shown("Error checking compiler version for %s")
