"""``attnmetrics pretrain --corpus``: pre-training on the user's own books, offline."""

import contextlib
import json
import os
import signal

import pytest

from attnmetrics.app.cli import main

TINY = ["--layers", "1", "--d-model", "16", "--heads", "2", "--context", "16", "--vocab-size", "260"]
TINY += ["--batch-size", "4", "--warmup", "1", "--steps", "2", "--no-progress"]

BOOK = "It was the best of times, it was the worst of times, it was the age of wisdom. " * 40
ISHMAEL = "Call me Ishmael. Some years ago, never mind how long. " * 40


def corpus_of(tmp_path, **books):
    """A ``--corpus`` folder holding the text files ``books`` (file name -> text; ``_`` for ``.``)."""
    corpus = tmp_path / "books"
    corpus.mkdir()
    for name, text in books.items():
        (corpus / name.replace("_", ".")).write_text(text, encoding="utf-8")
    return corpus


def test_pretrain_reads_the_books_of_a_corpus_folder(tmp_path, capsys):
    corpus = corpus_of(tmp_path, a_txt=BOOK, b_txt=ISHMAEL, notes_md="not a book")
    out = tmp_path / "gpt"
    assert main(["pretrain", "--out", str(out), "--corpus", str(corpus), "--held-out", "b.txt", *TINY]) == 0
    assert "validation perplexity" in capsys.readouterr().err
    latest = (out / "latest").read_text().strip()
    assert json.loads((out / latest / "model.json").read_text())["pretraining"]["steps"] == 2


def test_pretrain_corpus_errors_name_the_argument(tmp_path, capsys):
    corpus = corpus_of(tmp_path)
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


class Hung(Exception):
    """A block that ran past its time (:func:`within`)."""


@contextlib.contextmanager
def within(seconds: float):
    """Raise :class:`Hung` in the block after ``seconds``: SIGALRM interrupts a blocked ``open()``
    (of a named pipe with no writer), so a test of it fails instead of hanging the suite."""

    def hung(signum, frame):
        raise Hung(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize(
    "make, kind",
    [
        (os.mkfifo, "a named pipe"),
        (os.mkdir, "a folder"),
        (lambda path: os.symlink("c.txt", path), "a link that cannot be followed (Too many levels of symbolic links)"),
        (lambda path: os.symlink("gone.txt", path), "a link that cannot be followed (No such file or directory)"),
    ],
    ids=["named-pipe", "folder", "loop-of-links", "link-to-nowhere"],
)
def test_a_txt_that_is_not_a_regular_file_is_refused_by_name(tmp_path, capsys, make, kind):
    # a named pipe hung the command (reading it waits for a writer); a folder named x.txt or a
    # loop of links was a traceback, a link to nowhere an error without the file's name
    corpus = corpus_of(tmp_path, a_txt=BOOK, b_txt=ISHMAEL)
    make(corpus / "c.txt")
    out = tmp_path / "gpt"
    with within(60):
        assert main(["pretrain", "--out", str(out), "--corpus", str(corpus), "--held-out", "b.txt", *TINY]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert f"--corpus {corpus}: c.txt is {kind}, not a regular file" in err, err
    assert not out.exists()


@pytest.mark.parametrize(
    "train, held_out, named, tokens",
    [
        (BOOK, "", "--held-out b.txt", 0),
        (BOOK, "Call me.", "--held-out b.txt", 8),
        ("", ISHMAEL, "the training text (1 of --corpus {corpus}'s books: all but --held-out)", 0),
    ],
    ids=["empty-held-out", "short-held-out", "empty-training-book"],
)
def test_a_text_too_short_for_a_window_is_named_before_training(tmp_path, capsys, train, held_out, named, tokens):
    # an empty text was "cannot mmap an empty file"; a short held-out book failed at the first
    # evaluation (200 steps in by default) without naming the book
    corpus = corpus_of(tmp_path, a_txt=train, b_txt=held_out)
    out = tmp_path / "gpt"
    assert main(["pretrain", "--out", str(out), "--corpus", str(corpus), "--held-out", "b.txt", *TINY]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    expected = f"{named.format(corpus=corpus)} is too short to pre-train on: {tokens} tokens after BPE, at least 17"
    assert expected in err, err
    assert not any(p.name.startswith("step-") for p in out.iterdir())  # no step was trained


def test_an_out_in_an_unwritable_folder_is_refused_in_one_line(tmp_path, capsys, monkeypatch):
    # issue 31, unclear errors: a PermissionError traceback
    from tests.inputs import unwritable_folder

    corpus = corpus_of(tmp_path, a_txt=BOOK, b_txt=ISHMAEL)
    parent = (tmp_path / "locked").resolve()
    parent.mkdir()
    unwritable_folder(parent, monkeypatch)
    out = parent / "gpt"
    assert main(["pretrain", "--out", str(out), "--corpus", str(corpus), "--held-out", "b.txt", *TINY]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "step" not in err, err
    assert f"--out {out} cannot be written (Permission denied: {out}" in err, err
