"""SNLI and CNN readers (attnmetrics.data.pair_readers) on small folders written here in the
published layouts: no network, no real data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnmetrics.data.pair_readers import (
    SNLI_CLASSES,
    entity_token,
    load_cnn,
    load_snli,
    rewrite_entities,
)
from attnmetrics.data.pairs import Pair
from attnmetrics.data.tokens import tokenize

# --------------------------------------------------------------------------- SNLI


def snli_line(gold: str, s1: str, s2: str, pair_id: str = "3416050480.jpg#4r1n") -> str:
    """One line as snli_1.0_*.jsonl writes it, the fields not read included."""
    return json.dumps(
        {
            "annotator_labels": [gold if gold != "-" else "neutral", "entailment", "neutral"],
            "captionID": pair_id.split("r")[0],
            "gold_label": gold,
            "pairID": pair_id,
            "sentence1": s1,
            "sentence1_binary_parse": "( ( A person ) ( on ( a horse ) ) )",
            "sentence1_parse": "(ROOT (S (NP (DT A) (NN person))))",
            "sentence2": s2,
            "sentence2_binary_parse": "( ( A person ) ( is ( training ( his horse ) ) ) )",
            "sentence2_parse": "(ROOT (S (NP (DT A) (NN person))))",
        }
    )


SNLI_ROWS = {
    "train": [
        ("neutral", "A person on a horse jumps over a broken down airplane.", "A person is training his horse."),
        ("-", "Two women are embracing.", "The sisters are hugging."),
        ("contradiction", "A person on a horse jumps.", "A person is at a diner, ordering an omelette."),
        ("entailment", "A person on a horse jumps.", "A person is outdoors, on a horse."),
        ("-", "Children smiling.", "They are smiling at their parents."),
    ],
    "dev": [("entailment", "Two women are embracing.", "Two woman are holding packages.")],
    "test": [
        ("-", "This church choir sings.", "The church is filled with song."),
        ("contradiction", "A man in 2 hats.", "The man is bareheaded."),
    ],
}


def write_snli(folder: Path, rows: dict[str, list] = SNLI_ROWS) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for split, items in rows.items():
        text = "\n".join(snli_line(*r) for r in items) + "\n"
        (folder / f"snli_1.0_{split}.jsonl").write_text(text, encoding="utf-8")
    return folder


def test_snli_reads_pairs_labels_and_counts_the_no_consensus_lines(tmp_path):
    write_snli(tmp_path / "snli_1.0")
    for where in (tmp_path, tmp_path / "snli_1.0"):  # the folder unpacked into, or snli_1.0/ itself
        s = load_snli(where)
        assert s.name == "snli"
        assert s.classes == SNLI_CLASSES == ("contradiction", "entailment", "neutral")
        assert s.train == [
            (Pair("A person on a horse jumps over a broken down airplane.", "A person is training his horse."), 2),
            (Pair("A person on a horse jumps.", "A person is at a diner, ordering an omelette."), 0),
            (Pair("A person on a horse jumps.", "A person is outdoors, on a horse."), 1),
        ]
        assert s.dev == [(Pair("Two women are embracing.", "Two woman are holding packages."), 1)]
        assert s.test == [(Pair("A man in 2 hats.", "The man is bareheaded."), 0)]
        assert s.info["no_consensus_skipped"] == {"train": 2, "dev": 0, "test": 1}
        assert s.info["lines"] == {"train": 5, "dev": 1, "test": 2}
        assert s.info["empty_skipped"] == {"train": 0, "dev": 0, "test": 0}
        assert s.info["source"] == str((tmp_path / "snli_1.0").resolve())


def test_snli_skips_and_counts_pairs_without_tokens(tmp_path):
    rows = {**SNLI_ROWS, "dev": [*SNLI_ROWS["dev"], ("neutral", "A dog runs.", "...")]}
    s = load_snli(write_snli(tmp_path, rows))
    assert len(s.dev) == 1 and s.info["empty_skipped"] == {"train": 0, "dev": 1, "test": 0}


def test_snli_missing_folder_or_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_snli(tmp_path / "nowhere")
    write_snli(tmp_path / "snli_1.0")
    (tmp_path / "snli_1.0" / "snli_1.0_test.jsonl").unlink()
    with pytest.raises(FileNotFoundError, match=r"snli_1\.0 lacks snli_1\.0_test\.jsonl .*must hold"):
        load_snli(tmp_path)


@pytest.mark.parametrize(
    "line, message",
    [
        ("{not json", r"snli_1\.0_dev\.jsonl:2: not a JSON object"),
        ("[1, 2]", r"snli_1\.0_dev\.jsonl:2: not a JSON object \(got list\)"),
        (json.dumps({"gold_label": "neutral", "sentence1": "A dog."}), r":2: lacks the field 'sentence2'"),
        (json.dumps({"gold_label": "neutral", "sentence1": "A dog.", "sentence2": None}), r":2: field 'sentence2'"),
        (snli_line("entails", "A dog.", "An animal."), r"snli_1\.0_dev\.jsonl:2: unknown gold_label 'entails'"),
    ],
)
def test_snli_bad_lines_name_file_and_line(tmp_path, line, message):
    write_snli(tmp_path)
    path = tmp_path / "snli_1.0_dev.jsonl"
    path.write_text(snli_line(*SNLI_ROWS["dev"][0]) + "\n" + line + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=message):
        load_snli(tmp_path)


def test_snli_split_without_examples(tmp_path):
    rows = {**SNLI_ROWS, "dev": [("-", "Two women are embracing.", "The sisters are hugging.")]}
    with pytest.raises(ValueError, match=r"snli_1\.0_dev\.jsonl: no example with a gold label"):
        load_snli(write_snli(tmp_path, rows))


# --------------------------------------------------------------------------- CNN


def test_entity_tokens_survive_tokenize_whole_and_distinct():
    assert entity_token(0) == "entitya" and entity_token(12) == "entitybc" and entity_token(109) == "entitybaj"
    tokens = [entity_token(n) for n in range(1000)]
    assert len(set(tokens)) == 1000
    for n in (0, 7, 12, 100, 999):
        assert tokenize(rewrite_entities(f"@entity{n}")) == [entity_token(n)]
    assert tokenize(rewrite_entities("@placeholder")) == ["placeholder"]
    assert rewrite_entities("@entity1 's @entity12 , @placeholder said @entity120") == (
        "entityb 's entitybc , placeholder said entitybca"
    )
    with pytest.raises(ValueError):
        entity_token(-1)


def question_file(context: str, query: str, answer: str, mapping: dict[int, str]) -> str:
    """A .question file as DeepMind's cnn.tgz holds it."""
    lines = "\n".join(f"@entity{n}:{name}" for n, name in mapping.items())
    url = "http://web.archive.org/web/20150731183045id_/http://www.cnn.com/2015/03/07/us/story/index.html"
    return f"{url}\n\n{context}\n\n{query}\n\n{answer}\n\n{lines}\n"


CNN_EXAMPLES = {
    "training": [
        ("@entity0 ( @entity1 ) -- @entity2 won 3 games", "@placeholder won games", "@entity2"),
        ("@entity3 met @entity0 in @entity12 on monday", "@entity3 met @placeholder", "@entity0"),
        ("@entity1 said @entity5 was wrong", "@placeholder was wrong", "@entity5"),
    ],
    "validation": [
        ("@entity3 beat @entity1 in @entity12", "@placeholder beat @entity1", "@entity3"),
        ("@entity0 visited @entity3", "@entity0 visited @placeholder", "@entity3"),
        ("@entity3 and @entity12 signed", "@placeholder and @entity3 signed", "@entity12"),
    ],
    "test": [
        ("@entity1 told @entity0 about @entity40", "@placeholder told @entity0", "@entity1"),
        ("@entity12 ' s leader @entity3 spoke", "@entity12 ' s leader @placeholder spoke", "@entity3"),
        ("@entity2 left @entity0", "@entity2 left @placeholder", "@entity0"),
    ],
}


def write_cnn(root: Path, examples: dict[str, list] = CNN_EXAMPLES) -> Path:
    """``root/cnn/questions/{training,validation,test}/<hash>.question``, as the tarball unpacks."""
    for split, items in examples.items():
        folder = root / "cnn" / "questions" / split
        folder.mkdir(parents=True, exist_ok=True)
        for i, (context, query, answer) in enumerate(items):
            mapping = {n: f"Name {n}" for n in sorted({int(t[7:]) for t in context.split() if t.startswith("@entity")})}
            name = f"{i:x}{split[:2]}7d3a9e1c0b5f2468ace13579bdf02468ace1357.question"
            (folder / name).write_text(question_file(context, query, answer, mapping), encoding="utf-8")
    return root


def test_cnn_reads_deepmind_question_files(tmp_path):
    write_cnn(tmp_path)
    s = load_cnn(tmp_path)
    assert s.name == "cnn"
    # the entities of the training passages, by number
    assert s.classes == ("entitya", "entityb", "entityc", "entityd", "entityf", "entitybc")
    assert s.train == [
        (Pair("entitya ( entityb ) -- entityc won 3 games", "placeholder won games"), 2),
        (Pair("entityd met entitya in entitybc on monday", "entityd met placeholder"), 0),
        (Pair("entityb said entityf was wrong", "placeholder was wrong"), 4),
    ]
    assert [y for _, y in s.dev] == [3, 3, 5]
    assert [s.classes[y] for _, y in s.test] == ["entityb", "entityd", "entitya"]
    assert tokenize(s.test[1][0].question) == ["entitybc", "s", "leader", "placeholder", "spoke"]
    assert s.info["passage_entities_outside_classes"] == {"train": 0, "dev": 0, "test": 1}  # @entity40
    assert s.info["entity_classes"] == 6 and s.info["limit_per_split"] is None
    assert s.info["source"] == str((tmp_path / "cnn" / "questions").resolve())
    # the questions/ folder itself, or the cnn/ folder, work too
    assert load_cnn(tmp_path / "cnn" / "questions").train == s.train
    assert load_cnn(tmp_path / "cnn").test == s.test


def test_cnn_limit_per_split_keeps_the_first_files(tmp_path):
    write_cnn(tmp_path)
    s = load_cnn(tmp_path, limit_per_split=2)
    assert s.sizes() == {"train": 2, "dev": 2, "test": 2}
    assert s.classes == ("entitya", "entityb", "entityc", "entityd", "entitybc")
    assert s.info["limit_per_split"] == 2
    with pytest.raises(ValueError, match=r"the dev answer @entity3 \(entityd\) is not among the 3 .*limit_per_split=1"):
        load_cnn(tmp_path, limit_per_split=1)
    with pytest.raises(ValueError, match="limit_per_split"):
        load_cnn(tmp_path, limit_per_split=0)


def test_cnn_reads_chen_et_al_files_as_jw_did(tmp_path):
    folder = tmp_path / "cnn"
    folder.mkdir()
    names = {"training": "train", "validation": "dev", "test": "test"}
    for split, items in CNN_EXAMPLES.items():
        blocks = [f"{q}\n{a}\n{c}" for c, q, a in items]
        (folder / f"{names[split]}.txt").write_text("\n\n".join(blocks) + "\n\n", encoding="utf-8")
    s = load_cnn(tmp_path)
    write_cnn(tmp_path / "dm")
    dm = load_cnn(tmp_path / "dm")
    assert (s.classes, s.train, s.dev, s.test) == (dm.classes, dm.train, dm.dev, dm.test)
    assert "chen" in s.info["layout"] and "deepmind" in dm.info["layout"]
    assert load_cnn(tmp_path, limit_per_split=2).sizes() == {"train": 2, "dev": 2, "test": 2}
    (folder / "dev.txt").write_text("q @placeholder\n@entity1\n@entity1 here\n\nonly two\nlines\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"dev\.txt:5: expected 3 lines \(query, answer, passage\)"):
        load_cnn(tmp_path)


def test_cnn_answers_must_be_in_the_passage_and_the_classes(tmp_path):
    bad = {**CNN_EXAMPLES, "test": [*CNN_EXAMPLES["test"][:2], ("@entity2 left @entity0", "@entity2 left", "@entity7")]}
    write_cnn(tmp_path / "a", bad)
    with pytest.raises(ValueError, match=r"2te\w*\.question: the answer @entity7 is not among the context's entities"):
        load_cnn(tmp_path / "a")
    bad = {
        **CNN_EXAMPLES,
        "test": [*CNN_EXAMPLES["test"][:2], ("@entity9 left @entity0", "@placeholder left", "@entity9")],
    }
    write_cnn(tmp_path / "b", bad)
    with pytest.raises(ValueError, match=r"2te\w*\.question: the test answer @entity9 \(entityj\) is not among the 6"):
        load_cnn(tmp_path / "b")


@pytest.mark.parametrize(
    "text, message",
    [
        ("http://x\n\n@entity0 won\n\n@placeholder won\n\n@entity0\n", "expected 5 sections .* found 4"),
        ("http://x\n\n\n\n@placeholder won\n\n@entity0\n\n@entity0:A\n", "empty context"),
        ("http://x\n\n@entity0 won\n\n@placeholder won\n\n\n\n@entity0:A\n", "empty answer"),
        (
            "http://x\n\n@entity0 won\n\n@placeholder won\n\nAlice\n\n@entity0:A\n",
            "the answer must be one entity @entityN, got 'Alice'",
        ),
        (
            "http://x\n\n@entity0 won\nagain\n\n@placeholder won\n\n@entity0\n\n@entity0:A\n",
            "the context section must be one line, found 2",
        ),
        (b"\xff\xfe", "not UTF-8"),
    ],
)
def test_cnn_malformed_question_files_are_named(tmp_path, text, message):
    write_cnn(tmp_path)
    path = tmp_path / "cnn" / "questions" / "validation" / "0bad.question"
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    with pytest.raises(ValueError, match=r"0bad\.question: " + message):
        load_cnn(tmp_path)


def test_cnn_missing_folders_and_empty_splits(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_cnn(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match=r"holds neither DeepMind's questions/\{training, validation, test\}"):
        load_cnn(tmp_path)
    write_cnn(tmp_path)
    for f in (tmp_path / "cnn" / "questions" / "test").iterdir():
        f.unlink()
    with pytest.raises(ValueError, match=r"test: holds no \.question file"):
        load_cnn(tmp_path)
    (tmp_path / "cnn" / "questions" / "test").rmdir()
    with pytest.raises(FileNotFoundError, match=r"questions lacks test/ \(it must hold training, validation, test/\)"):
        load_cnn(tmp_path)
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "train.txt").write_text("q\n@entity0\n@entity0 p\n", encoding="utf-8")
    with pytest.raises(FileNotFoundError, match=r"lacks dev\.txt, test\.txt"):
        load_cnn(tmp_path / "c")
