"""Protocol presets: ``--protocol jain-wallace`` follows Jain & Wallace's code where attnmetrics'
defaults differ (docs/definitions.md §13); the default, ``attnmetrics``, changes nothing.

What the preset sets (each recorded under ``protocol`` in results.json):

- SST length filter (their preprocessing): sentences of at most 5 tokens are dropped, and the
  longest sentence of each split, which leaves 6,355 / 1,725 train / test sentences (J&W's
  Table 1); the other datasets are not filtered.
- Training: a positive-class weight N / N_pos - 1 in the binary loss, batches of rows of similar
  length in a shuffled order, AMSGrad (which attnmetrics uses by default too).
- Adversarial attention: their weighting of the candidates' diversity term, 6.25 times smaller
  than attnmetrics' (``diversity_weight = 0.16``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from attnmetrics.data import Splits
from attnmetrics.data.tokens import tokenize


@dataclass(frozen=True)
class Protocol:
    name: str
    sst_length_filter: bool = False  # drop sentences of <= 5 tokens and each split's longest
    pos_weight: str | None = None  # "balanced": N / N_pos - 1 on the positive class (binary tasks)
    sort_by_length: bool = False  # length-sorted batches in a shuffled order
    amsgrad: bool = True
    diversity_weight: float = 1.0  # weight of the adversarial candidates' mean pairwise JSD

    def to_dict(self) -> dict:
        return asdict(self)


PROTOCOLS = {
    "attnmetrics": Protocol("attnmetrics"),
    "jain-wallace": Protocol(
        "jain-wallace", sst_length_filter=True, pos_weight="balanced", sort_by_length=True, diversity_weight=1 / 6.25
    ),
}


def jain_wallace_length_filter(splits: Splits, min_tokens: int = 6) -> Splits:
    """J&W's SST filter: keep sentences of at least ``min_tokens`` tokens (after their preprocessing),
    then drop the longest remaining sentence of each split (the last of the longest, in file order)."""

    def keep(examples):
        counted = [(len(tokenize(text)), (text, y)) for text, y in examples]  # each text tokenised once
        kept = [(n, example) for n, example in counted if n >= min_tokens]
        if kept:
            longest = max(range(len(kept)), key=lambda i: (kept[i][0], i))
            del kept[longest]
        return [example for _, example in kept]

    return Splits(
        splits.name,
        splits.classes,
        keep(splits.train),
        keep(splits.dev),
        keep(splits.test),
        {**splits.info, "length_filter": f"jain-wallace: >= {min_tokens} tokens, each split's longest dropped"},
    )
