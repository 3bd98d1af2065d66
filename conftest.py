"""Repo-root conftest: its presence puts this checkout first on sys.path (pytest's prepend
import mode), so tests use its sources; it gives the library's doctests
(``pytest --doctest-modules attnmetrics``) ``torch`` as a global, and skips the tests marked
``sst`` (they read the real Stanford Sentiment Treebank) unless ATTNMETRICS_SST_DIR names it."""

import os
from pathlib import Path

import pytest

SST_FILES = ("train.txt", "dev.txt", "test.txt")


def pytest_collection_modifyitems(config, items):
    folder = os.environ.get("ATTNMETRICS_SST_DIR")
    if folder:
        missing = [f for f in SST_FILES if not (Path(folder) / f).is_file()]
        if missing:  # a wrong path must not pass as a clean skip
            raise pytest.UsageError(f"ATTNMETRICS_SST_DIR={folder} lacks {', '.join(missing)} (SST's PTB-format files)")
        return
    skip = pytest.mark.skip(
        reason="needs the real SST: set ATTNMETRICS_SST_DIR to the folder holding train.txt, dev.txt, test.txt"
    )
    for item in items:
        if "sst" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _doctest_torch(doctest_namespace):
    import torch

    doctest_namespace["torch"] = torch
