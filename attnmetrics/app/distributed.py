"""Processes started by ``torchrun`` (``torch.distributed``): the battery sharded over them, and
what data-parallel training (models/parallel.py) needs from the command line.
Which rank this is comes from models/parallel.py, the one place that reads it.

    torchrun --nproc-per-node 2 -m attnmetrics evaluate runs/sst-lstm --out runs/sst-eval

Every rank loads the model and the test split, takes a deterministic, length-balanced share of
the evaluation batches and runs the battery on it on its own device (``cuda:LOCAL_RANK`` with
``--device cuda``, else the CPU); rank 0 gathers the per-instance values and alone writes the
run folder, the same folder a single process writes: every random draw is keyed by (seed,
instance) (:class:`attnmetrics.KeyedRows`), never by rank or batch.

The processes exchange one message each (the per-instance values, a few MB) through gloo, which
runs on any machine; with GPUs too, since NCCL would only move those values off the GPU again.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.distributed as dist

from attnmetrics.models.parallel import launched

T = TypeVar("T")


@dataclass(frozen=True)
class World:
    """This process's place among ``size`` ranks (1: not under torchrun)."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        """Rank 0: the process that writes."""
        return self.rank == 0


def world() -> World:
    """This process's rank and the world size from torchrun's environment (``RANK``,
    ``WORLD_SIZE``, ``LOCAL_RANK``; :func:`attnmetrics.models.parallel.launched`), read before the
    group is joined; a single process when they are not set."""
    return World(*launched())


def start(w: World, device: str, timeout_min: float = 60.0) -> None:
    """Join the process group (gloo) and, with ``device == "cuda"``, make ``cuda:LOCAL_RANK`` this
    rank's current device. ``timeout_min``: how long a rank waits for the others at the gather
    (a rank that dies is noticed at once; one that hangs, after this)."""
    if device == "cuda":
        torch.cuda.set_device(w.local_rank)
    dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=timeout_min))


def stop() -> None:
    """Leave the process group (if one was joined) once every rank is here: no rank tears its
    connections down while another still waits on them (rank 0 writes the run folder after the
    gather, the others would otherwise exit first). Call it on success only."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def share(items: Sequence[T], costs: Sequence[float], w: World) -> list[T]:
    """Rank ``w.rank``'s share of ``items``: longest-processing-time-first over ``costs`` (each
    item, most costly first, ties by index, to the least loaded rank, ties to the lower rank), in
    their original order. A pure function of the items, costs and world size."""
    if w.size == 1:
        return list(items)
    load = [0.0] * w.size
    owner = [0] * len(items)
    for i in sorted(range(len(items)), key=lambda i: (-costs[i], i)):
        r = min(range(w.size), key=lambda r: (load[r], r))
        owner[i] = r
        load[r] += costs[i]
    return [item for item, r in zip(items, owner) if r == w.rank]


def broadcast(obj: T, w: World) -> T:
    """Rank 0's ``obj`` on every rank (``obj`` itself in one process)."""
    if w.size == 1:
        return obj
    shared = [obj if w.main else None]
    dist.broadcast_object_list(shared, src=0)
    return shared[0]


def gather(obj: T, w: World) -> list[T] | None:
    """Every rank's ``obj`` on rank 0, in rank order (None on the other ranks); ``[obj]`` alone.

    Raises:
        RuntimeError: another rank failed or left before sending its share (named by the rank
            that noticed; torchrun then stops the rest and names the rank that failed first).
    """
    if w.size == 1:
        return [obj]
    out = [None] * w.size if w.main else None
    try:
        dist.gather_object(obj, out, dst=0)
    except RuntimeError as e:
        raise RuntimeError(
            f"rank {w.rank} of {w.size}: another rank failed before sending its share of the battery "
            f"(torchrun's summary names it); nothing was written ({e})"
        ) from e
    return out
