"""The faithfulness battery on a trained model's test split (J&W 2019; S&S 2019).

Runs per evaluation batch and gathers per-instance results, so memory stays bounded by
the batch size whatever the size of the test set.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

import attnmetrics
from attnmetrics.procedures import forward, gradient_importance
from attnmetrics.report import flip_summary, tau_summary

#: S&S 2019's orderings (sec. 4): attention, random, gradient w.r.t. attention, attention x gradient; plus reverse.
DEFAULT_ORDERS = ("attention", "random", "gradient", "attn_grad", "reverse")


def run_battery(
    model: torch.nn.Module,
    batches: Iterable[tuple[Tensor, Tensor]],
    class_names: Sequence[str],
    orders: Sequence[str] = DEFAULT_ORDERS,
    seed: int = 0,
    random_samples: int = 1,
    never_flipped: float = float("nan"),
    progress: bool = True,
) -> tuple[dict, dict]:
    """Flip search for every ordering and Kendall tau (attention vs J&W gradient importance).

    ``batches`` yields (tokens [B, T] int64, lengths [B] int64) with special tokens included.
    Returns (summary, instances): summary statistics for ``results.json`` and per-instance
    lists (for figures and for re-analysis).
    """
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    per = {k: {"removed": [], "fraction": []} for k in orders}
    tau, pvalue, predicted, lengths_all, max_attention = [], [], [], [], []
    for tokens, lengths in tqdm(list(batches), desc="faithfulness", disable=not progress, leave=False):
        out = forward(model, tokens, lengths)
        pred = attnmetrics.decision(out.logits)
        for name in orders:
            r = attnmetrics.flip_fraction(
                out.attention,
                out.hidden,
                model.decoder,
                out.lengths,
                order=name,
                samples=random_samples if name == "random" else 1,
                generator=generator,
                never_flipped=never_flipped,
            )
            per[name]["removed"].append(r.removed.reshape(-1))
            per[name]["fraction"].append(r.fraction.reshape(-1))
        importance = gradient_importance(model, tokens, lengths)
        kt = attnmetrics.kendall_tau(out.attention, importance.to(out.attention.dtype), out.lengths)
        tau.append(kt.tau)
        pvalue.append(kt.pvalue)
        predicted.append(pred)
        lengths_all.append(out.lengths)
        max_attention.append(out.attention.max(1).values)

    cat = lambda xs: torch.cat(xs).cpu().numpy()  # noqa: E731
    lengths_np = cat(lengths_all)
    predicted_np = cat(predicted)
    summary: dict = {"flip": {}, "kendall": {}}
    instances: dict = {"flip_fraction": {}, "flip_removed": {}}
    for name in orders:
        removed, fraction = cat(per[name]["removed"]), cat(per[name]["fraction"])
        reps = removed.size // lengths_np.size  # random with several samples
        summary["flip"][name] = flip_summary(removed, fraction, np.tile(lengths_np, reps))
        instances["flip_fraction"][name] = fraction.astype(float).tolist()
        instances["flip_removed"][name] = removed.tolist()
    tau_np, p_np = cat(tau), cat(pvalue)
    summary["kendall"]["attention vs gradient"] = tau_summary(tau_np, p_np, predicted_np, class_names)
    instances.update(
        kendall_tau=tau_np.tolist(),
        kendall_pvalue=p_np.tolist(),
        predicted=predicted_np.tolist(),
        lengths=lengths_np.tolist(),
        max_attention=cat(max_attention).tolist(),
    )
    return summary, instances
