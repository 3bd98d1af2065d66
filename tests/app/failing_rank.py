"""``attnmetrics`` with rank 1's share of the battery failing midway (for torchrun tests):
``torchrun --nproc-per-node 2 -m tests.app.failing_rank evaluate RUN --out OUT``."""

import os
import sys

from attnmetrics.app import cli, faithfulness

_collect = faithfulness.collect


def _failing_collect(model, batches, **kw):
    if os.environ.get("RANK") == "1":
        batches = list(batches)
        _collect(model, batches[:1], **kw)  # some work first, then the failure
        raise RuntimeError("injected failure in rank 1's battery")
    return _collect(model, batches, **kw)


faithfulness.collect = _failing_collect
sys.exit(cli.main())
