"""``attnmetrics report RUN``: its figures written safely side by side, its refusals in one line,
its warning on a model at chance level."""

import threading

import pytest

from attnmetrics.app.figures import save_figure, subplots


def test_concurrent_writes_of_one_figure_all_succeed_and_leave_one_valid_png(tmp_path, monkeypatch):
    """Several ``report`` calls at once write the same figures: each through a temporary file of its
    own (a shared temporary name made all but one fail). The writers are held together between
    drawing and renaming, so every write overlaps every other."""
    from matplotlib.figure import Figure
    from matplotlib.image import imread

    writers = 4
    together = threading.Barrier(writers)
    savefig = Figure.savefig

    def savefig_then_wait(self, *args, **kwargs):
        savefig(self, *args, **kwargs)
        together.wait(timeout=60)

    monkeypatch.setattr(Figure, "savefig", savefig_then_wait)
    path, errors = tmp_path / "methods.png", []

    def write(k: int) -> None:
        try:
            fig, ax = subplots(figsize=(2, 2))
            ax.plot([0, 1], [k, 1 - k])
            assert save_figure(fig, path) == "methods.png"
        except BaseException as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=write, args=(k,)) for k in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert imread(path).shape[:2] == (240, 240)  # 2 in at 120 dpi: a whole PNG
    assert [p.name for p in tmp_path.iterdir()] == ["methods.png"]  # no temporary left


@pytest.mark.parametrize("where", ["top", "inside"])
def test_report_on_a_deeply_nested_results_json_is_one_line_naming_it(tmp_path, capsys, where):
    from attnmetrics.app.cli import main

    run = tmp_path / "run"
    run.mkdir()
    deep = "[" * 100_000 + "]" * 100_000
    text = deep if where == "top" else '{"command": "run", "config": {}, "data": {}, "instances": ' + deep + "}"
    (run / "results.json").write_text(text)
    assert main(["report", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"{run / 'results.json'} is not a run's results (JSON nested deeper than" in err


def _run(tmp_path, labels, accuracy):
    """A run folder of ``report``'s minimum: results.json with the test metrics, predictions.npz."""
    import numpy as np

    from attnmetrics.app.io import write_json_atomic, write_npz_atomic

    run = tmp_path / "run"
    run.mkdir()
    labels = np.asarray(labels)
    sizes = {"train": 10, "dev": 10, "test": len(labels)}
    data = {"name": "sst", "sizes": sizes, "classes": ["negative", "positive"]}
    results = {"command": "run", "config": {"dataset": "sst"}, "data": data}
    write_json_atomic(run / "results.json", results | {"test": {"accuracy": accuracy, "macro_f1": 0.5}})
    write_npz_atomic(run / "predictions.npz", labels=labels)
    return run


@pytest.mark.parametrize(
    ("accuracy", "interval"),
    [
        (0.62, "[0.551, 0.684]"),  # 124 of 200 right: the majority rate 0.6 is in its Wilson interval
        (0.55, "[0.481, 0.617]"),  # below the majority rate
        (0.70, None),  # 140 of 200, interval [0.633, 0.759]: above 0.6
        (0.90, None),
    ],
)
def test_a_model_at_chance_level_is_warned_of_in_the_report_and_on_stderr(tmp_path, capsys, accuracy, interval):
    """The test accuracy within its 95 % Wilson interval of the majority-class rate (here 0.6: 120 of
    200 labels negative): a warning in report.md and on stderr; a model above it: none."""
    from attnmetrics.app.cli import main

    run = _run(tmp_path, [0] * 120 + [1] * 80, accuracy)
    assert main(["report", str(run)]) == 0
    report, err = (run / "report.md").read_text(), capsys.readouterr().err
    if interval is None:
        assert "Warning" not in report and "chance" not in report and err == ""
        return
    words = (
        f"the model is at chance level: its test accuracy {accuracy:.3f} (95 % Wilson interval {interval} over 200 "
        "instances) is not above the majority-class rate 0.600 (always 'negative')"
    )
    assert f"**Warning**: {words}" in report
    assert err.startswith(f"attnmetrics: warning: {run}: {words}") and err.count("\n") == 1


def test_the_report_names_the_code_commit_or_says_it_is_unknown(tmp_path):
    from attnmetrics.app.report import render
    from attnmetrics.app.results import source_commit

    data = {"name": "mr", "sizes": {"train": 1, "dev": 1, "test": 1}, "classes": ["negative", "positive"]}
    base = {"config": {"dataset": "mr"}, "data": data, "versions": {"attnmetrics": "0.1.0", "torch": "2.13"}}
    for name in ("older", "recorded"):
        (tmp_path / name).mkdir()
    older = render(base, tmp_path / "older").read_text()
    assert "code commit unknown (not recorded by the attnmetrics that wrote this run)" in older
    commit = source_commit()  # this checkout's (CI clones one), or None outside git
    versions = {**base["versions"], "commit": commit}
    recorded = render({**base, "versions": versions}, tmp_path / "recorded").read_text()
    assert f"code commit {commit or 'unknown (not run from a git checkout)'}." in recorded
    if commit is not None:
        assert len(commit.removesuffix("+dirty")) == 40
