"""A data set as train/dev/test lists of ``(text, label)``, the shape every reader returns (the
single-text corpora, bAbI's generator, the SNLI and CNN readers) and every command reads."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

#: one example: a text (or a :class:`attnmetrics.data.pairs.Pair`) and its label's index
Example = tuple[str, int]


@dataclass(frozen=True)
class Splits:
    """train/dev/test lists of ``(text, label)``; ``classes[label]`` names a label.
    ``info`` records where the data came from and what cleaning dropped (for results.json)."""

    name: str
    classes: tuple[str, ...]
    train: list[Example]
    dev: list[Example]
    test: list[Example]
    info: dict = field(default_factory=dict)

    def sizes(self) -> dict[str, int]:
        return {"train": len(self.train), "dev": len(self.dev), "test": len(self.test)}

    def summary(self) -> str:
        """One line: sizes and the share of each class in train."""
        counts = np.bincount([y for _, y in self.train], minlength=len(self.classes))
        share = ", ".join(f"{c} {n / max(len(self.train), 1):.0%}" for c, n in zip(self.classes, counts))
        s = self.sizes()
        return f"{self.name}: train {s['train']:,} / dev {s['dev']:,} / test {s['test']:,} ({share})"
