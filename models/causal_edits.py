"""Causal prefix reuse for one-token edits of a Hugging Face decoder (docs/DESIGN.md §8).

On a causal model, deleting or masking the token at position ``s`` of a sequence leaves every
position before ``s`` unchanged, in every layer. :func:`prepare_edits` therefore runs the rows
once, keeping every layer's keys and values (the template's prefix and the text), and an edit
(row, position) then recomputes only the positions from the edit on: for a deletion, the tokens
after it moved one place left (at the rotary or learned positions of their NEW places), then
the rest of the input (a prompt's suffix template); for a masking, the mask token and what
follows it at their own places. Each layer's queries of those positions attend to the row's
cached keys and values of the positions before the edit and to the recomputed ones. The
results equal a full recomputation up to rounding (tests/models/test_causal_edits.py: float64
to 1e-10, float32 to 1e-5).

Two layouts are supported, by :func:`decoder_of`:

- Llama (``transformers``' Llama, Qwen2 with its q/k/v biases, Mistral; a ``model.layers`` of
  pre-RMSNorm layers): the layer's own ``input_layernorm``, ``q/k/v/o_proj``, the model's rotary
  embedding with ``apply_rotary_pos_emb``, grouped-query attention (query head ``h`` reads
  key/value head ``h // groups``, as ``repeat_kv``), ``post_attention_layernorm``, ``mlp``, the
  final ``norm``; a sliding window (Mistral's, Qwen2's sliding layers) is kept in the masks
  (key position ``> query position - window``, as ``transformers``' mask).
- GPT-2 (``h`` of pre-LayerNorm blocks, ``wpe`` learned positions added to the word embeddings,
  ``c_attn``/``c_proj`` Conv1D, the attention module's ``scaling``, ``ln_f``).

A call batches edits of many rows and positions: the recomputed positions are packed for the
position-wise work (norms, projections, MLP: no padding) and right-padded per edit for the
attention, with per-edit key masks over the cached prefix (its own length) and the recomputed
positions (causal, its own count). The last layer computes only each edit's last position's
query (the only state read out). The model must be in eval mode (no dropout).

:func:`cache_rows` (the rows run once, keys and values kept), :func:`recompute` (edited sequences
from a position on, over the cached prefix) and :func:`position_bytes` serve both these one-token
edits and ERASER's many-token ones (``models/causal_subsets.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor, nn

from attnmetrics.protocol import token_mask

#: the modes of an edit: a deletion (the sequence one shorter) or a masking (the token replaced)
EDIT_MODES = ("delete", "mask")


class CausalDecoder:
    """The layers of a Hugging Face decoder base model (``LlamaModel``-like or ``GPT2Model``-like)
    as :func:`prepare_edits` runs them, position-wise on packed states ``[M, d]``.

    Raises:
        ValueError: a base model of neither layout, naming its class.
    """

    def __init__(self, base: nn.Module):
        self.base = base
        layers = getattr(base, "layers", None)
        if isinstance(layers, nn.ModuleList) and len(layers) and hasattr(base, "rotary_emb"):
            from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

            self.kind, self.layers, self.norm = "llama", list(layers), base.norm
            self._rotate = apply_rotary_pos_emb
            attn = self.layers[0].self_attn
            self.head_dim = attn.head_dim
            self.heads = attn.q_proj.out_features // self.head_dim
            self.kv_heads = attn.k_proj.out_features // self.head_dim
            self.intermediate = self.layers[0].mlp.gate_proj.out_features
        elif isinstance(getattr(base, "h", None), nn.ModuleList) and hasattr(base, "wpe"):
            self.kind, self.layers, self.norm = "gpt2", list(base.h), base.ln_f
            attn = self.layers[0].attn
            self.head_dim, self.heads = attn.head_dim, attn.num_heads
            self.kv_heads = self.heads
            self.intermediate = self.layers[0].mlp.c_fc.nf
        else:
            raise ValueError(f"causal prefix reuse needs a Llama-layout or GPT-2 decoder, got {type(base).__name__}")
        self.d = self.heads * self.head_dim if self.kind == "gpt2" else base.config.hidden_size

    def start(self, x: Tensor, positions: Tensor) -> tuple[Tensor, tuple[Tensor, Tensor] | None]:
        """The first layer's input from the word embeddings ``x [M, d]`` at ``positions [M]``, and
        the rotary ``(cos, sin) [M, head_dim]`` (None for GPT-2, whose learned positions are added)."""
        if self.kind == "gpt2":
            return x + self.base.wpe(positions).to(x.dtype), None
        cos, sin = self.base.rotary_emb(x, positions[None])
        return x, (cos[0], sin[0])

    def qkv(self, layer: nn.Module, x: Tensor, rotary) -> tuple[Tensor, Tensor, Tensor]:
        """A layer's queries ``[M, heads, dh]``, keys and values ``[M, kv_heads, dh]`` (rotated)."""
        M, dh = x.shape[0], self.head_dim
        if self.kind == "gpt2":
            q, k, v = layer.attn.c_attn(layer.ln_1(x)).split(self.d, dim=-1)
            return q.view(M, -1, dh), k.view(M, -1, dh), v.view(M, -1, dh)
        attn, h = layer.self_attn, layer.input_layernorm(x)
        q, k, v = (proj(h).view(M, -1, dh) for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
        q, k = self._rotate(q, k, *rotary)  # cos, sin [M, dh] -> [M, 1, dh] over the heads
        return q, k, v

    def scaling(self, layer: nn.Module) -> float:
        return (layer.attn if self.kind == "gpt2" else layer.self_attn).scaling

    def window(self, layer: nn.Module) -> int | None:
        """The layer's sliding window (keys at positions ``> query - window``), None without one."""
        if self.kind == "gpt2":
            return None
        attn = layer.self_attn
        if hasattr(attn, "sliding_window"):  # Qwen2: per layer (None on its full-attention layers)
            return attn.sliding_window
        return getattr(self.base.config, "sliding_window", None)  # Mistral: every layer

    def after(self, layer: nn.Module, x: Tensor, out: Tensor) -> Tensor:
        """The layer's output from its input ``x [M, d]`` and the attention's heads ``out [M, heads * dh]``."""
        if self.kind == "gpt2":
            x = x + layer.attn.c_proj(out)
            return x + layer.mlp(layer.ln_2(x))
        x = x + layer.self_attn.o_proj(out)
        return x + layer.mlp(layer.post_attention_layernorm(x))


def decoder_of(base: nn.Module) -> CausalDecoder:
    """:class:`CausalDecoder` of a ``transformers`` decoder base model (``model.model`` of a Llama
    ``...ForCausalLM``/``...ForSequenceClassification``, ``model.transformer`` of GPT-2)."""
    return CausalDecoder(base)


def _masked_scores(scores: Tensor, allowed: Tensor, groups: int) -> Tensor:
    """``scores [N, kv_heads, groups * Q, K]`` with ``-max`` where ``allowed [N, 1, Q or 1, K]`` is False."""
    N, kvh, _, K = scores.shape
    view = scores.view(N, kvh, groups, -1, K)
    return view.masked_fill(~allowed[:, :, None], torch.finfo(scores.dtype).min).view(N, kvh, -1, K)


def run_layers(
    decoder: CausalDecoder,
    x: Tensor,
    count: Tensor,
    positions: Tensor,
    width: int,
    past: Callable[[int], tuple[Tensor, Tensor]] | None = None,
    past_lengths: Tensor | None = None,
    cache: list | None = None,
    every: bool = False,
) -> Tensor:
    """Run every layer on the positions of N sequences; return the final-normed state of each
    one's last position ``[N, d]`` (``every``: of every position, packed as ``x``, ``[M, d]``).

    Args:
        x: ``[M, d]`` the sequences' word embeddings, packed (sequence i's ``count[i]`` positions, in order).
        count: ``[N]`` int64 >= 1, each sequence's positions here; ``width`` their maximum (a host int).
        positions: ``[N, width]`` the position ids (each row ascending by one; past ``count``: any).
        past: ``layer -> (keys, values) [N, kv_heads, S, dh]``, each sequence's cached keys and values
            of its positions ``0 .. past_lengths[i] - 1`` (the positions before ``positions[i, 0]``).
        cache: a list that receives each layer's keys and values ``[N, kv_heads, width, dh]``.
        every: the last layer runs every position's query too (else only each sequence's last).
    """
    N, W = positions.shape[0], width
    where = token_mask(count, W)  # [N, W]: the packed positions
    pos = positions[:, :W]
    x, rotary = decoder.start(x, pos[where])
    last = count - 1
    rows = torch.arange(N, device=x.device)
    j = torch.arange(W, device=x.device)
    causal = (j[None, :] <= j[:, None])[None] & where[:, None, :]  # [N, Wq, Wk]
    H, kvh, dh = decoder.heads, decoder.kv_heads, decoder.head_dim
    groups = H // kvh
    for index, layer in enumerate(decoder.layers):
        final = index == len(decoder.layers) - 1 and not every
        q, k, v = decoder.qkv(layer, x, rotary)
        padded = []
        for t, heads in ((k, kvh), (v, kvh)) if final else ((q, H), (k, kvh), (v, kvh)):
            out = t.new_zeros(N, W, heads, dh)
            out[where] = t
            padded.append(out.transpose(1, 2))  # [N, heads, W, dh]
        if final:  # only each sequence's last query is read out
            k, v = padded
            offsets = torch.cumsum(count, 0) - count
            q = q[offsets + last][:, :, None]  # [N, H, 1, dh]
            allowed = causal[rows, last][:, None, None]  # [N, 1, 1, W]
            query_pos = pos[rows, last][:, None]  # [N, 1]
        else:
            q, k, v = padded
            allowed = causal[:, None]  # [N, 1, W, W]
            query_pos = pos
        if cache is not None:
            cache.append((k, v))
        Q = q.shape[2]
        qg = q.reshape(N, kvh, groups * Q, dh)  # query head h = kv * groups + g reads kv head kv
        window = decoder.window(layer)
        if window is not None:
            allowed = allowed & (pos[:, None, None, :] > query_pos[:, None, :, None] - window)
        scores = _masked_scores(torch.matmul(qg, k.transpose(-1, -2)) * decoder.scaling(layer), allowed, groups)
        S = 0
        if past is not None:
            pk, pv = past(index)
            S = pk.shape[2]
            s = torch.arange(S, device=x.device)
            seen = (s < past_lengths[:, None])[:, None, None, :]  # [N, 1, 1, S]
            if window is not None:
                seen = seen & (s > query_pos[:, :, None] - window)[:, None]
            past_scores = _masked_scores(torch.matmul(qg, pk.transpose(-1, -2)) * decoder.scaling(layer), seen, groups)
            scores = torch.cat([past_scores, scores], -1)
        probs = torch.softmax(scores, -1)
        out = torch.matmul(probs[..., S:], v)
        if S:
            out = out + torch.matmul(probs[..., :S], pv)
        out = out.view(N, H, Q, dh).transpose(1, 2).reshape(N, Q, H * dh)  # heads in order
        if final:
            x = decoder.after(layer, x[offsets + last], out[:, 0])
        else:
            x = decoder.after(layer, x, out[where])
    return decoder.norm(x)


class EditCounts(NamedTuple):
    """Positions run through the layers for the one-token edits of rows: ``recomputed`` with the
    prefix reuse (each edit from its position on), ``full`` by a full recomputation (each edited
    sequence whole); ``rows``: the rows' own forward, which either runs once (the reuse for its
    cache, a full recomputation for the original outputs). The work's ratio is
    ``(recomputed + rows) / (full + rows)``."""

    recomputed: int
    full: int
    rows: int

    @property
    def ratio(self) -> float:
        return (self.recomputed + self.rows) / (self.full + self.rows)


def edit_counts(lengths, prefix: int = 0, suffix: int = 0, mode: str = "delete") -> EditCounts:
    """:class:`EditCounts` of every one-token edit of texts of ``lengths`` (ints) between a
    template's ``prefix`` and ``suffix`` tokens (a prompted model; 0 and 0 for a decoder
    classifier). An edit at text position t recomputes ``prefix + length - (mode == "delete") -
    start`` positions from ``start = prefix + t`` (at least the last one: a decoder classifier's
    deletion of its last token recomputes its new last position). For SmolLM2's chat template
    (prefix 41, suffix 6) and SST-like texts of 23 tokens, deletions: recomputed 391, full 1587,
    rows 70, ratio 0.28 (0.25 without the rows)."""
    if mode not in EDIT_MODES:
        raise ValueError(f"mode must be one of {EDIT_MODES}, got {mode!r}")
    recomputed = full = rows = 0
    for n in (int(n) for n in lengths):
        whole = prefix + n + suffix
        new = whole - (mode == "delete")
        rows += whole
        full += n * new
        recomputed += sum(new - min(prefix + t, new - 1) for t in range(n))
    return EditCounts(recomputed, full, rows)


class CachedRows(NamedTuple):
    """G rows run once by :func:`cache_rows`: ``cache``, every layer's keys and values ``[G,
    kv_heads, Tf, dh]``, and ``logits`` ``[G, C]``, the rows' own."""

    cache: list[tuple[Tensor, Tensor]]
    logits: Tensor


def cache_rows(
    decoder: CausalDecoder,
    readout: Callable[[Tensor], Tensor],
    inputs: Tensor,
    full: Tensor,
    prefix: list[tuple[Tensor, Tensor]] | None = None,
) -> CachedRows:
    """Run G right-padded rows once (``inputs [G, Tf, d]`` word embeddings, ``full [G]`` int64
    lengths >= 1), keeping every layer's keys and values: :class:`CachedRows`.

    ``prefix``: every layer's keys and values ``[1, kv_heads, P, dh]`` of the first P positions,
    which every row shares (a prompt's template before the text, :func:`cache_rows` of it once):
    only the positions from P on run, over them (each row longer than P)."""
    G, Tf, _ = inputs.shape
    cache: list[tuple[Tensor, Tensor]] = []
    if prefix is None:
        where = token_mask(full, Tf)
        positions = torch.arange(Tf, device=inputs.device).expand(G, Tf)
        logits = readout(run_layers(decoder, inputs[where], full, positions, Tf, cache=cache))
        return CachedRows(cache, logits)
    logits = readout(run_after_prefix(decoder, prefix, inputs, full, cache=cache))
    joined = [
        (torch.cat([pk.expand(G, -1, -1, -1), k], 2), torch.cat([pv.expand(G, -1, -1, -1), v], 2))
        for (pk, pv), (k, v) in zip(prefix, cache)
    ]
    return CachedRows(joined, logits)


def run_after_prefix(
    decoder: CausalDecoder,
    prefix: list[tuple[Tensor, Tensor]],
    inputs: Tensor,
    full: Tensor,
    every: bool = False,
    cache: list | None = None,
) -> Tensor:
    """:func:`run_layers` on G right-padded rows ``inputs [G, Tf, d]`` (lengths ``full [G]``, each
    longer than P) from position P on, over ``prefix``: every layer's keys and values ``[1, kv_heads,
    P, dh]`` of the first P positions, which every row shares (a prompt's template before the text).
    Returns the final-normed state of each row's last position ``[G, d]`` (``every``: of every
    position run, packed: row i's ``full[i] - P``); ``cache`` receives each layer's keys and values
    of the positions run."""
    G, Tf, _ = inputs.shape
    P = prefix[0][0].shape[2]
    W, count = Tf - P, full - P
    positions = P + torch.arange(W, device=inputs.device).expand(G, W)

    def past(layer: int) -> tuple[Tensor, Tensor]:
        k, v = prefix[layer]
        return k.expand(G, -1, -1, -1), v.expand(G, -1, -1, -1)

    rest = inputs[:, P:][token_mask(count, W)]
    return run_layers(decoder, rest, count, positions, W, past, torch.full_like(full, P), cache=cache, every=every)


def recompute(
    decoder: CausalDecoder,
    readout: Callable[[Tensor], Tensor],
    cache: list[tuple[Tensor, Tensor]],
    rows: Tensor,
    start: Tensor,
    words: Tensor,
    count: Tensor,
    width: int,
    prefix: int,
) -> Tensor:
    """Logits ``[N, C]`` of N edited sequences, each its source row's cached positions before
    ``start[i]`` and then ``count[i]`` recomputed positions ``start[i], start[i] + 1, ...``.

    Args:
        cache: the source rows' keys and values (:func:`cache_rows`), unchanged before ``start``.
        rows: ``[N]`` int64, each sequence's source row (an index into the cache).
        start: ``[N]`` int64, its first recomputed position (also the cached positions it reads).
        words: ``[N, width, d]`` the recomputed positions' word embeddings (any past ``count``).
        count: ``[N]`` int64 >= 1; ``width`` its maximum and ``prefix`` ``start``'s (host ints).
    """
    at = start[:, None] + torch.arange(width, device=start.device)  # [N, W] the positions

    def past(layer: int) -> tuple[Tensor, Tensor]:
        k, v = cache[layer]
        return k[:, :, :prefix][rows], v[:, :, :prefix][rows]

    x = words[token_mask(count, width)]
    return readout(run_layers(decoder, x, count, at, width, past if prefix else None, start))


def position_bytes(decoder: CausalDecoder, inputs: Tensor, full: Tensor, first: Tensor, width: int) -> int:
    """About what a call of edits holds per text position (bytes; what ``leave_one_out`` and
    ERASER size their calls by): each edit's recomputed positions (at most the text and what
    follows it) with their activations (states, norms, q/k/v, the heads' outputs, the MLP's four
    intermediate vectors) and one layer's scores and probabilities over every key, and one
    layer's gathered prefix keys and values; spread over the text's ``width`` positions."""
    Tf = inputs.shape[1]
    span = int((full - first).max())
    per_position = 4 * decoder.d + 2 * (decoder.heads + decoder.kv_heads) * decoder.head_dim
    per_edit = span * (per_position + 4 * decoder.intermediate + 2 * decoder.heads * Tf)
    per_edit += 2 * decoder.kv_heads * decoder.head_dim * Tf
    return max(1, math.ceil(per_edit * inputs.element_size() / max(1, width)))


def prepare_edits(
    decoder: CausalDecoder,
    readout: Callable[[Tensor], Tensor],
    inputs: Tensor,
    full: Tensor,
    first: Tensor,
    width: int,
    replacement: Tensor | None = None,
    prefix: list[tuple[Tensor, Tensor]] | None = None,
) -> Callable[[Tensor, Tensor], Tensor]:
    """Prepare the one-token edits of G rows; returns a
    :class:`~attnmetrics.protocol.PreparedEdits`: ``edits(rows [N], positions [N])`` (int64) ->
    logits ``[N, C]`` of row ``rows[i]`` with its text position ``positions[i]`` deleted
    (``replacement`` None) or replaced by the word embedding ``replacement [d]``.

    Runs the rows once here (every layer's keys and values kept, and their own logits:
    ``edits.unedited_logits()``). ``edits.position_bytes``: about what a call holds per text
    position of its edits (what ``leave_one_out`` sizes its calls by); ``edits.recomputed``: the
    positions its calls have run so far (:func:`edit_counts`' ``recomputed``).

    Args:
        decoder: the model's layers (:func:`decoder_of`).
        readout: the final-normed state at the last position ``[N, d]`` -> logits ``[N, C]``.
        inputs: ``[G, Tf, d]`` the whole inputs' word embeddings (a template around the text),
            right-padded.
        full: ``[G]`` their lengths; the last position is read out.
        first: ``[G]`` each row's first text position (text position t is ``first + t``).
        width: the text's width (the protocol's T), for ``position_bytes``.
        prefix: the keys and values of the positions before every row's first text position,
            shared by every row (:func:`cache_rows`' ``prefix``), or None.
    """
    G, Tf, d = inputs.shape
    device = inputs.device
    masked = replacement is not None
    if not masked and G and int(full.min()) < 2:
        raise ValueError(
            f"a deletion needs inputs of at least 2 positions (one is left to read out), got lengths {full.tolist()}"
        )
    cache, unedited = cache_rows(decoder, readout, inputs, full, prefix)
    if masked:
        replacement = replacement.to(inputs.dtype)

    def edits(rows: Tensor, positions: Tensor) -> Tensor:
        edit = first[rows] + positions  # the edited position in the whole input
        new_length = full[rows] - int(not masked)
        # from the edit on; at least the last position (the deletion of a decoder's last token)
        start = torch.minimum(edit, new_length - 1)
        count = new_length - start
        W, S, total = torch.stack([count.max(), start.max(), count.sum()]).tolist()
        edits.recomputed += total
        at = start[:, None] + torch.arange(W, device=device)  # [N, W] the new positions
        src = at if masked else at + (at >= edit[:, None])  # where each one's token was
        words = inputs[rows[:, None], src.clamp(max=Tf - 1)]
        if masked:
            words = torch.where((at == edit[:, None])[..., None], replacement, words)
        return recompute(decoder, readout, cache, rows, start, words, count, W, S)

    edits.recomputed = 0
    edits.unedited_logits = lambda: unedited
    edits.position_bytes = position_bytes(decoder, inputs, full, first, width)
    return edits


def mask_embedding(words: nn.Embedding, mask_token: int, dtype: torch.dtype) -> Tensor:
    """The word embedding ``[d]`` of ``mask_token`` (ValueError outside the vocabulary)."""
    if isinstance(mask_token, bool) or not 0 <= int(mask_token) < words.num_embeddings:
        raise ValueError(f"mask_token must be an id in [0, {words.num_embeddings}), got {mask_token}")
    return words(torch.tensor(int(mask_token), device=words.weight.device)).to(dtype)
