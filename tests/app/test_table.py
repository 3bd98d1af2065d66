"""The long per-instance table (app/table.py) against the nested results it flattens."""

from __future__ import annotations

import math

import numpy as np
import pyarrow.parquet as pq
import pytest

from attnmetrics.app.io import write_parquet_atomic
from attnmetrics.app.table import RUN_COLUMNS, run_table, sweep_table

INSTANCES = {
    "predicted": [1, 0, 1],
    "lengths": [5, 1, 3],
    "max_attention": [0.5, 1.0, 0.7],
    "flip": {
        "attention": {"removed": [2, -1, 1], "fraction": [0.4, None, 1 / 3]},
        "random": {"removed": [1, -1, 2, 3, -1, 1], "fraction": [0.2, None, 2 / 3, 0.6, None, 1 / 3]},  # 2 samples
    },
    "kendall": {"attention vs gradient": {"tau": [0.1, None, -0.2], "pvalue": [0.5, None, 0.9]}},
    "single_removal": {"top": {"jsd": [0.01, None, 0.2], "flipped": [False, False, True]}},
    # W&P's model-consistent adversary: a λ grid (a run-level list) and one list of instances per λ
    "consistent_adversary": {"lambda": [0.1, 1.0], "tvd": [[0.01, 0.02, 0.03], [0.1, 0.2, 0.3]]},
}


def lookup(table, experiment, statistic):
    rows = [r for r in table.to_pylist() if r["experiment"] == experiment and r["statistic"] == statistic]
    return [(r["instance"], r["sample"], r["value"]) for r in rows]


def test_run_table_holds_every_value_once_at_its_instance_and_sample():
    table = run_table(INSTANCES)
    assert tuple(table.column_names) == RUN_COLUMNS
    assert table.num_rows == 3 * 3 + 3 * 2 + 6 * 2 + 3 * 2 + 3 * 2 + 2 * 3
    assert lookup(table, "instance", "lengths") == [(0, 0, 5.0), (1, 0, 1.0), (2, 0, 3.0)]
    random = lookup(table, "flip", "random/removed")
    assert [(i, s) for i, s, _ in random] == [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1)]
    assert [v for *_, v in random] == [1, -1, 2, 3, -1, 1]
    tau = lookup(table, "kendall", "attention vs gradient/tau")
    assert tau[0][2] == 0.1 and math.isnan(tau[1][2])  # null in results.json -> NaN
    assert [v for *_, v in lookup(table, "single_removal", "top/flipped")] == [0.0, 0.0, 1.0]
    assert lookup(table, "consistent_adversary", "tvd")[4] == (1, 1, 0.2)  # instance 1 at the second λ
    assert not lookup(table, "consistent_adversary", "lambda")


def test_sweep_table_puts_each_cells_config_beside_its_rows(tmp_path):
    cells = [
        ("g/a-s0", "g", "g/a", {"dataset": "sst", "seed": 0, "lr": 0.001}, {"instances": INSTANCES}),
        ("g/a-s1", "g", "g/a", {"dataset": "sst", "seed": 1, "pretrained": True}, {"instances": INSTANCES}),
    ]
    table = sweep_table(cells)
    n = run_table(INSTANCES).num_rows
    assert table.num_rows == 2 * n
    assert table.column_names[:7] == ["cell", "grid", "group", "dataset", "seed", "lr", "pretrained"]
    rows = table.to_pylist()
    assert rows[0]["lr"] == "0.001" and rows[0]["pretrained"] is None and rows[0]["seed"] == 0
    assert rows[n]["lr"] is None and rows[n]["pretrained"] == "True" and rows[n]["cell"] == "g/a-s1"
    path = tmp_path / "instances.parquet"
    write_parquet_atomic(path, table)
    back = pq.read_table(path)
    assert back.schema == table.schema
    for name in table.column_names:  # (Table.equals would call NaN unequal to itself)
        np.testing.assert_array_equal(
            back[name].to_numpy(zero_copy_only=False), table[name].to_numpy(zero_copy_only=False)
        )
    assert [p.name for p in tmp_path.iterdir()] == ["instances.parquet"]  # no temporary left behind


def test_pandas_reads_it_directly(tmp_path):
    pd = pytest.importorskip("pandas")
    path = tmp_path / "instances.parquet"
    write_parquet_atomic(path, run_table(INSTANCES))
    t = pd.read_parquet(path)
    assert t[t.statistic == "attention vs gradient/tau"].value.mean() == pytest.approx(-0.05)


@pytest.mark.parametrize("grid", [[0.1, 1.0, 10.0], [0.1, 1.0, 10.0, 100.0, 0.5, 2.0]])
def test_a_run_level_list_as_long_as_the_instances_is_not_taken_for_them(grid):
    # issue 31, item 12: a λ grid of as many values as instances (or a multiple) became "instances"
    instances = {**INSTANCES, "consistent_adversary": {"lambda": grid, "tvd": [[0.01, 0.02, 0.03]] * len(grid)}}
    table = run_table(instances)
    assert not lookup(table, "consistent_adversary", "lambda")
    assert len(lookup(table, "consistent_adversary", "tvd")) == 3 * len(grid)
    assert table.num_rows == run_table(INSTANCES).num_rows + 3 * (len(grid) - 2)
