"""GPT language-model pre-training (attnmetrics.models.pretraining): the token stream, the schedule,
validation perplexity, atomic checkpoints and exact resumption.

Tiny models on tiny texts; the test marked ``network`` trains on a slice of the real Gutenberg
books (``$ATTNMETRICS_CACHE``; skipped with ATTNMETRICS_OFFLINE=1).
"""

from __future__ import annotations

import json
import math
import os
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attnmetrics.models import pretraining as P
from attnmetrics.models.bpe import BPETokenizer
from attnmetrics.models.gpt import GPT, GPTConfig

pytestmark = pytest.mark.usefixtures("one_thread")

offline = pytest.mark.skipif(os.environ.get("ATTNMETRICS_OFFLINE") == "1", reason="ATTNMETRICS_OFFLINE=1")


TEXT = "".join(
    f"Line {i}: the quick brown fox jumps over the lazy dog, and the cat watches it {i % 7} times.\n"
    for i in range(300)
)
VALID = "The lazy dog watches the quick cat jump over the brown fox.\n" * 20


@pytest.fixture(scope="module")
def tokenizer():
    return BPETokenizer.train([TEXT], vocab_size=320)


def tiny(tokenizer, dropout=0.1) -> GPTConfig:
    return GPTConfig(tokenizer.vocab_size, n_layer=2, d_model=16, n_head=2, context=12, dropout=dropout)


# --------------------------------------------------------------------------- stream and schedule


def test_encode_to_file_in_chunks_is_the_stream_of_the_texts(tokenizer, tmp_path):
    texts = [TEXT[:3000], VALID]
    n = P.encode_to_file(tokenizer, texts, tmp_path / "t.tokens", chunk_chars=500)  # many chunks
    tokens = P.read_tokens(tmp_path / "t.tokens", tokenizer.vocab_size)
    assert len(tokens) == n and tokens.dtype == np.uint16
    assert tokenizer.decode(tokens.tolist()) == "".join(texts)  # chunk boundaries lose nothing
    # chunks end at line breaks, so the ids are those of encoding line by line
    assert tokens.tolist() == [i for t in texts for line in t.splitlines(True) for i in tokenizer.encode(line)]


def test_windows_are_contiguous_slices_drawn_from_the_generator():
    tokens = np.arange(1000, dtype=np.uint16)
    w = P.sample_windows(tokens, 64, 9, torch.Generator().manual_seed(0))
    assert w.shape == (64, 10) and w.dtype == torch.int64
    assert (w.diff(dim=1) == 1).all() and int(w.min()) >= 0 and int(w.max()) <= 999
    assert len(set(w[:, 0].tolist())) > 50  # spread over the stream
    again = P.sample_windows(tokens, 64, 9, torch.Generator().manual_seed(0))
    assert torch.equal(w, again)
    with pytest.raises(ValueError, match="shorter than one window"):
        P.sample_windows(tokens[:5], 1, 9, torch.Generator())
    # consecutive windows: every token but the first is a target exactly once (a short tail dropped)
    parts = torch.cat(list(P.consecutive_windows(tokens[:23], 5, batch_size=3)))
    assert parts.shape == (4, 6)
    assert parts[:, 1:].flatten().tolist() == list(range(1, 21))


def test_lr_schedule_warms_up_linearly_then_decays_by_cosine():
    f = [P.lr_factor(s, 10, 110) for s in range(111)]
    assert f[:10] == pytest.approx([(s + 1) / 10 for s in range(10)])
    assert f[10] == 1.0 and f[60] == pytest.approx(0.5) and f[110] == pytest.approx(0.0, abs=1e-12)
    assert all(a >= b for a, b in zip(f[10:], f[11:]))
    assert f[35] == pytest.approx(0.5 * (1 + math.cos(math.pi * 25 / 100)))
    model = GPT(GPTConfig(20, n_layer=1, d_model=8, n_head=2, context=4))
    config = P.PretrainConfig(steps=110, warmup=10, lr=0.5)
    opt = P.make_optimizer(model, config)
    sched = P.make_scheduler(opt, config)
    lrs = []
    for _ in range(110):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs == pytest.approx([0.5 * x for x in f[:110]])
    # decoupled decay on matrices only: not on biases, gains or the (tied) embeddings
    decayed = {id(p) for p in opt.param_groups[0]["params"]}
    names = {n for n, p in model.named_parameters() if id(p) in decayed}
    assert names == {n for n, p in model.named_parameters() if p.ndim == 2 and n.startswith("blocks")}
    assert sum(len(g["params"]) for g in opt.param_groups) == len(list(model.parameters()))


def test_validation_loss_is_the_mean_next_token_cross_entropy(tokenizer):
    torch.manual_seed(0)
    model = GPT(tiny(tokenizer)).double()
    tokens = np.array(tokenizer.encode(VALID), dtype=np.uint16)
    loss, n = P.validation_loss(model, tokens, batch_size=2)
    C = model.config.context
    windows = (len(tokens) - 1) // C
    assert n == windows * C
    model.eval()
    with torch.no_grad():
        want = torch.cat(
            [
                F.cross_entropy(
                    model(torch.as_tensor(tokens[i * C : i * C + C], dtype=torch.int64)[None]).logits[0],
                    torch.as_tensor(tokens[i * C + 1 : i * C + C + 1], dtype=torch.int64),
                    reduction="none",
                )
                for i in range(windows)
            ]
        )
    assert loss == pytest.approx(float(want.mean().detach()), rel=1e-12)
    assert model.training is False  # eval mode restored as it was
    assert P.validation_loss(model, tokens, max_windows=2)[1] == 2 * C
    with pytest.raises(ValueError, match="no window"):
        P.validation_loss(model, tokens[:C])


# --------------------------------------------------------------------------- checkpoints and resumption


def run(tmp_path, tokenizer, name, steps=8, **kw):
    config = P.PretrainConfig(
        steps=steps, batch_size=3, lr=3e-3, warmup=2, eval_every=3, checkpoint_every=5, progress=False, seed=7
    )
    return P.pretrain(
        tmp_path / name, tiny(tokenizer), config, train_texts=[TEXT], valid_text=VALID, tokenizer=tokenizer, **kw
    )


def test_resume_gives_exactly_the_uninterrupted_run(tokenizer, tmp_path):
    straight = run(tmp_path, tokenizer, "straight")
    first = run(tmp_path, tokenizer, "split", stop_at=4)
    assert first.step == 4 and (tmp_path / "split" / "latest").read_text() == "step-0000004"
    torch.manual_seed(12345)  # a resumed run must not depend on the process's RNG
    resumed = P.pretrain(tmp_path / "split", resume=True, train_texts=[TEXT], valid_text=VALID)
    assert resumed.step == straight.step == 8
    with pytest.raises(ValueError, match="not the ones the run started on"):
        P.pretrain(tmp_path / "split", resume=True, train_texts=[TEXT[:-100]], valid_text=VALID)
    a, b = P.load_gpt(tmp_path / "straight"), P.load_gpt(tmp_path / "split")
    for (k, x), (_, y) in zip(a.model.state_dict().items(), b.model.state_dict().items()):
        assert torch.equal(x, y), k  # dropout on: the RNG state is restored too
    sa, sb = P.load_training_state(tmp_path / "straight"), P.load_training_state(tmp_path / "split")
    for pa, pb in zip(sa.optimizer["state"].values(), sb.optimizer["state"].values()):
        assert all(torch.equal(pa[k], pb[k]) for k in pa)
    assert sa.scheduler == sb.scheduler and torch.equal(sa.generator, sb.generator)
    assert [h["val_loss"] for h in straight.history] == [h["val_loss"] for h in resumed.history]
    assert [h["train_loss"] for h in straight.history] == [h["train_loss"] for h in resumed.history]
    assert sorted(p.name for p in (tmp_path / "split").iterdir()) == [
        "latest",
        "step-0000008",
        "train.tokens",
        "valid.tokens",
    ]  # older checkpoints pruned, no temporary folders left


def test_checkpoint_round_trip_and_a_crash_mid_save_keeps_the_last_one(tokenizer, tmp_path, monkeypatch):
    run(tmp_path, tokenizer, "run", steps=5)
    loaded = P.load_gpt(tmp_path / "run")
    assert loaded.model.config == tiny(tokenizer) and loaded.meta["step"] == 5
    assert loaded.tokenizer.to_str() == tokenizer.to_str()
    assert P.load_gpt(tmp_path / "run" / "step-0000005").meta["step"] == 5
    assert loaded.model.lm_head.weight is loaded.model.tokens.weight  # tying survives the state dict

    real_save = torch.save

    def crash(obj, f, *a, **k):
        if str(f).endswith("training.pt"):
            raise OSError("disk full")
        return real_save(obj, f, *a, **k)

    monkeypatch.setattr(torch, "save", crash)
    state = P.load_training_state(tmp_path / "run")._replace(step=6)
    with pytest.raises(OSError, match="disk full"):
        P.save_pretraining_checkpoint(tmp_path / "run", loaded.model, loaded.tokenizer, P.PretrainConfig(), state)
    monkeypatch.undo()
    assert (tmp_path / "run" / "latest").read_text() == "step-0000005"
    assert not [p for p in (tmp_path / "run").iterdir() if p.name.startswith(".")]  # no half-written folder
    assert P.load_gpt(tmp_path / "run").meta["step"] == 5

    with pytest.raises(ValueError, match="nothing to resume"):
        P.pretrain(tmp_path / "empty", resume=True, train_texts=[TEXT], valid_text=VALID)
    (tmp_path / "run" / "step-0000005" / "model.json").write_text("{}")
    with pytest.raises(ValueError, match="not a GPT config"):
        P.load_gpt(tmp_path / "run")


def test_a_checkpoint_config_is_checked_against_its_weights_before_it_is_built(tokenizer, tmp_path):
    # issue 31, item 6: a config is validated, then compared with model.pt's shapes, before a
    # module is built; the error is one line naming the file and the field or key
    run(tmp_path, tokenizer, "run", steps=5)
    config = tmp_path / "run" / "step-0000005" / "model.json"
    meta = json.loads(config.read_text())
    for n_layer, file, what in ((1000, "model.json", "n_layer must be <= "), (3, "model.pt", "'blocks.2.")):
        config.write_text(json.dumps({**meta, "model": {**meta["model"], "n_layer": n_layer}}))
        with pytest.raises(ValueError) as e:
            P.load_gpt(tmp_path / "run")
        assert "\n" not in str(e.value) and len(str(e.value)) < 400, str(e.value)[:400]
        assert file in str(e.value) and what in str(e.value)


def test_latest_pointing_outside_its_folder_is_refused(tokenizer, tmp_path):
    # issue 31, item 14: an absolute or ../ latest was followed without notice
    run(tmp_path, tokenizer, "run", steps=5)
    run(tmp_path, tokenizer, "other", steps=5)
    elsewhere = tmp_path / "other" / "step-0000005"
    for target in (str(elsewhere), "../other/step-0000005", "."):
        (tmp_path / "run" / "latest").write_text(target)
        with pytest.raises(ValueError, match=r"latest: .*outside|latest: .*not a step folder"):
            P.load_gpt(tmp_path / "run")
        with pytest.raises(ValueError, match=r"latest: "):
            P.load_training_state(tmp_path / "run")


def test_a_checkpoint_write_killed_before_its_rename_is_cleaned_by_the_next(tokenizer, tmp_path):
    # issue 31, item 5: a SIGKILL inside save_checkpoint left .step-N.XXXX folders for ever
    first = run(tmp_path, tokenizer, "run", stop_at=4)
    assert first.step == 4
    left = tmp_path / "run" / ".step-0000005.k1ll3d"
    left.mkdir()
    (left / "model.pt").write_bytes(b"half a state dict")
    keep = tmp_path / "run" / ".step-notes"  # not a checkpoint's temporary name: left alone
    keep.mkdir()
    P.pretrain(tmp_path / "run", resume=True, train_texts=[TEXT], valid_text=VALID)
    assert not left.exists() and keep.exists()
    assert (tmp_path / "run" / "latest").read_text() == "step-0000008"


def test_checkpoints_respect_the_umask(tokenizer, tmp_path):
    # issue 31, item 14: checkpoints were 0700/0600 whatever the umask
    old = os.umask(0o022)
    try:
        run(tmp_path, tokenizer, "run", steps=5)
    finally:
        os.umask(old)
    folder = tmp_path / "run" / "step-0000005"
    assert folder.stat().st_mode & 0o777 == 0o755
    for path in (*folder.iterdir(), tmp_path / "run" / "latest"):
        assert path.stat().st_mode & 0o777 == 0o644, path


@pytest.mark.network
@offline
def test_pretraining_loss_falls_on_a_slice_of_gutenberg(tmp_path):
    from attnmetrics.data import GUTENBERG_HELD_OUT, load_gutenberg

    books = load_gutenberg()
    train = [books[n][:30_000] for n in sorted(books) if n != GUTENBERG_HELD_OUT]
    valid = books[GUTENBERG_HELD_OUT][:20_000]
    tok = BPETokenizer.train(train, vocab_size=512)
    config = P.PretrainConfig(
        steps=100, batch_size=8, lr=3e-3, warmup=10, eval_every=50, checkpoint_every=100, progress=False
    )
    model = GPTConfig(tok.vocab_size, n_layer=2, d_model=32, n_head=2, context=32)
    torch.manual_seed(0)
    before, _ = P.validation_loss(GPT(model), np.array(tok.encode(valid), dtype=np.uint16))
    result = P.pretrain(tmp_path / "run", model, config, train_texts=train, valid_text=valid, tokenizer=tok)
    val = [h["val_loss"] for h in result.history]
    assert before == pytest.approx(math.log(tok.vocab_size), abs=0.3)  # uniform-ish at the start
    assert val == sorted(val, reverse=True)  # falls at every evaluation
    # 0.9 nats below the untrained model on the unseen book: down to about the unigram entropy
    # (5.34 here), where so small a model plateaus for the first few hundred steps
    assert val[-1] < before - 0.8
    train_loss = [h["train_loss"] for h in result.history]
    assert train_loss == sorted(train_loss, reverse=True)
    assert result.history[-1]["val_ppl"] == pytest.approx(math.exp(val[-1]))


def test_a_truncated_checkpoint_file_is_named_in_one_line(tokenizer, tmp_path):
    # issue 31, unclear errors: a half-truncated model.pt ("[Errno 22] Invalid argument") or
    # training.pt (a RuntimeError traceback from torch's zip reader on --resume)
    run(tmp_path, tokenizer, "run", stop_at=4)
    step = tmp_path / "run" / "step-0000004"
    for name, load in (
        ("model.pt", lambda: P.load_gpt(tmp_path / "run")),
        ("training.pt", lambda: P.load_training_state(tmp_path / "run")),
        ("training.pt", lambda: P.pretrain(tmp_path / "run", resume=True, train_texts=[TEXT], valid_text=VALID)),
    ):
        whole = (step / name).read_bytes()
        for cut in (len(whole) // 2, 10, len(whole) - 1):
            (step / name).write_bytes(whole[:cut])
            with pytest.raises(ValueError) as e:
                load()
            message = str(e.value)
            assert "\n" not in message and len(message) < 300, message
            assert message.startswith(f"{step / name}: cannot read") and "truncated or damaged" in message, message
        (step / name).write_bytes(whole)
    (step / "training.pt").write_bytes(_saved({"step": 4}))  # readable, not a training state
    with pytest.raises(ValueError, match=f"^{re.escape(str(step / 'training.pt'))}: not a training state"):
        P.load_training_state(tmp_path / "run")


def _saved(obj) -> bytes:
    import io

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()
