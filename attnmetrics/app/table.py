"""One long table of per-instance results (Parquet), for a run and for a whole sweep.

A run's ``results.json`` keeps its per-instance values under ``"instances"``, nested by
experiment (``{"flip": {"attention": {"removed": [...], ...}}, "kendall": {...}, ...}``). This
module flattens them into rows that pandas, polars or DuckDB read directly:

- a run: ``instances.parquet`` with columns ``instance`` (int64, the test instance's index in
  split order), ``sample`` (int64: 0, the draw of a random order with several samples, or the
  index into a per-run list such as the model-consistent adversary's λ; such run-level lists
  themselves are not rows: a flat list beside lists of per-sample lists is one, whatever its length),
  ``experiment`` and ``statistic`` (strings: the first key, and the rest joined by ``/``; the
  per-instance basics ``predicted``, ``lengths``, ``max_attention`` have experiment
  ``"instance"``) and ``value`` (float64; booleans are 0/1; NaN where results.json has null);
- a sweep: ``instances.parquet`` in the sweep folder, every finished cell's rows under its
  ``cell`` (``grid/name``), ``grid`` and ``group``, its axes (``dataset``, ``encoder``,
  ``attention``, ``seed`` and any other the grid sets) and the model setting of
  :func:`attnmetrics.app.aggregate.model_setting`, as columns. Config columns are strings
  (null where a cell has no such setting), except ``seed`` (int64).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import pyarrow as pa

#: the columns of a run's table, in order
RUN_COLUMNS = ("instance", "sample", "experiment", "statistic", "value")


def _leaves(node: dict, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], list]]:
    """(key path, list of per-instance values) of every list in the nested dict, but for the
    run-level lists: a flat list beside lists of per-sample lists labels those samples (the
    model-consistent adversary's λ grid beside its per-λ lists of instances), whatever its length."""
    per_sample = any(isinstance(v, list) and v and isinstance(v[0], list) for v in node.values())
    for key, value in node.items():
        if isinstance(value, dict):
            yield from _leaves(value, (*path, key))
        elif isinstance(value, list) and not (per_sample and not (value and isinstance(value[0], list))):
            yield (*path, key), value


def run_table(instances: dict) -> pa.Table:
    """The long table of one run's ``results["instances"]`` (see the module docstring)."""
    n = len(instances.get("predicted", []))
    columns: dict[str, list] = {name: [] for name in RUN_COLUMNS}
    for path, values in _leaves(instances):
        experiment, statistic = (path[0], "/".join(path[1:])) if len(path) > 1 else ("instance", path[0])
        if values and isinstance(values[0], list):  # one list of instances per sample (e.g. per λ)
            sample = np.concatenate([np.full(len(v), s, dtype=np.int64) for s, v in enumerate(values)])
            instance = np.concatenate([np.arange(len(v)) for v in values])
            values = [x for v in values for x in v]
        elif not n or len(values) % n == 0:  # instances, sample after sample
            index = np.arange(len(values))
            instance, sample = (index % n, index // n) if n else (index, np.zeros_like(index))
        else:
            continue  # a run-level list (e.g. the adversary's λ grid), not per instance
        m = len(values)
        columns["instance"].append(instance)
        columns["sample"].append(sample)
        columns["experiment"].append(np.full(m, experiment, dtype=object))
        columns["statistic"].append(np.full(m, statistic, dtype=object))
        columns["value"].append(np.array([np.nan if v is None else float(v) for v in values], dtype=np.float64))
    types = {"instance": pa.int64(), "sample": pa.int64(), "experiment": pa.string(), "statistic": pa.string()}
    types["value"] = pa.float64()
    return pa.table(
        {name: pa.array(np.concatenate(parts) if parts else [], types[name]) for name, parts in columns.items()}
    )


def sweep_table(cells: Iterable[tuple[str, str, str, dict, dict]]) -> pa.Table:
    """One table of finished cells ``(cell, grid, group, config, results)``: each cell's
    :func:`run_table` with its config as columns (strings, ``seed`` int64)."""
    tables, config_keys = [], []
    for cell, grid, group, config, results in cells:
        table = run_table(results.get("instances", {}))
        for key in config:
            if key not in config_keys:
                config_keys.append(key)
        tables.append((cell, grid, group, config, table))
    out = []
    for cell, grid, group, config, table in tables:
        rows = table.num_rows
        columns = {
            "cell": pa.array([cell] * rows, pa.string()),
            "grid": pa.array([grid] * rows, pa.string()),
            "group": pa.array([group] * rows, pa.string()),
        }
        for key in config_keys:
            value = config.get(key)
            if key == "seed":
                columns[key] = pa.array([value] * rows, pa.int64())
            else:
                columns[key] = pa.array([None if value is None else str(value)] * rows, pa.string())
        out.append(pa.table({**columns, **{name: table[name] for name in RUN_COLUMNS}}))
    if not out:
        return pa.table({name: pa.array([], pa.string()) for name in ("cell", "grid", "group")})
    return pa.concat_tables(out)
