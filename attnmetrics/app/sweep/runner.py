"""Running a sweep's cells: each one ``attnmetrics run`` in its own process (or Slurm job),
resumably, every outcome recorded in ``OUT/status.json``.

Resume and safety:
- a cell whose folder holds ``results.json`` run with the same flags is done and skipped; the
  staging folders (``.CELL.partial-*``) an interrupted run leaves are removed and the cell rerun,
  unless a run of the cell is still going (its claim is held: a killed sweep leaves its cells
  running), whose staging folder is left alone (and said so);
- a finished cell whose recorded flags (``results.json`` "config") differ from the config's is
  *stale*: the sweep refuses to start unless ``--overwrite``, which reruns exactly the stale cells
  (each old folder is replaced only once its new run succeeds). Adding or removing cells is fine;
- failed cells are recorded in ``OUT/status.json`` (atomic) and the others go on; the exit status
  is 1 if any cell failed; one sweep at a time per folder (a lock file);
- ``OUT/sweep.toml`` keeps the config text of the last sweep started in the folder.

Executors (``[sweep] executor`` or ``--executor``): ``local`` runs each cell as a subprocess
here, ``jobs`` at a time. ``slurm`` submits each cell as a Slurm job through submitit
(:mod:`attnmetrics.app.sweep.slurm`; ``pip install submitit``), ``jobs`` in flight, with the resources of
``[sweep.slurm]`` (``partition``, ``time_min``, ``gpus``, ``cpus``, ``mem_gb``; flags of the same
names override them) and submitit's files in ``OUT/.submitit``; ``submitit-local`` is that path
on this machine (submitit's local executor). Resume, status, stale cells and the report are the
same for all three.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import fcntl
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from tqdm.auto import tqdm

from attnmetrics.app.config import RunConfig
from attnmetrics.app.io import (
    read_results,
    read_status,
    remove_abandoned_claim,
    remove_leftovers,
    write_json_atomic,
    write_text_atomic,
)
from attnmetrics.app.parser import build_parser
from attnmetrics.app.recipes import recipe_defaults
from attnmetrics.app.resumable import blocks_folder
from attnmetrics.app.sweep.config import IGNORED_CONFIG, Cell, Sweep, cell_command


def _config_of(argv: list[str]) -> dict:
    args = build_parser().parse_args(argv)
    recipe_defaults(args)  # as the run itself records them
    return json.loads(json.dumps(RunConfig.from_namespace(args).to_dict()))


def invalid_cells(grid: Sweep) -> list[str]:
    """One line per cell whose ``run`` flags the run itself would refuse after parsing (e.g. a
    GPT-1 flag with another encoder), so the sweep stops before any cell starts."""
    lines = []
    for cell in grid.cells:
        try:
            _config_of(cell_command(cell, grid.out)[3:])
        except ValueError as e:
            lines.append(f"cell {cell.grid}/{cell.name}: {e}")
    return lines


def _unreadable(cells: list[Cell], out: Path) -> dict[Cell, str]:
    """The finished cells whose results.json cannot be read, each with why (one line)."""
    found = {}
    for cell in cells:
        try:
            read_results(cell.folder(out) / "results.json")
        except ValueError as e:
            found[cell] = f"cell {cell.grid}/{cell.name}: {e}"
    return found


def is_stale(cell: Cell, out: Path) -> bool:
    """Whether the finished cell's results.json was run with flags other than the config's
    (options unknown to the older run are not compared)."""
    recorded = read_results(cell.folder(out) / "results.json").get("config", {})
    wanted = _config_of(cell_command(cell, out)[3:])
    return any(recorded[k] != v for k, v in wanted.items() if k in recorded and k not in IGNORED_CONFIG)


def cell_state(cell: Cell, out: Path) -> str:
    """A cell's state as ``--dry-run`` lists it: ``done``; ``stale`` (finished with other flags than
    the config's: rerun only under ``--overwrite``); ``unreadable`` (its results.json); ``todo``;
    with ``(N battery blocks kept)`` where a ``--resumable`` run of it left finished blocks."""
    if cell.is_done(out):
        try:
            state = "stale" if is_stale(cell, out) else "done"
        except ValueError:
            return "unreadable"
    else:
        state = "todo"
    kept = len(list(blocks_folder(cell.folder(out)).glob("block-*.npz")))
    return f"{state} ({kept} battery blocks kept)" if kept and state != "done" else state


def clean_partial(cell: Cell, out: Path) -> tuple[list[str], bool]:
    """Remove what interrupted runs of ``cell`` left: staging folders (``.CELL.partial-*``), a
    half-done ``--overwrite`` (finished or undone), a claim of a run killed before it finished.
    A run of the cell that is still going (a killed sweep leaves its cells running) keeps its
    claim and staging folder. Returns what was done, in words, and whether such a run is going.

    Raises:
        FileExistsError: another process has been replacing the cell's folder for a minute.
    """
    folder = cell.folder(out)
    done, running = remove_leftovers(folder, remove_kept=True)  # the cell is rerun: its log has the failure
    if not running and remove_abandoned_claim(folder):  # claimed by a run killed before it finished
        done.append(f"removed {folder}")
    return done, running


class Runner:
    """Runs cells as subprocesses on a thread pool; records each outcome in status.json."""

    def __init__(self, sweep: Sweep, status: dict, progress: bool):
        self.sweep, self.status, self.progress = sweep, status, progress
        self.lock = threading.Lock()
        self.procs: set[subprocess.Popen] = set()
        self.stopping = False

    def record(self, cell: Cell, **entry) -> None:
        with self.lock:
            self.status["cells"][f"{cell.grid}/{cell.name}"] = entry
            write_json_atomic(self.sweep.out / "status.json", self.status)

    def run(self, cell: Cell, overwrite: bool) -> bool:
        out = self.sweep.out
        try:
            removed, running = clean_partial(cell, out)
        except FileExistsError as e:  # another process is replacing the cell's folder: its run says more
            tqdm.write(f"{cell.grid}/{cell.name}: {e}", file=sys.stderr)
            removed, running = [], False
        for line in removed:
            tqdm.write(f"leftovers of an interrupted run of {cell.grid}/{cell.name}: {line}", file=sys.stderr)
        if running:
            tqdm.write(
                f"{cell.grid}/{cell.name}: a run of it is still going (it holds {cell.folder(out)}); "
                "its staging folder is left alone and this sweep's run of it will be refused",
                file=sys.stderr,
            )
        cmd = cell_command(cell, out, overwrite)
        log = out / cell.grid / f"{cell.name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        start = time.time()
        self.record(cell, state="running", command=cmd, log=str(log), started=start)
        with open(log, "a", encoding="utf-8") as f:
            f.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(cmd)}\n")
        rc = self.execute(cell, cmd, log)
        if rc is None:  # stopped before it started
            return False
        state = "done" if rc == 0 else ("interrupted" if self.stopping else "failed")
        self.record(cell, state=state, returncode=rc, command=cmd, log=str(log), seconds=time.time() - start)
        return rc == 0

    def execute(self, cell: Cell, cmd: list[str], log: Path) -> int | None:
        """Run ``cmd`` with its output appended to ``log``; its exit status (None: stopping)."""
        with open(log, "a", encoding="utf-8") as f:
            with self.lock:
                if self.stopping:
                    return None
                # own session: a Ctrl-C reaches the sweep, which stops its cells itself
                proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
                self.procs.add(proc)
            rc = proc.wait()
            with self.lock:
                self.procs.discard(proc)
        return rc

    def stop(self) -> None:
        with self.lock:
            self.stopping = True
            procs = list(self.procs)
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


@contextlib.contextmanager
def _folder_lock(out: Path):
    out.mkdir(parents=True, exist_ok=True)
    with open(out / ".sweep.lock", "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise FileExistsError(f"another sweep is running in {out}") from None
        yield


def run_sweep(sweep: Sweep, overwrite: bool = False, progress: bool = True, runner_type: type[Runner] = Runner) -> int:
    """Run every cell not yet done with ``runner_type`` (:class:`Runner`: local processes; the caller
    passes :class:`attnmetrics.app.sweep.slurm.SubmititRunner` for the cluster executors, so this
    module never imports that one); returns 0, 1 if a cell failed, 2 if refused (stale cells)."""
    out = sweep.out
    done = [c for c in sweep.cells if c.is_done(out)]
    unreadable = _unreadable(done, out)
    if unreadable and not overwrite:
        for why in unreadable.values():
            print(f"attnmetrics sweep: {why}; pass --overwrite to rerun the cell", file=sys.stderr)
        return 2
    stale = {c for c in done if c in unreadable or is_stale(c, out)}
    if stale and not overwrite:
        names = ", ".join(f"{c.grid}/{c.name}" for c in sorted(stale, key=lambda c: (c.grid, c.name))[:5])
        print(
            f"attnmetrics sweep: {len(stale)} finished cell(s) in {out} were run with other flags than this "
            f"config ({names}{', ...' if len(stale) > 5 else ''}); pass --overwrite to rerun them",
            file=sys.stderr,
        )
        return 2
    with _folder_lock(out):
        write_text_atomic(out / "sweep.toml", sweep.text)
        status = read_status(out / "status.json")
        runner = runner_type(sweep, status, progress)
        todo = [c for c in sweep.cells if c not in done or c in stale]
        for c in sweep.cells:
            if c in done and c not in stale:
                print(f"skip {c.grid}/{c.name}: done (results.json present)", file=sys.stderr)
                runner.record(c, state="done", log=str(out / c.grid / f"{c.name}.log"))
        failed = 0
        handlers = {s: signal.signal(s, _raise_interrupt) for s in (signal.SIGTERM, signal.SIGINT)}
        bar = tqdm(
            total=len(sweep.cells),
            initial=len(sweep.cells) - len(todo),
            desc="sweep",
            unit="cell",
            disable=not progress,
        )
        pool = cf.ThreadPoolExecutor(sweep.jobs)
        try:
            futures = {pool.submit(runner.run, c, c in stale): c for c in todo}
            for fut in cf.as_completed(futures):
                c = futures[fut]
                if not fut.result():
                    failed += 1
                    tqdm.write(f"FAILED {c.grid}/{c.name}: see {out / c.grid / (c.name + '.log')}", file=sys.stderr)
                bar.update()
                bar.set_postfix(failed=failed)
        except KeyboardInterrupt:
            print("attnmetrics sweep: interrupted; stopping the running cells (rerun to resume)", file=sys.stderr)
            runner.stop()
            return 130
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
            bar.close()
            for s, h in handlers.items():
                signal.signal(s, h)
    print(
        f"attnmetrics sweep: {len(sweep.cells) - failed}/{len(sweep.cells)} cells done, {failed} failed",
        file=sys.stderr,
    )
    return 1 if failed else 0
