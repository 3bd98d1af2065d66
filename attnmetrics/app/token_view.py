"""``report.html``: the evidence on the text. For a few chosen test instances, the sentence's tokens
shaded by each importance (attention, gradient, leave-one-out) in aligned rows, with the
prediction, the decision-flip point and the instance's statistics.

Static and self-contained: inline CSS, no script, no network at view time. Every token and label
is data and goes through Jinja2's HTML autoescaping.

The examples are chosen and scored by :func:`attnmetrics.app.faithfulness.examples` (``--examples N``) and kept in
``results.json`` under ``"examples"``, so ``attnmetrics report`` re-renders the view.
"""

from __future__ import annotations

import math
from pathlib import Path

from jinja2 import Environment, select_autoescape

from attnmetrics.app.io import write_text_atomic

#: each importance's row colour (red, green, blue); the shade's opacity is the score / row maximum
COLOURS = {"attention": (220, 80, 40), "gradient": (40, 110, 220), "loo": (30, 150, 80)}
OTHER = (120, 80, 180)

_TEMPLATE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>{{ title }}</title>
<style>
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; max-width: 80em; }
section { margin-bottom: 2.5em; }
div.tokens { display: flex; flex-wrap: wrap; gap: 0.5em 3px; align-items: flex-start; }
span.column { display: inline-flex; flex-direction: column; gap: 2px; }
span.column span { padding: 0.15em 0.3em; border-radius: 3px; white-space: pre; font-family: ui-monospace, monospace; }
span.names span { font-family: inherit; color: #555; text-align: right; padding-right: 0.6em; }
span.removed { outline: 2px solid #222; }
p.meta { color: #444; }
</style></head>
<body>
<h1>{{ title }}</h1>
<p>{{ intro }}</p>
{% for ex in examples %}
<section id="instance-{{ ex.instance }}">
<h2>Instance {{ ex.instance }} &middot; {{ ex.why }}</h2>
<p class="meta">label <b>{{ ex.label }}</b>, predicted <b>{{ ex.predicted }}</b>
(p = {{ "%.3f" | format(ex.probability) }}); {{ ex.flip }}</p>
{% if ex.question %}<p class="meta">question (held fixed, not scored): <b>{{ ex.question | join(" ") }}</b></p>{% endif %}
<div class="tokens">
<span class="column names">{% for name in ex.names %}<span>{{ name }}</span>{% endfor %}</span>
{% for column in ex.columns %}<span class="column">{% for cell in column %}<span style="background: rgba({{ cell.rgb }}, {{ cell.alpha }})"
{%- if cell.removed %} class="removed"{% endif %} title="{{ cell.title }}">{{ cell.token }}</span>{% endfor %}</span>
{% endfor %}</div>
{% if ex.stats %}<p class="meta">{% for k, v in ex.stats %}{{ k }} {{ v }}{% if not loop.last %}; {% endif %}{% endfor %}</p>{% endif %}
</section>
{% endfor %}
</body></html>
"""

_ENV = Environment(autoescape=select_autoescape(default=True, default_for_string=True))


def _columns(example: dict) -> list[list[dict]]:
    """One column per token: the token shaded by each importance in turn (opacity = the score /
    the importance's maximum over the row), so the rows stay aligned when the line wraps."""
    removed = set(example.get("removed_first", []))
    columns: list[list[dict]] = [[] for _ in example["tokens"]]
    for name, scores in example["scores"].items():
        top = max((s for s in scores if math.isfinite(s)), default=0.0)
        rgb = ", ".join(map(str, COLOURS.get(name, OTHER)))
        for t, (token, s) in enumerate(zip(example["tokens"], scores)):
            alpha = max(0.0, s) / top if top > 0 and math.isfinite(s) else 0.0
            columns[t].append(
                {
                    "token": token,
                    "rgb": rgb,
                    "alpha": f"{alpha:.3f}",
                    "removed": name == "attention" and t in removed,
                    "title": f"{name} {s:.4g}",
                }
            )
    return columns


def render_token_view(results: dict, folder: str | Path) -> Path | None:
    """Write ``report.html`` for ``results["examples"]`` into ``folder``; None if there are none."""
    examples = results.get("examples")
    if not examples:
        return None
    shown = []
    for ex in examples:
        removed = ex.get("flip_removed")
        flip = (
            f"the decision flips after removing {removed} of {len(ex['tokens'])} tokens in attention order (outlined)"
            if removed is not None and removed >= 0
            else "the decision never flips under attention-order removal"
        )
        stats = [(k, f"{v:.3f}" if isinstance(v, float) and math.isfinite(v) else "–") for k, v in ex["stats"].items()]
        shown.append({**ex, "names": list(ex["scores"]), "columns": _columns(ex), "flip": flip, "stats": stats})
    cfg = results.get("config", {})
    model = results.get("model", {})
    html = _ENV.from_string(_TEMPLATE).render(
        title=f"attnmetrics token view: {cfg.get('dataset')} / {model.get('encoder', '?')} + {model.get('attention', '?')}",
        intro=(
            "Each row shades the tokens by one importance, darkest at the row's highest score: attention (the "
            "tested attention, the head mean for a transformer's own), gradient (J&W's grad x input), "
            "leave-one-out (output TVD when the token is deleted), for a transformer attention rollout, and "
            "with --integrated-gradients and --input-x-gradient Captum's integrated gradients (ig) and the whole "
            "model's gradient x input. Hover a token for its score."
        ),
        examples=shown,
    )
    path = Path(folder) / "report.html"
    write_text_atomic(path, html)
    return path
