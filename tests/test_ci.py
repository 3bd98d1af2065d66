"""The README's test command (`bash .ci/run`) installs system packages under CI=true only."""

import os
import shutil
import subprocess

import pytest

from tests.inputs import ROOT


@pytest.fixture
def fake_bin(tmp_path):
    """A PATH holding only a recording apt-get / sudo and the tools .ci/chromium needs (no chromium)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("apt-get", "sudo"):
        (bin_dir / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> "{tmp_path}/calls"\n')
        (bin_dir / tool).chmod(0o755)
    for tool in ("id", "timeout"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    return bin_dir


@pytest.mark.parametrize("ci", [None, "false", "true"])
def test_chromium_is_installed_under_ci_only(fake_bin, ci):
    env = {"PATH": str(fake_bin)} | ({} if ci is None else {"CI": ci})
    proc = subprocess.run(
        [shutil.which("bash"), str(ROOT / ".ci" / "chromium")], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    calls = fake_bin.parent / "calls"
    if ci == "true":
        assert "apt-get install -y --no-install-recommends chromium" in calls.read_text()
    else:
        assert not calls.exists()
        assert "chromium not found: the token view's browser test will be skipped" in proc.stdout


def test_ci_run_installs_system_packages_only_through_the_guarded_script():
    run = (ROOT / ".ci" / "run").read_text()
    assert "apt-get" not in run and "bash .ci/chromium" in run
    assert os.access(ROOT / ".ci" / "chromium", os.R_OK)
