"""Repo-root conftest: its presence puts this checkout first on sys.path (pytest's prepend
import mode), so tests use its sources; it gives the library's doctests
(``pytest --doctest-modules attnmetrics``) ``torch`` as a global."""

import pytest


@pytest.fixture(autouse=True)
def _doctest_torch(doctest_namespace):
    import torch

    doctest_namespace["torch"] = torch
