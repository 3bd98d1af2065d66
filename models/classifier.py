"""J&W's attention classifier: embed -> encode -> attend -> decode.

Implements ``attnmetrics.protocol.AttentionClassifier``. Encoders and attention layers are
small modules looked up by name, as in J&W sec. 3 and W&P:

- ``ENCODERS``: ``lstm`` (BiLSTM, the default), ``gru`` (BiGRU), ``cnn`` (widths 1/3/5/7),
  ``average`` (per-token Linear + tanh, no context: the "no encoder"/MLP baseline).
- ``ATTENTIONS``: ``tanh`` (additive, the default), ``dot`` (scaled, learned query),
  ``uniform`` (W&P's baseline: 1/L over the real tokens, no parameters).
- ``REGULARISERS`` (T&Š 2020, sec. 3): ``none``, ``concat``/``residual`` (the embedding is fed
  past the encoder, so hidden states "stay true" to their words), ``tying``/``mlm`` (auxiliary
  losses, :meth:`EncoderAttentionClassifier.auxiliary_loss`).

Every encoder maps ``[B, T, E]`` and ``lengths [B]`` to ``[B, T, H]`` (``H = output_size``),
exactly zero on padding, and treats a row the same alone or in a padded batch.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from functools import partial
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from attnmetrics._ops import ops
from attnmetrics._validation import checked_ids
from attnmetrics.data.tokens import UNK
from attnmetrics.models.deletions import BiRNNDeletions, delete_positions, mask_positions
from attnmetrics.protocol import token_mask


def padded_runs(device: torch.device) -> bool:
    """Whether the RNN encoders run on ``device`` over the padded batch (each direction one
    call, the backward one over the rows reversed in place) instead of packed sequences. On
    a GPU packing and unpacking cost a few kernel launches per time step, forward and
    backward: one SST training step of the BiLSTM launched ~580 kernels and took ~17 ms of
    host time for ~2.5 ms of GPU work (H100, torch.profiler). On the CPU, packing computes
    fewer positions and wins where nothing is differentiated (a forward over SST's test set
    0.67 s packed, 1.41 s padded); with gradients enabled (training, the gradient importances)
    the padded batch's fused LSTM calls win over packing's graph of a step at a time
    (gradient importance over SST's test set 10.3 s packed, 4.6-5.0 s padded; training batches
    of 32, 1.2-1.5x; one thread)."""
    return device.type == "cuda" or torch.is_grad_enabled()


class _RowFlip(torch.autograd.Function):
    """x [B, T, F] with each row's positions permuted by ``index`` [B, T], a permutation that is
    its own inverse (each row's real positions reversed, padding in place): a gather forward
    and, because the permutation undoes itself, a gather backward too. Autograd's own gather
    backward scatters (a sort and device reads per call under deterministic algorithms, which
    training switches on): ~2 ms of host time a call on an H100."""

    @staticmethod
    def forward(ctx, x: Tensor, index: Tensor) -> Tensor:
        ctx.save_for_backward(index)
        return x.gather(1, index[..., None].expand_as(x))

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        (index,) = ctx.saved_tensors
        return grad.gather(1, index[..., None].expand_as(grad)), None


class _BiRNNEncoder(nn.Module):
    """A one-layer (Bi)RNN over packed sequences: [B, T, E], lengths [B] -> [B, T, 2·hidden],
    exactly zero on padding (so padding never leaks into contexts or gradients)."""

    rnn_class: type[nn.RNNBase]

    def __init__(self, embed_dim: int, hidden_size: int = 128, bidirectional: bool = True):
        super().__init__()
        self.rnn = self.rnn_class(embed_dim, hidden_size, batch_first=True, bidirectional=bidirectional)
        self.output_size = hidden_size * (2 if bidirectional else 1)

    def forward(self, embedded: Tensor, lengths: Tensor) -> Tensor:
        if padded_runs(embedded.device):
            return self._padded(embedded, lengths)
        T = embedded.shape[1]
        # Packing makes the backward direction start at each row's last real position, not
        # at its padding, and pad_packed_sequence fills padding with exact zeros.
        packed = pack_padded_sequence(embedded, lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, _ = self.rnn(packed)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=T)
        return out

    def _padded(self, embedded: Tensor, lengths: Tensor) -> Tensor:
        """The packed forward's outputs from two runs over the padded batch: the forward
        direction as it is (a row's padding comes after its real positions, so they never
        see it), the backward direction over each row's real positions reversed in place
        (padding left where it is), its outputs put back in order; padding zeroed."""
        T = embedded.shape[1]
        valid = token_mask(lengths, T)
        out = self._direction(embedded, "")
        if self.rnn.bidirectional:
            position = torch.arange(T, device=embedded.device)
            flipped = torch.where(valid, lengths[:, None] - 1 - position, position)  # an involution
            backward = self._direction(_RowFlip.apply(embedded, flipped), "_reverse")
            backward = _RowFlip.apply(backward, flipped)
            out = torch.cat([out, backward], -1)
        return out.masked_fill(~valid[..., None], 0.0)

    def _direction(self, x: Tensor, suffix: str) -> Tensor:
        """One direction of the RNN (weights ``*_l0`` + ``suffix``) over x [B, T, E] from zero
        states: [B, T, hidden]. On a GPU cuDNN copies the direction's four weight tensors into a
        buffer of its own each call (a one-direction call over the bidirectional module's
        flattened weights is not laid out as it wants; H100: the SST training's 8 epochs take
        13.6 s with the copies), and warns each time it does: the warning is silenced here."""
        rnn = self.rnn
        weights = [getattr(rnn, f"{name}_l0{suffix}") for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
        h0 = x.new_zeros(1, x.shape[0], rnn.hidden_size)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="RNN module weights are not part of single contiguous chunk")
            if isinstance(rnn, nn.LSTM):
                out, _, _ = torch._VF.lstm(x, (h0, h0), weights, True, 1, 0.0, self.training, False, True)
            else:
                out, _ = torch._VF.gru(x, h0, weights, True, 1, 0.0, self.training, False, True)
        return out

    def deletions(
        self,
        embedded: Tensor,
        lengths: Tensor,
        feature_map: Tensor | None = None,
        bias: Tensor | None = None,
        replacement: Tensor | None = None,
    ) -> BiRNNDeletions:
        """The rows' deletions (or, with ``replacement [E]``, maskings), reusing the states each
        leaves unchanged: their hidden states, or ``feature_map @ h + bias`` (models/deletions.py)."""
        return BiRNNDeletions(self.rnn, embedded, lengths, feature_map, bias, replacement)


class LSTMEncoder(_BiRNNEncoder):
    """J&W's encoder: one-layer BiLSTM, ``hidden_size`` per direction (H = 2·hidden_size)."""

    rnn_class = nn.LSTM


class GRUEncoder(_BiRNNEncoder):
    """One-layer BiGRU, ``hidden_size`` per direction (H = 2·hidden_size)."""

    rnn_class = nn.GRU


class CNNEncoder(nn.Module):
    """J&W's CNN encoder: convolutions of widths 1, 3, 5, 7 with ``hidden_size // 4`` channels
    each (128 -> 32), ReLU, 'same' padding, concatenated: [B, T, E], lengths [B] -> [B, T, H]
    with H = hidden_size.

    Padding is zeroed before the convolution, so a row in a padded batch sees exactly the
    zeros a row alone gets from the convolution's own 'same' padding, and again after it,
    so the output is exactly zero on padding.
    """

    widths = (1, 3, 5, 7)

    def __init__(self, embed_dim: int, hidden_size: int = 128):
        super().__init__()
        if hidden_size % len(self.widths):
            raise ValueError(f"cnn: hidden_size must be a multiple of {len(self.widths)}, got {hidden_size}")
        channels = hidden_size // len(self.widths)
        self.convs = nn.ModuleList(nn.Conv1d(embed_dim, channels, k, padding=k // 2) for k in self.widths)
        self.output_size = hidden_size

    def forward(self, embedded: Tensor, lengths: Tensor) -> Tensor:
        mask = token_mask(lengths, embedded.shape[1]).unsqueeze(-1).to(embedded.dtype)
        x = (embedded * mask).transpose(1, 2)  # [B, E, T] for Conv1d
        out = torch.cat([torch.relu(conv(x)) for conv in self.convs], dim=1).transpose(1, 2)
        return out * mask


class AverageEncoder(nn.Module):
    """No context: each token on its own through Linear(E, hidden_size) + tanh — the "MLP" /
    "no encoder" baseline of J&W and W&P. [B, T, E], lengths [B] -> [B, T, H = hidden_size],
    zero on padding (the bias would otherwise make it tanh(b))."""

    def __init__(self, embed_dim: int, hidden_size: int = 128):
        super().__init__()
        self.proj = nn.Linear(embed_dim, hidden_size)
        self.output_size = hidden_size

    def forward(self, embedded: Tensor, lengths: Tensor) -> Tensor:
        mask = token_mask(lengths, embedded.shape[1]).unsqueeze(-1).to(embedded.dtype)
        return torch.tanh(self.proj(embedded)) * mask

    def deletions(
        self, embedded: Tensor, lengths: Tensor, replacement: Tensor | None = None
    ) -> Callable[[Tensor, Tensor], Tensor]:
        """The rows' deletions (or, with ``replacement [E]``, maskings): without context, each
        row's own outputs less the deleted position (or with the replacement's output there)."""
        outputs = self(embedded, lengths)
        if replacement is None:
            return partial(delete_positions, outputs, lengths)
        masked = torch.tanh(self.proj(replacement))
        return lambda rows, positions: mask_positions(outputs, lengths, masked, rows, positions)


def _masked_softmax(scores: Tensor, mask: Tensor) -> Tensor:
    """scores [B, T], mask [B, T] bool -> softmax over the True positions, exactly 0 elsewhere."""
    weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    # A row with no real token would be all NaN; zeros make its context the zero vector.
    return weights.masked_fill(~mask, 0.0)


class TanhAttention(nn.Module):
    """Additive attention (J&W, after Bahdanau): score_t = v · tanh(W h_t + b), softmax over
    the positions where ``mask`` is True; every other position gets exactly 0."""

    def __init__(self, hidden_size: int, attention_dim: int):
        super().__init__()
        self.proj = nn.Linear(hidden_size, attention_dim)
        self.v = nn.Linear(attention_dim, 1, bias=False)

    @property
    def projection(self) -> nn.Linear:
        """The linear map through which the scores depend on h_t (see :meth:`scorer`)."""
        return self.proj

    def scorer(self) -> tuple[Tensor, bool]:
        """``(v [A], True)``: score_t = v · tanh(projection(h_t)), as ``attnmetrics::spliced_attention`` takes it."""
        return self.v.weight[0], True

    def score(self, projected: Tensor) -> Tensor:
        """projection(hidden) [..., T, A] -> scores [..., T]."""
        return self.v(torch.tanh(projected)).squeeze(-1)

    def forward(self, hidden: Tensor, mask: Tensor) -> Tensor:
        """hidden [B, T, H], mask [B, T] bool -> attention [B, T]."""
        return _masked_softmax(self.score(self.proj(hidden)), mask)


class DotAttention(nn.Module):
    """Scaled dot-product attention with a learned query (J&W): score_t = w · h_t / √H,
    softmax over the positions where ``mask`` is True; every other position gets exactly 0.
    ``attention_dim`` is accepted for a common signature and unused."""

    def __init__(self, hidden_size: int, attention_dim: int | None = None):
        super().__init__()
        self.w = nn.Linear(hidden_size, 1, bias=False)  # a bias would shift every score alike
        self.scale = hidden_size**-0.5

    @property
    def projection(self) -> nn.Linear:
        """The linear map through which the scores depend on h_t (see :meth:`scorer`)."""
        return self.w

    def scorer(self) -> tuple[Tensor, bool]:
        """``([1 / √H], False)``: score_t = projection(h_t) / √H, as ``attnmetrics::spliced_attention`` takes it."""
        return torch.full((1,), self.scale, dtype=self.w.weight.dtype, device=self.w.weight.device), False

    def score(self, projected: Tensor) -> Tensor:
        """projection(hidden) [..., T, 1] -> scores [..., T]."""
        return projected.squeeze(-1) * self.scale

    def forward(self, hidden: Tensor, mask: Tensor) -> Tensor:
        """hidden [B, T, H], mask [B, T] bool -> attention [B, T]."""
        return _masked_softmax(self.score(self.w(hidden)), mask)


class UniformAttention(nn.Module):
    """W&P 2019's uniform baseline (sec. 3.2): 1/L on each of the L positions where ``mask``
    is True, exactly 0 elsewhere. No parameters, so it stays frozen in training and testing.
    Arguments are accepted for a common signature and unused."""

    def __init__(self, hidden_size: int | None = None, attention_dim: int | None = None):
        super().__init__()

    def forward(self, hidden: Tensor, mask: Tensor) -> Tensor:
        """hidden [B, T, H], mask [B, T] bool -> attention [B, T] in hidden's dtype."""
        weights = mask.to(hidden.dtype)
        # A row with no real token stays all zero (its context is the zero vector).
        return weights / weights.sum(1, keepdim=True).clamp_min(1)


ENCODERS = {"lstm": LSTMEncoder, "gru": GRUEncoder, "cnn": CNNEncoder, "average": AverageEncoder}
ATTENTIONS = {"tanh": TanhAttention, "dot": DotAttention, "uniform": UniformAttention}
#: T&Š 2020 (sec. 3): how hidden states are kept close to their input words
REGULARISERS = ("none", "concat", "residual", "tying", "mlm")


@dataclass
class ModelConfig:
    """Everything needed to rebuild a classifier (saved as JSON beside the state_dict).

    ``num_classes == 1`` is one sigmoid logit for a binary task (J&W); ``>= 2`` softmax.
    ``hidden_size`` is per direction for ``lstm``/``gru`` (H = 2·hidden_size) and the whole
    output for ``cnn``/``average`` (H = hidden_size; J&W: 4 widths × 32 = 128).
    ``attention_dim`` (``tanh`` only) defaults to half the encoder's output (J&W: 256 -> 128).
    ``regulariser`` is one of :data:`REGULARISERS` (T&Š 2020); ``tying_weight`` and
    ``mlm_weight`` scale its auxiliary loss, ``mlm_mask_prob`` is the share of real tokens
    masked (replaced by ``<UNK>``) for the masked-LM head."""

    vocab_size: int
    embed_dim: int = 300
    hidden_size: int = 128
    num_classes: int = 1
    encoder: str = "lstm"
    attention: str = "tanh"
    attention_dim: int | None = None
    lead: int = 1
    trail: int = 1
    regulariser: str = "none"
    tying_weight: float = 1.0
    mlm_weight: float = 1.0
    mlm_mask_prob: float = 0.15

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> ModelConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown model config keys: {sorted(unknown)}")
        return cls(**d)


class States(NamedTuple):
    """One forward pass: logits [B, C], attention [B, T], embedded [B, T, E], hidden [B, T, H]."""

    logits: Tensor
    attention: Tensor
    embedded: Tensor
    hidden: Tensor


class AttentionForward:
    """``forward`` and ``states`` of a protocol model (embed -> encode -> attend -> decoder), shared
    by the classifiers (J&W's and GPT-1's); attention may be imposed instead of the model's own."""

    def forward(self, tokens: Tensor, lengths: Tensor, attention: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """tokens [B, T], lengths [B] -> (logits [B, C], attention [B, T]).

        ``attention`` [B, T], if given, is imposed instead of the model's own (uniform
        baselines, permutations, adversaries); it is returned as the attention used.
        """
        out = self.states(tokens, lengths, attention)
        return out.logits, out.attention

    def states(self, tokens: Tensor, lengths: Tensor, attention: Tensor | None = None) -> States:
        """:meth:`forward` keeping the intermediate tensors (for auxiliary losses)."""
        embedded = self.embed(tokens)
        hidden = self.encode(embedded, lengths)
        if attention is None:
            attention = self.attend(hidden, lengths)
        elif attention.shape != hidden.shape[:2]:
            raise ValueError(
                f"imposed attention must be [B, T] = {list(hidden.shape[:2])}, got {list(attention.shape)}"
            )
        context = torch.bmm(attention.unsqueeze(1).to(hidden.dtype), hidden).squeeze(1)
        dropout = getattr(self, "context_dropout", None)  # GPT-1's classifier dropout (training only)
        if dropout is not None:
            context = dropout(context)
        return States(self.decoder(context), attention, embedded, hidden)


class EncoderAttentionClassifier(AttentionForward, nn.Module):
    """embedding -> encoder -> attention -> ``decoder = nn.Linear(H, C)``.

    ``forward(tokens [B, T], lengths [B])`` -> ``(logits [B, C], attention [B, T])``.
    ``lengths`` count ``<SOS>``/``<EOS>`` (``lead = trail = 1``), which attention masks out.
    """

    def __init__(self, config: ModelConfig, embeddings: Tensor | None = None):
        super().__init__()
        if config.encoder not in ENCODERS:
            raise ValueError(f"unknown encoder {config.encoder!r}; choose from {sorted(ENCODERS)}")
        if config.attention not in ATTENTIONS:
            raise ValueError(f"unknown attention {config.attention!r}; choose from {sorted(ATTENTIONS)}")
        if config.num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {config.num_classes}")
        if config.regulariser not in REGULARISERS:
            raise ValueError(f"unknown regulariser {config.regulariser!r}; choose from {REGULARISERS}")
        if not 0 < config.mlm_mask_prob <= 1:
            raise ValueError(f"mlm_mask_prob must lie in (0, 1], got {config.mlm_mask_prob}")
        self.config = config
        self.lead, self.trail = config.lead, config.trail
        self.embedding = nn.Embedding(config.vocab_size, config.embed_dim, padding_idx=0)
        if embeddings is not None:
            if tuple(embeddings.shape) != (config.vocab_size, config.embed_dim):
                raise ValueError(
                    f"embeddings must be [{config.vocab_size}, {config.embed_dim}], got {list(embeddings.shape)}"
                )
            with torch.no_grad():
                self.embedding.weight.copy_(embeddings)
                self.embedding.weight[0].zero_()
        self.encoder = ENCODERS[config.encoder](config.embed_dim, config.hidden_size)
        H, E = self.encoder.output_size, config.embed_dim
        if config.regulariser == "concat":
            H = H + E  # hidden ⊕ embedding
        elif config.regulariser == "residual":
            self.residual = nn.Linear(E, H)  # hidden + W e + b
        elif config.regulariser == "tying":
            # ||P h_t - e_t||²: P maps a hidden state into embedding space (the identity when H == E,
            # T&Š's own set-up where the two have the same size).
            self.tying = nn.Identity() if H == E else nn.Linear(H, E, bias=False)
        elif config.regulariser == "mlm":
            # Masked-LM head: hidden -> embedding space -> vocabulary, the output matrix being the
            # embedding matrix itself (weight tying, Press & Wolf 2017).
            self.mlm_proj = nn.Linear(H, E)
            self.mlm_output = nn.Linear(E, config.vocab_size)
            self.mlm_output.weight = self.embedding.weight
        self.attention = ATTENTIONS[config.attention](H, config.attention_dim or H // 2)
        self.decoder = nn.Linear(H, config.num_classes)

    def embed(self, tokens: Tensor) -> Tensor:
        """tokens [B, T] int64 -> embeddings [B, T, E]; ValueError for ids outside the vocabulary."""
        tokens = checked_ids(tokens, self.config.vocab_size)  # deferred inside a procedure (attnmetrics._deferred)
        return self.embedding(tokens)

    def encode(self, embedded: Tensor, lengths: Tensor) -> Tensor:
        """embeddings [B, T, E], lengths [B] -> hidden states [B, T, H], zero on padding.

        With the ``concat`` regulariser H = encoder output + E (hidden ⊕ embedding); with
        ``residual`` the projected embedding is added (T&Š 2020, sec. 3)."""
        hidden = self.encoder(embedded, lengths)
        regulariser = self.config.regulariser
        if regulariser in ("concat", "residual"):
            mask = token_mask(lengths, embedded.shape[1]).unsqueeze(-1).to(hidden.dtype)
            extra = embedded if regulariser == "concat" else self.residual(embedded)
            hidden = torch.cat([hidden, extra * mask], -1) if regulariser == "concat" else hidden + extra * mask
        return hidden

    def deletion_logits(self, embedded: Tensor, lengths: Tensor) -> Callable[[Tensor, Tensor], Tensor]:
        """Prepare the one-token deletions of rows ``embedded [G, T, E]``, ``lengths [G]``
        (special tokens included); returns ``logits(rows [N], positions [N])`` (int64) ->
        ``[N, C]``, the logits on row ``rows[i]`` with position ``positions[i]`` deleted, as
        ``forward`` gives them on the shortened rows. Used by ``attnmetrics.leave_one_out``
        (J&W sec. 4.1).

        The recurrent encoders reuse the states a deletion leaves unchanged (the forward
        ones before it, the backward ones after it); with them, attention scores and logits
        depend on each state only through linear maps (the attention's projection and the
        decoder), so those are applied to each state once, not to every deletion's copy;
        that callable carries ``position_bytes``, what a call holds per position of its
        deletions, by which ``leave_one_out`` sizes the calls.
        """
        return self._one_token_logits(embedded, lengths, None)

    def masking_logits(self, embedded: Tensor, lengths: Tensor, mask_token: int) -> Callable[[Tensor, Tensor], Tensor]:
        """:meth:`deletion_logits` with position ``positions[i]`` replaced by ``mask_token``
        instead of deleted (the row keeps its length): ``leave_one_out(mode="mask")``. The same
        reuse: masking t leaves the forward states before t and the backward ones after it."""
        replacement = self.embed(torch.tensor([[mask_token]], device=embedded.device))[0, 0].to(embedded.dtype)
        return self._one_token_logits(embedded, lengths, replacement)

    def _one_token_logits(
        self, embedded: Tensor, lengths: Tensor, replacement: Tensor | None
    ) -> Callable[[Tensor, Tensor], Tensor]:
        """deletion_logits (``replacement`` None) or masking_logits (``replacement [E]``)."""
        kept = lengths if replacement is not None else lengths - 1  # each result's length
        # concat/residual add the embedding past the encoder: those re-encode each deletion
        plain = self.config.regulariser not in ("concat", "residual")
        if plain and isinstance(self.encoder, _BiRNNEncoder) and hasattr(self.attention, "scorer"):
            return self._spliced_logits(embedded, lengths, kept, replacement)
        if plain and hasattr(self.encoder, "deletions"):
            encode = self.encoder.deletions(embedded, lengths, replacement=replacement)
        else:

            def encode(rows: Tensor, positions: Tensor) -> Tensor:
                if replacement is None:
                    edited = delete_positions(embedded, lengths, rows, positions)
                else:
                    edited = mask_positions(embedded, lengths, replacement, rows, positions)
                return self.encode(edited, kept[rows])

        def logits(rows: Tensor, positions: Tensor) -> Tensor:
            hidden = encode(rows, positions)
            attention = self.attend(hidden, kept[rows])
            return self.decoder(torch.bmm(attention.unsqueeze(1).to(hidden.dtype), hidden).squeeze(1))

        return logits

    def _spliced_logits(
        self, embedded: Tensor, lengths: Tensor, kept: Tensor, replacement: Tensor | None
    ) -> Callable[[Tensor, Tensor], Tensor]:
        # Scores and decoder inputs depend on the hidden states through linear maps only: the
        # deletions give those features directly (attention projection ⊕ decoder input), as
        # pairs of table rows that attnmetrics::spliced_attention adds, scores and pools.
        projection = self.attention.projection
        maps = torch.cat([projection.weight, self.decoder.weight])  # [A + C, H], A the scorer's
        bias = None if projection.bias is None else F.pad(projection.bias, (0, self.decoder.out_features))
        deletions = self.encoder.deletions(embedded, lengths, maps, bias, replacement)
        v, tanh = self.attention.scorer()
        v = v.contiguous()

        def head(table: Tensor, pairs: Tensor, lengths: Tensor) -> Tensor:
            out = ops.spliced_attention(table, pairs, lengths, v, self.lead, self.trail, tanh)
            return out if self.decoder.bias is None else out + self.decoder.bias

        def logits(rows: Tensor, positions: Tensor) -> Tensor:
            return head(*deletions.spliced(rows, positions), kept[rows])

        def unedited_logits() -> Tensor:  # the rows' own, from the states already run
            own = deletions.own_features()
            (G, T, D), device = own.shape, own.device
            table = torch.cat([own.view(G * T, D), own.new_zeros(1, D)])  # a zero row to pair with
            pairs = torch.stack([torch.arange(G * T, device=device), torch.full((G * T,), G * T, device=device)], 1)
            return head(table, pairs.view(G, T, 2), lengths)

        logits.unedited_logits = unedited_logits
        # what a call holds per position of its deletions (leave_one_out sizes calls by it): the
        # features of the recomputed states, A + C, and the pairs of table rows, 16 bytes
        logits.position_bytes = maps.shape[0] * embedded.element_size() + 16
        return logits

    def attend(self, hidden: Tensor, lengths: Tensor) -> Tensor:
        """hidden [B, T, H], lengths [B] -> attention [B, T]: sums to 1 over the real tokens,
        exactly 0 at ``<SOS>``, ``<EOS>`` and padding."""
        return self.attention(hidden, token_mask(lengths, hidden.shape[1], self.lead, self.trail))

    def auxiliary_loss(self, tokens: Tensor, lengths: Tensor, embedded: Tensor, hidden: Tensor) -> Tensor | None:
        """The regulariser's auxiliary training loss (T&Š 2020, sec. 3), already weighted, or
        None when the regulariser has none. ``training.train`` adds it to the task loss.

        - ``tying``: ``tying_weight`` · mean over real tokens of ||P h_t − e_t||² (squared L2;
          the embedding is the target, detached, so the loss pulls hidden states towards their
          words rather than shrinking the embeddings towards the hidden states).
        - ``mlm``: ``mlm_weight`` · cross-entropy of predicting the original id of each masked
          real token (a ``mlm_mask_prob`` share, replaced by ``<UNK>``) from the hidden states of
          the masked input, through a head whose output matrix is the embedding matrix.

        Args: tokens [B, T] int64, lengths [B] int64 (specials included), embedded [B, T, E]
        and hidden [B, T, H] of the unmasked forward pass. Returns a scalar tensor or None.
        """
        real = token_mask(lengths, tokens.shape[1], self.lead, self.trail)
        if self.config.regulariser == "tying":
            squared = (self.tying(hidden) - embedded.detach()).pow(2).sum(-1)
            return self.config.tying_weight * squared[real].mean()
        if self.config.regulariser == "mlm":
            masked = real & (torch.rand(real.shape, device=tokens.device) < self.config.mlm_mask_prob)
            if not masked.any():
                return hidden.sum() * 0.0  # keeps the graph; no token drawn in this batch
            states = self.encode(self.embed(tokens.masked_fill(masked, UNK)), lengths)[masked]
            logits = self.mlm_output(torch.tanh(self.mlm_proj(states)))  # [M, V]
            return self.config.mlm_weight * F.cross_entropy(logits, tokens[masked])
        return None

    def attention_parameters(self) -> list[nn.Parameter]:
        """The attention layer's parameters (J&W exempt them from weight decay)."""
        return list(self.attention.parameters())
