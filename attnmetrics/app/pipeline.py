"""What ``run``, ``train`` and ``evaluate`` share (:mod:`attnmetrics.app.commands`): claim the run
folder, build or load the model (:mod:`attnmetrics.app.factory`), predict the test split, run
the battery (:mod:`attnmetrics.app.faithfulness`; not ``train``), then write the run folder:
predictions.npz, instances.parquet, results.json (:class:`~attnmetrics.app.results.Results`),
report.md and its figures. Under torchrun each rank does its part and rank 0 writes."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable
from pathlib import Path

from attnmetrics.app.battery import missing_package
from attnmetrics.app.battery.registry import left_out_of_all
from attnmetrics.app.config import RunConfig
from attnmetrics.app.distributed import World
from attnmetrics.app.errors import INPUT_ERRORS, input_error
from attnmetrics.app.factory import CHECKPOINT, Built, build, say_truncated
from attnmetrics.app.faithfulness import battery, examples, importance_settings, tested_attention
from attnmetrics.app.io import run_folder, write_json_atomic, write_npz_atomic, write_parquet_atomic
from attnmetrics.app.report import render
from attnmetrics.app.results import Results, new_results
from attnmetrics.app.resumable import blocks_folder, remove_blocks
from attnmetrics.app.table import run_table
from attnmetrics.models.text import EncodedSplit
from attnmetrics.models.training import Predictions, predict, prediction_metrics

#: a command's experiments after the battery, on the model it built (``run``: W&P's trained ones)
AfterBattery = Callable[[RunConfig, Built, EncodedSplit, Results], None]


def execute(config: RunConfig, w: World, *, with_battery: bool, after_battery: AfterBattery | None = None) -> int:
    """train (``with_battery=False``), run or evaluate; this rank's part of it under torchrun."""
    start = time.perf_counter()
    missing = missing_package(importance_settings(config))  # before training
    if missing:
        return input_error(ImportError(missing), config.debug)
    left_out = left_out_of_all(config.importances)
    if left_out and w.main:
        print(f"attnmetrics: --importances all leaves out {', '.join(left_out)}", file=sys.stderr)
    results = new_results(config)
    if w.size > 1:  # training data-parallel, the battery sharded (app/distributed.py)
        results["distributed"] = {"ranks": w.size, "backend": "gloo"}
    out = config.out
    if config.command in ("run", "train") and out is None:
        out = Path("runs") / f"{config.dataset.replace(':', '_')}-{config.encoder}"
    trained_in = []  # the staging folder once it holds the trained model
    try:
        protect = (config.model_run,) if config.command == "evaluate" else ()
        # under torchrun rank 0 alone claims and writes the run folder
        claim = run_folder(out, config.overwrite, protect) if w.main else contextlib.nullcontext()
        kept = blocks_folder(out) if config.resumable and with_battery else None
        with claim as folder:
            if not _in_folder(config, w, folder, results, trained_in, with_battery, after_battery, kept):
                return 0  # rank 0 writes
            _finish(results, folder, start)
        if kept is not None:  # its blocks are in the run folder now
            remove_blocks(kept)
    except BaseException as e:
        if trained_in and (trained_in[0] / CHECKPOINT).exists():
            e.add_note(
                f"the trained model is kept in {trained_in[0]}: `attnmetrics evaluate {trained_in[0]} --out DIR` "
                "runs the battery on it without training again (move the folder to keep it)"
            )
        if isinstance(e, INPUT_ERRORS):
            return input_error(e, config.debug)
        raise
    test = results["test"]
    print(
        f"test: accuracy {test['accuracy']:.3f}, macro F1 {test['macro_f1']:.3f}, ROC-AUC {test['roc_auc']:.3f} "
        f"on {results['data']['sizes']['test']} instances ({time.perf_counter() - start:.0f} s in all)",
        file=sys.stderr,
    )
    print(f"wrote {out / 'report.md'}", file=sys.stderr)
    return 0


def _in_folder(
    config: RunConfig,
    w: World,
    folder: Path | None,
    results: Results,
    trained_in: list[Path],
    with_battery: bool,
    after_battery: AfterBattery | None,
    blocks: Path | None = None,
) -> bool:
    """The work inside the claimed run folder (``folder``; None on ranks other than 0), up to
    results.json; False where this rank writes nothing. ``blocks``: ``--resumable``'s folder."""
    built = build(config, results, folder if w.main else None)
    if config.command != "evaluate" and folder is not None:
        trained_in.append(folder)
    results["protocol"] = built.protocol.to_dict()
    model = built.model
    test = built.vocab.encode_split(built.splits.test)
    say_truncated("test", test, built.vocab, results)
    predictions = predict(model, test) if w.main else None
    results["test"] = prediction_metrics(predictions) if w.main else None
    if with_battery:
        if tested := tested_attention(model):
            results["battery"] = tested
        protocol = built.protocol
        if not battery(
            config,
            model,
            test,
            built.splits,
            protocol.diversity_weight,
            results,
            w,
            protocol.adversarial_amsgrad,
            blocks,
        ):
            return False
        if after_battery is not None:
            after_battery(config, built, test, results)
    if not w.main:
        return False
    if with_battery:
        examples(config, model, test, built.vocab, built.splits, results)
    _write_predictions(model, predictions, folder)
    return True


def _write_predictions(model, p: Predictions, folder: Path) -> None:
    """predictions.npz: the test split's predictions ``p`` in split order, real tokens only (for
    re-analysis across runs, e.g. W&P seed variance): logits [N, C] float32, attention [N, T]
    float32 (zero past each length), lengths [N] int64 (real tokens), labels [N] int64."""
    lengths = p.lengths - model.lead - model.trail
    attention = p.attention[:, model.lead : model.lead + int(lengths.max())]
    write_npz_atomic(
        folder / "predictions.npz",
        logits=p.logits.float().numpy(),
        attention=attention.float().numpy(),
        lengths=lengths.numpy(),
        labels=p.labels.numpy(),
    )


def _finish(results: Results, folder: Path, start: float) -> None:
    results["wall_time_s"]["total"] = time.perf_counter() - start
    # the per-instance values as one long table (app/table.py), then results.json: its
    # presence marks the run finished
    write_parquet_atomic(folder / "instances.parquet", run_table(results.get("instances", {})))
    write_json_atomic(folder / "results.json", results)
    render(results, folder)
