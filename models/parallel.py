"""Processes under ``torch.distributed`` (torchrun): which rank this is, and the gradient all-reduce
that keeps every rank's weights identical in data-parallel training. The one place that answers
"which rank am I, of how many", at the two stages a process goes through:

- :func:`launched`: what torchrun's environment says, readable before the process group is
  joined (the command line reads it to decide whether to join one:
  :func:`attnmetrics.app.distributed.world`);
- :func:`data_parallel`: the group this process has joined, which fine-tuning
  (models/training.py) and pre-training (models/pretraining.py) all-reduce over; one process
  when none is joined, whatever the environment says.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

#: what torchrun (its elastic agent) sets in every worker's environment, and a stray
#: ``WORLD_SIZE`` left by a batch script does not come with
TORCHRUN_MARK = "TORCHELASTIC_RUN_ID"
#: the variables of a process group's environment (``env://``), named when they are stray
GROUP_VARIABLES = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


class StrayLaunch(RuntimeError):
    """``WORLD_SIZE`` > 1 in the environment of a process torchrun did not start."""


def launched() -> tuple[int, int, int]:
    """(rank, world size, local rank) from torchrun's environment (``RANK``, ``WORLD_SIZE``,
    ``LOCAL_RANK``), joined to a process group or not yet; (0, 1, 0) when they are not set.

    Raises:
        StrayLaunch: ``WORLD_SIZE`` > 1 without torchrun's ``TORCHELASTIC_RUN_ID`` (variables
            left by a batch script): joining would wait for ranks that never come.
    """
    size = int(os.environ.get("WORLD_SIZE", "1"))
    if size <= 1:
        return 0, 1, 0
    if TORCHRUN_MARK not in os.environ:
        found = " ".join(f"{v}={os.environ[v]}" for v in GROUP_VARIABLES if v in os.environ)
        raise StrayLaunch(
            f"{found} in the environment, but this process was not started by torchrun (no "
            f"{TORCHRUN_MARK}): unset them to run one process, or launch with torchrun"
        )
    return int(os.environ["RANK"]), size, int(os.environ.get("LOCAL_RANK", "0"))


def data_parallel() -> tuple[int, int]:
    """(rank, world size) of an initialised ``torch.distributed`` group (torchrun), else (0, 1)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def all_reduce_gradients(model: torch.nn.Module, weight: float) -> None:
    """Replace each gradient by the sum over ranks of ``weight`` x it (missing gradients count as
    zeros), one flat all-reduce per dtype: with ``weight`` = this rank's share of the batch's
    rows, the gradient of the whole batch's mean loss, identical on every rank."""
    params = [p for p in model.parameters() if p.requires_grad]
    for dtype in dict.fromkeys(p.dtype for p in params):
        group = [p for p in params if p.dtype == dtype]
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in group])
        flat.mul_(weight)
        dist.all_reduce(flat)
        for p, g in zip(group, flat.split([p.numel() for p in group])):
            p.grad = g.view_as(p).clone()
