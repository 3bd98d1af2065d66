"""``attnmetrics sweep CONFIG.toml``: run a grid of ``attnmetrics run`` cells, resumably, then
aggregate them into one report (attnmetrics/app/aggregate.py).

Config (TOML; relative paths resolve against the config file's folder; see configs/sweep.toml)::

    [sweep]
    out = "runs/sweep"                        # sweep folder (--out overrides, relative to the cwd)
    jobs = 2                                  # cells run at once (--jobs overrides)
    data_dirs = { sst = "path/to/sst" }       # --data-dir per dataset (the sweep's --data-dir sst=DIR overrides)

    [defaults]                                # run flags for every cell
    epochs = 8
    threads = 1

    [[grid]]
    name = "wp"                               # sub-folder of the sweep folder
    datasets = ["sst", "mr"]                  # axes: the cells are their product
    encoders = ["lstm", "average"]            # (default: run's default encoder)
    attentions = ["tanh", "uniform"]          # (default: run's default attention)
    regularisers = ["none", "tying"]          # (optional: left out, --regulariser is not passed)
    seeds = [0, 1, 2]                         # (default: [0])
    skip = ["loo"]                            # any other key is a run flag for these cells

A flag key is the option without its dashes (``consistent_adversary`` or ``consistent-adversary``
-> ``--consistent-adversary``): ``true`` passes the bare flag, ``false`` leaves it out, a list
passes its items, anything else its value. Grid keys override ``[defaults]``. Keys that are not
options of ``attnmetrics run`` (or that the sweep sets itself: out, dataset, seed, ...) are errors.

Each cell runs ``python -m attnmetrics run ... --out OUT/GRID/CELL --no-progress`` in
its own process, CELL = ``DATASET-ENCODER-ATTENTION[-REGULARISER]-sSEED`` (``:`` -> ``_``), its
output appended to ``OUT/GRID/CELL.log``.

Resume and safety:
- a cell whose folder holds ``results.json`` run with the same flags is done and skipped; the
  staging folders (``.CELL.partial-*``) an interrupted run leaves are removed and the cell rerun;
- a finished cell whose recorded flags (``results.json`` "config") differ from the config's is
  *stale*: the sweep refuses to start unless ``--overwrite``, which reruns exactly the stale cells
  (each old folder is replaced only once its new run succeeds). Adding or removing cells is fine;
- failed cells are recorded in ``OUT/status.json`` (atomic) and the others go on; the exit status
  is 1 if any cell failed; one sweep at a time per folder (a lock file);
- ``OUT/sweep.toml`` keeps the config text of the last sweep started in the folder.

Executors (``[sweep] executor`` or ``--executor``): ``local`` runs each cell as a subprocess
here, ``jobs`` at a time. ``slurm`` submits each cell as a Slurm job through submitit
(attnmetrics/app/cluster.py; ``pip install submitit``), ``jobs`` in flight, with the resources of
``[sweep.slurm]`` (``partition``, ``time_min``, ``gpus``, ``cpus``, ``mem_gb``; flags of the same
names override them) and submitit's files in ``OUT/.submitit``; ``submitit-local`` is that path
on this machine (submitit's local executor). Resume, status, stale cells and the report are the
same for all three.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import fcntl
import itertools
import json
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from tqdm.auto import tqdm

from attnmetrics.app.io import remove_abandoned_claim, write_json_atomic, write_text_atomic
from attnmetrics.app.parser import build_parser, recipe_defaults

#: grid axis -> the run option it sets
AXES = {
    "datasets": "dataset",
    "encoders": "encoder",
    "attentions": "attention",
    "regularisers": "regulariser",
    "seeds": "seed",
}
#: run options the sweep sets itself
RESERVED = {"out", "overwrite", "no_progress", "debug", "data_dir", *AXES.values()}
#: where cells run: ``local`` (subprocesses here), ``slurm`` (a job each, through submitit),
#: ``submitit-local`` (the slurm path on this machine: submitit's local executor, for trying a config)
EXECUTORS = ("local", "slurm", "submitit-local")
#: the [sweep.slurm] table (and the sweep command's flags of the same names): job resources
SLURM_KEYS = {"partition": str, "time_min": int, "gpus": int, "cpus": int, "mem_gb": int}
#: datasets read from a local folder (run's --data-dir), and the files that folder must hold
LOCAL_DATASETS = {"sst": ("train.txt", "dev.txt", "test.txt")}
#: results.json "config" keys that may differ without making a finished cell stale
IGNORED_CONFIG = {"out", "overwrite", "no_progress", "command", "debug"}


@dataclass(frozen=True)
class Cell:
    """One ``attnmetrics run``: its grid, axis values and full flag list (without --out)."""

    grid: str
    axes: dict = field(hash=False)
    flags: tuple

    @property
    def name(self) -> str:
        parts = [self.axes["dataset"], self.axes["encoder"], self.axes["attention"]]
        if "regulariser" in self.axes:
            parts.append(self.axes["regulariser"])
        return re.sub(r"[^A-Za-z0-9._-]", "_", "-".join(map(str, parts)) + f"-s{self.axes['seed']}")

    @property
    def group(self) -> str:
        """The cell's name without the seed: cells of one group differ only in the seed."""
        return f"{self.grid}/{self.name.rsplit('-s', 1)[0]}"

    def folder(self, out: Path) -> Path:
        return out / self.grid / self.name

    def is_done(self, out: Path) -> bool:
        """A cell is done once its run folder holds results.json (run folders appear whole)."""
        return (self.folder(out) / "results.json").is_file()


@dataclass
class Sweep:
    out: Path
    jobs: int
    cells: list[Cell]
    text: str  # the config file's text
    executor: str = "local"  # EXECUTORS: where the cells run
    slurm: dict = field(default_factory=dict)  # the [sweep.slurm] table: SLURM_KEYS
    data_dirs: dict = field(default_factory=dict)  # dataset -> folder (absolute), config and --data-dir

    def missing_data(self) -> list[str]:
        """What keeps cells from finding their data, one line per dataset read from a local
        folder (LOCAL_DATASETS): no folder given, a folder that does not exist, or one without
        the dataset's files. Empty when every cell's data is there."""
        problems = []
        for dataset, files in LOCAL_DATASETS.items():
            n = sum(1 for c in self.cells if c.axes["dataset"] == dataset)
            if not n:
                continue
            cells = f"{n} cell{'s' if n > 1 else ''}"
            folder = self.data_dirs.get(dataset)
            if folder is None:
                problems.append(
                    f"dataset {dataset!r} ({cells}) needs its folder: pass --data-dir {dataset}=FOLDER "
                    f"(the folder holding {', '.join(files)}) or set [sweep] data_dirs"
                )
            elif not folder.is_dir():
                problems.append(f"dataset {dataset!r} ({cells}): data folder {folder} does not exist")
            elif lacking := [f for f in files if not (folder / f).is_file()]:
                problems.append(f"dataset {dataset!r} ({cells}): data folder {folder} lacks {', '.join(lacking)}")
        return problems


def _run_options() -> dict[str, argparse.Action]:
    """``attnmetrics run``'s options by dest, read from the CLI parser (so new flags need no change here)."""
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {a.dest: a for a in sub.choices["run"]._actions if a.option_strings}


def _flag(key: str, value, options: dict[str, argparse.Action], where: str) -> list[str]:
    dest = key.replace("-", "_")
    if dest in RESERVED:
        raise ValueError(
            f"{where}: key {key!r} is set by the sweep itself"
            + (
                f"; use the grid axis {next(k for k, v in AXES.items() if v == dest)!r}"
                if dest in AXES.values()
                else ""
            )
        )
    if dest not in options:
        raise ValueError(
            f"{where}: unknown key {key!r}: neither a grid axis ({', '.join(AXES)}) nor an option of 'attnmetrics run'"
        )
    action = options[dest]
    opt = action.option_strings[-1]
    if isinstance(value, bool):
        if action.nargs != 0:  # only on/off flags take true/false
            raise ValueError(f"{where}: key {key!r} takes a value, got {str(value).lower()}")
        return [opt] if value else []
    if isinstance(value, dict):
        raise ValueError(f"{where}: key {key!r} must be a value or a list, got a table")
    if isinstance(value, list) and not value:
        raise ValueError(f"{where}: key {key!r} is an empty list")
    texts = list(map(str, value)) if isinstance(value, list) else [str(value)]
    for text in texts:  # checked now, as 'run' would, not when each cell starts
        try:
            typed = action.type(text) if action.type else text
        except (ValueError, TypeError, argparse.ArgumentTypeError) as e:
            raise ValueError(f"{where}: key {key!r}: invalid value {text!r} ({e})") from None
        if action.choices is not None and typed not in action.choices:
            raise ValueError(f"{where}: key {key!r}: {text!r} is not one of {sorted(action.choices)}")
    return [opt, *texts]


def _resolve(base: Path, path: str) -> Path:
    p = Path(path).expanduser()
    return (p if p.is_absolute() else base / p).resolve()


def load_config(
    path: str | Path,
    out: Path | None = None,
    jobs: int | None = None,
    executor: str | None = None,
    slurm: dict | None = None,
    given_dirs: dict[str, Path] | None = None,
) -> Sweep:
    """Read a sweep config (format in the module docstring) and expand its grids into cells.
    ``given_dirs`` (dataset -> folder, relative to the cwd: the sweep's ``--data-dir``) add to
    and override the config's ``data_dirs``.

    Raises:
        FileNotFoundError: no such config file.
        ValueError: malformed TOML, unknown sections or keys, empty or ill-typed axes, duplicate
            grid names or cells; each message names the grid and key.
    """
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path} is a folder; give the sweep's TOML config file")
    text = path.read_text(encoding="utf-8")
    try:
        conf = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{path}: not valid TOML: {e}") from None
    unknown = set(conf) - {"sweep", "defaults", "grid"}
    if unknown:
        raise ValueError(f"{path}: unknown sections {sorted(unknown)}; expected [sweep], [defaults], [[grid]]")
    for section, kind in (("sweep", dict), ("defaults", dict), ("grid", list)):
        if not isinstance(conf.get(section, kind()), kind):
            shape = "a table [" + section + "]" if kind is dict else "tables [[grid]]"
            raise ValueError(f"{path}: {section} must be {shape}, got {conf[section]!r}")
    base = path.resolve().parent
    head = dict(conf.get("sweep", {}))
    extra = set(head) - {"out", "jobs", "data_dirs", "executor", "slurm"}
    if extra:
        raise ValueError(f"[sweep]: unknown keys {sorted(extra)}; expected out, jobs, data_dirs, executor, slurm")
    executor = executor if executor is not None else head.get("executor", "local")
    if executor not in EXECUTORS:
        raise ValueError(f"executor must be one of {EXECUTORS}, got {executor!r}")
    slurm = {**head.get("slurm", {}), **(slurm or {})}
    bad = {k: v for k, v in slurm.items() if k not in SLURM_KEYS or not isinstance(v, SLURM_KEYS[k])}
    if bad:
        expected = ", ".join(f"{k} ({t.__name__})" for k, t in SLURM_KEYS.items())
        raise ValueError(f"[sweep.slurm]: bad keys or values {bad}; expected {expected}")
    out = Path(out).resolve() if out is not None else _resolve(base, head.get("out", "runs/sweep"))
    jobs = jobs if jobs is not None else head.get("jobs", 1)
    if not isinstance(jobs, int) or isinstance(jobs, bool) or jobs < 1:
        raise ValueError(f"jobs must be an integer >= 1, got {jobs!r}")
    data_dirs = head.get("data_dirs", {})
    if not isinstance(data_dirs, dict) or not all(isinstance(v, str) for v in data_dirs.values()):
        raise ValueError(f'[sweep]: data_dirs must be a table of dataset = "folder", got {data_dirs!r}')
    data_dirs = {k: _resolve(base, v) for k, v in data_dirs.items()}
    data_dirs |= {k: Path(v).expanduser().resolve() for k, v in (given_dirs or {}).items()}

    options = _run_options()
    defaults = conf.get("defaults", {})
    grids = conf.get("grid", [])
    if not isinstance(grids, list) or not grids:
        raise ValueError(f"{path}: no [[grid]] tables")
    cells, names = [], set()
    for i, grid in enumerate(grids):
        if not isinstance(grid, dict):
            raise ValueError(f"[[grid]] #{i + 1}: must be a table of axes and flags, got {grid!r}")
        name = grid.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9._-]+", name) or set(name) == {"."}:
            raise ValueError(f"[[grid]] #{i + 1}: 'name' must be a folder name (letters, digits, . _ -), got {name!r}")
        if name in names:
            raise ValueError(f"[[grid]] {name!r}: duplicate grid name")
        names.add(name)
        if "datasets" not in grid:
            raise ValueError(f"[[grid]] {name!r}: missing axis 'datasets'")
        axes = {}
        for axis, dest in AXES.items():
            values = grid.get(axis)
            if values is None:
                if dest == "regulariser":
                    continue
                values = [0] if dest == "seed" else [options[dest].default]
            if not isinstance(values, list) or not values:
                raise ValueError(f"[[grid]] {name!r}: axis {axis!r} must be a non-empty list, got {values!r}")
            if len(set(map(str, values))) != len(values):
                raise ValueError(f"[[grid]] {name!r}: axis {axis!r} repeats a value: {values!r}")
            choices = options[dest].choices
            bad = [v for v in values if choices is not None and v not in choices]
            if dest == "seed":
                bad = [v for v in values if not isinstance(v, int) or isinstance(v, bool)]
            if bad:
                raise ValueError(
                    f"[[grid]] {name!r}: axis {axis!r} has invalid values {bad}"
                    + (f"; choose from {sorted(choices)}" if choices and dest != "seed" else "")
                )
            axes[dest] = values
        flags = {k: v for k, v in {**defaults, **grid}.items() if k not in AXES and k != "name"}
        common = [f for k, v in flags.items() for f in _flag(k, v, options, f"[[grid]] {name!r}")]
        for values in itertools.product(*axes.values()):
            ax = dict(zip(axes, values))
            argv = []
            for dest, v in ax.items():
                argv += [options[dest].option_strings[-1], str(v)]
            if ax["dataset"] in data_dirs:
                argv += ["--data-dir", str(data_dirs[ax["dataset"]])]
            cells.append(Cell(name, ax, tuple(argv + common)))
    seen = set()
    for c in cells:
        if (c.grid, c.name) in seen:
            raise ValueError(f"[[grid]] {c.grid!r}: two cells share the folder name {c.name!r}")
        seen.add((c.grid, c.name))
    return Sweep(out, jobs, cells, text, executor, slurm, data_dirs)


def cell_command(cell: Cell, out: Path, overwrite: bool = False) -> list[str]:
    """The subprocess argv of one cell."""
    return [
        sys.executable,
        "-m",
        "attnmetrics",
        "run",
        *cell.flags,
        "--out",
        str(cell.folder(out)),
        "--no-progress",
        *(["--overwrite"] if overwrite else []),
    ]


def _config_of(argv: list[str]) -> dict:
    args = build_parser().parse_args(argv)
    recipe_defaults(args)  # as the run itself records them
    return json.loads(json.dumps({k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}))


def is_stale(cell: Cell, out: Path) -> bool:
    """Whether the finished cell's results.json was run with flags other than the config's
    (options unknown to the older run are not compared)."""
    recorded = json.loads((cell.folder(out) / "results.json").read_text()).get("config", {})
    wanted = _config_of(cell_command(cell, out)[3:])
    return any(recorded[k] != v for k, v in wanted.items() if k in recorded and k not in IGNORED_CONFIG)


def clean_partial(cell: Cell, out: Path) -> list[Path]:
    """Remove the staging folders an interrupted run of ``cell`` left behind; returns them."""
    leftovers = sorted((out / cell.grid).glob(f".{cell.name}.partial-*"))
    for p in leftovers:
        shutil.rmtree(p)
    if remove_abandoned_claim(cell.folder(out)):  # claimed by a run killed before it finished
        leftovers.append(cell.folder(out))
    return leftovers


class _Runner:
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
        for p in clean_partial(cell, out):
            tqdm.write(f"removed the leftovers of an interrupted run: {p}", file=sys.stderr)
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


def run_sweep(sweep: Sweep, overwrite: bool = False, progress: bool = True) -> int:
    """Run every cell not yet done; returns 0, 1 if a cell failed, 2 if refused (stale cells)."""
    out = sweep.out
    done = [c for c in sweep.cells if c.is_done(out)]
    stale = {c for c in done if is_stale(c, out)}
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
        status_path = out / "status.json"
        status = json.loads(status_path.read_text()) if status_path.is_file() else {"cells": {}}
        if sweep.executor == "local":
            runner = _Runner(sweep, status, progress)
        else:
            from attnmetrics.app.cluster import SubmititRunner  # submitit: an optional extra

            runner = SubmititRunner(sweep, status, progress)
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


def main(args: argparse.Namespace) -> int:
    """The ``sweep`` subcommand: run (or list, or only aggregate) a config's cells, then write
    OUT/report.md, OUT/aggregate.json and the figures."""
    from attnmetrics.app.aggregate import aggregate_sweep

    try:
        slurm = {k: getattr(args, k) for k in SLURM_KEYS if getattr(args, k, None) is not None}
        sweep = load_config(args.config, args.out, args.jobs, args.executor, slurm, dict(args.data_dir or ()))
    except (ValueError, FileNotFoundError) as e:
        print(f"attnmetrics sweep: {e}", file=sys.stderr)
        return 2
    missing = [] if args.report_only else sweep.missing_data()
    if missing:  # before any cell starts, not as a failure in each cell's log
        for line in missing:
            print(f"attnmetrics sweep: {line}", file=sys.stderr)
        return 2
    if args.dry_run:
        for c in sweep.cells:
            state = "done" if c.is_done(sweep.out) else "todo"
            print(f"{state}\t{c.grid}/{c.name}\t{' '.join(cell_command(c, sweep.out)[3:])}")
        print(f"{len(sweep.cells)} cells in {sweep.out}", file=sys.stderr)
        return 0
    rc = 0
    if not args.report_only:
        try:
            rc = run_sweep(sweep, args.overwrite, progress=not args.no_progress)
        except FileExistsError as e:
            print(f"attnmetrics sweep: {e}", file=sys.stderr)
            return 2
        if rc in (2, 130):
            return rc
    path = aggregate_sweep(sweep)
    print(f"wrote {path}", file=sys.stderr)
    return rc
