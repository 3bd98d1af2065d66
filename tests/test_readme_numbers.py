"""The README's and docs' quoted results equal the committed files they come from
(``scripts/readme_numbers.py``), and the script's mechanism on small markdown and JSON files."""

import importlib.util
import json
import os
import re
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("readme_numbers", ROOT / "scripts" / "readme_numbers.py")
rn = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = rn  # dataclasses look their module up
_spec.loader.exec_module(rn)
_spec = importlib.util.spec_from_file_location("collect", ROOT / "benchmarks" / "gpu" / "collect.py")
collect = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(collect)


def test_committed_documents_quote_their_sources():
    findings = rn.run(ROOT, write=False)
    assert not findings, "run python scripts/readme_numbers.py:\n" + "\n".join(map(str, findings))


def test_committed_documents_are_marked():
    """The check above passes vacuously if the markers go; each document keeps its quoted numbers marked."""
    for document, least in (("README.md", 17), ("docs/results.md", 165), ("docs/speed.md", 170)):
        text = (ROOT / document).read_text(encoding="utf-8")
        assert len(rn.MARKER.findall(text)) >= least, document


def test_every_key_resolves():
    cache = {}
    for key, quote in rn.SOURCES.items():
        assert quote.text(ROOT, cache), key


# --- the mechanism on a temporary markdown file and JSON source ---------------------------------


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "results.json").write_text(
        json.dumps(
            {
                "test": {"accuracy": 0.8337, "n": 1821},
                "rows": [{"name": "a", "s": 2.0}, {"name": "b", "s": 0.5}, {"name": "zero", "s": 0.0}],
            }
        )
    )
    # json.dumps would write NaN and Infinity too; json.loads reads them
    (tmp_path / "r" / "nonfinite.json").write_text('{"x": NaN, "parts": {"a": 1.0, "b": -Infinity}}')
    (tmp_path / "r" / "latin1.json").write_bytes('{"x": 1, "name": "café"}'.encode("latin-1"))
    a, b, zero = (rn.Value("r/results.json", ("rows", {"name": n}, "s")) for n in ("a", "b", "zero"))
    sources = {
        "acc": rn.one(".3f", "r/results.json", "test", "accuracy"),
        "n": rn.one(",", "r/results.json", "test", "n"),
        "speedup": rn.ratio(".1f", a, b),
        "over_zero": rn.ratio(".1f", a, zero),
        "pair": rn.Quote(
            "{:.3f} of {:,}",
            (rn.Value("r/results.json", ("test", "accuracy")), rn.Value("r/results.json", ("test", "n"))),
        ),
        "gone": rn.one(".3f", "r/missing.json", "test"),
        "nopath": rn.one(".3f", "r/results.json", "test", "f1"),
        "nan": rn.one(".3f", "r/nonfinite.json", "x"),
        "inf_summed": rn.one(".1f", "r/nonfinite.json", "parts", then=rn._sum),
        "latin1": rn.one(".0f", "r/latin1.json", "x"),
    }
    return tmp_path, sources


def _doc(root, text):
    (root / "doc.md").write_text(text, encoding="utf-8")
    return root / "doc.md"


def test_matching_numbers_leave_the_file(tree):
    root, sources = tree
    text = "Accuracy <!-- n:acc -->0.834<!-- /n --> on <!-- n:n -->1,821<!-- /n --> rows, <!-- n:speedup -->4.0<!-- /n -->×, <!-- n:pair -->0.834 of 1,821<!-- /n -->.\n"
    doc = _doc(root, text)
    assert rn.run(root, ["doc.md"], sources, write=True) == []
    assert doc.read_text(encoding="utf-8") == text


def test_a_mismatch_names_key_file_and_both_values(tree):
    root, sources = tree
    text = "intro\n\nAccuracy <!-- n:acc -->0.833<!-- /n --> and <!-- n:acc:.2f -->0.83<!-- /n -->.\n"
    doc = _doc(root, text)
    findings = rn.run(root, ["doc.md"], sources, write=False)
    assert len(findings) == 1
    f = findings[0]
    assert (f.document, f.line, f.key, f.quoted, f.source, f.expected, f.problem) == (
        "doc.md",
        3,
        "acc",
        "0.833",
        "r/results.json",
        "0.834",
        None,
    )
    assert str(f) == "doc.md:3: acc: quoted '0.833', r/results.json gives '0.834'"
    assert doc.read_text(encoding="utf-8") == text  # the check writes nothing
    # the rewrite changes the number and nothing else
    assert rn.run(root, ["doc.md"], sources, write=True) == findings
    assert doc.read_text(encoding="utf-8") == text.replace("-->0.833<!--", "-->0.834<!--")
    assert rn.run(root, ["doc.md"], sources, write=False) == []


@pytest.mark.parametrize(
    "marker, named",
    [
        ("<!-- n:nokey -->1<!-- /n -->", "'nokey' is not in the mapping"),
        ("<!-- n:gone -->1<!-- /n -->", "r/missing.json not found"),
        ("<!-- n:nopath -->1<!-- /n -->", "r/results.json has no ['test']['f1']"),
        ("<!-- n:pair:.1f -->1<!-- /n -->", "quotes one value"),
        ("<!-- n:acc -->0.834", "not closed"),
    ],
)
def test_an_unresolved_marker_is_an_error_naming_it(tree, marker, named):
    root, sources = tree
    text = f"A <!-- n:acc -->0.000<!-- /n --> and {marker}.\n"
    doc = _doc(root, text)
    findings = rn.run(root, ["doc.md"], sources, write=True)
    problems = [f for f in findings if f.problem]
    assert len(problems) == 1 and named in str(problems[0]), findings
    assert doc.read_text(encoding="utf-8") == text  # a document with a problem is not rewritten


@pytest.mark.parametrize(
    "marker, named",
    [
        ("<!-- n:nan -->nan<!-- /n -->", "nan: r/nonfinite.json['x'] is nan, not a finite number"),
        (
            "<!-- n:inf_summed -->0<!-- /n -->",
            "inf_summed: r/nonfinite.json['parts']['b'] is -inf, not a finite number",
        ),
        (
            "<!-- n:over_zero -->0<!-- /n -->",
            "over_zero: r/results.json: 2.0, 0.0: ZeroDivisionError: float division by zero",
        ),
        ("<!-- n:acc:.3q -->0<!-- /n -->", "acc: format '{:.3q}' does not apply to 0.8337: Unknown format code 'q'"),
        ("<!-- n:latin1 -->1<!-- /n -->", "latin1: source file r/latin1.json is not UTF-8: 'utf-8' codec can't decode"),
        ("<!-- n:nokey -->1<!-- /n -->", "nokey: key 'nokey' is not in the mapping"),
    ],
)
def test_the_command_line_names_a_marker_it_cannot_quote_and_exits_2(tree, monkeypatch, capsys, marker, named):
    """A NaN or infinity, a ratio over zero, a format spec that does not apply, a source that is not
    UTF-8: one line naming the marker's key and file (and the format spec), exit 2 (1 is a number that
    differs), the document left as it was."""
    root, sources = tree
    monkeypatch.setattr(rn, "SOURCES", sources)
    text = f"A <!-- n:acc -->0.000<!-- /n --> and {marker}.\n"
    doc = _doc(root, text)
    for check in ([], ["--check"]):
        assert rn.main(["--root", str(root), "doc.md", *check]) == 2
        assert doc.read_text(encoding="utf-8") == text
        lines = capsys.readouterr().err.splitlines()
        problems = [line for line in lines if "0.000" not in line]
        assert len(problems) == 2 and problems[0].startswith("doc.md:1: " + named), lines
        assert problems[1] == "1 marker(s) could not be resolved; their documents were left as they were"


def test_a_document_that_is_not_utf8_is_refused(tree, monkeypatch, capsys):
    root, sources = tree
    monkeypatch.setattr(rn, "SOURCES", sources)
    (root / "doc.md").write_bytes("Accuracy <!-- n:acc -->0.834<!-- /n --> café\n".encode("latin-1"))
    assert rn.main(["--root", str(root), "doc.md"]) == 2
    assert capsys.readouterr().err == (
        "error: document doc.md is not UTF-8: 'utf-8' codec can't decode byte 0xe9 in position 43: invalid continuation byte\n"
    )


def test_write_atomic_gives_a_new_file_the_umask_and_keeps_an_existing_files_mode(tmp_path):
    path = tmp_path / "new.json"
    rn.write_atomic(path, "{}\n")
    umask = os.umask(0)
    os.umask(umask)
    assert path.read_text() == "{}\n" and path.stat().st_mode & 0o777 == 0o666 & ~umask
    path.chmod(0o640)
    rn.write_atomic(path, "[]\n")
    assert path.read_text() == "[]\n" and path.stat().st_mode & 0o777 == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new.json"]  # no temporary file left


def test_a_marker_opening_a_line_is_refused(tree):
    root, sources = tree
    _doc(root, "text\n<!-- n:acc -->0.834<!-- /n --> opens the line\n")
    (f,) = rn.run(root, ["doc.md"], sources, write=False)
    assert f.line == 2 and "opens the line" in f.problem


def test_quotes_combine_typeset_and_override(tree):
    root, _ = tree
    cache = {}
    big, small = (
        rn.Value("r/results.json", ("rows", {"name": "a"}, "s")),
        rn.Value("r/results.json", ("rows", {"name": "b"}, "s")),
    )
    assert rn.Quote("{}", (big,), lambda x: 60 * x, typeset=rn._seconds).text(root, cache) == "120"
    assert rn.Quote("{}", (small,), lambda x: 60 * x, typeset=rn._seconds).text(root, cache) == "30.0"
    assert rn.Quote("{:.2f}", (small,), lambda x: -x, minus="−").text(root, cache) == "−0.50"
    assert rn.ratio(".1f", big, small).text(root, cache, ".0f") == "4"
    with pytest.raises(rn.SourceError, match="not a number"):
        rn.one(".1f", "r/results.json", "rows", 0, "name").text(root, cache)


def test_markers_in_code_are_examples(tree):
    """A marker inside a code span or a fenced block documents the syntax; it is neither checked nor rewritten."""
    root, sources = tree
    text = "Write `<!-- n:KEY -->0.1<!-- /n -->` and `<!-- n:acc -->9<!-- /n -->`:\n\n```md\n<!-- n:acc -->9<!-- /n -->\n```\n"
    doc = _doc(root, text)
    assert rn.run(root, ["doc.md"], sources, write=True) == []
    assert doc.read_text(encoding="utf-8") == text


def test_a_missing_document_is_an_error(tree):
    root, sources = tree
    with pytest.raises(rn.SourceError, match="nodoc.md"):
        rn.run(root, ["nodoc.md"], sources, write=False)


def test_the_command_line_on_a_copy_of_the_readme(tmp_path, capsys):
    """--check fails on a README whose quoted number drifted and names it; the rewrite restores it."""
    original = (ROOT / "README.md").read_text(encoding="utf-8")
    for file in {v.file for q in rn.SOURCES.values() for v in q.values}:
        (tmp_path / file).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / file, tmp_path / file)
    marker = "<!-- n:minilm3.alti.comprehensiveness -->"
    assert original.count(marker + "0.263<") == 1
    drifted = original.replace(marker + "0.263<", marker + "0.264<")
    (tmp_path / "README.md").write_text(drifted, encoding="utf-8")

    assert rn.main(["--root", str(tmp_path), "README.md", "--check"]) == 1
    err = capsys.readouterr().err
    assert "minilm3.alti.comprehensiveness: quoted '0.264'" in err and "gives '0.263'" in err
    assert (tmp_path / "README.md").read_text(encoding="utf-8") == drifted

    assert rn.main(["--root", str(tmp_path), "README.md"]) == 0
    assert (tmp_path / "README.md").read_text(encoding="utf-8") == original
    assert rn.main(["--root", str(tmp_path), "README.md", "--check"]) == 0


REPORT = """# attnmetrics report

| test accuracy   | ROC-AUC   |
|-----------------|-----------|
| 0.834           | 0.914     |

## Kendall τ-b between importance measures (Jain & Wallace 2019, sec. 4.1)

**attention vs gradient**

| instances | mean τ | std   |
|-----------|--------|-------|
| all       | 0.332  | 0.234 |

**attention vs loo**

| instances | mean τ | std   |
|-----------|--------|-------|
| all       | 0.323  | -0.212 |

## Adversarial attention (Jain & Wallace 2019, sec. 4.3)

Max JSD ...; share above 0.5: 0.619.
"""


def test_a_committed_report_md_as_source(tmp_path):
    """A report.md's tables (rows told apart by their section and bold label) and text as a source."""
    (tmp_path / "report.md").write_text(REPORT, encoding="utf-8")
    source = rn.markdown_source(REPORT)
    assert source["tables"][0] == {
        "test accuracy": "0.834",
        "ROC-AUC": "0.914",
        "_section": "attnmetrics report",
        "_label": "",
    }
    assert source["tables"][2]["_section"] == "Kendall τ-b between importance measures"
    assert source["tables"][2]["_label"] == "attention vs loo"

    def cell(row, column, **kw):
        return rn.one(".2f", "report.md", "tables", row, column, then=rn.cell_number, **kw)

    sources = {
        "acc": rn.one(".3f", "report.md", "tables", {"test accuracy": ...}, "test accuracy", then=rn.cell_number),
        "tau_loo": cell({"_label": "attention vs loo", "instances": "all"}, "mean τ"),
        "tau_loo_std": cell({"_label": "attention vs loo", "instances": "all"}, "std", minus="−"),
        "share": rn.one(
            ".0f",
            "report.md",
            "text",
            re.compile(r"share above 0\.5: ([0-9]+\.[0-9]+)"),
            then=lambda x: 100 * float(x),
        ),
        "ambiguous": cell({"instances": "all"}, "mean τ"),
        "not_a_number": cell({"_label": "attention vs gradient"}, "instances"),
    }
    _doc(
        tmp_path,
        "acc <!-- n:acc -->0.834<!-- /n -->, τ <!-- n:tau_loo -->0.32<!-- /n --> ± <!-- n:tau_loo_std -->−0.21<!-- /n -->,"
        " <!-- n:share -->61<!-- /n --> %\n",
    )
    (f,) = rn.run(tmp_path, ["doc.md"], sources, write=False)
    assert (f.key, f.quoted, f.expected) == ("share", "61", "62")
    _doc(tmp_path, "<!-- n:ambiguous -->0<!-- /n --> <!-- n:not_a_number -->0<!-- /n -->\n".join(["x ", ""]))
    problems = rn.run(tmp_path, ["doc.md"], sources, write=False)
    assert [p.key for p in problems] == ["ambiguous", "not_a_number"]
    assert "2 elements match" in problems[0].problem and "'all'" in problems[1].problem


# --- benchmarks/gpu/collect.py -----------------------------------------------------------------

COLLECTED = "gpu-check-h200-2026-11-27-abc1234.json"


@pytest.fixture
def check_out(tmp_path):
    """A check's output folder laid out from the committed H200 check, and an empty results folder."""
    committed = json.loads((ROOT / rn.GPU_H200).read_text())
    out = tmp_path / "out"
    out.mkdir()
    (out / "env.txt").write_text("\n".join(committed["device"]) + "\n")
    (out / "stages.txt").write_text("\n".join(committed["stages"]) + "\n")
    (out / "tests-cuda.log").write_text("FAILED tests/test_cuda.py::test_x - boom\n1 failed, 125 passed in 20s\n")
    by_run = {run: name for name, run in collect.RUNS.items()}
    for run in (rn.GPU_MAIN, rn.CPU_MAIN, rn.GPU_BATTERY, rn.CPU_BATTERY, rn.MINILM):
        (out / by_run[run[1]]).write_text(json.dumps(committed["runs"][run[1]]))
    (out / "peers-cuda.json").write_text(json.dumps(committed["peers_cuda"]))
    results = tmp_path / "results"
    results.mkdir()
    return out, results, committed


def _collect(out, results, *args):
    return collect.main([str(out), "--commit", "abc1234", "--date", "2026-11-27", "--results", str(results), *args])


def test_gpu_collector_writes_what_readme_numbers_reads(check_out, capsys):
    """benchmarks/gpu/collect.py turns a check's output folder into the committed gpu-check JSON: on a
    folder laid out from the committed H200 check, every run lands under the name readme_numbers reads,
    equal to its source, and a second write is refused without --force."""
    out, results, committed = check_out
    assert _collect(out, results) == 0
    written = json.loads((results / COLLECTED).read_text())
    for run in (rn.GPU_MAIN, rn.CPU_MAIN, rn.GPU_BATTERY, rn.CPU_BATTERY, rn.MINILM):
        assert written["runs"][run[1]] == committed["runs"][run[1]]
    assert written["peers_cuda"] == committed["peers_cuda"] and written["device"] == committed["device"]
    assert written["tests_cuda"] == {
        "summary": "1 failed, 125 passed in 20s",
        "failed": ["FAILED tests/test_cuda.py::test_x - boom"],
    }
    assert written["missing"] == [] and not (results / "cuda-h200-2026-11-27-abc1234.json").exists()
    capsys.readouterr()
    assert _collect(out, results) == 2
    assert capsys.readouterr().err == f"collect.py: error: {results / COLLECTED} exist; pass --force to overwrite\n"


def test_gpu_collector_copies_the_kernel_benchmarks_as_written(check_out):
    out, results, _ = check_out
    bench = '{"benchmarks": [{"name": "tvd", "stats": {"median": 3.3e-05}}]}'  # not json.dumps's spacing
    (out / "bench-cuda.json").write_text(bench)
    assert _collect(out, results) == 0
    assert (results / "cuda-h200-2026-11-27-abc1234.json").read_text() == bench


def test_gpu_collector_writes_through_a_temporary_file_of_its_own(check_out):
    """Two runs at once: the other run's temporary file (the name a fixed temporary would share) is
    neither overwritten nor renamed over the result, and the result is one run's whole JSON."""
    out, results, _ = check_out
    others = results / COLLECTED.replace(".json", ".tmp")
    others.write_text('{"another run": ')
    assert _collect(out, results) == 0
    assert others.read_text() == '{"another run": '
    assert json.loads((results / COLLECTED).read_text())["commit"] == "abc1234"
    assert sorted(p.name for p in results.iterdir()) == sorted([COLLECTED, others.name])


@pytest.mark.parametrize(
    "change, named",
    [
        (
            {"eval-cuda-results.json": '{"wall_time_s": {"experiments": NaN}}'},
            "eval-cuda-results.json['wall_time_s']['experiments'] is nan, expected a finite number",
        ),
        (
            {"peers-cuda.json": '{"loo_ours_s": [1.0, Infinity]}'},
            "peers-cuda.json['loo_ours_s'][1] is inf, expected a finite number",
        ),
        (
            {"bench-cuda.json": '{"benchmarks": [{"stats": {"ops": Infinity}}]}'},
            "bench-cuda.json['benchmarks'][0]['stats']['ops'] is inf",
        ),
        (
            {"sst-cuda-results.json": '{"test": {"accuracy": 0.8'},
            "sst-cuda-results.json is not JSON (a truncated copy?): Expecting",
        ),
        ({"peers-cuda.json": b'{"name": "caf\xe9"}'}, "peers-cuda.json is not UTF-8"),
        ({"tests-cuda.log": ""}, "tests-cuda.log is empty, expected pytest's output ending in its summary line"),
    ],
)
def test_gpu_collector_refuses_a_file_it_would_commit_wrong(check_out, capsys, change, named):
    """A NaN or infinity (named by its key), a truncated JSON, an empty tests log: one line naming the
    file, exit 2, nothing written."""
    out, results, _ = check_out
    for name, content in change.items():
        (out / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    assert _collect(out, results) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"collect.py: error: {out}/{named}") and err.count("\n") == 1, err
    assert list(results.iterdir()) == []


@pytest.mark.parametrize(
    "folder, args, named",
    [
        ("missing", (), "{out}: no such folder, expected the check's output folder"),
        ("empty", (), "{out} holds none of the check's files (env.txt, stages.txt, tests-cuda.log, "),
        ("out", ("--commit", "a/b"), "--commit 'a/b': expected a commit's hash, 7 to 40 hex digits"),
        ("out", ("--date", "2026/11/27"), "--date '2026/11/27': expected a date, YYYY-MM-DD"),
        ("out", ("--gpu", "../h200"), "--gpu '../h200': expected letters, digits, - and _"),
    ],
)
def test_gpu_collector_refuses_a_folder_or_argument_it_cannot_collect(check_out, capsys, folder, args, named):
    out, results, _ = check_out
    out = out.parent / folder
    if folder == "empty":
        out.mkdir()
    assert _collect(out, results, *args) == 2
    err = capsys.readouterr().err
    assert err.startswith("collect.py: error: " + named.format(out=out)) and err.count("\n") == 1, err
    assert list(results.iterdir()) == []


# --- seed-level t intervals and separation claims -----------------------------------------------


def test_t_quantile_table_is_scipys():
    stats = pytest.importorskip("scipy.stats")
    for df, q in enumerate(rn.T975, 1):
        assert q == pytest.approx(stats.t.ppf(0.975, df), abs=1e-6), df
    assert [round(q, 3) for q in rn.T975[:5]] == [12.706, 4.303, 3.182, 2.776, 2.571]


def test_t_interval_is_scipys():
    np = pytest.importorskip("numpy")
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    for n in (2, 3, 5, 12, 31):
        x = rng.normal(0.03, 0.02, n)
        mean, low, high = rn.t_interval(list(x))
        want = stats.t.interval(0.95, n - 1, loc=x.mean(), scale=stats.sem(x))
        assert mean == pytest.approx(x.mean()) and (low, high) == pytest.approx(want, abs=1e-6)
    for n in (1, 32):
        with pytest.raises(ValueError, match="2 to 31"):
            rn.t_interval([0.0] * n)


def test_seed_t_interval_pairs_the_seeds(tmp_path):
    """The differences are taken seed by seed over the seeds both groups have; GPT-1's <extract>
    ablation reproduces issue 47's intervals."""
    stats = {
        "a": {"statistics": {"acc": {"per_seed": {"0": 0.71, "1": 0.68, "2": 0.73, "10": 0.9}}}},
        "b": {"statistics": {"acc": {"per_seed": {"0": 0.73, "1": 0.74, "2": 0.76}}}},
    }
    (tmp_path / "agg.json").write_text(json.dumps({"groups": stats}))
    quote = rn.seed_t_interval("agg.json", "a", "b", "acc")
    mean, low, high = quote.numbers(tmp_path, {})
    assert mean == pytest.approx((-0.02 - 0.06 - 0.03) / 3)
    assert rn.paired_seed_differences({"0": 1, "10": 5, "2": 3}, {"2": 1, "10": 1, "0": 0}) == [1, 2, 4]
    assert quote.text(tmp_path, {}).startswith("−0.037 [")
    assert rn.SOURCES["gpt1x.pretrained-no-lm.diff.seed_t"].text(ROOT, {}) == "−0.032 [−0.081, 0.017]"
    assert rn.SOURCES["gpt1x.transfer-2-transfer-0.diff.seed_t"].text(ROOT, {}) == "0.037 [−0.004, 0.079]"


@pytest.fixture
def intervals(tmp_path):
    (tmp_path / "iv.json").write_text(
        json.dumps(
            {"x": [0.552, 0.592], "y": [0.590, 0.629], "z": [0.651, 0.687], "d": [-0.058, -0.009], "e": [-0.004, 0.079]}
        )
    )

    def iv(name):
        return rn.Quote("{:.3f} [{:.3f}, {:.3f}]", (rn.Value("iv.json", (name,)),), lambda v: ((v[0] + v[1]) / 2, *v))

    sources = {k: iv(k) for k in "xyzde"}
    sources["one"] = rn.Quote("{:.3f}", (rn.Value("iv.json", ("x", 0)),))
    return tmp_path, sources


@pytest.mark.parametrize(
    "claim",
    [
        "<!-- sep:y:z -->apart<!-- /sep -->",
        "<!-- nosep:x:y -->overlap<!-- /sep -->",
        "<!-- sep-paired:d -->below 0<!-- /sep -->",
        "<!-- nosep-paired:e -->not told apart<!-- /sep -->",
        "`<!-- sep:x:y -->an example<!-- /sep -->`",
    ],
)
def test_a_claim_that_holds_passes(intervals, claim):
    root, sources = intervals
    _doc(root, f"The two {claim} here.\n")
    assert rn.run(root, ["doc.md"], sources, write=False) == []


@pytest.mark.parametrize(
    ("claim", "named"),
    [
        ("<!-- sep:x:y -->apart<!-- /sep -->", "marked separated, but x [0.552, 0.592] and y [0.590, 0.629] overlap"),
        (
            "<!-- nosep:y:z -->overlap<!-- /sep -->",
            "marked overlapping, but y [0.590, 0.629] and z [0.651, 0.687] do not overlap",
        ),
        ("<!-- sep-paired:e -->above<!-- /sep -->", "marked separated from 0, but e [-0.004, 0.079] includes 0"),
        ("<!-- nosep-paired:d -->same<!-- /sep -->", "marked not separated from 0, but d [-0.058, -0.009] excludes 0"),
        ("<!-- sep:x:gone -->apart<!-- /sep -->", "key 'gone' is not in the mapping"),
        ("<!-- sep:x:one -->apart<!-- /sep -->", "quotes no interval"),
        ("<!-- sep:x -->apart<!-- /sep -->", "names 2 key(s), not 1"),
        ("<!-- sep:x:y -->apart, never closed", "not closed by <!-- /sep -->"),
    ],
)
def test_a_claim_the_numbers_do_not_bear_out_is_named(intervals, capsys, monkeypatch, claim, named):
    root, sources = intervals
    doc = _doc(root, f"text\nThe two are {claim} here.\n")
    (f,) = rn.run(root, ["doc.md"], sources, write=True)
    assert f.line == 2 and named in f.problem
    monkeypatch.setattr(rn, "SOURCES", sources)
    assert rn.main(["--root", str(root), "--check", "doc.md"]) == 2
    assert named in capsys.readouterr().err
    assert doc.read_text(encoding="utf-8").endswith("here.\n")


def test_a_claim_marker_opening_a_line_is_refused(intervals):
    root, sources = intervals
    _doc(root, "text\n<!-- sep:y:z -->apart<!-- /sep --> opens the line\n")
    (f,) = rn.run(root, ["doc.md"], sources, write=False)
    assert "opens the line" in f.problem
