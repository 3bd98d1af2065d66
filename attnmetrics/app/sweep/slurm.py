"""Sweep cells as cluster jobs through submitit (``attnmetrics sweep --executor slurm``).

Each cell becomes one job that runs the same ``python -m attnmetrics run ...`` command a local
sweep runs, its output appended to the cell's log; the sweep waits for the jobs (``jobs`` in
flight) and records them in ``status.json`` exactly as the local executor does, so resuming,
stale cells and the report do not depend on where the cells ran. ``submitit-local`` runs the jobs
through submitit's local executor on this machine (what the tests use; no Slurm needed).

submitit is an optional dependency (``pip install submitit``); it is imported only here.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from attnmetrics.app.sweep.config import Cell
from attnmetrics.app.sweep.runner import Runner


def run_logged(cmd: list[str], log: str) -> int:
    """The job: run ``cmd`` with its output appended to ``log``; its exit status."""
    with open(log, "a", encoding="utf-8") as f:
        return subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode


def make_executor(folder: Path, cluster: str, slurm: dict):
    """A submitit executor writing its files to ``folder``: ``cluster`` "slurm" or "local"."""
    try:
        import submitit
    except ImportError:
        raise RuntimeError(
            "attnmetrics sweep --executor slurm needs submitit: pip install submitit (or .[slurm])"
        ) from None
    executor = submitit.AutoExecutor(folder=folder, cluster=cluster)
    params = {"timeout_min": slurm.get("time_min", 60), "cpus_per_task": slurm.get("cpus", 1)}
    if slurm.get("gpus"):
        params["gpus_per_node"] = slurm["gpus"]
    if slurm.get("mem_gb"):
        params["mem_gb"] = slurm["mem_gb"]
    if cluster == "slurm" and slurm.get("partition"):
        params["slurm_partition"] = slurm["partition"]
    executor.update_parameters(name="attnmetrics", **params)
    return executor


class SubmititRunner(Runner):
    """:class:`attnmetrics.app.sweep.runner.Runner` whose cells run as submitit jobs."""

    def __init__(self, sweep, status: dict, progress: bool):
        super().__init__(sweep, status, progress)
        cluster = "slurm" if sweep.executor == "slurm" else "local"
        self.executor = make_executor(sweep.out / ".submitit", cluster, sweep.slurm)
        self.jobs: set = set()
        self.job_ids: dict[str, str] = {}

    def record(self, cell: Cell, **entry) -> None:
        """status.json's entry, with the cell's job id once it has one."""
        job_id = self.job_ids.get(f"{cell.grid}/{cell.name}")
        super().record(cell, **entry, **({"job_id": job_id} if job_id else {}))

    def execute(self, cell: Cell, cmd: list[str], log: Path) -> int | None:
        with self.lock:
            if self.stopping:
                return None
            job = self.executor.submit(run_logged, cmd, str(log))
            self.jobs.add(job)
        self.job_ids[f"{cell.grid}/{cell.name}"] = str(job.job_id)
        self.record(cell, state="running", command=cmd, log=str(log))
        try:
            return int(job.result())
        except Exception as e:  # the job itself failed (killed, out of time, node lost)
            with open(log, "a", encoding="utf-8") as f:
                f.write(f"=== job {job.job_id} failed: {e}\n")
            return 1
        finally:
            with self.lock:
                self.jobs.discard(job)

    def stop(self) -> None:
        with self.lock:
            self.stopping = True
            jobs = list(self.jobs)
        for job in jobs:
            job.cancel(check=False)
