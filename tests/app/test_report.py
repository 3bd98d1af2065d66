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
