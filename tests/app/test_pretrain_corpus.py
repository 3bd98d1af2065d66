"""``attnmetrics pretrain --corpus``: pre-training on the user's own books, offline."""

import json

from attnmetrics.app.cli import main

TINY = ["--layers", "1", "--d-model", "16", "--heads", "2", "--context", "16", "--vocab-size", "260"]
TINY += ["--batch-size", "4", "--warmup", "1", "--steps", "2", "--no-progress"]

BOOK = "It was the best of times, it was the worst of times, it was the age of wisdom. " * 40


def test_pretrain_reads_the_books_of_a_corpus_folder(tmp_path, capsys):
    corpus = tmp_path / "books"
    corpus.mkdir()
    (corpus / "a.txt").write_text(BOOK, encoding="utf-8")
    (corpus / "b.txt").write_text("Call me Ishmael. Some years ago, never mind how long. " * 40, encoding="utf-8")
    (corpus / "notes.md").write_text("not a book")
    out = tmp_path / "gpt"
    assert main(["pretrain", "--out", str(out), "--corpus", str(corpus), "--held-out", "b.txt", *TINY]) == 0
    assert "validation perplexity" in capsys.readouterr().err
    latest = (out / "latest").read_text().strip()
    assert json.loads((out / latest / "model.json").read_text())["pretraining"]["steps"] == 2


def test_pretrain_corpus_errors_name_the_argument(tmp_path, capsys):
    corpus = tmp_path / "books"
    corpus.mkdir()
    assert main(["pretrain", "--out", str(tmp_path / "g1"), "--corpus", str(corpus), *TINY]) == 2
    err = capsys.readouterr().err
    assert "--corpus" in err and "no .txt files" in err
    (corpus / "a.txt").write_text(BOOK, encoding="utf-8")
    assert main(["pretrain", "--out", str(tmp_path / "g2"), "--corpus", str(corpus), *TINY]) == 2
    assert "--held-out carroll-alice.txt: no such book" in capsys.readouterr().err
    assert main(["pretrain", "--out", str(tmp_path / "g3"), "--corpus", str(corpus), "--held-out", "a.txt", *TINY]) == 2
    assert "nothing to train on" in capsys.readouterr().err
    (corpus / "c.txt").write_bytes(b"caf\xe9")
    assert main(["pretrain", "--out", str(tmp_path / "g4"), "--corpus", str(corpus), "--held-out", "a.txt", *TINY]) == 2
    assert "c.txt is not UTF-8" in capsys.readouterr().err
