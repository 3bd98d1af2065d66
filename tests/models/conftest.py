"""Fixtures of the model tests."""

import pytest
import torch


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models run many times faster on one thread than on two contended ones (modules opt in
    with ``pytestmark = pytest.mark.usefixtures("one_thread")``)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
