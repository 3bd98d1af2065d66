"""``attnmetrics sweep CONFIG.toml``: run a grid of ``attnmetrics run`` cells, resumably, then
aggregate them into one report (:mod:`attnmetrics.app.aggregate`); the subcommand itself is
:mod:`attnmetrics.app.commands.sweep`.

- :mod:`~attnmetrics.app.sweep.config`: the TOML format, its checks, the cells;
- :mod:`~attnmetrics.app.sweep.runner`: running the cells here, resume and status;
- :mod:`~attnmetrics.app.sweep.slurm`: the cells as Slurm jobs through submitit (optional).
"""

from __future__ import annotations

from attnmetrics.app.sweep.config import Cell, Sweep, cell_command, load_config
from attnmetrics.app.sweep.runner import Runner, run_sweep

__all__ = ["Cell", "Runner", "Sweep", "cell_command", "load_config", "run_sweep"]
