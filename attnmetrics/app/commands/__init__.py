"""The ``attnmetrics`` subcommands, one module each, each with the function the command line
(:mod:`attnmetrics.app.cli`) calls and the typed arguments it takes:

- :mod:`~attnmetrics.app.commands.run`, :mod:`~attnmetrics.app.commands.train`,
  :mod:`~attnmetrics.app.commands.evaluate`: a :class:`~attnmetrics.app.config.RunConfig`, run by
  :mod:`attnmetrics.app.pipeline`;
- :mod:`~attnmetrics.app.commands.report`: :class:`~attnmetrics.app.commands.report.ReportArgs`;
- :mod:`~attnmetrics.app.commands.sweep`: :class:`~attnmetrics.app.commands.sweep.SweepArgs`;
- :mod:`~attnmetrics.app.commands.pretrain`: :class:`~attnmetrics.app.commands.pretrain.PretrainArgs`.
"""

from __future__ import annotations

import argparse
from dataclasses import fields
from typing import TypeVar

T = TypeVar("T")


def args_from(cls: type[T], args: argparse.Namespace) -> T:
    """A command's arguments dataclass ``cls`` from argparse's namespace (its fields by name)."""
    return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})
