"""A sweep's config: the TOML format, its checks, and its expansion into cells (one
``attnmetrics run`` each).

Config (TOML; relative paths resolve against the config file's folder; see configs/sweep.toml)::

    [sweep]
    out = "runs/sweep"                        # sweep folder (--out overrides, relative to the cwd)
    jobs = 2                                  # cells run at once (--jobs overrides)
    data_dirs = { sst = "path/to/sst" }       # --data-dir per dataset (the sweep's --data-dir sst=DIR overrides)
    compare = [["pretrained", "scratch"]]     # pairs of grids whose models the report compares, paired
                                              # on common seeds and test instances (optional)

    [defaults]                                # run flags for every cell
    epochs = 8
    threads = 1

    [[grid]]
    name = "wp"                               # sub-folder of the sweep folder
    datasets = ["sst", "mr"]                  # axes: the cells are their product
    encoders = ["lstm", "average"]            # (default: run's default encoder)
    attentions = ["tanh", "uniform"]          # (default: run's default attention)
    regularisers = ["none", "tying"]          # (optional: left out, --regulariser is not passed)
    prompts = ["sentiment", "sentiment-plain"] # (optional, with --model and a causal LM: zero-shot; the
                                              # prompts are then the group's replicates, not the seeds)
    seeds = [0, 1, 2]                         # (default: [0])
    skip = ["loo"]                            # any other key is a run flag for these cells

A flag key is the option without its dashes (``consistent_adversary`` or ``consistent-adversary``
-> ``--consistent-adversary``): ``true`` passes the bare flag, ``false`` leaves it out, a list
passes its items, anything else its value. Grid keys override ``[defaults]``. Keys that are not
options of ``attnmetrics run`` (or that the sweep sets itself: out, dataset, seed, ...) are errors.

Each cell runs ``python -m attnmetrics run ... --out OUT/GRID/CELL --no-progress`` in
its own process, CELL = ``DATASET-ENCODER-ATTENTION[-REGULARISER]-sSEED`` (``:`` -> ``_``), its
output appended to ``OUT/GRID/CELL.log``.

How the cells run, resume and are recorded: :mod:`attnmetrics.app.sweep.runner`.
"""

from __future__ import annotations

import argparse
import itertools
import re
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from attnmetrics.app.parser import build_parser
from attnmetrics.data import SST_FILES

#: grid axis -> the run option it sets
AXES = {
    "datasets": "dataset",
    "encoders": "encoder",
    "attentions": "attention",
    "regularisers": "regulariser",
    "seeds": "seed",
    "prompts": "prompt",
}
#: run options the sweep sets itself
RESERVED = {"out", "overwrite", "no_progress", "debug", "data_dir", *AXES.values()}
#: where cells run: ``local`` (subprocesses here), ``slurm`` (a job each, through submitit),
#: ``submitit-local`` (the slurm path on this machine: submitit's local executor, for trying a config)
EXECUTORS = ("local", "slurm", "submitit-local")
#: the [sweep.slurm] table (and the sweep command's flags of the same names): job resources
SLURM_KEYS = {"partition": str, "time_min": int, "gpus": int, "cpus": int, "mem_gb": int}
#: datasets read from a local folder (run's --data-dir), and the files that folder must hold
LOCAL_DATASETS = {"sst": SST_FILES}
#: results.json "config" keys that may differ without making a finished cell stale
IGNORED_CONFIG = {"out", "overwrite", "no_progress", "command", "debug"}


@dataclass(frozen=True)
class Cell:
    """One ``attnmetrics run``: its grid, axis values and full flag list (without --out)."""

    grid: str
    axes: dict = field(hash=False)
    flags: tuple

    def _setting(self) -> str:
        """The cell's name without its replicate (:attr:`replicate`)."""
        if "prompt" in self.axes:  # a prompted model (no encoder, no attention head) replicates over prompts
            parts = [self.axes["dataset"], "prompted", f"s{self.axes['seed']}"]
            return re.sub(r"[^A-Za-z0-9._-]", "_", "-".join(map(str, parts)))
        parts = [self.axes["dataset"], self.axes["encoder"], self.axes["attention"]]
        if "regulariser" in self.axes:
            parts.append(self.axes["regulariser"])
        return re.sub(r"[^A-Za-z0-9._-]", "_", "-".join(map(str, parts)))

    @property
    def replicate(self) -> int | str:
        """What the cells of one group differ in: the seed, or for a zero-shot prompted model
        (a ``prompts`` axis) the prompt: nothing is trained, and the template is a prompted
        model's source of variance (docs/results.md), so its intervals resample prompts, then instances."""
        return self.axes["prompt"] if "prompt" in self.axes else self.axes["seed"]

    @property
    def name(self) -> str:
        if "prompt" in self.axes:
            return self._setting() + "-p" + re.sub(r"[^A-Za-z0-9._-]", "_", str(self.axes["prompt"]))
        return self._setting() + f"-s{self.axes['seed']}"

    @property
    def group(self) -> str:
        """The cell's setting: cells of one group differ only in their replicate (seed or prompt)."""
        return f"{self.grid}/{self._setting()}"

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
    compare: list = field(default_factory=list)  # [(grid A, grid B)]: the report's paired model comparisons

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


def _read(path: Path) -> tuple[str, dict]:
    """The config's text and its TOML tables, the sections and their kinds checked."""
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
    return text, conf


def _head(head: dict, base: Path, out, jobs, executor, slurm, given_dirs) -> tuple[Path, int, str, dict, dict]:
    """The [sweep] table, overridden by the command's flags: (out, jobs, executor, slurm, data_dirs)."""
    extra = set(head) - {"out", "jobs", "data_dirs", "executor", "slurm", "compare"}
    if extra:
        raise ValueError(
            f"[sweep]: unknown keys {sorted(extra)}; expected out, jobs, data_dirs, executor, slurm, compare"
        )
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
    return out, jobs, executor, slurm, data_dirs


#: what a sweep writes in its folder beside the grids' folders (and its figures, *.png)
SWEEP_OWN_FILES = ("status.json", "aggregate.json", "report.md", "instances.parquet", "sweep.toml")


def _grid_name(i: int, grid, names: set[str]) -> str:
    """[[grid]] number ``i``'s name, checked: a folder name, not one of ``names`` (those before it)."""
    if not isinstance(grid, dict):
        raise ValueError(f"[[grid]] #{i + 1}: must be a table of axes and flags, got {grid!r}")
    name = grid.get("name")
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9._-]+", name) or set(name) == {"."}:
        raise ValueError(f"[[grid]] #{i + 1}: 'name' must be a folder name (letters, digits, . _ -), got {name!r}")
    if name in names:
        raise ValueError(f"[[grid]] {name!r}: duplicate grid name")
    if name in SWEEP_OWN_FILES or name.startswith(".") or name.endswith(".png"):
        raise ValueError(
            f"[[grid]] {name!r}: 'name' is a file the sweep writes in its folder (or a hidden name); choose another"
        )
    if "datasets" not in grid:
        raise ValueError(f"[[grid]] {name!r}: missing axis 'datasets'")
    return name


def _axes(name: str, grid: dict, options: dict[str, argparse.Action]) -> dict[str, list]:
    """A grid's axes (run option -> its values), each checked; a missing axis takes run's default
    (the seed 0; the regulariser and the prompt are then left out)."""
    axes = {}
    for axis, dest in AXES.items():
        values = grid.get(axis)
        if values is None:
            if dest in ("regulariser", "prompt"):
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
    return axes


def _grid_cells(
    name: str, grid: dict, defaults: dict, options: dict[str, argparse.Action], data_dirs: dict
) -> list[Cell]:
    """The cells of one grid: the product of its axes, each with the grid's flags over [defaults]."""
    axes = _axes(name, grid, options)
    flags = {k: v for k, v in {**defaults, **grid}.items() if k not in AXES and k != "name"}
    common = [f for k, v in flags.items() for f in _flag(k, v, options, f"[[grid]] {name!r}")]
    cells = []
    for values in itertools.product(*axes.values()):
        ax = dict(zip(axes, values))
        argv = []
        for dest, v in ax.items():
            argv += [options[dest].option_strings[-1], str(v)]
        if ax["dataset"] in data_dirs:
            argv += ["--data-dir", str(data_dirs[ax["dataset"]])]
        cells.append(Cell(name, ax, tuple(argv + common)))
    return cells


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
    text, conf = _read(path)
    head = dict(conf.get("sweep", {}))
    out, jobs, executor, slurm, data_dirs = _head(head, path.resolve().parent, out, jobs, executor, slurm, given_dirs)
    options = _run_options()
    grids = conf.get("grid", [])
    if not isinstance(grids, list) or not grids:
        raise ValueError(f"{path}: no [[grid]] tables")
    cells, names = [], set()
    for i, grid in enumerate(grids):
        name = _grid_name(i, grid, names)
        names.add(name)
        cells += _grid_cells(name, grid, conf.get("defaults", {}), options, data_dirs)
    seen = set()
    for c in cells:
        if (c.grid, c.name) in seen:
            raise ValueError(f"[[grid]] {c.grid!r}: two cells share the folder name {c.name!r}")
        seen.add((c.grid, c.name))
    return Sweep(out, jobs, cells, text, executor, slurm, data_dirs, _compare(head.get("compare", []), names))


def _compare(pairs, names: set[str]) -> list[tuple[str, str]]:
    """[sweep] compare: a list of [grid A, grid B] pairs of two different grids of the config."""
    if not isinstance(pairs, list):
        raise ValueError(f'[sweep]: compare must be a list of ["grid A", "grid B"] pairs, got {pairs!r}')
    out = []
    for pair in pairs:
        if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(g, str) for g in pair)):
            raise ValueError(f'[sweep]: compare takes pairs ["grid A", "grid B"], got {pair!r}')
        unknown = [g for g in pair if g not in names]
        if unknown:
            raise ValueError(f"[sweep]: compare names grids {unknown} that the config has not; it has {sorted(names)}")
        if pair[0] == pair[1]:
            raise ValueError(f"[sweep]: compare pairs a grid with itself: {pair!r}")
        out.append((pair[0], pair[1]))
    # a pair twice, or both ways round (the same comparison, its sign flipped): the report would repeat it
    twice = sorted({f"{list(p)!r} and {list(q)!r}" for k, p in enumerate(out) for q in out[k + 1 :] if {*p} == {*q}})
    if twice:
        raise ValueError(f"[sweep]: compare lists the same pair of grids twice: {'; '.join(twice)}; list each once")
    return out


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
