"""From decoder logits to output distributions and decisions (docs/definitions.md §1).

``C >= 2`` logits are softmax classes; ``C == 1`` is one sigmoid output for a binary
task (as in J&W 2019), whose distribution is ``(1 - p, p)``. The decision is the
argmax of the distribution, ties going to the lower class (so ``p == 0.5`` -> 0).
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnmetrics._validation import check_logits


def output_distribution(logits: Tensor) -> Tensor:
    """logits [N, C] -> class probabilities [N, max(C, 2)]."""
    check_logits(logits)
    if logits.shape[1] == 1:
        p = torch.sigmoid(logits)
        return torch.cat([1 - p, p], dim=1)
    return torch.softmax(logits, dim=1)


def decision(logits: Tensor) -> Tensor:
    """logits [N, C] -> predicted class [N] int64 (argmax of the distribution)."""
    check_logits(logits)
    if logits.shape[1] == 1:
        return (logits[:, 0] > 0).to(torch.int64)
    return logits.argmax(dim=1)
