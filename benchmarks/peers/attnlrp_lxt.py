"""``lxt``'s side of ``tests/test_attnlrp.py``: AttnLRP relevances computed by ``lxt`` itself (its efficient
implementation, ``lxt.efficient.monkey_patch``) on tiny random decoders, written to
``tests/fixtures/attnlrp_lxt.json``, which the tests compare ``attnmetrics.llm.attnlrp`` with. Run with
the python of ``lxt``'s own virtual environment: ``lxt`` 2.1 does not import beside ``transformers`` 5
(its BERT module imports ``transformers.pytorch_utils.find_pruneable_heads_and_indices``, since removed),
so it cannot share attnmetrics' environment. It imports nothing of attnmetrics.

Usage (about a second)::

    python3 -m venv /tmp/lxtenv
    /tmp/lxtenv/bin/pip install torch "transformers>=4.53,<4.54" torchvision numpy packaging
    /tmp/lxtenv/bin/pip install --no-deps lxt==2.1
    /tmp/lxtenv/bin/python benchmarks/peers/attnlrp_lxt.py tests/fixtures/attnlrp_lxt.json

(``--no-deps``: ``lxt`` lists ``bitsandbytes``, ``open_clip_torch``, ``zennit`` and others that its
language-model patches do not use.)

The models: a ``LlamaForCausalLM`` with grouped-query attention (4 query heads, 2 key/value heads) and a
``Qwen2ForCausalLM`` (q/k/v biases, the same sizes), float32, every parameter drawn by :func:`randomise`
from one seeded generator (the tests draw the same ones, and check the label words' logits to prove
it). Each row is ``prefix + text + suffix``; the explained logit is the largest of the label words'
next-token logits at the row's last position (the decision of a prompted model with those label words,
or of a classification head holding ``lm_head``'s rows of them), the backward pass seeded with 1, as in
``lxt``'s examples; a token's relevance is ``(input_embeds * input_embeds.grad).sum(-1)``. ``lxt`` runs
each row alone, without padding, in eager attention (``lxt`` patches ``eager_attention_forward``).
"""

from __future__ import annotations

import json
import math
import sys
from importlib.metadata import version

import torch

#: what the fixture describes: the models' sizes and seed, the rows and the label words' ids
SPEC = {
    "seed": 7,
    "config": {
        "vocab_size": 40,
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 64,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "pad_token_id": 0,
        "bos_token_id": 1,
        "eos_token_id": 2,
    },
    "architectures": {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"},
    "prefix": [3, 4],
    "suffix": [5, 6],
    "texts": [[9, 17, 31, 12, 25, 38], [14, 9, 33], [27]],
    "label_ids": [20, 21, 22],
}


def randomise(model: torch.nn.Module, seed: int) -> None:
    """Every parameter of ``model`` drawn from one generator seeded ``seed``, in the order of their sorted
    names: norm weights ``1 + 0.3 N(0, 1)``, biases ``0.3 N(0, 1)``, embeddings ``N(0, 1)``, other
    matrices ``N(0, 1) * 1.5 / sqrt(fan_in)`` (attention far from uniform, activations of order 1)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            noise = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if name.endswith("norm.weight"):
                value = 1 + 0.3 * noise
            elif name.endswith("bias"):
                value = 0.3 * noise
            elif "embed_tokens" in name:
                value = noise
            else:
                value = noise * 1.5 / math.sqrt(p.shape[1])
            p.copy_(value)


def build(family: str, spec: dict = SPEC) -> torch.nn.Module:
    """The tiny causal LM of ``family`` ("llama" or "qwen2"), float32, eval mode, eager attention."""
    import transformers

    name = spec["architectures"][family]
    config = getattr(transformers, name.replace("ForCausalLM", "Config"))(**spec["config"])
    config._attn_implementation = "eager"
    model = getattr(transformers, name)(config).float().eval()
    randomise(model, spec["seed"])
    return model


def rows(spec: dict = SPEC) -> list[list[int]]:
    """Each row's whole ids: prefix, text, suffix."""
    return [spec["prefix"] + text + spec["suffix"] for text in spec["texts"]]


def main(out: str) -> None:
    import transformers
    from lxt.efficient import monkey_patch
    from transformers.models.llama import modeling_llama
    from transformers.models.qwen2 import modeling_qwen2

    monkey_patch(modeling_llama)
    monkey_patch(modeling_qwen2)
    torch.set_num_threads(1)
    labels = torch.tensor(SPEC["label_ids"])
    results = {}
    for family in SPEC["architectures"]:
        model = build(family)
        for p in model.parameters():
            p.requires_grad_(False)
        per_row = []
        for ids in rows():
            embeds = model.get_input_embeddings()(torch.tensor([ids])).detach().requires_grad_(True)
            logits = model(inputs_embeds=embeds, use_cache=False).logits[0, -1, labels]
            predicted = int(logits.argmax())
            logits[predicted].backward()
            relevance = (embeds * embeds.grad).float().sum(-1)[0].detach()
            per_row.append(
                {
                    "logits": [float(v) for v in logits.detach()],
                    "predicted": predicted,
                    "relevance": [float(v) for v in relevance],
                }
            )
        results[family] = per_row
    fixture = {
        "about": "AttnLRP relevances by lxt (lxt.efficient.monkey_patch) on tiny random decoders; written by "
        "benchmarks/peers/attnlrp_lxt.py, compared with by tests/test_attnlrp.py",
        "versions": {name: version(name) for name in ("lxt", "transformers", "torch")},
        "spec": SPEC,
        "rows": rows(),
        "results": results,
    }
    with open(out, "w") as f:
        json.dump(fixture, f, indent=1)
        f.write("\n")
    print(f"wrote {out} ({transformers.__name__} {version('transformers')}, lxt {version('lxt')})")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} OUT.json")
    main(sys.argv[1])
