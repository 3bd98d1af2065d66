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
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.distributed as dist
from torch.distributed.rendezvous import rendezvous

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


def start(w: World, device: str, timeout_min: float = 60.0, rendezvous_s: float = 120.0) -> None:
    """Join the process group (gloo) and, with ``device == "cuda"``, make ``cuda:LOCAL_RANK`` this
    rank's current device. ``rendezvous_s``: how long a rank waits to reach the others' store at
    ``MASTER_ADDR:MASTER_PORT`` (torchrun starts every rank at once); ``timeout_min``: how long a
    rank waits for the others at the gather (a rank that dies is noticed at once; one that hangs,
    after this).

    Raises:
        RuntimeError: the rendezvous did not complete within ``rendezvous_s`` (one line naming
            the address, the port and the world size).
    """
    if device == "cuda":
        torch.cuda.set_device(w.local_rank)
    try:
        store, rank, size = next(rendezvous("env://", timeout=datetime.timedelta(seconds=rendezvous_s)))
    except (RuntimeError, ValueError) as e:  # DistNetworkError, DistStoreError: RuntimeErrors
        where = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
        raise RuntimeError(
            f"rank {w.rank} of {w.size}: no rendezvous with the other ranks at {where} within "
            f"{rendezvous_s:g} s (is every rank started, by one torchrun?): {str(e).splitlines()[0] if str(e) else e!r}"
        ) from e
    timeout = datetime.timedelta(minutes=timeout_min)
    store.set_timeout(timeout)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=size, timeout=timeout)


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
