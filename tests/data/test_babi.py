"""bAbI tasks 1-3 (attnmetrics.data.babi): the generator ported from facebookarchive/bAbI-tasks' Lua,
the published v1.2 text format (reader and writer), J&W's examples and ``load_babi``'s splits.

Where an expected number comes from:

- 5 questions per story: WhereIsActor.lua asks at i = 3, 6, ..., 15; WhereIsObject.lua and
  WhereWasObject.lua loop ``while num_questions < 5``. So 1,000 questions (the published en/ files)
  are 200 stories and 10,000 (en-10k/ train) 2,000.
- Task 1 stories are exactly 15 lines, two statements before each question (WhereIsActor.lua).
- Tasks 2-3: a question only when ``story_length > 2`` (at least 3 statements since the last
  question), then with probability 1/2 (``math.random(2) < 2``) if an object qualifies: so every gap
  is >= 3 statements, a story has >= 5 * (3 + 1) = 20 lines, and the mean gap is >= 3 + 1 = 4
  (a geometric number of further statements with success probability <= 1/2).
- Supporting facts: 1 (task 1: the actor's last move), 2 (task 2: the get and the holder's move),
  exactly 3 (task 3: stringify.lua's BeforeIsIn requires ``#support == 3``).
- Answers: task 1's is where an actor went, uniform over the 5 other places from any place, so the six
  locations come out near 1/6 each. In tasks 2-3 the answer is where a held object is (or was), and
  the objects start in the kitchen (apple, milk) and the garden (football) of world_basic.txt, where
  they are picked up, so these two are the most frequent answers; every location still occurs.
- data-stats.sh counts stories (not questions) as examples, unique stories and train/test overlap.
"""

from __future__ import annotations

import collections
import re

import pytest

from attnmetrics.data import babi as B
from attnmetrics.data.corpora import Splits
from attnmetrics.data.pairs import Pair

# --------------------------------------------------------------------------- an independent checker

# The Lua's phrasings and, for the published fixture, the v1.2 files' ("went back to", "picked up
# the apple there", "discarded", "left").
_MOVE = re.compile(r"(\w+) (?:went|journeyed|travelled|moved)(?: back)? to the (\w+)\.")
_GET = re.compile(r"(\w+) (?:grabbed|took|got|picked up) the (\w+)(?: there)?\.")
_DROP = re.compile(r"(\w+) (?:dropped|put down|let go of|discarded|left) the (\w+)\.")
_Q_ACTOR = re.compile(r"Where is ([A-Z]\w+)\?")
_Q_OBJECT = re.compile(r"Where is the (\w+)\?")
_Q_BEFORE = re.compile(r"Where was the (\w+) before the (\w+)\?")


def check_story(story: B.Story) -> None:
    """Replay the statements as a reader would (who went where, who got or dropped what, on which
    line) and assert each answer and its supporting lines follow from them."""
    moves: dict[str, list[tuple[int, str]]] = collections.defaultdict(list)  # actor -> [(line, place)]
    last_event: dict[str, tuple[str, str, int]] = {}  # object -> ("get" | "drop", actor, line)
    seen: dict[str, list[str]] = collections.defaultdict(list)  # object -> places, consecutive repeats merged

    def loc(actor: str, before: int) -> tuple[int, str] | None:
        """The actor's last move before line ``before``."""
        earlier = [m for m in moves[actor] if m[0] < before]
        return earlier[-1] if earlier else None

    def place_of(obj: str, now: int) -> str | None:
        if obj not in last_event:
            return None
        kind, actor, line = last_event[obj]
        where = loc(actor, now if kind == "get" else line)
        return where[1] if where else None

    for n, line in enumerate(story.lines, 1):
        if not line.is_question:
            if m := _MOVE.fullmatch(line.text):
                moves[m[1]].append((n, m[2]))
            elif m := _GET.fullmatch(line.text):
                assert last_event.get(m[2], ("drop",))[0] == "drop", f"line {n}: {m[2]} is already held"
                last_event[m[2]] = ("get", m[1], n)
            elif m := _DROP.fullmatch(line.text):
                assert last_event.get(m[2], ("get", m[1]))[:2] == ("get", m[1]), f"line {n}: {m[1]} does not hold it"
                last_event[m[2]] = ("drop", m[1], n)
            else:
                raise AssertionError(f"line {n}: unknown statement {line.text!r}")
            for obj in list(last_event):
                p = place_of(obj, n + 1)
                if p is not None and (not seen[obj] or seen[obj][-1] != p):
                    seen[obj].append(p)
            continue
        assert all(k < n and not story.lines[k - 1].is_question for k in line.supporting)
        sup = tuple(sorted(line.supporting))
        if m := _Q_ACTOR.fullmatch(line.text):
            last = loc(m[1], n)
            assert last is not None, f"line {n}: {m[1]}'s place is unknown"
            assert line.answer == last[1] and sup == (last[0],), f"line {n}"
        elif m := _Q_OBJECT.fullmatch(line.text):
            kind, actor, at = last_event[m[1]]
            last = loc(actor, n if kind == "get" else at)
            assert last is not None, f"line {n}: {m[1]}'s place is unknown"
            assert line.answer == last[1] and sup == tuple(sorted((at, last[0]))), f"line {n}"
        elif m := _Q_BEFORE.fullmatch(line.text):
            obj, after = m[1], m[2]
            assert len(seen[obj]) >= 2 and seen[obj][-1] == after and seen[obj][-2] == line.answer, f"line {n}"
            # the last move of a holder while holding it took it to its last place; the facts are that
            # move, the get that began the holding, and the holder's move before (the earlier place)
            carried = [(k, a, p) for a in moves for k, p in moves[a] if k < n and _holding(story, obj, k) == ("get", a)]
            last_move, holder, dest = max(carried)
            assert dest == after, f"line {n}"
            get_line = _holding(story, obj, last_move, line_of_get=True)
            prev = loc(holder, last_move)
            assert prev is not None and prev[1] == line.answer, f"line {n}"
            assert sup == tuple(sorted({get_line, prev[0], last_move})), f"line {n}: {sup}"
        else:
            raise AssertionError(f"line {n}: unknown question {line.text!r}")


def _holding(story: B.Story, obj: str, before: int, line_of_get: bool = False):
    """Who holds ``obj`` just before line ``before`` (("get", actor) or ("drop", actor)), or the line of that get."""
    state: tuple = ("drop", None, 0)
    for n, line in enumerate(story.lines[: before - 1], 1):
        if (m := _GET.fullmatch(line.text)) and m[2] == obj:
            state = ("get", m[1], n)
        elif (m := _DROP.fullmatch(line.text)) and m[2] == obj:
            state = ("drop", m[1], n)
    return state[2] if line_of_get else state[:2]


# --------------------------------------------------------------------------- fixtures

_TRAIN_SEED = {t: B._derive_seed("babi", t, "train", 0) for t in B.TASKS}


@pytest.fixture(scope="module")
def generated() -> dict[int, list[B.Story]]:
    """1,000 questions of each task (a published en/ file's size)."""
    return {t: B.generate(t, 1000, _TRAIN_SEED[t]) for t in B.TASKS}


# The published v1.2 format: the first lines of en/qa1 (as the brief gives them) and of en/qa2.
PUBLISHED = (
    "1 Mary moved to the bathroom.\n"
    "2 John went to the hallway.\n"
    "3 Where is Mary? \tbathroom\t1\n"
    "4 Daniel went back to the hallway.\n"
    "5 Sandra moved to the garden.\n"
    "6 Where is Daniel? \thallway\t4\n"
    "1 Mary got the milk there.\n"
    "2 John moved to the bedroom.\n"
    "3 Sandra went back to the kitchen.\n"
    "4 Mary travelled to the hallway.\n"
    "5 Where is the milk? \thallway\t1 4\n"
    "6 John got the football there.\n"
    "7 John went to the hallway.\n"
    "8 Where is the football? \thallway\t6 7\n"
    "9 John put down the football.\n"
    "10 Mary went to the garden.\n"
    "11 Where is the football? \thallway\t9 7\n"
    "12 John went to the kitchen.\n"
    "13 Sandra travelled to the hallway.\n"
    "14 Where is the football? \thallway\t9 7\n"
    "15 Daniel went to the hallway.\n"
    "16 Mary discarded the milk.\n"
    "17 Where is the milk? \tgarden\t16 10\n"
)


# --------------------------------------------------------------------------- format


def test_generated_text_has_the_published_form(generated, tmp_path):
    statement = re.compile(r"\d+ [A-Z][a-z]+ [a-z ]+ the [a-z]+\.")
    question = {
        1: re.compile(r"\d+ Where is (John|Mary|Sandra|Daniel)\? \t[a-z]+\t\d+"),
        2: re.compile(r"\d+ Where is the (apple|football|milk)\? \t[a-z]+\t\d+ \d+"),
        3: re.compile(r"\d+ Where was the (apple|football|milk) before the [a-z]+\? \t[a-z]+\t\d+ \d+ \d+"),
    }
    for t, stories in generated.items():
        path = B.write_babi(stories, tmp_path / B.task_file_name(t, "train"))
        lines = path.read_text(encoding="utf-8").split("\n")
        assert lines[-1] == "" and lines[0].startswith("1 ")
        prev = 0
        for line in lines[:-1]:
            n = int(line.split(" ", 1)[0])
            assert n in (1, prev + 1)
            prev = n
            if "\t" in line:
                assert question[t].fullmatch(line), line
                assert line.count("\t") == 2
            else:
                assert statement.fullmatch(line), line
        # the answer is a location; supporting ids ascend (stringify sorts them)
        for story in stories:
            for _, q in story.questions():
                assert q.answer in B.LOCATIONS and list(q.supporting) == sorted(q.supporting)
    words = {w for s in generated[2] for line in s.lines for w in line.text.rstrip(".?").split()}
    assert {"grabbed", "took", "got", "dropped", "put", "let", "went", "journeyed", "travelled", "moved"} <= words


def test_round_trip(generated, tmp_path):
    for t, stories in generated.items():
        path = B.write_babi(stories, tmp_path / f"qa{t}.txt")
        assert B.read_babi(path) == stories
        assert B.format_babi(B.read_babi(path)) == path.read_text(encoding="utf-8")
    assert not list(tmp_path.glob(".*.tmp"))  # the atomic write left no temporary file


def test_determinism_and_seeds():
    for t in B.TASKS:
        a, b, c = B.generate(t, 100, 7), B.generate(t, 100, 7), B.generate(t, 100, 8)
        assert a == b and a != c


def test_generate_does_not_touch_global_random():
    import random

    random.seed(123)
    expected = random.random()
    random.seed(123)
    B.generate(3, 20, 1)
    assert random.random() == expected


def test_published_sizes(generated):
    for stories in generated.values():
        assert B.count_questions(stories) == 1000 and len(stories) == 200
        assert all(s.num_questions() == 5 for s in stories)
    big = B.generate(1, 10000, 3)  # en-10k/ train
    assert B.count_questions(big) == 10000 and len(big) == 2000
    odd = B.generate(2, 7, 0)  # not a multiple of 5: the last story stops at its 2nd question
    assert [s.num_questions() for s in odd] == [5, 2] and odd[1].lines[-1].is_question
    assert B.generate(1, 0, 0) == []
    with pytest.raises(ValueError, match="task"):
        B.generate(4, 10, 0)


# --------------------------------------------------------------------------- statistics


def _gaps(story: B.Story) -> list[int]:
    gaps, g = [], 0
    for line in story.lines:
        if line.is_question:
            gaps.append(g)
            g = 0
        else:
            g += 1
    return gaps


def test_story_shapes_follow_the_lua(generated):
    for story in generated[1]:
        assert len(story.lines) == 15 and [n for n, _ in story.questions()] == [3, 6, 9, 12, 15]
    for t in (2, 3):
        gaps = [g for s in generated[t] for g in _gaps(s)]
        assert min(gaps) >= 3
        assert all(len(s.lines) >= 20 for s in generated[t])
        assert sum(gaps) / len(gaps) >= 4
        assert gaps.count(3) / len(gaps) <= 0.5 + 0.05  # P(question at the 3rd statement) <= 1/2
    sizes = {t: {len(q.supporting) for s in st for _, q in s.questions()} for t, st in generated.items()}
    assert sizes == {1: {1}, 2: {2}, 3: {3}}


def test_answer_shares(generated):
    for t, stories in generated.items():
        counts = collections.Counter(q.answer for s in stories for _, q in s.questions())
        assert set(counts) == set(B.LOCATIONS)
        shares = {k: v / 1000 for k, v in counts.items()}
        if t == 1:  # near 1/6 each: +-5 standard deviations of a share of 1,000 (0.012)
            assert all(0.11 <= s <= 0.23 for s in shares.values()), shares
        else:  # the objects' starting places lead, every place still answers
            assert min(shares.values()) >= 0.05, shares
            assert set(sorted(shares, key=shares.get)[-2:]) == {"kitchen", "garden"}, shares


def test_train_and_test_stories_do_not_overlap():
    # data-stats.sh: stories as examples, text and answers (cut -f 1,2), unique and overlapping
    def keys(stories):
        return {"\n".join(f"{line.text}\t{line.answer}" for line in s.lines) for s in stories}

    for t in B.TASKS:
        train, test = B.generate(t, 500, 1), B.generate(t, 500, 2)
        assert len(keys(train)) == 100 and len(keys(test)) == 100 and not keys(train) & keys(test)


def test_every_answer_follows_from_its_supporting_facts(generated):
    for stories in generated.values():
        for story in stories:
            check_story(story)


def test_checker_rejects_a_wrong_answer_and_wrong_support(generated):
    for t in B.TASKS:
        story = generated[t][0]
        n, q = story.questions()[-1]
        wrong = next(p for p in B.LOCATIONS if p != q.answer)
        other = next(k for k in range(1, n) if k not in q.supporting and not story.lines[k - 1].is_question)
        for bad in (
            B.Line(q.text, wrong, q.supporting),  # another place
            B.Line(q.text, q.answer, (*q.supporting[:-1], other)),  # one supporting fact swapped
            B.Line(q.text, q.answer, q.supporting[1:] or (other,)),  # one dropped
        ):
            lines = list(story.lines)
            lines[n - 1] = bad
            with pytest.raises(AssertionError):
                check_story(B.Story(tuple(lines)))


# --------------------------------------------------------------------------- the published format, read


def test_published_fixture_is_read(tmp_path):
    path = tmp_path / "qa2_two-supporting-facts_train.txt"
    path.write_text(PUBLISHED, encoding="utf-8")
    stories = B.read_babi(path)
    assert [len(s.lines) for s in stories] == [6, 17]
    assert stories[0].lines[0] == B.Line("Mary moved to the bathroom.")
    assert stories[0].lines[2] == B.Line("Where is Mary?", "bathroom", (1,))
    assert stories[1].lines[10] == B.Line("Where is the football?", "hallway", (9, 7))
    for story in stories:
        check_story(story)
    ex = B.examples(stories)
    assert len(ex) == 7
    assert ex[0] == ("Mary moved to the bathroom . John went to the hallway", "Where is Mary", "bathroom", (0,))
    # the question line is not in the passage; supporting line 9 is the passage's 7th sentence (index 6)
    passage, question, answer, sup = ex[4]
    assert passage.split(" . ")[sup[0]] == "John went to the hallway" and passage.count(" . ") == 7
    assert (question, answer, sup) == ("Where is the football", "hallway", (5, 6))


def test_reader_accepts_the_lua_form_and_crlf(tmp_path):
    path = tmp_path / "lua.txt"
    path.write_bytes(b"1 Mary moved to the office.\r\n2 Where is Mary?\toffice\t1\r\n\r\n")
    assert B.read_babi(path) == [
        B.Story((B.Line("Mary moved to the office."), B.Line("Where is Mary?", "office", (1,))))
    ]


@pytest.mark.parametrize(
    "text, line, message",
    [
        ("Mary moved to the bathroom.\n", 1, "not a numbered line"),
        ("1 Mary moved to the bathroom.\n3 Where is Mary? \tbathroom\t1\n", 2, "skips"),
        ("1 Mary moved to the bathroom.\n2 Where is Mary?\n", 2, "question line needs"),
        ("1 Mary moved to the bathroom.\n2 Where is Mary? \tbathroom\n", 2, "question line needs"),
        ("1 Mary moved to the bathroom.\n2 Where is Mary? \tbathroom\t\n", 2, "question line needs"),
        ("1 Mary moved to the bathroom.\n2 Where is Mary? \t\t1\n", 2, "question line needs"),
        ("1 Mary moved to the bathroom.\n2 Where is Mary? \tbathroom\t2\n", 2, "not an earlier line"),
        ("1 Mary moved to the bathroom.\n2 Where is Mary? \tbathroom\t0\n", 2, "not an earlier line"),
        ("1 Mary moved to the bathroom.\n2 Where is Mary? \tbathroom\tx\n", 2, "not a line number"),
        (
            "1 Mary moved to the bathroom.\n2 Where is Mary? \tbathroom\t1\n3 Where is Mary? \tbathroom\t2\n",
            3,
            "points at a question",
        ),
        (
            "1 Mary moved to the bathroom.\n2 Where is Mary? \tbathroom\t1\n3 John went to the hallway.\n",
            3,
            "ends without",
        ),
        (
            "1 Mary moved to the bathroom.\n1 Mary moved to the office.\n2 Where is Mary? \toffice\t1\n",
            1,
            "ends without",
        ),
    ],
)
def test_reader_errors_name_file_and_line(tmp_path, text, line, message):
    path = tmp_path / "bad.txt"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match=re.escape(f"{path}:{line}:") + ".*" + message):
        B.read_babi(path)


def test_reader_errors_on_empty_and_binary_files(tmp_path):
    for content in (b"", b"\n\n"):
        (tmp_path / "empty.txt").write_bytes(content)
        with pytest.raises(ValueError, match=re.escape(str(tmp_path / "empty.txt")) + ": holds no story"):
            B.read_babi(tmp_path / "empty.txt")
    (tmp_path / "bin.txt").write_bytes(b"1 \xff\xfe\n")
    with pytest.raises(ValueError, match="not UTF-8"):
        B.read_babi(tmp_path / "bin.txt")


# --------------------------------------------------------------------------- load_babi


def test_load_babi_generates_once_then_reads_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNMETRICS_CACHE", str(tmp_path / "cache"))
    first = B.load_babi(1, seed=5)
    files = sorted(p.name for p in (tmp_path / "cache" / "babi").iterdir())
    assert files == [
        "qa1_single-supporting-fact_gen1_1k_seed5_test.txt",
        "qa1_single-supporting-fact_gen1_1k_seed5_train.txt",
    ]

    def fail(*args, **kwargs):
        raise AssertionError("generated again instead of reading the cache")

    monkeypatch.setattr(B, "generate", fail)
    second = B.load_babi(1, seed=5)
    assert second == first
    with pytest.raises(AssertionError, match="generated again"):
        B.load_babi(1, seed=6)


def test_load_babi_splits(tmp_path):
    s = B.load_babi(2, cache_dir=tmp_path, seed=0)
    assert isinstance(s, Splits) and s.name == "babi2"
    assert s.sizes() == {"train": 850, "dev": 150, "test": 1000}
    assert s.classes == tuple(sorted(B.LOCATIONS))
    for part in (s.train, s.dev, s.test):
        for pair, label in part[:50]:
            assert isinstance(pair, Pair) and 0 <= label < len(s.classes)
            assert pair.question.startswith("Where is the ") and not pair.question.endswith("?")
            assert not pair.passage.endswith(".")
    assert s.info["questions"] == {"train": 850, "dev": 150, "test": 1000}
    assert s.info["stories"] == {"train": 200, "test": 200}
    assert "port of facebookarchive/bAbI-tasks" in s.info["source"] and "seed 0" in s.info["source"]
    assert s.train[:5] != s.test[:5]  # train and test are drawn with different seeds
    again = B.load_babi(2, cache_dir=tmp_path, seed=0)
    assert again.dev == s.dev
    other = B.load_babi(2, cache_dir=tmp_path, seed=1)
    assert other.train != s.train and other.test != s.test
    # the label is the answer of the question, as the generated file says
    stories = B.read_babi(tmp_path / "babi" / "qa2_two-supporting-facts_gen1_1k_seed0_test.txt")
    answers = [a for _, _, a, _ in B.examples(stories)]
    assert [s.classes[y] for _, y in s.test] == answers
    with pytest.raises(ValueError, match="size"):
        B.load_babi(1, cache_dir=tmp_path, size="5k")


def test_load_babi_reads_a_published_folder(tmp_path):
    stories = B.read_babi(_write(tmp_path / "one.txt", PUBLISHED))
    root = tmp_path / "tasks_1-20_v1-2"
    B.write_babi(stories * 4, root / "en" / B.task_file_name(2, "train"))
    B.write_babi(stories[:1], root / "en" / B.task_file_name(2, "test"))
    s = B.load_babi(2, data_dir=root, seed=0)
    assert s.sizes() == {"train": 23, "dev": 5, "test": 2}
    assert s.classes == ("bathroom", "garden", "hallway")
    assert s.info["stories"] == {"train": 8, "test": 1} and str(root / "en") in s.info["source"]
    assert s.test[0] == (Pair("Mary moved to the bathroom . John went to the hallway", "Where is Mary"), 0)
    # the files directly in the folder are found too
    assert B.load_babi(2, data_dir=root / "en").sizes() == s.sizes()
    with pytest.raises(FileNotFoundError, match="en-10k"):
        B.load_babi(2, data_dir=root, size="10k")


def test_load_babi_names_an_answer_never_seen_in_training(tmp_path):
    _write(
        tmp_path / B.task_file_name(1, "train"), "1 Mary moved to the bathroom.\n2 Where is Mary? \tbathroom\t1\n" * 4
    )
    _write(tmp_path / B.task_file_name(1, "test"), "1 Mary moved to the office.\n2 Where is Mary? \toffice\t1\n")
    with pytest.raises(ValueError, match="test answer 'office'"):
        B.load_babi(1, data_dir=tmp_path)


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path
