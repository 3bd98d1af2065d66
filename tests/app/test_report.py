"""``attnmetrics report RUN``: its figures written safely side by side, its refusals in one line,
its warning on a model at chance level."""

import threading

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
