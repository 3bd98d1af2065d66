"""The extension's build lock: a lock file left by a killed build never hangs an import."""

import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from torch.utils import cpp_extension

from attnmetrics import _ops
from tests.inputs import ROOT


def test_stale_torch_lock_never_hangs_an_import():
    # torch's own lock file, as a build killed midway (kill -9, OOM) leaves it: before the
    # flock around the build, every later import waited on it forever without a word.
    build_dir = Path(cpp_extension._get_build_directory(_ops.EXTENSION_NAME, verbose=False))
    stale = build_dir / "lock"
    stale.touch()
    try:
        proc = subprocess.run(
            [sys.executable, "-c", "import attnmetrics"],
            cwd=ROOT,
            env=os.environ,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        stale.unlink(missing_ok=True)
    assert proc.returncode == 0, proc.stderr
    assert f"removing the stale build lock {stale}" in proc.stderr
    assert "compiling" not in proc.stderr  # the cached build was reused, and said nothing else


def test_build_lock_is_released_with_its_holder():
    lock = Path(cpp_extension._get_build_directory(_ops.EXTENSION_NAME, verbose=False)).parent
    lock = lock / f"{_ops.EXTENSION_NAME}.build-lock"
    assert lock.is_file()  # the import that built or loaded this process's kernels held it
    with _ops._build_lock(_ops.EXTENSION_NAME):  # free again: this process's import released it
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
