"""A resumable battery (``run``/``evaluate --resumable``): each finished instance block's
per-instance values kept on disk, so a run that is killed, cut off or out of machine time continues
from the blocks it finished when the same command is started again.

The folder is ``.OUT.battery`` beside the run folder ``OUT`` (the run folder itself is staged and
appears only once the run succeeds, :func:`attnmetrics.app.io.run_folder`; a dead run's staging
folder is removed by the next claim, so the blocks cannot live in it). It holds ``blocks.json``
(what the blocks were computed from) and one ``block-FIRST.npz`` per finished block (FIRST: the
global index of its first instance): :func:`attnmetrics.app.battery.collect`'s values and wall
seconds for that block, and the commit of the code that computed it. A block's values do not
depend on the blocks around it (every random draw is keyed by instance:
:class:`attnmetrics.KeyedRows`), so blocks computed by different processes, before and after a
restart, merge into the values one uninterrupted run gives.

A block is reused only when the run is the same: the same flags (those that change a value:
not ``--out``, ``--threads``, ``--examples``, ...), the same model weights (every parameter and
buffer, hashed: a model trained again that is not bit-for-bit the first is refused) and the same
test instances in the same blocks. Anything else is refused in one line that names what differs;
the folder is never overwritten or removed by a run that does not match it. It is removed once the
run folder is written.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from attnmetrics.app.io import write_json_atomic, write_npz_atomic

#: blocks.json's format; a folder of another format is refused
FORMAT = 1
#: the config keys that change no value of the battery (where it is written, how fast, what is shown;
#: where the data was read from: the test instances themselves are fingerprinted, so a copy of the
#: data in another folder, on another machine, continues the blocks)
NOT_FINGERPRINTED = frozenset(
    {"command", "out", "overwrite", "no_progress", "debug", "threads", "examples", "resumable", "flags", "data_dir"}
)
#: what a fingerprint covers, in blocks.json and in a refusal's words
PARTS = {
    "flags": "the run's flags and battery settings",
    "model": "the model's weights",
    "instances": "the test instances or their blocks",
}


def blocks_folder(out: str | Path) -> Path:
    """Where ``--resumable`` keeps the battery's blocks of the run folder ``out``: ``.OUT.battery``
    beside it."""
    out = Path(out)
    return out.parent / f".{out.name}.battery"


def _hash_tensors(h, named: Iterable[tuple[str, Tensor]]) -> None:
    for name, t in named:
        t = t.detach().to("cpu").contiguous().reshape(-1)
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().data if t.numel() else b"")


def fingerprints(
    config: Mapping[str, Any],
    settings: Mapping[str, Any],
    model: torch.nn.Module,
    batches: Sequence[tuple[int, Tensor, Tensor]],
) -> dict[str, str]:
    """sha256 of each of :data:`PARTS`: ``config`` (results.json's "config", less
    :data:`NOT_FINGERPRINTED`) with the battery's ``settings`` and the model's device type; the
    model's parameters and buffers (names, dtypes, shapes, bytes); the blocks (first index,
    token ids, lengths)."""
    flags = {k: v for k, v in config.items() if k not in NOT_FINGERPRINTED}
    device = next(model.parameters()).device.type
    text = json.dumps({"config": flags, "settings": settings, "device": device}, sort_keys=True, default=str)
    weights = hashlib.sha256(type(model).__qualname__.encode())
    seen = {}
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        seen.setdefault(name, t)
    _hash_tensors(weights, sorted(seen.items()))
    instances = hashlib.sha256()
    for first, tokens, lengths in batches:
        instances.update(f"{first}|".encode())
        _hash_tensors(instances, [("tokens", tokens), ("lengths", lengths)])
    return {
        "flags": hashlib.sha256(text.encode()).hexdigest(),
        "model": weights.hexdigest(),
        "instances": instances.hexdigest(),
    }


def remove_blocks(folder: str | Path) -> None:
    """Remove a run's blocks folder once its run folder is written (the blocks are in its results)."""
    shutil.rmtree(folder, ignore_errors=True)


class BatteryBlocks:
    """One run's finished battery blocks in ``folder`` (:func:`blocks_folder`).

    Use :meth:`open` before the battery, :meth:`done` for the blocks finished earlier,
    :meth:`save` as each block finishes (the ``on_block`` of
    :func:`attnmetrics.app.battery.collect`), :meth:`load` for a finished block's values;
    :func:`remove_blocks` once the run folder is written.
    """

    def __init__(self, folder: Path, commit: str | None):
        self.folder, self.commit = Path(folder), commit

    @classmethod
    def open(
        cls,
        folder: str | Path,
        prints: Mapping[str, str],
        blocks: int,
        rows: int,
        commit: str | None,
    ) -> BatteryBlocks:
        """The blocks kept in ``folder``, made if missing (``blocks.json`` holding ``prints``,
        :func:`fingerprints`, and the number of ``blocks`` of at most ``rows`` instances).

        Raises:
            ValueError: ``folder`` holds blocks of another run (names what differs: the flags,
                the model's weights, the test instances), or a blocks.json this version
                cannot read; ``folder`` is left as it is.
        """
        folder = Path(folder)
        meta_path = folder / "blocks.json"
        meta = {"format": FORMAT, "fingerprints": dict(prints), "blocks": blocks, "rows_per_block": rows}
        if meta_path.exists():
            try:
                found = json.loads(meta_path.read_text())
                theirs = found["fingerprints"]
                if found.get("format") != FORMAT:
                    raise ValueError(f"format {found.get('format')!r}, this version writes {FORMAT}")
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(
                    f"--resumable: {meta_path} cannot be read ({e}); remove {folder} or run without --resumable"
                ) from None
            differ = [PARTS[k] for k in PARTS if theirs.get(k) != prints[k]]
            if differ:
                raise ValueError(
                    f"--resumable: {folder} holds battery blocks of another run ({', '.join(differ)} differ "
                    f"from this run's); remove it to start again, or run the command that made it"
                )
        else:
            folder.mkdir(parents=True, exist_ok=True)
            write_json_atomic(meta_path, meta)
        return cls(folder, commit)

    def _path(self, first: int) -> Path:
        return self.folder / f"block-{first:09d}.npz"

    def done(self, firsts: Iterable[int]) -> list[int]:
        """The blocks among ``firsts`` (their first instances' indices) saved here."""
        return [f for f in firsts if self._path(f).exists()]

    def save(self, first: int, values: Mapping[str, np.ndarray], seconds: Mapping[str, float]) -> None:
        """Keep block ``first``'s per-instance ``values`` and wall ``seconds`` (atomically)."""
        arrays = {f"value/{k}": np.asarray(v) for k, v in values.items()}
        arrays.update({f"seconds/{k}": np.asarray(v, dtype=np.float64) for k, v in seconds.items()})
        arrays["commit"] = np.asarray(self.commit or "")
        write_npz_atomic(self._path(first), **arrays)

    def load(self, first: int) -> tuple[dict[str, np.ndarray], dict[str, float], str]:
        """Block ``first``'s (values, seconds, commit) as :meth:`save` kept them.

        Raises:
            ValueError: the file cannot be read as a block (names it).
        """
        path = self._path(first)
        try:
            with np.load(path, allow_pickle=False) as z:
                values = {k.split("/", 1)[1]: z[k] for k in z.files if k.startswith("value/")}
                seconds = {k.split("/", 1)[1]: float(z[k]) for k in z.files if k.startswith("seconds/")}
                commit = str(z["commit"])
        except (OSError, ValueError, KeyError) as e:
            raise ValueError(f"--resumable: {path} cannot be read as a battery block ({e}); remove it") from None
        instances = values.get("instance")
        if instances is None or not len(instances) or int(instances[0]) != first:
            raise ValueError(f"--resumable: {path} does not hold block {first}'s instances; remove it")
        return values, seconds, commit
