"""The errors a user's input causes (files, folders, flags, data) and how the commands show them:
one line, no traceback unless ``--debug``."""

from __future__ import annotations

import sys

from attnmetrics.app.io import UnwritableFolder
from attnmetrics.data import ArtifactError

#: errors that a user's input causes (files, folders, flags, data): one line, no traceback
INPUT_ERRORS = (FileExistsError, FileNotFoundError, ValueError, ArtifactError, UnwritableFolder)


def input_error(e: Exception, debug: bool) -> int:
    """Print ``e`` (and its notes) as one line, return the exit code 2; with ``debug``, raise it."""
    if debug:
        raise e
    notes = "".join(f"; {n}" for n in getattr(e, "__notes__", []))
    print(f"attnmetrics: {e}{notes} (--debug shows the traceback)", file=sys.stderr)
    return 2
