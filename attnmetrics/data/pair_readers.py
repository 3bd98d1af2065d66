"""Readers for J&W 2019's two published pair tasks, from a folder holding the data as distributed:
SNLI (natural language inference) and the CNN reading-comprehension set (question answering).
Each returns :class:`~attnmetrics.data.corpora.Splits` of ``(Pair(passage, question), label)``
(:mod:`attnmetrics.data.pairs`), every split checked by :func:`~attnmetrics.data.pairs.check_pairs`.

J&W's preprocessing is in their repository (``successar/AttentionExplanation``,
``preprocess/SNLI/SNLI.ipynb``, ``preprocess/CNN/CNN.ipynb`` and ``preprocess/preprocess_data_QA.py``);
each reader's docstring says what of it is followed.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from attnmetrics.data.pairs import Pair, check_pairs
from attnmetrics.data.splits import Splits
from attnmetrics.data.tokens import tokenize

SPLITS = ("train", "dev", "test")

# --------------------------------------------------------------------------- SNLI

#: SNLI's labels in J&W's label-index order: their notebook writes ``neutral, contradiction,
#: entailment`` to entity_list.txt, and preprocess_data_QA.py sorts that list before numbering it.
SNLI_CLASSES = ("contradiction", "entailment", "neutral")
#: the SNLI 1.0 files read, one per split (``snli_1.0.zip`` holds them in a folder ``snli_1.0/``)
SNLI_FILES = {"train": "snli_1.0_train.jsonl", "dev": "snli_1.0_dev.jsonl", "test": "snli_1.0_test.jsonl"}
_SNLI_FIELDS = ("gold_label", "sentence1", "sentence2")
_NO_CONSENSUS = "-"


def _snli_folder(data_dir: Path) -> Path:
    """``data_dir`` or ``data_dir/snli_1.0``, whichever holds the three jsonl files."""
    if not data_dir.is_dir():
        raise FileNotFoundError(
            f"SNLI folder {data_dir} does not exist (pass the folder holding {', '.join(SNLI_FILES.values())}, "
            "or the folder snli_1.0.zip was unpacked in)"
        )
    candidates = [data_dir, data_dir / "snli_1.0"]
    for folder in candidates:
        if all((folder / f).is_file() for f in SNLI_FILES.values()):
            return folder
    # Name what is missing from the candidate that holds the most of the files.
    best = max(candidates, key=lambda d: sum((d / f).is_file() for f in SNLI_FILES.values()))
    missing = [f for f in SNLI_FILES.values() if not (best / f).is_file()]
    raise FileNotFoundError(
        f"SNLI folder {best} lacks {', '.join(missing)} (the folder must hold SNLI 1.0's "
        f"{', '.join(SNLI_FILES.values())}, directly or in snli_1.0/)"
    )


def _read_snli_file(path: Path) -> tuple[list[tuple[Pair, int]], dict[str, int]]:
    """One SNLI jsonl file -> examples, and counts of its lines, of the lines without a gold label
    (``"-"``) and of those whose premise or hypothesis has no token, which are skipped."""
    label_of = {c: i for i, c in enumerate(SNLI_CLASSES)}
    out: list[tuple[Pair, int]] = []
    counts = {"lines": 0, "no_consensus": 0, "empty": 0}
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text ({e})") from None
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        counts["lines"] += 1
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{n}: not a JSON object ({e})") from None
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{n}: not a JSON object (got {type(row).__name__})")
        for key in _SNLI_FIELDS:
            if key not in row:
                raise ValueError(f"{path}:{n}: lacks the field {key!r} (each line needs {', '.join(_SNLI_FIELDS)})")
            if not isinstance(row[key], str):
                raise ValueError(f"{path}:{n}: field {key!r} must be a string, got {type(row[key]).__name__}")
        gold = row["gold_label"]
        if gold == _NO_CONSENSUS:
            counts["no_consensus"] += 1
            continue
        if gold not in label_of:
            raise ValueError(
                f"{path}:{n}: unknown gold_label {gold!r} (expected one of {', '.join(SNLI_CLASSES)}, "
                f"or {_NO_CONSENSUS!r} for no consensus)"
            )
        if not tokenize(row["sentence1"]) or not tokenize(row["sentence2"]):
            counts["empty"] += 1
            continue
        out.append((Pair(passage=row["sentence1"], question=row["sentence2"]), label_of[gold]))
    if not out:
        raise ValueError(
            f"{path}: no example with a gold label ({counts['lines']} lines, {counts['no_consensus']} "
            f"without consensus, {counts['empty']} with an empty sentence): an empty SNLI split"
        )
    return out, counts


def load_snli(data_dir: str | os.PathLike) -> Splits:
    """SNLI 1.0 (Bowman, Angeli, Potts & Manning 2015, "A large annotated corpus for learning natural
    language inference", EMNLP), J&W's natural-language-inference task, as published in
    ``snli_1.0.zip``: ``snli_1.0_{train,dev,test}.jsonl`` in ``data_dir`` or ``data_dir/snli_1.0``.

    Each line is a JSON object; the fields read are ``gold_label`` (the majority of the annotators'
    labels: ``entailment``, ``neutral``, ``contradiction``, or ``-`` when no label had a majority),
    ``sentence1`` (the premise) and ``sentence2`` (the hypothesis); the others
    (``annotator_labels``, ``pairID``, the parses, ...) are ignored. An example is
    ``(Pair(passage=premise, question=hypothesis), label)``: the model attends over the premise.

    As J&W's ``SNLI.ipynb``: the three official splits as they are, and the lines whose gold_label
    is ``-`` dropped (no consensus, so no label), counted per split in
    ``info["no_consensus_skipped"]`` (785 / 158 / 176 in train / dev / test, leaving
    549,367 / 9,842 / 9,824). ``classes`` is J&W's label numbering,
    ``("contradiction", "entailment", "neutral")`` (their list, sorted by preprocess_data_QA.py).
    Unlike J&W, a pair whose premise or hypothesis has no token (:func:`~attnmetrics.data.tokens.tokenize`)
    is also skipped (``check_pairs`` forbids them) and counted in ``info["empty_skipped"]``.

    Raises FileNotFoundError naming the folder and the missing files; ValueError naming the file and
    line for a line that is not a JSON object, lacks one of the three fields (or holds a non-string
    there), or has another gold_label; ValueError naming the file for a split left without examples.
    """
    folder = _snli_folder(Path(data_dir))
    parts = {s: _read_snli_file(folder / SNLI_FILES[s]) for s in SPLITS}
    for s in SPLITS:
        check_pairs(f"snli {s}", parts[s][0], SNLI_CLASSES)
    return Splits(
        "snli",
        SNLI_CLASSES,
        parts["train"][0],
        parts["dev"][0],
        parts["test"][0],
        info={
            "source": str(folder.resolve()),
            "files": dict(SNLI_FILES),
            "lines": {s: p[1]["lines"] for s, p in parts.items()},
            "no_consensus_skipped": {s: p[1]["no_consensus"] for s, p in parts.items()},
            "empty_skipped": {s: p[1]["empty"] for s, p in parts.items()},
        },
    )


# --------------------------------------------------------------------------- CNN

_ENTITY = re.compile(r"@entity(\d+)(?!\d)")
_PLACEHOLDER = re.compile(r"@placeholder(?![A-Za-z0-9_])")
_ANSWER = re.compile(r"@entity\d+")
_DIGIT_LETTERS = str.maketrans("0123456789", "abcdefghij")

#: DeepMind's layout: one ``.question`` file per example in these folders of ``questions/``
CNN_QUESTION_DIRS = {"train": "training", "dev": "validation", "test": "test"}
#: Chen et al.'s layout (``cnn.tar.gz``, the files J&W read): one file per split
CNN_CHEN_FILES = {"train": "train.txt", "dev": "dev.txt", "test": "test.txt"}


def entity_token(n: int) -> str:
    """The token standing for ``@entity{n}``: ``entity`` and ``n`` spelled with the letters a-j for the
    digits 0-9, so that :func:`~attnmetrics.data.tokens.tokenize` keeps it whole and distinct (it
    maps any token holding a digit to ``qqq`` and splits off ``@``).

    >>> entity_token(12)
    'entitybc'
    """
    if n < 0:
        raise ValueError(f"entity numbers are >= 0, got {n}")
    return "entity" + str(n).translate(_DIGIT_LETTERS)


def rewrite_entities(text: str) -> str:
    """``text`` with every ``@entityN`` replaced by :func:`entity_token` ``(N)`` and ``@placeholder``
    by ``placeholder``; the rest is left as it is.

    >>> rewrite_entities("@placeholder met @entity0 and @entity12")
    'placeholder met entitya and entitybc'
    """
    text = _ENTITY.sub(lambda m: entity_token(int(m.group(1))), text)
    return _PLACEHOLDER.sub("placeholder", text)


def _entity_ids(text: str) -> set[int]:
    return {int(m) for m in _ENTITY.findall(text)}


# A raw example: (where it was read, for messages; context; query; answer), all before rewriting.
_RawQA = tuple[str, str, str, str]


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8").replace("\r\n", "\n")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text ({e})") from None


def _check_qa(where: str, context: str, query: str, answer: str) -> None:
    for name, value in (("context", context), ("query", query), ("answer", answer)):
        if not value:
            raise ValueError(f"{where}: empty {name}")
    if not _ANSWER.fullmatch(answer):
        raise ValueError(f"{where}: the answer must be one entity @entityN, got {answer[:80]!r}")
    if int(answer[len("@entity") :]) not in _entity_ids(context):
        raise ValueError(
            f"{where}: the answer {answer} is not among the context's entities (answers are restricted to the "
            "passage's entities)"
        )


def _read_question_file(path: Path) -> _RawQA:
    """One DeepMind ``.question`` file: URL, context, query, answer and the entity mapping, separated by
    blank lines."""
    sections = [s.strip() for s in _read_text(path).strip().split("\n\n")]
    if len(sections) != 5:
        raise ValueError(
            f"{path}: expected 5 sections separated by blank lines (URL, context, query, answer, entity mapping), "
            f"found {len(sections)}"
        )
    _url, context, query, answer, _mapping = sections
    for name, value in (("context", context), ("query", query), ("answer", answer)):
        if "\n" in value:
            raise ValueError(f"{path}: the {name} section must be one line, found {value.count(chr(10)) + 1}")
    _check_qa(str(path), context, query, answer)
    return str(path), context, query, answer


def _read_question_dir(folder: Path, limit: int | None) -> list[_RawQA]:
    files = sorted(folder.glob("*.question"))
    if not files:
        raise ValueError(f"{folder}: holds no .question file (an empty CNN split)")
    return [_read_question_file(f) for f in files[:limit]]


def _read_chen_file(path: Path, limit: int | None) -> list[_RawQA]:
    """Chen et al.'s file: per example the query, the answer and the passage on three lines, examples
    separated by a blank line."""
    out: list[_RawQA] = []
    block: list[str] = []
    start = 0
    lines = _read_text(path).split("\n")
    for n, line in enumerate([*lines, ""], 1):
        if line.strip():
            if not block:
                start = n
            block.append(line.strip())
            continue
        if not block:
            continue
        where = f"{path}:{start}"
        if len(block) != 3:
            raise ValueError(f"{where}: expected 3 lines (query, answer, passage) per example, found {len(block)}")
        query, answer, context = block
        _check_qa(where, context, query, answer)
        out.append((where, context, query, answer))
        block = []
        if limit is not None and len(out) >= limit:
            break
    if not out:
        raise ValueError(f"{path}: holds no example (an empty CNN split)")
    return out


def _cnn_layout(data_dir: Path) -> tuple[str, Path]:
    """Which published layout ``data_dir`` holds: ("deepmind", the ``questions`` folder) or ("chen", the
    folder of train/dev/test.txt)."""
    if not data_dir.is_dir():
        raise FileNotFoundError(f"CNN folder {data_dir} does not exist")
    want_dm = ", ".join(CNN_QUESTION_DIRS.values())
    want_chen = ", ".join(CNN_CHEN_FILES.values())
    for q in (data_dir, data_dir / "questions", data_dir / "cnn" / "questions"):
        present = [d for d in CNN_QUESTION_DIRS.values() if (q / d).is_dir()]
        if len(present) == len(CNN_QUESTION_DIRS):
            return "deepmind", q
        if present and q != data_dir:
            missing = [d for d in CNN_QUESTION_DIRS.values() if d not in present]
            raise FileNotFoundError(f"CNN folder {q} lacks {', '.join(missing)}/ (it must hold {want_dm}/)")
    for c in (data_dir, data_dir / "cnn"):
        present = [f for f in CNN_CHEN_FILES.values() if (c / f).is_file()]
        if len(present) == len(CNN_CHEN_FILES):
            return "chen", c
        if present:
            missing = [f for f in CNN_CHEN_FILES.values() if f not in present]
            raise FileNotFoundError(f"CNN folder {c} lacks {', '.join(missing)} (it must hold {want_chen})")
    raise FileNotFoundError(
        f"CNN folder {data_dir} holds neither DeepMind's questions/{{{want_dm}}}/*.question "
        f"(in it, in questions/ or in cnn/questions/) nor Chen et al.'s {want_chen} (in it or in cnn/)"
    )


def load_cnn(data_dir: str | os.PathLike, limit_per_split: int | None = None) -> Splits:
    """The CNN reading-comprehension set (Hermann et al. 2015, "Teaching machines to read and
    comprehend", NeurIPS; J&W's "CNN News"): a news article with its entities anonymised
    (``@entity0``, ``@entity12``, ...), a cloze query with one entity replaced by ``@placeholder``,
    and the answer, that entity. An example is ``(Pair(passage=article, question=query), label)``.

    Two published layouts are read, found in ``data_dir`` (or ``data_dir/cnn``):

    - DeepMind's (``cnn.tgz``): ``questions/training/``, ``questions/validation/``, ``questions/test/``
      (train / dev / test), one ``<hash>.question`` file per example: the URL, the context, the query,
      the answer and the entity mapping lines ``@entityN:Original Name`` (not read), separated by
      blank lines. Files are read in sorted name order.
    - Chen, Bolton & Manning's (2016; ``cnn.tar.gz``), the copy J&W's ``CNN.ipynb`` reads:
      ``train.txt``, ``dev.txt``, ``test.txt``, each example the query, the answer and the passage on
      three lines (lower-cased), examples separated by a blank line.

    Both hold the same 380,298 / 3,924 / 3,198 examples. As J&W: the splits as published, every
    example kept; the answer must be one of its passage's entities; ``classes`` are the entities
    seen in the training passages (J&W's entity_list.txt: a superset of the training answers), and
    a dev or test answer outside them is an error (J&W's label lookup would fail on it). J&W sort
    these classes as strings (``@entity10`` before ``@entity2``); here they are sorted by N, which
    only permutes the label indices. J&W also give each example a mask of its passage's entities
    (the only answers it may predict); the mask is not stored here: ``entity_token`` identifies the
    classes among the passage's tokens. Dev/test passages may hold entities outside ``classes``
    (never a right answer): the examples with any are counted in
    ``info["passage_entities_outside_classes"]``.

    Not from J&W: ``limit_per_split`` keeps the first N examples of each split (files in sorted name
    order, or file order for Chen's layout), recorded in ``info``; ``classes`` then come from the
    training examples kept, so a small limit may leave a dev/test answer outside them (an error).
    Every ``@entityN`` in passage, query and answer is rewritten by :func:`rewrite_entities` to
    ``entity`` + N in letters (``@entity12`` -> ``entitybc``) and ``@placeholder`` to
    ``placeholder``, as :func:`~attnmetrics.data.tokens.tokenize` would make every entity ``qqq``.

    Raises FileNotFoundError naming the folder and what it must hold when neither layout (or only
    part of one) is there; ValueError naming the file (and line, for Chen's layout) for a file that is
    not UTF-8, lacks a section, has an empty or multi-line context, query or answer, an answer that is
    not one ``@entityN`` or not among the context's entities; ValueError naming the example and the
    entity for a dev/test answer outside ``classes``; ValueError for a split without examples.
    """
    if limit_per_split is not None and (isinstance(limit_per_split, bool) or limit_per_split < 1):
        raise ValueError(f"limit_per_split must be None or a positive integer, got {limit_per_split!r}")
    layout, folder = _cnn_layout(Path(data_dir))
    if layout == "deepmind":
        raw = {s: _read_question_dir(folder / CNN_QUESTION_DIRS[s], limit_per_split) for s in SPLITS}
    else:
        raw = {s: _read_chen_file(folder / CNN_CHEN_FILES[s], limit_per_split) for s in SPLITS}

    ids = sorted(set().union(*(_entity_ids(context) for _, context, _, _ in raw["train"])))
    classes = tuple(entity_token(n) for n in ids)
    index = {n: i for i, n in enumerate(ids)}
    parts: dict[str, list[tuple[Pair, int]]] = {}
    outside: dict[str, int] = {}
    for s in SPLITS:
        examples = []
        outside[s] = 0
        for where, context, query, answer in raw[s]:
            n = int(answer[len("@entity") :])
            if n not in index:
                raise ValueError(
                    f"{where}: the {s} answer {answer} ({entity_token(n)}) is not among the {len(classes)} entities "
                    "of the training passages (the classes)"
                    + (f"; limit_per_split={limit_per_split} may be too small" if limit_per_split else "")
                )
            outside[s] += not _entity_ids(context) <= index.keys()
            examples.append((Pair(passage=rewrite_entities(context), question=rewrite_entities(query)), index[n]))
        check_pairs(f"cnn {s}", examples, classes)
        parts[s] = examples
    return Splits(
        "cnn",
        classes,
        parts["train"],
        parts["dev"],
        parts["test"],
        info={
            "source": str(folder.resolve()),
            "layout": "deepmind .question files" if layout == "deepmind" else "chen et al. 2016 train/dev/test.txt",
            "limit_per_split": limit_per_split,
            "entity_classes": len(classes),
            "classes_from": "entities in the training passages",
            "passage_entities_outside_classes": outside,
            "entity_rewrite": "@entityN -> entity + N with letters a-j for digits 0-9; @placeholder -> placeholder",
        },
    )
