"""``python -m attnmetrics``: the command line (:mod:`attnmetrics.app.cli`)."""

import sys

from attnmetrics.app.cli import main

sys.exit(main())
