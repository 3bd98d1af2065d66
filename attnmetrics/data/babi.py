"""bAbI tasks 1-3 (single, two and three supporting facts), the question-answering sets Jain & Wallace
2019 (sec. 3) test attention on: a seeded Python port of the generator, a reader and writer for the
published text format, and :func:`load_babi`, the train/dev/test :class:`~attnmetrics.data.corpora.Splits`.

Source: Weston, Bordes, Chopra, Mikolov, Rush, van Merriënboer 2015, "Towards AI-Complete Question
Answering: A Set of Prerequisite Toy Tasks" (arXiv:1502.05698); the rules are ported from the Lua
generator facebookarchive/bAbI-tasks: ``lua/babi/World.lua``, ``Task.lua``, ``Clause.lua``,
``actions.lua`` (Teleport, Get, Drop), ``Knowledge.lua`` (what the reader knows, with the clauses that
support it; ``get_value_history``), ``Question.lua``, ``stringify.lua`` (the templates SimpleTeleport,
SimpleGet, SimpleDrop, EvalIsIn, BeforeIsIn, the capitalisation and punctuation), the three tasks
``tasks/WhereIsActor.lua``, ``WhereIsObject.lua``, ``WhereWasObject.lua``, the world
``tasks/worlds/world_basic.txt``, the driver ``babi-tasks`` and ``data-stats.sh``.

The world (world_basic): actors John (kitchen), Mary (bedroom), Sandra (garden), Daniel (hallway);
objects one can get: apple (kitchen), football (garden), milk (kitchen); six locations bedroom,
kitchen, garden, hallway, bathroom, office. (The table is not gettable and never used by these tasks.)
The reader of a story starts knowing nothing; the world's starting places only constrain what can
happen (an actor cannot go where he is, nor get an object that is not where he is).

Actions and their text (stringify.lua, default configuration: no coreference, no conjunction):

- teleport: "<Actor> went to / journeyed to / travelled to / moved to the <location>."
- get: "<Actor> grabbed / took / got the <object>." (valid when the object lies where the actor is)
- drop: "<Actor> dropped / put down / let go of the <object>." (valid when the actor holds it)

The tasks:

1. WhereIsActor: 15 lines, two teleports then "Where is <Actor>?" about an actor whose location the
   reader knows, five times; the answer's support is the actor's last move (1 fact).
2. WhereIsObject: a random action (get, drop or teleport, 1/3 each, then a valid clause of that kind);
   after at least 3 statements since the last question, with probability 1/2 a question
   "Where is the <object>?" about an object held by an actor whose location the reader knows; the
   support is the get and the holder's last move (2 facts). Five questions per story.
3. WhereWasObject: the same story process; the question "Where was the <object> before the <location>?"
   about an object the reader has seen in at least two places (locations of held objects resolved
   through their holder), asking for the place before the last; the support is the union of the
   supports of the last two places. ``stringify.lua`` (BeforeIsIn) renders it only when that union has
   exactly 3 clauses; otherwise the whole story fails and ``babi-tasks`` draws a new one, so stories
   with a 2- or 4-clause support never appear (here: the story is abandoned at that question and drawn
   again, the same distribution). Five questions per story.

Where the port differs from the Lua, and why:

- Randomness: ``random.Random(seed)``, never global state (the Lua seeds ``math.random`` with the
  clock), so a seed gives the same stories on every machine. The Lua's sampling structure is kept
  (a clause is drawn by up to 100 tries of uniform actor, action and argument until a valid one,
  ``Clause.sample_valid``; in tasks 2-3 a failed draw goes back to choosing get/drop or teleport).
- Size: ``babi-tasks N`` writes N stories; the published files count questions (1,000 per ``en/``
  file, 10,000 in ``en-10k/`` train; 5 per story, so 200 and 2,000 stories). :func:`generate`
  takes a number of questions; a number that is not a multiple of 5 ends the last story early, at
  that question.
- Question lines are written as in the published v1.2 files, "Where is Mary? \\tbathroom\\t1" (a space
  before the tab), where the Lua's template has none; the reader accepts either.
- The published v1.2 data was made by an earlier generator (the README: "it is not possible to
  produce exactly the same dataset"); its text has phrasings the Lua rewrite lacks ("went back to",
  "picked up the apple there", "discarded", "left the milk"), its task 2 also asks about dropped
  objects (WhereIsObject.lua only about held ones), and its tasks 2-3 ask after as few as 2
  statements (en/qa2's first story asks on lines 5, 8, 11, 14, 17) where the Lua waits for 3
  (``story_length > 2``). This module follows the Lua, whose rules can be read; :func:`read_babi`
  reads the published files as they are.

The format (bAbI v1.2, ``qa1_single-supporting-fact_train.txt`` and so on): a story's lines are
numbered from 1, a new story starts when the number returns to 1; a statement is ``N text.``; a
question is ``N question?\\tanswer\\tsupporting line numbers separated by spaces``.
"""

from __future__ import annotations

import hashlib
import math
import os
import random
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from attnmetrics.data.artifacts import default_cache_dir
from attnmetrics.data.pairs import Pair, check_pairs
from attnmetrics.data.splits import Splits

TASKS = {1: "single-supporting-fact", 2: "two-supporting-facts", 3: "three-supporting-facts"}

#: world_basic.txt: the six locations, the four actors, the three gettable objects, starting places
LOCATIONS = ("bedroom", "kitchen", "garden", "hallway", "bathroom", "office")
ACTORS = ("John", "Mary", "Sandra", "Daniel")
OBJECTS = ("apple", "football", "milk")
START = {
    "John": "kitchen",
    "Mary": "bedroom",
    "Sandra": "garden",
    "Daniel": "hallway",
    "apple": "kitchen",
    "football": "garden",
    "milk": "kitchen",
}

#: stringify.lua's templates (SimpleTeleport, SimpleGet, SimpleDrop), ``{a}`` the actor, ``{x}`` the argument
PHRASES = {
    "teleport": ("{a} went to the {x}", "{a} journeyed to the {x}", "{a} travelled to the {x}", "{a} moved to the {x}"),
    "get": ("{a} grabbed the {x}", "{a} took the {x}", "{a} got the {x}"),
    "drop": ("{a} dropped the {x}", "{a} put down the {x}", "{a} let go of the {x}"),
}

QUESTIONS_PER_STORY = 5  # WhereIsActor: i = 3, 6, ..., 15; WhereIsObject/WhereWasObject: while num_questions < 5
SIZES = {"1k": 1000, "10k": 10000}  # training questions of the published en/ and en-10k/ files
TEST_QUESTIONS = 1000  # both en/ and en-10k/ test files
DEV_FRACTION = 0.15  # J&W's Babi.ipynb: train_test_split(test_size=0.15)
GENERATOR_VERSION = 1  # in the cache file names: a changed generator never reads stale files

_TRIES = 100  # Clause.sample_valid


# --------------------------------------------------------------------------- stories


@dataclass(frozen=True)
class Line:
    """One numbered line of a story.

    text: a statement with its final period ("Mary moved to the bathroom.") or a question with its
        question mark ("Where is Mary?").
    answer: the answer word of a question; None for a statement.
    supporting: a question's supporting facts, as the 1-based line numbers of statements earlier in
        the same story (the published file's third field); () for a statement."""

    text: str
    answer: str | None = None
    supporting: tuple[int, ...] = ()

    @property
    def is_question(self) -> bool:
        return self.answer is not None


@dataclass(frozen=True)
class Story:
    """A story's lines in order; line ``i`` (0-based) is numbered ``i + 1`` in the file."""

    lines: tuple[Line, ...]

    def questions(self) -> list[tuple[int, Line]]:
        """The ``(line number, line)`` of each question, in order."""
        return [(i + 1, line) for i, line in enumerate(self.lines) if line.is_question]

    def num_questions(self) -> int:
        return sum(line.is_question for line in self.lines)


def count_questions(stories: list[Story]) -> int:
    return sum(s.num_questions() for s in stories)


# --------------------------------------------------------------------------- the simulation


class _World:
    """Where things are (``place``: an actor's location; an object's location or holding actor) and
    what the reader knows (``known``: entity -> (value, the indices of the clauses supporting it)),
    updated as Teleport/Get/Drop's ``perform`` and ``update_knowledge`` in actions.lua do."""

    def __init__(self) -> None:
        self.place: dict[str, str] = dict(START)
        self.known: dict[str, tuple[str, frozenset[int]]] = {}
        self.clauses = 0

    def is_valid(self, kind: str, actor: str, arg: str) -> bool:
        if kind == "teleport":
            return self.place[actor] != arg
        if kind == "get":
            return self.place[arg] == self.place[actor]
        return self.place[arg] == actor  # drop

    def perform(self, kind: str, actor: str, arg: str) -> int:
        """Apply the clause to the world and to the reader's knowledge; its index."""
        c = self.clauses
        self.clauses += 1
        if kind == "teleport":
            self.place[actor] = arg
            self.known[actor] = (arg, frozenset({c}))
        elif kind == "get":
            self.place[arg] = actor
            self.known[arg] = (actor, frozenset({c}))
        else:
            self.place[arg] = self.place[actor]
            if actor in self.known:  # the object is where its dropper is known to be
                loc, support = self.known[actor]
                self.known[arg] = (loc, support | {c})
            else:  # "We just don't know where the object is"
                self.known.pop(arg, None)
        return c

    def resolved(self, obj: str) -> tuple[str, frozenset[int]] | None:
        """Knowledge.get_value_history's value at this step: the object's known place, a holder's
        known location standing for the holder (support merged); None if unknown."""
        if obj not in self.known:
            return None
        value, support = self.known[obj]
        if value in ACTORS:
            if value not in self.known:
                return None
            loc, holder_support = self.known[value]
            return loc, support | holder_support
        return value, support


def _sample_valid(rng: random.Random, world: _World, kinds: tuple[str, ...], args: tuple[str, ...]):
    """Clause.sample_valid: up to 100 draws of (actor, action, argument), the first valid one, else None."""
    for _ in range(_TRIES):
        actor, kind, arg = rng.choice(ACTORS), rng.choice(kinds), rng.choice(args)
        if world.is_valid(kind, actor, arg):
            return kind, actor, arg
    return None


def _story_clause(rng: random.Random, world: _World):
    """WhereIsObject/WhereWasObject: get, drop or teleport at 1/3 each; drawn again until valid."""
    while True:
        if rng.choice(("get", "drop", "teleport")) == "teleport":
            clause = _sample_valid(rng, world, ("teleport",), LOCATIONS)
        else:
            clause = _sample_valid(rng, world, ("get", "drop"), OBJECTS)
        if clause is not None:
            return clause


# A story under construction: ("s", kind, actor, arg, clause index) or ("q", text, answer, clause indices)
def _task1(rng: random.Random) -> list[tuple] | None:
    world, story = _World(), []
    for i in range(1, 16):
        if i % 3:
            clause = None
            while clause is None:
                clause = _sample_valid(rng, world, ("teleport",), LOCATIONS)
            story.append(("s", *clause, world.perform(*clause)))
        else:
            known = [a for a in ACTORS if a in world.known]
            actor = rng.choice(known)
            loc, support = world.known[actor]
            story.append(("q", f"Where is {actor}?", loc, support))
    return story


def _task23(rng: random.Random, task: int) -> list[tuple] | None:
    world, story = _World(), []
    history: dict[str, list[tuple[str, frozenset[int]]]] = {o: [] for o in OBJECTS}
    asked = since = 0
    while asked < QUESTIONS_PER_STORY:
        clause = _story_clause(rng, world)
        story.append(("s", *clause, world.perform(*clause)))
        since += 1
        for o in OBJECTS:
            now = world.resolved(o)
            if now is not None and (not history[o] or history[o][-1][0] != now[0]):
                history[o].append(now)
        if since > 2 and rng.randrange(2) == 0:  # math.random(2) < 2
            if task == 2:
                # held by an actor whose location the reader knows (the filter of WhereIsObject.lua)
                known = [o for o in OBJECTS if o in world.known and world.place[o] in ACTORS]
                known = [o for o in known if world.place[o] in world.known]
                if not known:
                    continue
                obj = rng.choice(known)
                holder, support = world.known[obj]
                loc, holder_support = world.known[holder]
                story.append(("q", f"Where is the {obj}?", loc, support | holder_support))
            else:
                known = [o for o in OBJECTS if len(history[o]) > 1]
                if not known:
                    continue
                obj = rng.choice(known)
                (before, s1), (last, s2) = history[obj][-2:]
                if len(s1 | s2) != 3:  # BeforeIsIn is not valid: stringify fails, the story is redrawn
                    return None
                story.append(("q", f"Where was the {obj} before the {last}?", before, s1 | s2))
            asked += 1
            since = 0
    return story


def _render(rng: random.Random, story: list[tuple]) -> Story:
    """stringify: a template drawn uniformly per statement, capitalised, a period added; questions
    with their answer and the sorted line numbers of their supporting clauses."""
    line_of: dict[int, int] = {}
    lines = []
    for n, item in enumerate(story, 1):
        if item[0] == "s":
            _, kind, actor, arg, c = item
            line_of[c] = n
            text = rng.choice(PHRASES[kind]).format(a=actor, x=arg)
            lines.append(Line(text[0].upper() + text[1:] + "."))
        else:
            _, text, answer, support = item
            lines.append(Line(text, answer, tuple(sorted(line_of[c] for c in support))))
    return Story(tuple(lines))


def generate_story(task: int, rng: random.Random) -> Story:
    """One story of ``task`` (1, 2 or 3) drawn with ``rng`` (5 questions); see the module docstring."""
    _check_task(task)
    while True:
        story = _task1(rng) if task == 1 else _task23(rng, task)
        if story is not None:
            return _render(rng, story)


def generate(task: int, questions: int, seed: int) -> list[Story]:
    """Stories of bAbI task ``task`` (1, 2 or 3) holding exactly ``questions`` questions, the same for
    the same ``seed`` (``random.Random(seed)``; no global random state is read or changed).

    Each story holds 5 questions (the Lua's tasks), so 1,000 questions are 200 stories; when
    ``questions`` is not a multiple of 5 the last story stops after its ``questions % 5``-th question.
    Raises ValueError for a task outside 1-3 or a negative number of questions."""
    _check_task(task)
    if questions < 0:
        raise ValueError(f"questions must be >= 0, got {questions}")
    rng = random.Random(seed)
    stories: list[Story] = []
    left = questions
    while left > 0:
        story = generate_story(task, rng)
        q = story.questions()
        if len(q) > left:
            story = Story(story.lines[: q[left - 1][0]])
        stories.append(story)
        left -= story.num_questions()
    return stories


def _check_task(task: int) -> None:
    if task not in TASKS:
        raise ValueError(f"bAbI task must be one of {sorted(TASKS)}, got {task!r}")


# --------------------------------------------------------------------------- the published format


def format_babi(stories: list[Story]) -> str:
    """The text of a published-format file (each line ends with a newline)."""
    out = []
    for story in stories:
        for n, line in enumerate(story.lines, 1):
            if any(ch in line.text for ch in "\t\n\r"):
                raise ValueError(f"line text holds a tab or newline: {line.text!r}")
            if line.is_question:
                out.append(f"{n} {line.text} \t{line.answer}\t{' '.join(map(str, line.supporting))}\n")
            else:
                out.append(f"{n} {line.text}\n")
    return "".join(out)


def write_babi(stories: list[Story], path: str | os.PathLike) -> Path:
    """Write ``stories`` to ``path`` in the published bAbI v1.2 format (UTF-8), atomically: a temporary
    file in the same folder renamed over ``path``, so a reader never sees a partial file. Returns the path."""
    path = Path(path)
    text = format_babi(stories)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


_NUMBERED = re.compile(r"(\d+) (.*)")


def _parse_question(where: str, rest: str, lines: list[Line]) -> Line:
    """A question line's text after its number, checked against the story's earlier ``lines``."""
    parts = [p.strip() for p in rest.split("\t")]
    if len(parts) < 3 or not parts[1] or not parts[2]:
        raise ValueError(f"{where}: a question line needs 'question?<TAB>answer<TAB>supporting ids'")
    if len(parts) > 3:
        raise ValueError(f"{where}: a question line has {len(parts)} tab-separated fields, expected 3")
    ids = []
    for tok in parts[2].split():
        if not tok.isdigit():
            raise ValueError(f"{where}: supporting id {tok!r} is not a line number")
        k = int(tok)
        if not 1 <= k <= len(lines):
            raise ValueError(f"{where}: supporting id {k} is not an earlier line of this story (lines 1-{len(lines)})")
        if lines[k - 1].is_question:
            raise ValueError(f"{where}: supporting id {k} points at a question line, not a statement")
        ids.append(k)
    return Line(parts[0], parts[1], tuple(ids))


def read_babi(path: str | os.PathLike) -> list[Story]:
    """The stories of a published-format bAbI file (v1.2: ``qa1_single-supporting-fact_train.txt``...).

    Returns a list of :class:`Story`; statement texts keep their final period, question texts their
    question mark (spaces around the question are stripped). Blank lines are ignored.

    Raises ValueError naming the file and line for: text that is not UTF-8; a line that is not
    ``N text`` (not numbered); numbering that neither continues the story (N + 1) nor starts a new
    one (1); a question line (one with a tab, or ending in "?") without an answer or without
    supporting ids; a supporting id that is not a number, or not an earlier statement line of the
    same story (out of range, or a question line); a story that ends without a question (strict: such
    a story is an error, not skipped, since the published files have none and a cut-off file ends
    that way); a file without any line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text ({e})") from None
    stories: list[Story] = []
    lines: list[Line] = []
    last_n = 0  # the file line of the current story's last line

    def close() -> None:
        if lines:
            if not lines[-1].is_question:
                raise ValueError(f"{path}:{last_n}: the story ends without a question (its last line is a statement)")
            stories.append(Story(tuple(lines)))

    for n, raw in enumerate(text.splitlines(), 1):
        raw = raw.rstrip("\r\n")
        if not raw.strip():
            continue
        m = _NUMBERED.fullmatch(raw)
        if m is None:
            raise ValueError(f"{path}:{n}: not a numbered line ('N text' expected): {raw[:60]!r}")
        num, rest = int(m.group(1)), m.group(2)
        if num == 1:
            close()
            lines = []
        elif num != len(lines) + 1:
            raise ValueError(f"{path}:{n}: line number {num} skips (expected {len(lines) + 1} or 1 for a new story)")
        if "\t" in rest or rest.rstrip().endswith("?"):
            lines.append(_parse_question(f"{path}:{n}", rest, lines))
        else:
            lines.append(Line(rest.strip()))
        last_n = n
    close()
    if not stories:
        raise ValueError(f"{path}: holds no story (an empty bAbI file)")
    return stories


# --------------------------------------------------------------------------- J&W's examples


def examples(stories: list[Story]) -> list[tuple[str, str, str, tuple[int, ...]]]:
    """One ``(passage, question, answer, supporting)`` per question, as J&W's ``_parse``
    (AttentionExplanation, preprocess/Babi/Babi.ipynb) builds them:

    passage: the story's statements before the question (question lines left out), each without its
        final period, joined by " . " (J&W's ``" . ".join(substory)``);
    question: the question without its "?"; answer: the answer word;
    supporting: the 0-based positions, among the passage's sentences, of the supporting statements
        (the published 1-based line numbers mapped past the question lines), sorted."""
    out = []
    for story in stories:
        sentences: list[str] = []
        position: dict[int, int] = {}  # line number -> index in sentences
        for n, line in enumerate(story.lines, 1):
            if line.is_question:
                q = line.text[:-1] if line.text.endswith("?") else line.text
                sup = tuple(sorted(position[k] for k in line.supporting))
                out.append((" . ".join(sentences), q.strip(), line.answer, sup))
            else:
                position[n] = len(sentences)
                sentences.append(line.text[:-1] if line.text.endswith(".") else line.text)
    return out


# --------------------------------------------------------------------------- splits


def _derive_seed(*parts: object) -> int:
    """A seed from ``parts`` that is the same in every Python process (unlike ``hash``)."""
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little")


def task_file_name(task: int, split: str) -> str:
    """The published file name: ``qa{task}_{name}_{split}.txt``."""
    return f"qa{task}_{TASKS[task]}_{split}.txt"


def _find_published(task: int, data_dir: Path, size: str) -> tuple[Path, Path]:
    sub = "en" if size == "1k" else "en-10k"
    for folder in (data_dir, data_dir / sub):
        train, test = folder / task_file_name(task, "train"), folder / task_file_name(task, "test")
        if train.is_file() and test.is_file():
            return train, test
    raise FileNotFoundError(
        f"bAbI folder {data_dir} holds neither {task_file_name(task, 'train')} and "
        f"{task_file_name(task, 'test')} nor {sub}/ with them"
    )


def _generated(task: int, split: str, size: str, seed: int, questions: int, folder: Path) -> tuple[list[Story], Path]:
    """The generated split and its cache file: read from there, or generated and written there the first time."""
    path = folder / f"qa{task}_{TASKS[task]}_gen{GENERATOR_VERSION}_{size}_seed{seed}_{split}.txt"
    if path.is_file():
        stories = read_babi(path)
        if count_questions(stories) != questions:
            raise ValueError(
                f"{path}: holds {count_questions(stories)} questions, expected {questions} (delete it to regenerate)"
            )
        return stories, path
    stories = generate(task, questions, _derive_seed("babi", task, split, seed))
    write_babi(stories, path)
    return stories, path


def load_babi(
    task: int,
    cache_dir: str | os.PathLike | None = None,
    seed: int = 0,
    size: str = "1k",
    data_dir: str | os.PathLike | None = None,
) -> Splits:
    """bAbI task ``task`` (1, 2, 3) as ``Splits(name=f"babi{task}")`` of ``(Pair(passage, question), label)``.

    With ``data_dir``: the published files ``qa{task}_{name}_train.txt`` / ``_test.txt`` read from
    ``data_dir`` itself, or else from ``data_dir/en`` (``size="1k"``) or ``data_dir/en-10k`` (``"10k"``).
    Without: train (1,000 or 10,000 questions, as the published en/ and en-10k/ files) and test (1,000)
    generated by :func:`generate` with seeds derived from ``seed`` (different for train and test),
    written once to ``<cache>/babi/`` (``cache_dir``, else ``default_cache_dir()``; file names hold the
    task, generator version, size and seed) and read back from there on later calls.

    Dev: 15 % of the training questions (ceil, as sklearn's ``train_test_split(test_size=0.15)`` in
    J&W's Babi.ipynb, whose random_state=16377 shuffle this does not reproduce): the first
    ``ceil(0.15 n)`` of ``np.random.default_rng(s).permutation(n)``, ``s`` derived from ``seed``; both
    parts keep the file's order. As in J&W, questions of one story can fall in train and dev.

    Examples are built by :func:`examples` (J&W's passage, question, answer); ``classes`` is the sorted
    tuple of the training answers, a label the index of its answer there. Raises ValueError for a
    task outside 1-3, an unknown size, a dev/test answer never seen in training (naming it), or any
    reader error; FileNotFoundError for a ``data_dir`` without the files."""
    _check_task(task)
    if size not in SIZES:
        raise ValueError(f"size must be one of {sorted(SIZES)}, got {size!r}")
    name = f"babi{task}"
    if data_dir is not None:
        train_path, test_path = _find_published(task, Path(data_dir), size)
        train_stories, test_stories = read_babi(train_path), read_babi(test_path)
        source = f"published files in {train_path.parent.resolve()}"
        files = [str(train_path.resolve()), str(test_path.resolve())]
    else:
        folder = (Path(cache_dir) if cache_dir is not None else default_cache_dir()) / "babi"
        train_stories, train_path = _generated(task, "train", size, seed, SIZES[size], folder)
        test_stories, test_path = _generated(task, "test", size, seed, TEST_QUESTIONS, folder)
        source = (
            f"generated by attnmetrics' port of facebookarchive/bAbI-tasks "
            f"(task {task} {TASKS[task]}, seed {seed}, size {size}, generator version {GENERATOR_VERSION})"
        )
        files = [str(train_path), str(test_path)]
    train_all, test = examples(train_stories), examples(test_stories)

    dev_seed = _derive_seed("babi", task, "dev", seed)
    n_dev = math.ceil(DEV_FRACTION * len(train_all))
    dev_idx = set(np.random.default_rng(dev_seed).permutation(len(train_all))[:n_dev].tolist())
    train = [e for i, e in enumerate(train_all) if i not in dev_idx]
    dev = [e for i, e in enumerate(train_all) if i in dev_idx]

    classes = tuple(sorted({e[2] for e in train}))
    index = {c: i for i, c in enumerate(classes)}

    def labelled(part: list, split: str) -> list[tuple[Pair, int]]:
        out = []
        for passage, question, answer, _ in part:
            if answer not in index:
                raise ValueError(f"{name}: {split} answer {answer!r} is not among the training answers {classes}")
            out.append((Pair(passage, question), index[answer]))
        return out

    parts = {"train": labelled(train, "train"), "dev": labelled(dev, "dev"), "test": labelled(test, "test")}
    for split, ex in parts.items():
        check_pairs(f"{name} {split}", ex, classes)
    info = {
        "source": source,
        "task": task,
        "task_name": TASKS[task],
        "seed": seed,
        "size": size,
        "files": files,
        "questions": {k: len(v) for k, v in parts.items()},
        "stories": {"train": len(train_stories), "test": len(test_stories)},
        "dev": f"{DEV_FRACTION:.0%} of the training questions, numpy permutation seed {dev_seed}",
        "citation": "Weston et al. 2015, Towards AI-Complete Question Answering (arXiv:1502.05698)",
    }
    return Splits(name, classes, parts["train"], parts["dev"], parts["test"], info=info)
