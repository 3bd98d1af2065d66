"""Hugging Face sequence classifiers on attnmetrics' protocol, tested on their own attention
(docs/definitions.md §15). Needs the optional ``transformers`` (``pip install -e .[hf]``).

Supported: BERT-like encoders (``BertForSequenceClassification``: BERT, MiniLM, ...; pooled at
``[CLS]``), RoBERTa-like ones (``RobertaForSequenceClassification`` and the same post-LayerNorm
layout in XLM-R, CamemBERT; pooled at ``<s>``, with explicit position ids: see
:meth:`HFClassifier.encode`), DistilBERT-like ones (``DistilBertForSequenceClassification``;
pooled at ``[CLS]``), GPT-2-like decoders (``GPT2ForSequenceClassification``) and Llama-layout decoders
(``LlamaForSequenceClassification`` and the same layout in Qwen2, with q/k/v biases, and Mistral:
RMSNorm before each block, rotary positions, grouped-query attention, a gated MLP); the decoders
are pooled at the last real token. The tested attention is the last layer's attention row of the pooled position, per head,
decomposed as for GPT-1 (models/own_attention.py): with ``a[h, s]`` that row, ``U[h, s]`` head h's
value vectors through its slice of the output projection, ``b_o`` that projection's bias and
``x_p`` the layer's input at the pooled position,

- the real tokens' share ``alpha[h, t] = a[h, t] / m_h``, ``m_h`` their mass (the softmax of the
  head's scores over the real tokens alone);
- the special positions keep their weights: ``S_h = sum_{s special} a[h, s] U[h, s]``;
- ``values[h, t] = m_h U[h, t] + S_h + (x_p + b_o) / heads``,

so ``sum_h sum_t alpha[h, t] values[h, t]`` is the attention sublayer's output plus its residual,
exactly, for any ``alpha`` whose heads each sum to 1. The decoder is the rest of the network from
there to the logits (:class:`BertAfterAttention`, :class:`RobertaAfterAttention`,
:class:`DistilBertAfterAttention`, :class:`GPT2AfterAttention`, :class:`LlamaAfterAttention`). With grouped-query attention each query head reads its key/value
head's values (``transformers``' ``repeat_kv``: query head ``h`` uses key/value head
``h // (heads / key_value_heads)``), so the decomposition is per query head.

The model's attention runs through ``transformers``' attention interface: one eager attention
function registered as ``"attnmetrics"``, with the eager mask function under the same name (a
custom attention without its mask function gets no padding mask at all: padding would be
attended). It lets the last layer's pooled row be read, or edited (the tests edit it to check the
decomposition against a real forward).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnmetrics import loo
from attnmetrics._validation import checked_ids
from attnmetrics.models.own_attention import decompose_row
from attnmetrics.models.text import TextEncoder
from attnmetrics.protocol import TestedAttention, token_mask

#: the name the attention function and its mask function are registered under
ATTENTION = "attnmetrics"


def _transformers():
    try:
        import transformers
    except ImportError:
        raise ImportError(
            "Hugging Face models need the optional transformers: pip install -e .[hf] (or pip install transformers)"
        ) from None
    return transformers


def eager_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Eager scaled dot-product attention (``transformers``' reference formula) that hands each
    layer's probabilities ``[B, heads, T, T]`` to the layer's ``_attnmetrics_hook(query, key,
    value, probs, scaling)`` when it has one, and continues with what the hook returns.

    Where nothing reads the probabilities (no such hook, ``transformers`` not collecting them
    for ``output_attentions=True``, eval mode: no dropout), the same formula runs as torch's
    fused ``scaled_dot_product_attention`` with the same additive mask: equal up to rounding,
    no ``[B, heads, T, T]`` tensor and no copies of the strided query, key and value (7-20 %
    off an SST-sized forward of a d = 256 BERT on one CPU thread; every re-encoding procedure
    runs this way). A forward hook of one's own on the module sees ``None`` probabilities
    then: set ``_attnmetrics_hook`` (:func:`hooked`) to read them. Grouped-query attention's
    ``key`` and ``value`` (fewer heads than ``query``) are repeated to the query heads first, as
    ``transformers``' ``repeat_kv``; the hook sees them per query head."""
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    groups = query.shape[1] // key.shape[1]
    if groups > 1:  # grouped-query attention: each key/value head serves `groups` query heads in turn
        key, value = (t.repeat_interleave(groups, dim=1) for t in (key, value))
    if not module.training and getattr(module, "_attnmetrics_hook", None) is None and not _collecting_attentions():
        mask = None if attention_mask is None else attention_mask[..., : key.shape[-2]]
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scaling)
        return out.transpose(1, 2).contiguous(), None
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask[..., : key.shape[-2]]
    probs = torch.softmax(scores, dim=-1)
    hook = getattr(module, "_attnmetrics_hook", None)
    if hook is not None:
        probs = hook(query, key, value, probs, scaling)
    probs = F.dropout(probs, p=dropout, training=module.training)
    return torch.matmul(probs, value).transpose(1, 2).contiguous(), probs


def _collecting_attentions() -> bool:
    """Whether ``transformers`` collects this forward's attention probabilities (``output_attentions=True``:
    its output-capturing hooks read them from the attention modules' outputs). True where this
    ``transformers`` keeps no such collector: then any of its hooks may read them."""
    collector = _attention_collector()
    if collector is None:
        return True
    collected = collector.get()
    return collected is not None and "attentions" in collected


@functools.cache
def _attention_collector():
    """``transformers``' context variable of the outputs it collects this forward; None where it keeps none."""
    try:
        from transformers.utils.output_capturing import _active_collector
    except ImportError:
        return None
    return _active_collector


def attention_mask(**kwargs) -> Tensor | None:
    """``transformers``' eager mask function (a ``[B, 1, T, T]`` additive mask), except where the
    procedures pad their calls (:func:`attnmetrics.loo.padded_calls`: a GPU): there it does not test
    whether the padding mask holds any padding before building it. That test reads the mask back to
    the host, a wait on the device in every model call (issue 32), and a padded call nearly always
    holds padding. On the CPU, calls of one length hold none, and skipping the mask is worth the
    (free) read."""
    from transformers.masking_utils import eager_mask  # optional: imported on use

    if loo.padded_calls(torch.device(kwargs.get("device", "cpu"))):  # looked up per call (tests force the plan)
        kwargs["allow_is_bidirectional_skip"] = False
    return eager_mask(**kwargs)


def register() -> None:
    """Register :func:`eager_attention` and :func:`attention_mask` as ``"attnmetrics"``."""
    transformers = _transformers()
    from transformers.masking_utils import AttentionMaskInterface

    transformers.AttentionInterface.register(ATTENTION, eager_attention)
    AttentionMaskInterface.register(ATTENTION, attention_mask)


class _Head(nn.Module):
    """The protocol's decoder: the pooled final state ``[N, d]`` -> logits (BERT: pooler,
    dropout, classifier; RoBERTa: its classification head, dropout -> dense -> tanh -> dropout ->
    out_proj, on position 0 of the ``[N, 1, d]`` it is handed; DistilBERT: pre_classifier ->
    ReLU -> dropout -> classifier; the decoders: score, their final norm being in the encoder).
    Shares the model's modules."""

    def __init__(self, model, family: str):
        super().__init__()
        self.family = family
        if family == "bert":
            parts = [model.bert.pooler, model.dropout, model.classifier]
        elif family == "roberta":
            parts = [model.classifier]
        elif family == "distilbert":
            parts = [model.pre_classifier, model.dropout, model.classifier]
        else:
            parts = [model.score]
        self.parts = nn.ModuleList(parts)

    def forward(self, context: Tensor) -> Tensor:
        if self.family == "bert":
            pooler, dropout, classifier = self.parts
            return classifier(dropout(pooler(context[:, None])))
        if self.family == "roberta":  # RobertaClassificationHead reads features[:, 0]
            return self.parts[0](context[:, None])
        if self.family == "distilbert":
            pre_classifier, dropout, classifier = self.parts
            return classifier(dropout(F.relu(pre_classifier(context))))
        return self.parts[0](context)


class BertAfterAttention(nn.Module):
    """A BERT-like classifier after the last layer's attention at ``[CLS]``: ``z`` (attention
    output plus residual) ``[N, d]`` -> LayerNorm -> feed-forward with its residual and
    LayerNorm -> the head (pooler, dropout, classifier) ``[N, C]``."""

    def __init__(self, model, head: _Head):
        super().__init__()
        self.layer, self.head = model.bert.encoder.layer[-1], head

    def forward(self, z: Tensor) -> Tensor:
        y = self.layer.attention.output.LayerNorm(z)
        return self.head(self.layer.output(self.layer.intermediate(y), y))


class RobertaAfterAttention(BertAfterAttention):
    """A RoBERTa-like classifier after the last layer's attention at ``<s>``: BERT's post-LayerNorm
    layer (:class:`BertAfterAttention`), then its classification head (:class:`_Head`) ``[N, C]``."""

    def __init__(self, model, head: _Head):
        nn.Module.__init__(self)
        self.layer, self.head = model.roberta.encoder.layer[-1], head


class DistilBertAfterAttention(nn.Module):
    """A DistilBERT-like classifier after the last block's attention at ``[CLS]``: ``z`` (attention
    output, ``out_lin`` included, plus residual) ``[N, d]`` -> ``y = sa_layer_norm(z)`` ->
    ``output_layer_norm(ffn(y) + y)`` -> the head (pre_classifier, ReLU, dropout, classifier) ``[N, C]``."""

    def __init__(self, model, head: _Head):
        super().__init__()
        self.block, self.head = model.distilbert.transformer.layer[-1], head

    def forward(self, z: Tensor) -> Tensor:
        y = self.block.sa_layer_norm(z)
        return self.head(self.block.output_layer_norm(self.block.ffn(y) + y))


class GPT2AfterAttention(nn.Module):
    """A GPT-2-like classifier after the last block's attention at the pooled token: ``z``
    ``[N, d]`` -> ``+ MLP(LN_2(z))`` -> final LayerNorm -> the head (score) ``[N, C]``."""

    def __init__(self, model, head: _Head):
        super().__init__()
        self.block, self.ln_f, self.head = model.transformer.h[-1], model.transformer.ln_f, head

    def forward(self, z: Tensor) -> Tensor:
        return self.head(self.ln_f(z + self.block.mlp(self.block.ln_2(z))))


class LlamaAfterAttention(nn.Module):
    """A Llama-layout classifier after the last layer's attention at the pooled token: ``z``
    ``[N, d]`` (attention output plus residual) -> ``+ MLP(RMSNorm_2(z))`` -> final RMSNorm -> the
    head (score) ``[N, C]``."""

    def __init__(self, model, head: _Head):
        super().__init__()
        self.layer, self.norm, self.head = model.model.layers[-1], model.model.norm, head

    def forward(self, z: Tensor) -> Tensor:
        return self.head(self.norm(z + self.layer.mlp(self.layer.post_attention_layernorm(z))))


#: the parts a Llama-layout decoder layer has (``transformers``' Llama, Qwen2, Mistral)
_LLAMA_LAYER = ("self_attn", "input_layernorm", "post_attention_layernorm", "mlp")


def _llama_layout(model: nn.Module) -> bool:
    """``model.model.layers`` of Llama-layout decoder layers, ``model.model.norm`` and ``model.score``."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    return (
        isinstance(layers, nn.ModuleList)
        and len(layers) > 0
        and hasattr(model.model, "norm")
        and hasattr(model, "score")
        and all(hasattr(layer, part) for layer in layers for part in _LLAMA_LAYER)
        and all(hasattr(layers[-1].self_attn, f"{n}_proj") for n in "qkvo")
    )


def _has(module: nn.Module, path: str) -> bool:
    """Whether ``module`` has the dotted attribute ``path``."""
    for name in path.split("."):
        module = getattr(module, name, None)
        if module is None:
            return False
    return True


#: the parts a post-LayerNorm BERT-like encoder layer has (``transformers``' Bert, Roberta, XLM-R:
#: not XLM-R XL's pre-LayerNorm layer, whose ``attention.output`` has no LayerNorm)
_BERT_LAYER = (
    "attention.self.query",
    "attention.self.key",
    "attention.self.value",
    "attention.output.dense",
    "attention.output.LayerNorm",
    "intermediate.dense",
    "output.dense",
    "output.LayerNorm",
)


def _roberta_layout(model: nn.Module) -> bool:
    """``model.roberta.encoder.layer`` of post-LayerNorm BERT-like layers, embeddings numbering
    positions after ``padding_idx``, and a RobertaClassificationHead ``model.classifier``."""
    roberta = getattr(model, "roberta", None)
    layers = getattr(getattr(roberta, "encoder", None), "layer", None)
    return (
        isinstance(layers, nn.ModuleList)
        and len(layers) > 0
        and isinstance(getattr(getattr(roberta, "embeddings", None), "padding_idx", None), int)
        and all(_has(model, f"classifier.{part}") for part in ("dense", "dropout", "out_proj"))
        and all(_has(layer, part) for layer in layers for part in _BERT_LAYER)
    )


#: the parts a DistilBERT block has
_DISTILBERT_BLOCK = ("attention.q_lin", "attention.out_lin", "sa_layer_norm", "ffn", "output_layer_norm")


def _distilbert_layout(model: nn.Module) -> bool:
    """``model.distilbert.transformer.layer`` of DistilBERT blocks, and ``pre_classifier``,
    ``dropout``, ``classifier``."""
    layers = getattr(getattr(getattr(model, "distilbert", None), "transformer", None), "layer", None)
    return (
        isinstance(layers, nn.ModuleList)
        and len(layers) > 0
        and all(hasattr(model, part) for part in ("pre_classifier", "dropout", "classifier"))
        and all(_has(layer, part) for layer in layers for part in _DISTILBERT_BLOCK)
    )


#: the encoder families: pooled at position 0 (``[CLS]``, ``<s>``), their tokenizer's special
#: tokens around the text (lead = trail = 1)
ENCODERS = ("bert", "roberta", "distilbert")

#: the classes :class:`HFClassifier` is proved on, for its error message
SUPPORTED = (
    "BertForSequenceClassification",
    "RobertaForSequenceClassification",
    "XLMRobertaForSequenceClassification",
    "DistilBertForSequenceClassification",
    "GPT2ForSequenceClassification",
    "LlamaForSequenceClassification",
    "Qwen2ForSequenceClassification",
    "MistralForSequenceClassification",
)


@contextlib.contextmanager
def hooked(modules: list[nn.Module], hook):
    """Give each attention module :func:`eager_attention`'s ``_attnmetrics_hook`` for the block."""
    for module in modules:
        module._attnmetrics_hook = hook
    try:
        yield
    finally:
        for module in modules:
            del module._attnmetrics_hook


class HFInputs(TextEncoder):
    """Texts -> the model's own token ids (its tokenizer: WordPiece, BPE, ...; no lower-casing or
    number replacement of ours), at most ``max_length`` ids, with the tokenizer's special tokens
    when ``special_tokens`` (BERT's ``[CLS] ... [SEP]``, the model's ``lead``/``trail``); a
    decoder's ids are the text's alone (``special_tokens=False``: a Llama tokenizer's ``<s>`` would
    otherwise be tested as a word)."""

    filename = "hf_tokenizer"  # a folder in the checkpoint

    def __init__(self, tokenizer, max_length: int = 64, special_tokens: bool = True):
        self.tokenizer, self.max_length, self.special_tokens = tokenizer, max_length, special_tokens

    def __len__(self) -> int:
        return len(self.tokenizer)

    def encode(self, texts: Iterable[str]) -> list[list[int]]:
        """Each text's ids, cut to ``max_length`` (special tokens kept); ``last_truncated`` counts
        the texts that were longer."""
        texts = list(texts)
        whole = self.tokenizer(texts, add_special_tokens=self.special_tokens)["input_ids"]
        self.last_truncated = sum(len(ids) > self.max_length for ids in whole)
        if not self.last_truncated:
            return whole
        return self.tokenizer(
            texts, truncation=True, max_length=self.max_length, add_special_tokens=self.special_tokens
        )["input_ids"]

    def decode(self, ids: Iterable[int]) -> list[str]:
        """Each id's token (``##`` pieces and ``Ġ`` spaces as the tokenizer writes them)."""
        return self.tokenizer.convert_ids_to_tokens(list(ids))

    def save(self, path: str | os.PathLike) -> None:
        path = Path(path)
        self.tokenizer.save_pretrained(path)
        settings = {"max_length": self.max_length, "special_tokens": self.special_tokens}
        (path / "attnmetrics.json").write_text(json.dumps(settings))

    @classmethod
    def load(cls, path: str | os.PathLike) -> HFInputs:
        path = Path(path)
        transformers = _transformers()
        settings = json.loads((path / "attnmetrics.json").read_text())
        tokenizer = transformers.AutoTokenizer.from_pretrained(path)
        return cls(tokenizer, settings["max_length"], settings.get("special_tokens", True))


@dataclass(frozen=True)
class HFClassifierConfig:
    """What rebuilds an :class:`HFClassifier`: the ``transformers`` class and its config."""

    architecture: str
    hf_config: dict
    encoder: str = "hf"
    attention: str = "own"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> HFClassifierConfig:
        return cls(d["architecture"], d["hf_config"])


@contextlib.contextmanager
def quiet_transformers():
    """``transformers``' logging at errors only inside the block (a checkpoint's loading report: the
    new head's missing weights, the unused ones), restored after it."""
    transformers = _transformers()
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        yield
    finally:
        transformers.logging.set_verbosity(verbosity)


def load_tokenizer(path: str | os.PathLike) -> tuple[Path, dict, Any]:
    """A checkpoint's tokenizer, read offline: ``(folder, gguf, tokenizer)``, where a GGUF file
    (``*.gguf``: weights and tokenizer in one file; needs the ``gguf`` package) gives its folder and
    ``gguf = {"gguf_file": name}`` for the model's ``from_pretrained``, a folder itself and ``{}``.

    Raises:
        ValueError: a GGUF file that does not exist, a folder without tokenizer files
            (``transformers`` would build a tokenizer of the special tokens alone), or a tokenizer
            that cannot be loaded; each naming ``path``.
    """
    path = Path(path)
    transformers = _transformers()
    gguf = {}
    if path.suffix == ".gguf":  # a GGUF file: its folder, the file named (weights and tokenizer inside)
        if not path.is_file():
            raise ValueError(f"{path}: no such GGUF file")
        path, gguf = path.parent, {"gguf_file": path.name}
        _needs("gguf", "reading a GGUF file")
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True, **gguf)
    except (OSError, ValueError) as e:
        files = ("tokenizer*", "vocab*", "merges.txt", "*.model")
        if (path / "config.json").is_file() and not any(next(path.glob(f), None) for f in files):
            raise ValueError(
                f"{path} has no tokenizer files (expected tokenizer.json, or its tokenizer class's vocabulary "
                "files); save the model's tokenizer there (tokenizer.save_pretrained)"
            ) from e
        raise ValueError(f"{path}: cannot load the Hugging Face tokenizer: {_first_line(e)}") from e
    return path, gguf, tokenizer


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


#: the dtypes a checkpoint may hold that the loaders upcast to float32: half precision overflows in
#: fine-tuning (NaN logits within an epoch on the CPU), and the procedures compute in float32 or float64
HALF_PRECISION = (torch.float16, torch.bfloat16)


def _needs(package: str, what: str) -> None:
    """ValueError naming ``package`` (and the extra that installs it) where it is not installed."""
    import importlib.util

    if importlib.util.find_spec(package) is None:
        raise ValueError(
            f"{what} needs the optional {package} package: pip install -e .[llm] (or pip install {package})"
        )


def _check_tokenizer(path: Path, tokenizer, vocab_size: int, in_file: bool = False) -> None:
    """ValueError where ``path`` holds none of ``tokenizer``'s files (``transformers`` then builds
    one of the special tokens alone: every word ``[UNK]``; ``in_file``: the tokenizer came from a
    GGUF file, which holds it), or where its ids reach past the model's ``vocab_size`` embeddings."""
    names = sorted({"tokenizer.json", *type(tokenizer).vocab_files_names.values()})
    if not in_file and not any((path / name).is_file() for name in names):
        raise ValueError(
            f"{path} has no tokenizer files (expected {' or '.join(names)}); save the model's tokenizer "
            "there (tokenizer.save_pretrained)"
        )
    top = max(tokenizer.get_vocab().values())
    if top >= vocab_size:
        raise ValueError(
            f"{path}: the tokenizer's ids go up to {top}, the model's vocabulary has {vocab_size} "
            "(vocab_size in config.json); the tokenizer is not this model's"
        )


class HFClassifier(nn.Module):
    """A Hugging Face sequence classifier of :data:`SUPPORTED` (or their layouts) on the protocol
    (``embed``, ``encode``, ``attend``, ``decoder``, ``lead``/``trail``) with
    :meth:`tested_attention`, its own attention.

    ``tokens`` are the model tokenizer's ids with right padding: the encoders' ``[CLS] ... [SEP]``
    (BERT, DistilBERT) or ``<s> ... </s>`` (RoBERTa) (lead = trail = 1; pooled at position 0),
    the decoders' the text's ids alone (lead = trail = 0; pooled at the last real token).
    ``attend`` puts all the weight on the pooled position, so the protocol's forward is the
    model's own; the procedures test :meth:`tested_attention` instead. Every method taking
    ``tokens`` raises ValueError for ids outside ``[0, vocab_size)``, naming ``tokens``, its
    extreme ids and ``vocab_size`` (the model's input embeddings): one ``aminmax`` per call.

    ``upcast_from``: the half-precision dtype (float16 or bfloat16) :meth:`from_pretrained` or
    :meth:`from_config` found and upcast to float32, else None (the constructor casts nothing).
    """

    upcast_from: torch.dtype | None = None

    def __init__(self, model: nn.Module):
        super().__init__()
        register()
        name = type(model).__name__
        if hasattr(model, "bert") and hasattr(model, "classifier"):
            self.family, self.lead, self.trail = "bert", 1, 1
        elif _roberta_layout(model):
            if getattr(model.config, "is_decoder", False):
                raise ValueError(
                    f"{name} is configured as a decoder (is_decoder=True: causal attention), which pools "
                    "nothing but <s> at position 0; load it as an encoder (is_decoder=False)"
                )
            self.family, self.lead, self.trail = "roberta", 1, 1
        elif _distilbert_layout(model):
            self.family, self.lead, self.trail = "distilbert", 1, 1
        elif hasattr(model, "transformer") and hasattr(model, "score"):
            self.family, self.lead, self.trail = "gpt2", 0, 0
        elif _llama_layout(model):
            self.family, self.lead, self.trail = "llama", 0, 0
        else:
            raise ValueError(f"unsupported model {name}: supported are {', '.join(SUPPORTED)} (or their layouts)")
        model.set_attn_implementation(ATTENTION)
        self.hf = model
        self.decoder = _Head(model, self.family)
        # the wrapper takes the wrapped model's mode: a procedure's eval_mode restores the
        # wrapper's flag on exit, which would otherwise switch an eval-mode model to training
        self.train(model.training)

    @property
    def config(self) -> HFClassifierConfig:
        return HFClassifierConfig(type(self.hf).__name__, self.hf.config.to_dict())

    @classmethod
    def _in_float32(cls, hf: nn.Module) -> HFClassifier:
        """The loaders' wrapper of ``hf``, cast to float32 in place (its config's ``dtype`` too: what
        a run's model.json records) where its weights or, for a model built from a config, that
        config are half precision; :attr:`upcast_from` names that dtype."""
        dtype = next(hf.parameters()).dtype
        if dtype not in HALF_PRECISION:
            dtype = getattr(hf.config, "dtype", None)
            dtype = getattr(torch, dtype, None) if isinstance(dtype, str) else dtype
        if dtype in HALF_PRECISION:
            hf.float()
            hf.config.dtype = torch.float32
        model = cls(hf)
        model.upcast_from = dtype if dtype in HALF_PRECISION else None
        return model

    @classmethod
    def from_config(cls, config: HFClassifierConfig) -> HFClassifier:
        """A randomly initialised float32 model of ``config`` (the weights come from a checkpoint;
        a half-precision ``dtype`` in the config is upcast: :attr:`upcast_from`)."""
        transformers = _transformers()
        hf_config = transformers.AutoConfig.for_model(**config.hf_config)
        return cls._in_float32(getattr(transformers, config.architecture)(hf_config))

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, num_labels: int) -> tuple[HFClassifier, HFInputs]:
        """A Hugging Face checkpoint folder, or a GGUF file (``*.gguf``: weights and tokenizer in one
        file, dequantised to float32 by ``transformers``; needs the ``gguf`` package), read offline,
        with a new ``num_labels``-way head (whatever head it had is replaced), and its tokenizer. Half-precision (float16, bfloat16)
        weights are upcast to float32 (:attr:`upcast_from` names their dtype); float32 and float64
        ones are kept.

        Raises:
            ValueError: a model or tokenizer that cannot be loaded, a folder without tokenizer files
                (``transformers`` would build a tokenizer of the special tokens alone), or a
                tokenizer whose ids reach past the model's vocabulary; each naming ``path``.
        """
        transformers = _transformers()
        path, gguf, tokenizer = load_tokenizer(path)
        with quiet_transformers():  # its report would list the new head as missing
            try:
                hf = transformers.AutoModelForSequenceClassification.from_pretrained(
                    path, num_labels=num_labels, local_files_only=True, ignore_mismatched_sizes=True, **gguf
                )
            except (OSError, ValueError, RuntimeError) as e:
                raise ValueError(f"{path}: cannot load the Hugging Face model: {_first_line(e)}") from e
            except Exception as e:  # safetensors' SafetensorError (a truncated or damaged weights file)
                if type(e).__name__ != "SafetensorError":
                    raise
                raise ValueError(
                    f"{path}: cannot read its weights (truncated or damaged safetensors file): {_first_line(e)}"
                ) from e
        _check_tokenizer(path, tokenizer, hf.get_input_embeddings().num_embeddings, in_file=bool(gguf))
        if hf.config.pad_token_id is None:  # GPT-2: padding is masked, the id is only a filler
            hf.config.pad_token_id = 0
        model = cls._in_float32(hf)
        return model, HFInputs(tokenizer, special_tokens=model.family in ENCODERS)

    def no_weight_decay(self) -> list[nn.Parameter]:
        """Biases and LayerNorm weights, exempt from weight decay (BERT's fine-tuning recipe)."""
        return [p for name, p in self.named_parameters() if name.endswith("bias") or p.dim() == 1]

    @property
    def blocks(self) -> nn.ModuleList:
        """The transformer's layers (blocks), first to last."""
        if self.family in ("bert", "roberta"):
            return self.base.encoder.layer
        if self.family == "distilbert":
            return self.base.transformer.layer
        return self.base.h if self.family == "gpt2" else self.base.layers

    def train_last_layers(self, k: int) -> int:
        """Freeze the embeddings and every layer but the last ``k`` (``requires_grad`` off), so that
        fine-tuning trains the head, the final norm (and BERT's pooler) and the last ``k`` layers
        only, and backpropagation stops at the first trained layer (no graph is kept below it):
        fine-tuning a decoder on the CPU. Returns the number of parameters left to train.

        Raises:
            ValueError: ``k`` not in ``[0, layers]``."""
        blocks = self.blocks
        if not 0 <= k <= len(blocks):
            raise ValueError(f"train_last_layers: k must be in [0, {len(blocks)}] (the model's layers), got {k}")
        frozen = [p for block in blocks[: len(blocks) - k] for p in block.parameters()]
        embeddings = ("embeddings.", "wte.", "wpe.", "embed_tokens.")
        frozen += [p for name, p in self.base.named_parameters() if name.startswith(embeddings)]
        ids = {id(p) for p in frozen}
        for p in self.parameters():
            p.requires_grad_(id(p) not in ids)
        return sum(p.numel() for p in self.parameters() if p.requires_grad)

    @property
    def base(self) -> nn.Module:
        if self.family in ENCODERS:
            return getattr(self.hf, self.family)
        return self.hf.transformer if self.family == "gpt2" else self.hf.model

    @property
    def last_attention(self) -> nn.Module:
        """The last layer's self-attention module (where the attention function is called)."""
        return self.attention_layers[-1]

    def embed(self, tokens: Tensor) -> Tensor:
        """tokens [B, T] int64 -> word embeddings [B, T, d] (positions are added by the model);
        ValueError for ids outside the vocabulary, as every method taking ``tokens``."""
        return self.base.get_input_embeddings()(self._checked(tokens))

    def _checked(self, tokens: Tensor) -> Tensor:
        """``tokens`` if every id lies in ``[0, vocab_size)`` (the model's input embeddings), else
        ValueError naming ``tokens``, the extreme ids and ``vocab_size``. One ``aminmax`` per call;
        its read waits for the device once per call outside a procedure, once at the procedure's
        end inside one (the ids then come back clamped until the error is raised:
        :func:`attnmetrics._validation.checked_ids`)."""
        return checked_ids(tokens, self.base.get_input_embeddings().num_embeddings)

    def _run(self, lengths: Tensor, **inputs):
        """The base model on ``input_ids`` or ``inputs_embeds`` ``[B, T, ...]`` (and any other
        keyword), padding past ``lengths`` masked, at the positions :meth:`positions` gives."""
        x = inputs["input_ids"] if "input_ids" in inputs else inputs["inputs_embeds"]
        B, T = x.shape[:2]
        positions = self.positions(B, T, x.device)
        if positions is not None:
            inputs["position_ids"] = positions
        return self.base(attention_mask=token_mask(lengths, T).long(), **inputs)

    def positions(self, rows: int, T: int, device: torch.device | str = "cpu") -> Tensor | None:
        """The position ids every call of the base model is given, ``[rows, T]``; None where the
        model numbers positions by itself (0, 1, ...; rotary ones by the mask).

        RoBERTa's are ``padding_idx + 1 + t`` at every position ``t``: what ``transformers`` gives
        right-padded ``input_ids`` at their real tokens, numbering only the ids that are not the pad
        id, and what it gives ``inputs_embeds`` (:meth:`encode`) everywhere, not knowing the ids.
        Given explicitly, :meth:`forward`, :meth:`encode` of :meth:`embed` and
        :meth:`tested_attention` number alike even where a real token is the pad id (``transformers``'
        own forward would skip that token's number, and shift every later one)."""
        if self.family != "roberta":
            return None
        start = self.base.embeddings.padding_idx + 1
        return torch.arange(start, start + T, device=device).expand(rows, T)

    def encode(self, embedded: Tensor, lengths: Tensor) -> Tensor:
        """The last layer's states [B, T, d] (GPT-2: after the final LayerNorm), zero on padding."""
        hidden = self._run(lengths, inputs_embeds=embedded).last_hidden_state
        return hidden * token_mask(lengths, embedded.shape[1])[..., None].to(hidden.dtype)

    def pooled(self, lengths: Tensor) -> Tensor:
        """[B] int64: the pooled position ([CLS] or ``<s>`` = 0, or a decoder's last real token)."""
        return torch.zeros_like(lengths) if self.family in ENCODERS else lengths - 1

    def attend(self, hidden: Tensor, lengths: Tensor) -> Tensor:
        """All the weight on the pooled position: the decoder then sees the model's pooled state."""
        return F.one_hot(self.pooled(lengths), hidden.shape[1]).to(hidden.dtype)

    def forward(self, tokens: Tensor, lengths: Tensor, attention: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """The model's logits [B, C] on right-padded ``tokens``, and :meth:`attend`'s weights
        [B, T] (the training loop's interface; ``attention`` must be None: nothing to impose)."""
        if attention is not None:
            raise ValueError("a Hugging Face classifier takes no imposed attention (W&P's diagnostic models)")
        hidden = self._run(lengths, input_ids=self._checked(tokens)).last_hidden_state
        rows = torch.arange(tokens.shape[0], device=tokens.device)
        return self.decoder(hidden[rows, self.pooled(lengths)]), self.attend(hidden, lengths)

    @property
    def attention_layers(self) -> list[nn.Module]:
        """Every layer's self-attention module, first to last."""
        if self.family in ("bert", "roberta"):
            return [layer.attention.self for layer in self.base.encoder.layer]
        if self.family == "distilbert":  # its attention module applies out_lin after the function
            return [block.attention for block in self.base.transformer.layer]
        if self.family == "gpt2":
            return [block.attn for block in self.base.h]
        return [layer.self_attn for layer in self.base.layers]

    def layer_attentions(self, tokens: Tensor, lengths: Tensor) -> Tensor:
        """Every layer's attention probabilities ``[B, layers, heads, T, T]`` (query × key), first
        to last, from one forward of the model's own attention (padded keys get no weight; padded
        queries' rows are the mask's, never read): what :meth:`rollout` rolls out and
        :func:`attnmetrics.attention_flow` takes as its graph. ValueError when the model's
        attention implementation is not this adapter's (e.g. ``sdpa``: no probabilities)."""
        probs: list[Tensor] = []
        layers = self.attention_layers
        with hooked(layers, lambda q, k, v, p, scaling: probs.append(p) or p):
            self._run(lengths, input_ids=self._checked(tokens))
        if len(probs) != len(layers):
            raise ValueError(
                f"the layers' attention probabilities: {type(self.hf).__name__}'s attention implementation "
                f"({getattr(self.hf.config, '_attn_implementation', '?')}) returns none; set it back with "
                f"model.hf.set_attn_implementation({ATTENTION!r})"
            )
        return torch.stack(probs, 1)

    @torch.no_grad()
    def rollout(self, tokens: Tensor, lengths: Tensor, residual: float = 0.5) -> Tensor:
        """Attention rollout's importance (Abnar & Zuidema 2020; docs/definitions.md §17): the
        pooled position's row of :func:`attnmetrics.attention_rollout` over every layer's
        attention (:meth:`layer_attentions`), at the real tokens: ``[B, T - lead]``, zero past
        each row's."""
        from attnmetrics.rollout import attention_rollout

        B, T = tokens.shape
        rolled = attention_rollout(self.layer_attentions(tokens, lengths), lengths, residual)  # [B, T, T]
        row = rolled[torch.arange(B, device=tokens.device), self.pooled(lengths)]
        real = token_mask(lengths, T, self.lead, self.trail)
        return (row * real)[:, self.lead :]

    @torch.no_grad()
    def tested_attention(self, tokens: Tensor, lengths: Tensor) -> TestedAttention:
        """The decomposition of the module docstring (call in eval mode).

        Args:
            tokens: ``[B, T]`` int64, right-padded.
            lengths: ``[B]`` int64 in ``[lead + trail + 1, T]``.

        Returns:
            :class:`~attnmetrics.protocol.TestedAttention`: attention ``[B, heads, T - lead]`` and
            values ``[B, heads, T - lead, d]`` over the real tokens (zero past each row's), the
            logits and the decoder.
        """
        real = token_mask(lengths, tokens.shape[1], self.lead, self.trail)
        items = lengths - self.lead - self.trail
        return self._decomposed(self._checked(tokens), lengths, self.pooled(lengths), real, self.lead, items)

    def _decomposed(
        self,
        ids: Tensor,
        lengths: Tensor,
        pooled: Tensor,
        real: Tensor,
        lead: int,
        items: Tensor,
        width: int | None = None,
    ) -> TestedAttention:
        """:meth:`tested_attention` of the model's input ``ids [B, T]`` (``lengths`` their own):
        the last layer's row at position ``pooled [B]`` decomposed over the ``real [B, T]``
        positions, every other one's weight fixed, columns from ``lead`` on (``width`` of them
        where given), ``items [B]`` each row's real positions (their count)."""
        rows = torch.arange(ids.shape[0], device=ids.device)
        p = pooled
        captured = {}

        def hook(query, key, value, probs, scaling):
            captured.update(query=query, key=key, value=value, probs=probs, scaling=scaling)
            return probs

        with hooked([self.last_attention], hook):
            out = self._run(lengths, input_ids=ids, output_hidden_states=True)
        x = out.hidden_states[-2][rows, p]  # the last layer's input at the pooled position
        logits = self.decoder(out.last_hidden_state[rows, p])
        q, k, v, probs = (captured[n] for n in ("query", "key", "value", "probs"))
        heads, dh = v.shape[1], v.shape[-1]
        w_o, b_o = self._output_projection()
        after = self.after_attention()
        attention, values, factored, _ = decompose_row(
            probs[rows, :, p],
            q[rows, :, p],
            k,
            v,
            w_o.view(-1, heads, dh),
            b_o,
            x,
            captured["scaling"],
            real,
            lead,
        )
        if width is not None:  # the columns past every row's real positions dropped (a prompt's suffix)
            attention, values = attention[..., :width].contiguous(), values[:, :, :width].contiguous()
            factored = factored._replace(per_head=factored.per_head[:, :, :width].contiguous())
        return TestedAttention(attention, values, items, logits, after, factored)

    def _output_projection(self) -> tuple[Tensor, Tensor]:
        """The last attention layer's output projection: weight ``[d, heads * dh]`` (out, in) and bias ``[d]``."""
        if self.family in ("bert", "roberta"):
            proj = self.base.encoder.layer[-1].attention.output.dense
        elif self.family == "distilbert":
            proj = self.last_attention.out_lin
        elif self.family == "gpt2":
            proj = self.base.h[-1].attn.c_proj  # Conv1D: weight [in, out]
            return proj.weight.T, proj.bias
        else:
            proj = self.last_attention.o_proj  # Llama's has no bias
        w_o = proj.weight
        return w_o, proj.bias if proj.bias is not None else w_o.new_zeros(w_o.shape[0])

    def after_attention(self) -> nn.Module:
        """The rest of the network after the last layer's attention at the pooled position: the
        tested attention's decoder (attention output plus residual ``[N, d]`` -> logits)."""
        after = {
            "bert": BertAfterAttention,
            "roberta": RobertaAfterAttention,
            "distilbert": DistilBertAfterAttention,
            "gpt2": GPT2AfterAttention,
        }.get(self.family, LlamaAfterAttention)
        return after(self.hf, self.decoder)

    # ---- causal prefix reuse (models/causal_edits.py) ------------------------------------------

    @property
    def deletion_logits(self):
        """A decoder's (``gpt2``, ``llama``) :meth:`attnmetrics.protocol.DeletesTokens`
        capability, ``(embedded [G, T, d], lengths [G]) -> PreparedEdits``: every layer's keys and
        values run once, each deletion recomputing only the positions from it on (the causal prefix
        reuse, models/causal_edits.py); None for an encoder (no such capability)."""
        return self._prefix_deletions if self.family in ("gpt2", "llama") else None

    @property
    def masking_logits(self):
        """:attr:`deletion_logits` for ``leave_one_out(mode="mask")``: ``(embedded, lengths,
        mask_token) -> PreparedEdits``; None for an encoder."""
        return self._prefix_maskings if self.family in ("gpt2", "llama") else None

    @property
    def subset_logits(self):
        """A decoder's (``gpt2``, ``llama``) :class:`attnmetrics.protocol.EditsSubsets` capability,
        ``(embedded [G, T, d], lengths [G], mask_token: int | None) -> PreparedSubsets``: the logits
        with a set of tokens deleted (``mask_token`` None) or masked, each edit recomputing only the
        positions from its first changed token on (models/causal_subsets.py), for ERASER; None for
        an encoder."""
        return self._prefix_subsets if self.family in ("gpt2", "llama") else None

    def _prefix_subsets(self, embedded: Tensor, lengths: Tensor, mask_token: int | None):
        from attnmetrics.models.causal_edits import decoder_of, mask_embedding
        from attnmetrics.models.causal_subsets import prepare_subsets

        words = self.base.get_input_embeddings()
        mask = None if mask_token is None else mask_embedding(words, mask_token, embedded.dtype)
        first = torch.zeros_like(lengths)
        return prepare_subsets(decoder_of(self.base), self.decoder, embedded, lengths, first, lengths, mask)

    def _prefix_deletions(self, embedded: Tensor, lengths: Tensor):
        from attnmetrics.models.causal_edits import decoder_of, prepare_edits

        first = torch.zeros_like(lengths)
        return prepare_edits(decoder_of(self.base), self.decoder, embedded, lengths, first, embedded.shape[1])

    def _prefix_maskings(self, embedded: Tensor, lengths: Tensor, mask_token: int):
        from attnmetrics.models.causal_edits import decoder_of, mask_embedding, prepare_edits

        mask = mask_embedding(self.base.get_input_embeddings(), mask_token, embedded.dtype)
        first = torch.zeros_like(lengths)
        return prepare_edits(decoder_of(self.base), self.decoder, embedded, lengths, first, embedded.shape[1], mask)
