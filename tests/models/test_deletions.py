"""One-token deletions and maskings with reuse (models/deletions.py,
EncoderAttentionClassifier.deletion_logits / masking_logits) against running the model on each
edited row alone, and leave_one_out through them against the per-sequence reference."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from attnmetrics import leave_one_out
from attnmetrics.models import deletions as deletions_module
from attnmetrics.models.classifier import ATTENTIONS, ENCODERS, EncoderAttentionClassifier, ModelConfig
from attnmetrics.testing.reference import leave_one_out_reference

F64 = torch.float64


def model_for(
    encoder: str, dtype=F64, seed=0, classes=1, attention="tanh", regulariser="none"
) -> EncoderAttentionClassifier:
    torch.manual_seed(seed)
    config = ModelConfig(
        vocab_size=40,
        embed_dim=5,
        hidden_size=8,
        num_classes=classes,
        encoder=encoder,
        attention=attention,
        regulariser=regulariser,
    )
    return EncoderAttentionClassifier(config).to(dtype).eval()


def each_deletion_alone(model, embedded, lengths, rows, positions, replacement=None):
    """The definition: delete the position (or set it to ``replacement``), then encode the
    edited row by itself."""
    masked = replacement is not None
    width = int(lengths[rows].max()) - (not masked)  # the chunk's longest result
    out = torch.zeros(len(rows), width, model.encoder.output_size, dtype=embedded.dtype)
    for i, (r, t) in enumerate(zip(rows.tolist(), positions.tolist())):
        n = int(lengths[r])
        if n == 1 and not masked:
            continue  # nothing is left to encode
        x = embedded[r, :n].clone()
        x = torch.cat([x[:t], replacement[None], x[t + 1 :]]) if masked else torch.cat([x[:t], x[t + 1 :]])
        out[i, : len(x)] = model.encode(x[None], torch.tensor([len(x)]))[0]
    return out


def replacement_for(masked, dtype=F64):
    """An embedded mask token (or None: delete)."""
    return torch.linspace(-1, 1, 5, dtype=dtype) if masked else None


def every_deletion(lengths):
    rows = torch.repeat_interleave(torch.arange(len(lengths)), lengths)
    positions = torch.cat([torch.arange(int(n)) for n in lengths])
    return rows, positions


def ragged_embeddings(lengths, width, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(len(lengths), width, 5, generator=g, dtype=dtype)
    return x * (torch.arange(width) < lengths[:, None]).unsqueeze(-1).to(dtype)  # zero padding, as embed gives


REUSING = ["lstm", "gru", "average"]  # encoders with a `deletions` method


@pytest.mark.parametrize("encoder", REUSING)
@pytest.mark.parametrize("dtype", [F64, torch.float32])
@pytest.mark.parametrize("masked", [False, True])
def test_every_deletion_equals_encoding_the_shortened_row(encoder, dtype, masked):
    model = model_for(encoder, dtype)
    lengths = torch.tensor([7, 2, 5, 9, 3])
    embedded = ragged_embeddings(lengths, 10, dtype)  # one column of extra padding
    rows, positions = every_deletion(lengths)
    replacement = replacement_for(masked, dtype)
    with torch.no_grad():
        got = model.encoder.deletions(embedded, lengths, replacement=replacement)(rows, positions)
        want = each_deletion_alone(model, embedded, lengths, rows, positions, replacement)
    assert got.shape == (len(rows), 9 if masked else 8, model.encoder.output_size)
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == F64 else dict(rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got, want, **tol)


@pytest.mark.parametrize("encoder", ["lstm", "gru"])
def test_a_length_one_row_leaves_nothing(encoder):
    model = model_for(encoder)
    lengths = torch.tensor([1, 4])
    embedded = ragged_embeddings(lengths, 4, F64)
    with torch.no_grad():
        got = model.encoder.deletions(embedded, lengths)(torch.tensor([0, 1]), torch.tensor([0, 3]))
    assert (got[0] == 0).all()
    torch.testing.assert_close(
        got, each_deletion_alone(model, embedded, lengths, torch.tensor([0, 1]), torch.tensor([0, 3]))
    )


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 8), min_size=1, max_size=5),
    encoder=st.sampled_from(["lstm", "gru"]),
    masked=st.booleans(),
    seed=st.integers(0, 2**16),
    data=st.data(),
)
def test_any_subset_of_deletions_in_any_order(lengths, encoder, masked, seed, data):
    model = model_for(encoder, seed=seed % 3)
    replacement = replacement_for(masked)
    lengths = torch.tensor(lengths)
    width = int(lengths.max()) + data.draw(st.integers(0, 2))
    embedded = ragged_embeddings(lengths, width, F64, seed)
    rows, positions = every_deletion(lengths)
    pick = torch.tensor(data.draw(st.lists(st.integers(0, len(rows) - 1), min_size=1, max_size=12)))
    with torch.no_grad():
        got = model.encoder.deletions(embedded, lengths, replacement=replacement)(rows[pick], positions[pick])
        want = each_deletion_alone(model, embedded, lengths, rows[pick], positions[pick], replacement)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("encoder", sorted(ENCODERS))
@pytest.mark.parametrize("attention", sorted(ATTENTIONS))
@pytest.mark.parametrize("classes", [1, 3])
@pytest.mark.parametrize("dtype", [F64, torch.float32])
@pytest.mark.parametrize("masked", [False, True])
def test_deletion_logits_equal_the_model_on_each_shortened_row(encoder, attention, classes, dtype, masked):
    check_deletion_logits(model_for(encoder, dtype, seed=2, classes=classes, attention=attention), dtype, masked)


@pytest.mark.parametrize("encoder", ["lstm", "average"])
@pytest.mark.parametrize("regulariser", ["concat", "residual", "tying"])
@pytest.mark.parametrize("masked", [False, True])
def test_deletion_logits_with_regularisers(encoder, regulariser, masked):
    check_deletion_logits(model_for(encoder, seed=3, regulariser=regulariser), F64, masked)


def check_deletion_logits(model, dtype, masked):
    """deletion_logits (masking_logits with mask token 1) against the model on each edited row."""
    lengths = torch.tensor([7, 3, 5, 9, 2])  # <SOS> ... <EOS>; the last row has no real token left
    embedded = ragged_embeddings(lengths, 10, dtype)
    rows = torch.repeat_interleave(torch.arange(5), lengths - 2)
    positions = torch.cat([torch.arange(1, int(n) - 1) for n in lengths])
    rows, positions = torch.cat([rows, torch.tensor([4])]), torch.cat([positions, torch.tensor([1])])
    with torch.no_grad():
        prepared = model.masking_logits(embedded, lengths, 1) if masked else model.deletion_logits(embedded, lengths)
        got = prepared(rows, positions)
        mask = model.embed(torch.tensor([[1]]))[0]
        want = []
        for r, t in zip(rows.tolist(), positions.tolist()):
            n = int(lengths[r])
            middle = [mask] if masked else []
            x = torch.cat([embedded[r, :t], *middle, embedded[r, t + 1 : n]])[None]
            hidden = model.encode(x, torch.tensor([x.shape[1]]))
            attention_ = model.attend(hidden, torch.tensor([x.shape[1]]))
            want.append(model.decoder(attention_ @ hidden[0]))
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == F64 else dict(rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got, torch.cat(want), **tol)


@pytest.mark.parametrize("encoder", ["lstm", "gru"])
@pytest.mark.parametrize("dtype", [F64, torch.float32])
@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("with_bias", [False, True])
def test_own_features_are_the_rows_encoded(encoder, dtype, masked, with_bias):
    model = model_for(encoder, dtype, seed=4)
    lengths = torch.tensor([7, 1, 5, 9, 3])
    embedded = ragged_embeddings(lengths, 11, dtype, seed=4)  # two columns of extra padding
    g = torch.Generator().manual_seed(4)
    feature_map = torch.randn(6, 16, generator=g, dtype=dtype)
    bias = torch.randn(6, generator=g, dtype=dtype) if with_bias else None
    with torch.no_grad():
        prepared = model.encoder.deletions(embedded, lengths, feature_map, bias, replacement_for(masked, dtype))
        got = prepared.own_features()
        want = model.encode(embedded, lengths) @ feature_map.T  # zero states on padding
    if with_bias:
        want = want + bias * (torch.arange(11) < lengths[:, None]).unsqueeze(-1).to(dtype)
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == F64 else dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got, want, **tol)
    assert (got[1, 1:] == 0).all() and (got[:, 9:] == 0).all()


@pytest.mark.parametrize("encoder", ["lstm", "gru"])
@pytest.mark.parametrize("attention", ["tanh", "dot"])
@pytest.mark.parametrize("classes", [1, 3])
@pytest.mark.parametrize("dtype", [F64, torch.float32])
@pytest.mark.parametrize("masked", [False, True])
def test_unedited_logits_equal_the_model_on_the_rows(encoder, attention, classes, dtype, masked):
    model = model_for(encoder, dtype, seed=5, classes=classes, attention=attention)
    lengths = torch.tensor([7, 3, 5, 9, 2])  # <SOS> ... <EOS>; the last row has no real token
    embedded = ragged_embeddings(lengths, 10, dtype, seed=5)
    with torch.no_grad():
        prepared = model.masking_logits(embedded, lengths, 1) if masked else model.deletion_logits(embedded, lengths)
        got = prepared.unedited_logits()
        hidden = model.encode(embedded, lengths)
        want = model.decoder(torch.einsum("bt,bth->bh", model.attend(hidden, lengths).nan_to_num(0.0), hidden))
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == F64 else dict(rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got, want, **tol)


@pytest.mark.parametrize("encoder", sorted(ENCODERS))
@pytest.mark.parametrize("classes", [1, 3])
@pytest.mark.parametrize("mode", ["delete", "mask"])
def test_leave_one_out_through_reuse_matches_the_reference(encoder, classes, mode):
    model = model_for(encoder, classes=classes, seed=1)
    g = torch.Generator().manual_seed(7)
    lengths = torch.tensor([12, 3, 8, 8, 5, 11])
    tokens = torch.randint(5, 40, (6, 12), generator=g)
    pos = torch.arange(12)
    tokens[:, 0] = 2
    tokens[pos == (lengths - 1)[:, None]] = 3
    tokens[pos >= lengths[:, None]] = 0
    kw = dict(mode="mask", mask_token=1) if mode == "mask" else {}
    got = leave_one_out(model, tokens, lengths, memory_budget=4096, **kw)  # several calls, rows split
    want = leave_one_out_reference(model, tokens, lengths, **kw)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-13)


# ---- how the runs are cut into RNN calls, the growing table, the fast forms ------------------


@pytest.mark.parametrize("encoder", ["lstm", "gru"])
@pytest.mark.parametrize(
    "batch, round_, slack, round_cells",
    [
        (1, 1, 0.0, 512),  # one run per call, no padding
        (2, 1, 1.0, 512),  # two runs of lengths up to twice apart
        (3, 4, 0.5, 512),  # calls padded with copies of their last run
        (3, 4, 0.5, 0),  # ... unless padding would run any step
        (64, 16, 0.125, 512),  # the defaults
    ],
)
@pytest.mark.parametrize("masked", [False, True])
def test_any_cut_of_the_runs_into_calls(encoder, batch, round_, slack, round_cells, masked, monkeypatch):
    for name, value in (
        ("RUN_BATCH", batch),
        ("RUN_ROUND", round_),
        ("RUN_SLACK", slack),
        ("ROUND_CELLS", round_cells),
    ):
        monkeypatch.setattr(deletions_module, name, value)
    model = model_for(encoder)
    lengths = torch.tensor([9, 3, 1, 6, 9, 2, 7, 9, 4, 8, 5, 9])
    embedded = ragged_embeddings(lengths, 9, F64, seed=4)
    rows, positions = every_deletion(lengths)
    with torch.no_grad():
        got = model.encoder.deletions(embedded, lengths, replacement=replacement_for(masked))(rows, positions)
        want = each_deletion_alone(model, embedded, lengths, rows, positions, replacement_for(masked))
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_run_pieces():
    counts = [0, 0, 1, 1, 1, 2, 3, 3, 8, 9]
    pieces = deletions_module._run_pieces(counts, batch=2)
    # every run of non-zero length in exactly one call, calls within the batch and the slack
    assert [i for s, e, _ in pieces for i in range(s, e)] == list(range(2, 10))
    for s, e, width in pieces:
        assert e - s <= 2 and counts[e - 1] <= counts[s] * (1 + deletions_module.RUN_SLACK)
        assert width >= e - s and (width % deletions_module.RUN_ROUND == 0 or width == e - s)
    assert deletions_module._run_pieces([0, 0], batch=4) == []


def test_table_grows_across_calls():
    """A first call of few short deletions, then larger ones: the table grows, earlier rows kept."""
    model = model_for("lstm")
    lengths = torch.tensor([9, 4, 8, 9])
    embedded = ragged_embeddings(lengths, 9, F64, seed=5)
    rows, positions = every_deletion(lengths)
    maps = torch.randn(3, 16, dtype=F64, generator=torch.Generator().manual_seed(0))
    bias = torch.tensor([0.5, -1.0, 2.0], dtype=F64)
    with torch.no_grad():
        deletions = model.encoder.deletions(embedded, lengths, maps, bias)
        sizes = []
        for part in (slice(9, 10), slice(0, 9), slice(None)):
            got = deletions(rows[part], positions[part])
            sizes.append(deletions.table.shape[0])
            want = each_deletion_alone(model, embedded, lengths, rows[part], positions[part]) @ maps.t() + bias
            valid = torch.arange(got.shape[1]) < (lengths[rows[part]] - 1)[:, None]
            torch.testing.assert_close(got, want * valid.unsqueeze(-1), rtol=1e-12, atol=1e-12)
    assert sizes[0] < sizes[1] <= sizes[2]


def test_linear_equals_f_linear():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(300, 128, generator=g)
    weight = torch.randn(129, 256, generator=g)[:, :128]  # strided, as a half of a map
    bias = torch.randn(129, generator=g)
    assert not weight.is_contiguous()
    torch.testing.assert_close(
        deletions_module.linear(x, weight, bias), F.linear(x, weight, bias), rtol=1e-5, atol=1e-4
    )
    torch.testing.assert_close(
        deletions_module.linear(x.double(), weight.double()),
        F.linear(x.double(), weight.double()),
        rtol=1e-14,
        atol=1e-12,
    )
