"""Outputs are written atomically and run folders are never silently overwritten."""

import json
import math

import pytest

from attnmetrics.app.io import run_folder, write_json_atomic


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
    (out / "keep.txt").write_text("precious")
    with pytest.raises(RuntimeError):
        with run_folder(out, overwrite=True) as staging:
            (staging / "half.txt").write_text("x")
            raise RuntimeError("training crashed")
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]


def test_overwrite_replaces_only_on_success(tmp_path):
    out = tmp_path / "run"
    with run_folder(out) as staging:
        (staging / "a.txt").write_text("1")
    with run_folder(out, overwrite=True) as staging:
        (staging / "b.txt").write_text("2")
    assert sorted(p.name for p in out.iterdir()) == ["b.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]
