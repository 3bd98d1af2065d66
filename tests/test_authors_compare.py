"""benchmarks/peers/authors_compare.py, this side of the timing against the authors' code: ``prepare`` saves
the benchmark's model and ids (here the tiny one, two rows), ``compare`` times ours on them and sets them
against an authors' JSON (here a synthetic one, of known seconds and of our own scores with known changes), so
that its ratios and value differences are checked against hand-computed numbers."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="needs transformers (pip install -e .[hf])")

from benchmarks.peers import authors_compare as ac  # noqa: E402


def test_value_differences_by_hand():
    # row 0: n = 4, compared positions 1..2; ours [B, T - 1] holds positions 1.. (its [SEP] and padding 0)
    # row 1: n = 5, compared positions 1..3
    ours = torch.tensor([[0.1, 0.2, 0.0, 0.0], [0.5, -0.5, 1.0, 0.0]])
    authors = [[9.0, 0.1, 0.25, 9.0], [-7.0, 0.5, -0.5, 0.8, 7.0]]  # [CLS] and [SEP] entries must be ignored
    d = ac.value_differences(ours, authors, [4, 5])
    assert d["values"] == 5
    # raw: row 0 |diff| = (0, 0.05), row 1 (0, 0, 0.2): max abs 0.2; relative 0.05 / 0.25 = 0.2 and 0.2 / 0.8 = 0.25
    assert d["raw"]["max_abs"] == pytest.approx(0.2)
    assert d["raw"]["max_rel"] == pytest.approx(0.25)
    assert d["raw"]["worst_row"] == 1
    # normalised by the sum of |.|: row 0 ours (1/3, 2/3), authors (0.1/0.35, 0.25/0.35): max |diff| 1/3 - 2/7;
    # row 1 ours (0.25, -0.25, 0.5), authors (0.5/1.8, -0.5/1.8, 0.8/1.8): max |diff| 0.5 - 0.8/1.8
    r0, r1 = 1 / 3 - 0.1 / 0.35, 0.5 - 0.8 / 1.8
    assert d["row_normalised"]["max_abs"] == pytest.approx(max(r0, r1))
    assert d["row_normalised"]["max_rel"] == pytest.approx(max(r0 / (0.25 / 0.35), r1 / (0.8 / 1.8)))
    assert d["same_top"] == 1.0
    with pytest.raises(ValueError, match="row 0"):
        ac.value_differences(ours, [[9.0, 0.1, 9.0], authors[1]], [4, 5])


def test_ratios_by_hand():
    r = ac.ratios({"one_per_call": 6.0, "batched": 3.0}, ours_batched_s=0.5, ours_one_s=2.0)
    assert r == {
        "one_per_call/ours_batched": 12.0,
        "one_per_call/ours_one_per_call": 3.0,
        "batched/ours_batched": 6.0,
        "batched/ours_one_per_call": 1.5,
    }


def test_draw_rows_is_the_benchmarks():
    rows = ac.draw_rows(64)
    assert len(rows) == 64 and all(12 <= len(r) <= 52 for r in rows)
    assert all(r[0] == 101 and r[-1] == 102 and all(1000 <= t < 30522 for t in r[1:-1]) for r in rows)
    # test_bench_attributions.inputs("sst"): one generator seeded 0, lengths first, then the ids
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(12, 53, (64,), generator=g)
    tokens = torch.randint(1000, 30522, (64, int(lengths.max())), generator=g)
    assert [len(r) for r in rows] == lengths.tolist()
    assert rows[5][1:-1] == tokens[5, 1 : int(lengths[5]) - 1].tolist()


@pytest.fixture
def threads():
    """compare sets one thread for the process: put the count back after."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_prepare_and_compare(tmp_path, capsys, threads):
    from attnmetrics.attributions import METHODS
    from attnmetrics.models.hf import HFClassifier

    folder = tmp_path / "model"
    assert ac.main(["prepare", "--out", str(folder), "--rows", "2", "--tiny"]) == 0
    assert (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()
    rows = json.loads((folder / "ids.json").read_text())["rows"]
    assert len(rows) == 2 and all(r[0] == 101 and r[-1] == 102 for r in rows)
    hf = transformers.BertForSequenceClassification.from_pretrained(folder).eval()
    assert hf.config.num_hidden_layers == 2 and hf.config.hidden_size == 32
    assert torch.equal(
        hf.bert.embeddings.word_embeddings.weight, ac.build_model(tiny=True).bert.embeddings.word_embeddings.weight
    )
    logged = capsys.readouterr().out
    assert "logits of row 0" in logged and "logits of row 1" in logged

    # a synthetic authors' JSON: our own scores on every position ([CLS] and [SEP] set to 99: not compared),
    # row 1's second token raised by 0.25; known seconds
    tokens, lengths = ac.padded(rows)
    ours = METHODS["globenc"](HFClassifier(hf).eval(), tokens, lengths).double()
    scores = []
    for b, n in enumerate(lengths.tolist()):
        row = [99.0] + ours[b, : n - 2].tolist() + [99.0]
        if b == 1:
            row[2] += 0.25
        scores.append(row)
    authors = {
        "model_dir": str(folder),
        "ids_file": str(folder / "ids.json"),
        "ids_sha256": ac.ids_digest(rows),
        "rows": 2,
        "threads": 1,
        "versions": {"transformers": "4.18.0"},
        "methods": {
            "globenc": {
                "code": {"commit": "a26b38b", "files": ["src/attention_rollout.py"]},
                "variants": {
                    "one_per_call": {"seconds": 3.0, "scores": scores, "logits": ac.row_logits(hf, rows)},
                    "batched": {"seconds": 1.5, "scores": scores},
                },
            }
        },
    }
    (tmp_path / "authors.json").write_text(json.dumps(authors))
    out = tmp_path / "compare.json"
    assert ac.main(["compare", "--authors", str(tmp_path / "authors.json"), "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert list(result["methods"]) == ["globenc"] and result["rows"] == 2 and result["threads"] == 1
    g = result["methods"]["globenc"]
    assert g["authors_s"] == {"one_per_call": 3.0, "batched": 1.5}
    assert g["ratios"]["one_per_call/ours_batched"] == pytest.approx(3.0 / g["ours_batched_s"])
    assert g["ratios"]["batched/ours_one_per_call"] == pytest.approx(1.5 / g["ours_one_per_call_s"])
    scale = float(ours.abs().max())  # our scores here and compare's, from two thread counts: rounding apart
    assert g["ours_batched_vs_one_per_call_max_abs"] <= 1e-5 * scale
    for variant in ("one_per_call", "batched"):
        d = g["differences"][variant]
        assert d["values"] == sum(n - 2 for n in lengths.tolist())
        assert d["raw"]["max_abs"] == pytest.approx(0.25, abs=1e-5 * scale)
        assert d["raw"]["worst_row"] == 1
        assert d["raw"]["max_rel"] == pytest.approx(0.25 / max(abs(x) for x in scores[1][1:-1]), rel=1e-4)
    assert g["logits_max_abs"]["one_per_call"] == 0.0 and "batched" not in g["logits_max_abs"]

    # another set of rows than the authors ran is refused
    authors["ids_sha256"] = "0" * 64
    (tmp_path / "authors.json").write_text(json.dumps(authors))
    with pytest.raises(SystemExit, match="not the ones"):
        ac.main(["compare", "--authors", str(tmp_path / "authors.json"), "--out", str(out)])
