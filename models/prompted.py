"""A decoder language model used zero-shot through a prompt, on attnmetrics' protocol
(docs/definitions.md §15, "Prompted decoders").

A prompt is a template holding ``{text}`` once and one label word per class. Each row's model input
is ``[start] prefix text suffix``: the tokenizer's own start tokens (Llama's ``<s>``; none for
SmolLM2), the template before ``{text}``, the text's tokens, the template after it. The output
distribution is the softmax over the label words' next-token logits at the answer position (the
suffix's last token: the position whose next token would be the answer); the decision is its
argmax. Nothing is trained.

Only the text's tokens are items: the procedures explain, delete, mask and permute them; the
template is fixed context around them. ``tokens`` and ``lengths`` are therefore the text's alone
(``lead = trail = 0``) and the model adds the template; :meth:`PromptedLM.sequence` gives the
whole input.

Tokenisation: the template's two parts and the text are tokenised separately and concatenated,
so a text's tokens are the same in every template. Where the template has a space right before
``{text}``, that space goes to the text (tokenised as ``" " + text``, as a BPE tokeniser
tokenises the whole string: ``"Review: a"`` is ``Review``, ``:``, ``Ġa``). A named prompt of
kind ``chat`` is wrapped in the tokenizer's chat template first (a user turn, then the assistant
turn's opening: SmolLM2's default system turn included).

The protocol's vectors: :meth:`PromptedLM.encode` returns the text positions' final states, except
that each row's last text position holds the answer position's final state, and
:meth:`PromptedLM.attend` puts all the weight there; the decoder (:class:`LabelWords`) maps that
state to the label words' logits. So the protocol's forward is the model's own, and gradients
with respect to the text's embeddings flow through the whole network and the template.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnmetrics._deferred import defer
from attnmetrics.models.hf import (
    _LLAMA_LAYER,
    HALF_PRECISION,
    HFClassifier,
    HFInputs,
    LlamaAfterAttention,
    _first_line,
    _transformers,
    hooked,
    load_tokenizer,
    quiet_transformers,
    register,
)
from attnmetrics.protocol import TestedAttention, token_mask


@dataclass(frozen=True)
class Prompt:
    """A prompt: ``template`` holds ``{text}`` once; ``label_words`` maps each class name to its
    word (one token each, with its leading space as the tokenizer writes it); ``chat``: the
    template is the user's turn of the tokenizer's chat template."""

    name: str
    template: str
    label_words: dict[str, str]
    chat: bool = False

    def words(self, classes: Sequence[str]) -> list[str]:
        """The label words in the order of ``classes`` (a data set's class names).

        Raises:
            ValueError: a class without a label word, naming it and the prompt's classes.
        """
        missing = [c for c in classes if c not in self.label_words]
        if missing:
            raise ValueError(
                f"--prompt {self.name}: no label word for class {', '.join(map(repr, missing))}; it has words for "
                f"{', '.join(map(repr, self.label_words))} (give --label-words, one per class in the order "
                f"{', '.join(classes)})"
            )
        return [self.label_words[c] for c in classes]


_SENTIMENT = {"negative": "negative", "positive": "positive"}
_SENTIMENT_SPACED = {"negative": " negative", "positive": " positive"}

#: the shipped prompts, by name (``--prompt NAME``). The three sentiment prompts are the templates
#: whose spread a prompted model's results report (docs/results.md).
PROMPTS: dict[str, Prompt] = {
    p.name: p
    for p in (
        Prompt(
            "sentiment",
            "Is this movie review positive or negative? Answer with one word.\nReview: {text}",
            _SENTIMENT,
            chat=True,
        ),
        Prompt(
            "sentiment-oneword",
            "Read this movie review and answer with one word, positive or negative.\n\n{text}",
            _SENTIMENT,
            chat=True,
        ),
        Prompt("sentiment-plain", "Review: {text}\nSentiment (positive or negative):", _SENTIMENT_SPACED),
        Prompt(
            "topic",
            "Article: {text}\nTopic (business, entertainment, politics, sport or tech):",
            {
                "business": " business",
                "entertainment": " entertainment",
                "politics": " politics",
                "sports": " sport",
                "tech": " tech",
            },
        ),
    )
}


def prompt_named(name_or_template: str, label_words: Sequence[str] | None, classes: Sequence[str]) -> Prompt:
    """``--prompt``'s prompt: a name of :data:`PROMPTS`, or a template holding ``{text}`` (used as
    written, no chat wrapping) with ``label_words`` in the order of ``classes``.

    Raises:
        ValueError: an unknown name (no ``{text}``), a template without ``{text}`` or with it more
            than once, label words missing for a template or not one per class.
    """
    if label_words is not None and len(label_words) != len(classes):
        raise ValueError(
            f"--label-words: one word per class ({', '.join(classes)}), got {len(label_words)}: {list(label_words)}"
        )
    if "{text}" not in name_or_template:
        if name_or_template in PROMPTS:
            prompt = PROMPTS[name_or_template]
            if label_words is not None:
                prompt = Prompt(prompt.name, prompt.template, dict(zip(classes, label_words)), prompt.chat)
            return prompt
        raise ValueError(
            f"--prompt {name_or_template!r}: neither a prompt's name ({', '.join(PROMPTS)}) nor a template "
            "holding {text} (where the text goes)"
        )
    if label_words is None:
        raise ValueError(
            f"--prompt {name_or_template!r}: a template needs --label-words, one per class ({', '.join(classes)})"
        )
    return Prompt("custom", name_or_template, dict(zip(classes, label_words)))


def _split(template: str) -> tuple[str, str]:
    """The template's parts before and after ``{text}`` (ValueError unless it holds it exactly once)."""
    count = template.count("{text}")
    if count != 1:
        raise ValueError(
            f"the prompt template must hold {{text}} exactly once, it holds it {count} times: {template!r}"
        )
    prefix, suffix = template.split("{text}")
    return prefix, suffix


class PromptInputs(HFInputs):
    """Texts -> the model tokenizer's ids of the text alone (no special tokens), ``" " + text``
    where the template puts a space before ``{text}`` (``space``), at most ``max_length`` ids."""

    def __init__(self, tokenizer, max_length: int = 64, space: bool = False):
        super().__init__(tokenizer, max_length, special_tokens=False)
        self.space = space

    def encode(self, texts: Iterable[str]) -> list[list[int]]:
        return super().encode([" " + t if self.space else t for t in texts])

    def save(self, path: str | os.PathLike) -> None:
        super().save(path)
        settings = json.loads((Path(path) / "attnmetrics.json").read_text())
        (Path(path) / "attnmetrics.json").write_text(json.dumps({**settings, "space": self.space}))

    @classmethod
    def load(cls, path: str | os.PathLike) -> PromptInputs:
        inputs = HFInputs.load(path)
        settings = json.loads((Path(path) / "attnmetrics.json").read_text())
        return cls(inputs.tokenizer, inputs.max_length, settings.get("space", False))


class LabelWords(nn.Module):
    """The decoder of a prompted model: the answer position's final state ``[N, d]`` -> the label
    words' next-token logits ``[N, C]`` (the language-model head's rows of the label words; it
    stays the model's own)."""

    def __init__(self, lm_head: nn.Linear, ids: Sequence[int]):
        super().__init__()
        self.lm_head = lm_head
        self.register_buffer("ids", torch.tensor(list(ids), dtype=torch.long), persistent=False)

    def forward(self, state: Tensor) -> Tensor:
        bias = None if self.lm_head.bias is None else self.lm_head.bias[self.ids]
        return F.linear(state, self.lm_head.weight[self.ids], bias)


class FullSequence(NamedTuple):
    """A prompted model's whole input for text rows: ``ids [B, Tf]`` int64, right-padded;
    ``lengths [B]`` their lengths; ``first [B]``: the position of each row's first text token;
    ``pooled [B]``: the answer position (each row's last)."""

    ids: Tensor
    lengths: Tensor
    first: Tensor
    pooled: Tensor


@dataclass(frozen=True)
class PromptedLMConfig:
    """What rebuilds a :class:`PromptedLM`: its source (a checkpoint folder or GGUF file: nothing
    is trained, so the weights are the source's), the prompt and the label words' ids."""

    source: str
    prompt: dict
    classes: list[str]
    label_ids: list[int] = field(default_factory=list)
    architecture: str = ""
    encoder: str = "prompted"
    attention: str = "own"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> PromptedLMConfig:
        return cls(d["source"], d["prompt"], d["classes"], d.get("label_ids", []), d.get("architecture", ""))


def load_causal_lm(path: str | os.PathLike):
    """``transformers``' causal language model and tokenizer from a checkpoint folder or a GGUF
    file (``*.gguf``, dequantised to float32; needs ``gguf``), read offline, float32.

    Raises:
        ValueError: what cannot be loaded, naming ``path``.
    """
    transformers = _transformers()
    path, gguf, tokenizer = load_tokenizer(path)
    with quiet_transformers():
        try:
            lm = transformers.AutoModelForCausalLM.from_pretrained(path, local_files_only=True, **gguf)
        except (OSError, ValueError, RuntimeError) as e:
            raise ValueError(f"{path}: cannot load the Hugging Face causal language model: {_first_line(e)}") from e
    dtype = next(lm.parameters()).dtype
    if dtype not in HALF_PRECISION:
        return lm, tokenizer, None
    lm.float()
    lm.config.dtype = torch.float32
    return lm, tokenizer, dtype


class PromptedLM(HFClassifier):
    """A Llama-layout causal language model (``LlamaForCausalLM``, Qwen2, Mistral) used zero-shot
    through a prompt (module docstring): the protocol over the text's tokens, the template fixed.

    Args:
        lm: the causal language model (float32 or float64).
        tokenizer: its tokenizer.
        prompt: the :class:`Prompt`.
        classes: the data set's class names (the label words' order).

    Raises:
        ValueError: a model that is not Llama-layout (naming it), a template without ``{text}`` or
            with nothing after it (the answer position must be the template's), a label word that is
            not one token (naming it and its pieces: it is refused, not cut), two classes with the
            same word.
    """

    def __init__(self, lm: nn.Module, tokenizer, prompt: Prompt, classes: Sequence[str]):
        nn.Module.__init__(self)
        register()
        layers = getattr(getattr(lm, "model", None), "layers", None)
        if not (
            isinstance(layers, nn.ModuleList)
            and len(layers)
            and isinstance(getattr(lm, "lm_head", None), nn.Linear)
            and hasattr(lm.model, "norm")
            and all(hasattr(layer, part) for layer in layers for part in _LLAMA_LAYER)
        ):
            raise ValueError(
                f"--prompt needs a Llama-layout causal language model (LlamaForCausalLM, Qwen2ForCausalLM, "
                f"MistralForCausalLM), got {type(lm).__name__}"
            )
        self.family, self.lead, self.trail = "llama", 0, 0
        # deleting every text token leaves the template (its suffix ends at the answer position):
        # leave_one_out and ERASER run a one-token text's deletion (attnmetrics.protocol.edits_whole_texts)
        self.encodes_empty_text = True
        lm.set_attn_implementation("attnmetrics")
        self.hf, self.tokenizer, self.prompt, self.classes = lm, tokenizer, prompt, list(classes)
        text = prompt.template
        if prompt.chat:
            text = tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=False
            )
        prefix, suffix = _split(text)
        self.space = prefix.endswith(" ")
        if self.space:
            prefix = prefix[:-1]
        start = _start_tokens(tokenizer, prefix)
        body = tokenizer(prefix, add_special_tokens=False)["input_ids"]
        if start and body[: len(start)] == start:  # the template writes them itself (a chat template's BOS)
            start = []
        prefix_ids = start + body
        suffix_ids = tokenizer(suffix, add_special_tokens=False)["input_ids"]
        if not suffix_ids:
            raise ValueError(
                f"the prompt template must end with at least one token after {{text}} (the answer position is the "
                f"template's last token): {prompt.template!r}"
            )
        words = prompt.words(self.classes)
        ids = []
        for c, word in zip(self.classes, words):
            pieces = tokenizer(word, add_special_tokens=False)["input_ids"]
            if len(pieces) != 1:
                raise ValueError(
                    f"label word {word!r} (class {c!r}) is {len(pieces)} tokens "
                    f"({', '.join(map(repr, tokenizer.convert_ids_to_tokens(pieces)))}); each label word must be one "
                    "token: its next-token logit is the class's score (refused, not cut to its first token)"
                )
            ids.append(pieces[0])
        if len(set(ids)) != len(ids):
            raise ValueError(f"the label words {words} are not distinct tokens; each class needs its own")
        self.register_buffer("prefix_ids", torch.tensor(prefix_ids, dtype=torch.long), persistent=False)
        self.register_buffer("suffix_ids", torch.tensor(suffix_ids, dtype=torch.long), persistent=False)
        self.label_words, self.label_ids = words, ids
        self.decoder = LabelWords(lm.lm_head, ids)
        self.source: str = ""
        self.upcast_from = None
        self.train(False)

    # ---- construction -------------------------------------------------------------------------

    @classmethod
    def from_pretrained(
        cls, path: str | os.PathLike, prompt: Prompt, classes: Sequence[str], max_length: int = 64
    ) -> tuple[PromptedLM, PromptInputs]:
        """The model at ``path`` (folder or GGUF file) with ``prompt``, and its inputs."""
        lm, tokenizer, upcast = load_causal_lm(path)
        model = cls(lm, tokenizer, prompt, classes)
        model.source, model.upcast_from = str(Path(path).resolve()), upcast
        return model, PromptInputs(tokenizer, max_length, model.space)

    @property
    def config(self) -> PromptedLMConfig:
        return PromptedLMConfig(self.source, asdict(self.prompt), self.classes, self.label_ids, type(self.hf).__name__)

    @classmethod
    def from_config(cls, config: PromptedLMConfig) -> PromptedLM:
        """The model again from its source (the weights are the source's: nothing was trained)."""
        prompt = Prompt(**config.prompt)
        model, _ = cls.from_pretrained(config.source, prompt, config.classes)
        return model

    def state_dict(self, *args, **kwargs):
        """Empty: a prompted model is its source's weights, unchanged (:class:`PromptedLMConfig`
        names the source); a run folder does not copy them."""
        return {}

    def load_state_dict(self, state_dict, strict: bool = True, assign: bool = False):
        if state_dict:
            raise ValueError("a prompted model's weights come from its source, not from a state dict")
        return nn.modules.module._IncompatibleKeys([], [])

    @property
    def base(self) -> nn.Module:
        return self.hf.model

    # ---- the whole input ----------------------------------------------------------------------

    def sequence(self, tokens: Tensor, lengths: Tensor) -> FullSequence:
        """The whole input of text rows ``tokens [B, T]`` (right-padded) with ``lengths [B]``."""
        src, full, first, pooled = self._layout(lengths, tokens.shape[1])
        table = torch.cat(
            [self.prefix_ids.expand(len(tokens), -1), self._checked(tokens), self.suffix_ids.expand(len(tokens), -1)], 1
        )
        return FullSequence(table.gather(1, src), full, first, pooled)

    def _layout(self, lengths: Tensor, T: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Where each position of the whole input comes from, in ``cat([prefix, text (T), suffix])``:
        ``src [B, P + T + S]`` (padding: 0), the whole lengths, first text positions and answer positions."""
        if len(lengths):  # read with the procedure's other checks (attnmetrics._deferred)
            defer((lengths >= 1).all(), lambda: _empty_text(lengths))
        P, S = len(self.prefix_ids), len(self.suffix_ids)
        j = torch.arange(P + T + S, device=lengths.device)[None]
        L = lengths[:, None]
        in_suffix = (j >= P + L) & (j < P + L + S)
        src = torch.where(in_suffix, j - L + T, j)
        src = torch.where(j < P + L + S, src, torch.zeros_like(src))
        full = lengths + P + S
        return src, full, torch.full_like(lengths, P), full - 1

    def _embeddings(self, embedded: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The whole input's embeddings ``[B, Tf, d]`` around the text's ``embedded``, its lengths and answer positions."""
        B, T, _ = embedded.shape
        src, full, _, pooled = self._layout(lengths, T)
        words = self.base.get_input_embeddings()
        prefix, suffix = words(self.prefix_ids).to(embedded.dtype), words(self.suffix_ids).to(embedded.dtype)
        table = torch.cat([prefix.expand(B, -1, -1), embedded, suffix.expand(B, -1, -1)], 1)
        return table.gather(1, src[..., None].expand(-1, -1, table.shape[-1])), full, pooled

    # ---- the protocol -------------------------------------------------------------------------

    def encode(self, embedded: Tensor, lengths: Tensor) -> Tensor:
        """The text positions' final states ``[B, T, d]``, the last one's replaced by the answer
        position's (the state the label words are read from), zero on padding. In eval mode the
        template's prefix is not rerun (:meth:`_after_the_prefix`)."""
        if len(self.prefix_ids) and not self.training:
            return self._after_the_prefix_states(embedded, lengths, every=True)
        inputs, full, pooled = self._embeddings(embedded, lengths)
        mask = token_mask(full, inputs.shape[1]).long()
        hidden = self.base(inputs_embeds=inputs, attention_mask=mask).last_hidden_state
        return self._text_states(hidden, lengths, pooled, embedded.shape[1])

    def _text_states(
        self, hidden: Tensor, lengths: Tensor, pooled: Tensor, T: int, prefix: int | None = None
    ) -> Tensor:
        """Text positions ``prefix .. prefix + T - 1`` of ``hidden`` (default: the template's prefix
        length), each row's last one replaced by its answer position's (``pooled``), zero on padding."""
        P = len(self.prefix_ids) if prefix is None else prefix
        rows = torch.arange(len(lengths), device=lengths.device)
        text = hidden[:, P : P + T]
        last = F.one_hot(lengths - 1, T).bool()[..., None]
        text = torch.where(last, hidden[rows, pooled][:, None], text)
        return text * token_mask(lengths, T)[..., None].to(text.dtype)

    def forward(self, tokens: Tensor, lengths: Tensor, attention: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """The label words' logits ``[B, C]`` and :meth:`attend`'s weights ``[B, T]``."""
        if attention is not None:
            raise ValueError("a prompted model takes no imposed attention (W&P's diagnostic models)")
        if len(self.prefix_ids) and not self.training:
            logits = self._after_the_prefix(tokens, lengths)
            return logits, F.one_hot(lengths - 1, tokens.shape[1]).to(logits.dtype)
        seq = self.sequence(tokens, lengths)
        mask = token_mask(seq.lengths, seq.ids.shape[1]).long()
        hidden = self.base(input_ids=seq.ids, attention_mask=mask).last_hidden_state
        rows = torch.arange(len(tokens), device=tokens.device)
        logits = self.decoder(hidden[rows, seq.pooled])
        return logits, F.one_hot(lengths - 1, tokens.shape[1]).to(logits.dtype)

    def _after_the_prefix(self, tokens: Tensor, lengths: Tensor) -> Tensor:
        """:meth:`forward`'s logits ``[B, C]`` in eval mode: the template's prefix is the same in
        every row and comes first, so on a causal model its keys and values are the same in every
        row; they are computed once (:meth:`_prefix_cache`, without gradients) and each row runs
        only its text and the suffix, attending to them (``models/causal_edits.run_after_prefix``; the
        last layer at the answer position only). Equal to the whole input run up to rounding
        (tests/models/test_prompted.py); gradients reach the text's embeddings as before, the
        weights only through the text's and the suffix's positions (a prompted model is not
        trained; in train mode the whole input runs). SmolLM2's chat template: 41 of an SST row's
        ~70 positions not rerun."""
        return self.decoder(self._after_the_prefix_states(self.embed(tokens), lengths, every=False))

    def _after_the_prefix_states(self, embedded: Tensor, lengths: Tensor, every: bool) -> Tensor:
        """The final-normed states after the cached prefix (:meth:`_after_the_prefix`): the answer
        position's ``[B, d]``, or (``every``) :meth:`encode`'s text states ``[B, T, d]``."""
        from attnmetrics.models.causal_edits import run_after_prefix

        decoder, cache = self._prefix_cache()
        inputs, full, _ = self._embeddings(embedded, lengths)
        B, T, _ = embedded.shape
        states = run_after_prefix(decoder, cache, inputs, full, every=every)
        if not every:
            return states
        count = full - len(self.prefix_ids)  # the text and the suffix
        hidden = states.new_zeros(B, T + len(self.suffix_ids), states.shape[-1])
        hidden[token_mask(count, hidden.shape[1])] = states
        return self._text_states(hidden, lengths, count - 1, T, prefix=0)

    def _shared_prefix(self):
        """The layers' runner and the template prefix's keys and values (:meth:`_prefix_cache`), or
        None for a template with nothing before ``{text}``."""
        from attnmetrics.models.causal_edits import decoder_of

        return self._prefix_cache() if len(self.prefix_ids) else (decoder_of(self.base), None)

    def _prefix_cache(self):
        """The template prefix's keys and values in every layer (``models/causal_edits.cache_rows``
        of the one row ``prefix_ids``) and the layers' runner, computed once per device, dtype and
        weights (a parameter changed in place, moved or cast: computed again)."""
        from attnmetrics.models.causal_edits import cache_rows, decoder_of

        key = tuple((p.data_ptr(), p.dtype, p._version) for p in self.hf.parameters())
        cached = self.__dict__.get("_prefix_kv")
        if cached is None or cached[0] != key:
            decoder = decoder_of(self.base)
            words = self.base.get_input_embeddings()(self.prefix_ids[None]).detach()
            P = torch.tensor([len(self.prefix_ids)], device=words.device)
            with torch.no_grad():  # constants: no gradient reaches the weights through the prefix
                cached = (key, decoder, cache_rows(decoder, self.decoder, words, P).cache)
            self.__dict__["_prefix_kv"] = cached
        return cached[1], cached[2]

    #: not the protocol's ``[B, layers, heads, T, T]`` over the items (the template's positions are
    #: in the graph): attention flow builds its graph over the whole input from :meth:`whole_attentions`
    layer_attentions = None

    def whole_attentions(self, tokens: Tensor, lengths: Tensor) -> Tensor:
        """Every layer's attention ``[B, layers, heads, Tf, Tf]`` over the whole input (template included)."""
        seq = self.sequence(tokens, lengths)
        probs: list[Tensor] = []
        with hooked(self.attention_layers, lambda q, k, v, p, scaling: probs.append(p) or p):
            self.base(input_ids=seq.ids, attention_mask=token_mask(seq.lengths, seq.ids.shape[1]).long())
        return torch.stack(probs, 1)

    @torch.no_grad()
    def rollout(self, tokens: Tensor, lengths: Tensor, residual: float = 0.5) -> Tensor:
        """Attention rollout (Abnar & Zuidema 2020) over the whole input, the answer position's row
        at the text's tokens ``[B, T]`` (the template's share left out, not renormalised)."""
        from attnmetrics.rollout import attention_rollout

        seq = self.sequence(tokens, lengths)
        rolled = attention_rollout(self.whole_attentions(tokens, lengths), seq.lengths, residual)
        row = rolled[torch.arange(len(tokens), device=tokens.device), seq.pooled]
        P, T = len(self.prefix_ids), tokens.shape[1]
        return row[:, P : P + T] * token_mask(lengths, T).to(row.dtype)

    @torch.no_grad()
    def tested_attention(self, tokens: Tensor, lengths: Tensor) -> TestedAttention:
        """The last layer's attention row of the answer position over the text's tokens, per query
        head, decomposed as :class:`~attnmetrics.models.hf.HFClassifier`'s (the template's
        positions keep their weights: they are fixed context). Attention ``[B, heads, T]``, values
        ``[B, heads, T, d]``; the decoder (:class:`~attnmetrics.models.hf.LlamaAfterAttention`)
        ends in the label words."""
        seq = self.sequence(tokens, lengths)
        T = tokens.shape[1]
        P = len(self.prefix_ids)
        real = token_mask(lengths + P, seq.ids.shape[1], P)
        return self._decomposed(seq.ids, seq.lengths, seq.pooled, real, P, lengths, width=T)

    def after_attention(self) -> nn.Module:
        return LlamaAfterAttention(self.hf, self.decoder)

    # ---- causal prefix reuse (models/causal_edits.py) ----------------------------------------------

    def deletion_logits(self, embedded: Tensor, lengths: Tensor):
        """:class:`attnmetrics.protocol.DeletesTokens`: the label words' logits with one text token
        deleted, for ``leave_one_out``. The inputs run once, every layer's keys and values kept
        (the template's prefix once for every row: :meth:`_prefix_cache`); a deletion at text position t recomputes only the text after
        it (one place left, at its new rotary positions) and the suffix template, attending to the
        cached prefix (positions before ``P + t``). Equal to a full recomputation up to rounding."""
        return self._prefix_edits(embedded, lengths, None)

    def masking_logits(self, embedded: Tensor, lengths: Tensor, mask_token: int):
        """:meth:`deletion_logits` with the token replaced by ``mask_token`` (``mode="mask"``)."""
        from attnmetrics.models.causal_edits import mask_embedding

        mask = mask_embedding(self.base.get_input_embeddings(), mask_token, embedded.dtype)
        return self._prefix_edits(embedded, lengths, mask)

    def subset_logits(self, embedded: Tensor, lengths: Tensor, mask_token: int | None):
        """:class:`attnmetrics.protocol.EditsSubsets`: the label words' logits with a set of text
        tokens deleted (``mask_token`` None) or replaced by ``mask_token``, for ERASER. The inputs
        run once, every layer's keys and values kept (the template's prefix once for every row); an edit recomputes only the positions
        from its first changed token on (the kept text after it, at its new rotary positions, and
        the suffix template), attending to the cached prefix (models/causal_subsets.py). Equal to
        a full recomputation up to rounding."""
        from attnmetrics.models.causal_edits import mask_embedding
        from attnmetrics.models.causal_subsets import prepare_subsets

        words = self.base.get_input_embeddings()
        mask = None if mask_token is None else mask_embedding(words, mask_token, embedded.dtype)
        inputs, full, _ = self._embeddings(embedded, lengths)
        first = torch.full_like(lengths, len(self.prefix_ids))
        decoder, prefix = self._shared_prefix()
        return prepare_subsets(decoder, self.decoder, inputs, full, first, lengths, mask, prefix)

    def _prefix_edits(self, embedded: Tensor, lengths: Tensor, replacement: Tensor | None):
        from attnmetrics.models.causal_edits import prepare_edits

        inputs, full, _ = self._embeddings(embedded, lengths)
        first = torch.full_like(lengths, len(self.prefix_ids))
        decoder, prefix = self._shared_prefix()
        return prepare_edits(decoder, self.decoder, inputs, full, first, embedded.shape[1], replacement, prefix)


def _empty_text(lengths: Tensor) -> ValueError:
    b = int(lengths.argmin())
    return ValueError(
        f"lengths: a prompted model's rows need at least one text token (the last one carries the answer "
        f"position's state, docs/definitions.md §15), got lengths[{b}] = {int(lengths[b])}; an empty text is the "
        "template alone, which only the deletions of leave_one_out and ERASER run"
    )


def sequence_of(model, tokens: Tensor, lengths: Tensor) -> FullSequence:
    """The whole input of a decoder on the protocol: a :class:`PromptedLM`'s (template around
    the text), or a Hugging Face decoder classifier's own rows (``lead = 0``, pooled at the last
    real token)."""
    if isinstance(model, PromptedLM):
        return model.sequence(tokens, lengths)
    checked = model._checked(tokens)
    return FullSequence(checked, lengths, torch.zeros_like(lengths), model.pooled(lengths))


def _start_tokens(tokenizer, prefix: str) -> list[int]:
    """The ids the tokenizer puts before a text of its own accord (Llama's ``<s>``; none for GPT-2 or SmolLM2)."""
    plain = tokenizer(prefix or "a", add_special_tokens=False)["input_ids"]
    full = tokenizer(prefix or "a", add_special_tokens=True)["input_ids"]
    for k in range(len(full) - len(plain) + 1):
        if full[k : k + len(plain)] == plain:
            return full[:k]
    return []
