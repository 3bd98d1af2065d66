"""The authors' own code of four attention-derived attributions, timed and recorded outside attnmetrics: the
peer side of ``benchmarks/peers/authors_compare.py`` (issue 46 item 6). It imports nothing of attnmetrics and
runs in a virtual environment of its own, since the authors' modified BERT modules are written against
``transformers`` 4.x (GlobEnc and DecompX pin 4.18.0 in their notebooks, ALTI 4.17.0 in ``environment.yml``,
Value Zeroing 4.15.0 in ``requirements.txt``); attnmetrics needs ``transformers`` 5. Their code is read at run
time from the folders given with ``--code NAME=DIR`` (each an extracted checkout, ``DIR/.commit`` holding its
commit, or a git work tree); nothing of it is copied here.

What each method runs, on one CPU thread, float32, eval mode, under ``torch.no_grad()`` (every call below is
the authors' code; line numbers at the commits named):

- ``globenc`` (mohsenfayyaz/GlobEnc a26b38b): their ``src/modeling/modeling_bert.py``
  ``BertForSequenceClassification`` (``BertNormOutput`` lines 381-490 and ``BertLayer`` lines 705-727: N_Enc,
  ``post_ln2_norm``) and ``src/attention_rollout.py`` ``AttentionRollout.compute_flows`` /
  ``compute_joint_attention`` (lines 11-36), called as the cell "Compute GlobEnc" of ``GlobEnc_Demo.ipynb``
  does: ``model(**tokenized_sentence, output_attentions=True, output_norms=True, return_dict=False)``, then
  ``norms[i][4]`` of every layer stacked and rolled out. One sentence per call (the notebook's, and
  ``src/model_attentions.py`` ``extract_attentions``'s loop). Variant ``batched``: their model's own batched
  rollout (``output_globenc=True``, ``BertEncoder.forward`` lines 829-839: N_Enc of every layer multiplied in
  the encoder, padded queries zeroed through ``exp(attention_mask)``) on padded chunks of ``--batch`` rows.
  Score: the ``[CLS]`` row of the last layer's rolled-out matrix.
- ``alti`` (mt-upc/transformer-contributions 4f89039): ``src/contributions.py`` ``ModelWrapper.__call__``
  (lines 289-312, hooks on every module, one forward, ``get_contributions`` lines 92-279), then
  ``src/utils_contributions.py`` ``normalize_contributions(..., scaling='min_sum', resultant_norm=...)``
  (lines 257-294) with ``resultant_norm = ||resultants||_1`` and ``compute_joint_attention`` (lines 455-470),
  as the cells of ``Text_classification.ipynb`` do (one sentence per call; ``get_contributions`` assumes a
  batch of one: its ``ln_std_coef.view(1, -1, 1)``, line 206, so there is no batched variant). Their
  ``__call__`` runs ``get_contributions`` twice (lines 303 and 306, the first result discarded); variant
  ``contributions_once`` times the same call with the second run answered from the first (a monkeypatch of
  ``ModelWrapper.get_contributions`` here, same values). Score: the ``[CLS]`` row of the last layer's
  rolled-out matrix. The stock ``transformers`` ``BertForSequenceClassification`` is used, eager attention.
- ``value_zeroing`` (hmohebbi/ValueZeroing 57d448d): ``modeling/customized_modeling_bert.py``
  ``BertForSequenceClassification`` (``zero_value_index``, lines 342-344) and the scoring loop of ``demo.py``
  (lines 75-107, the same loop as ``scoring/value_zeroing.py`` lines 138-173; ``METRIC = 'cosine'``, line 5): one forward for the hidden
  states, then per layer and per token one recomputation of the layer with that token's values zeroed,
  scikit-learn's ``cosine_distances`` between the original and altered outputs, rows normalised, and
  ``compute_joint_attention(..., res=False)`` (``demo.py`` lines 27-39). Those statements of ``demo.py`` are
  read with ``ast`` and executed as they are (the module itself loads a checkpoint from the hub at import),
  one sentence per call as their loop (``DataLoader(..., batch_size=1)``). Score: the ``[CLS]`` row of the
  last layer's rolled-out matrix.
- ``decompx`` (mohsenfayyaz/DecompX b6bddf0): ``src/modeling_bert.py`` ``BertForSequenceClassification``
  with ``src/decompx_utils.py`` ``DecompXConfig`` as ``DecompX_Colab_Demo.ipynb`` sets it (``CONFIGS
  ["DecompX"]``: AbsDot biases, LN1, FFN with GeLU_ZO, LN2, vector aggregation, pooler and classifier with
  tanh ZO, ``output_all_layers=True``, aggregated and pooler norms output), called as its cell does:
  ``model(**tokenized, output_attentions=False, return_dict=False, output_hidden_states=True,
  decompx_config=...)``. The notebook runs a padded batch of its sentences: variant ``batched`` (padded chunks
  of ``--batch`` rows), and the default one sentence per call. Score: ``decompx_last_layer_outputs.classifier``
  ``[n, C]`` at the class the model predicts (argmax of its logits), every position.

Each method's first row runs once as a warm-up, untimed; then every row is timed (``time.perf_counter``
around the calls alone: no JSON, no conversion of the scores). Each variant records ``seconds`` (all rows),
``seconds_per_row``, ``calls``, ``scores`` (one list per row, the row's every position, ``[CLS]`` and
``[SEP]`` included) and the model's ``logits`` (their model's, from the same call, where it gives them).

The model: a saved ``BertForSequenceClassification`` folder (``config.json``, ``model.safetensors``);
``transformers`` 4.18 predates safetensors in ``from_pretrained``, so each class is built from the config and
given the file's tensors by ``load_state_dict`` (every parameter must be there; only the position-id buffer
may be missing). ``--logits-only`` prints and records the stock model's logits on every row, nothing else
(``authors_compare.py prepare --peer-python`` uses it to check both ``transformers`` see the same weights).

Environment (``transformers`` 4.18.0 has no Python 3.11 wheel of its ``tokenizers`` < 0.13, which nothing
here uses: it is installed without dependencies, its others by hand; ``captum``, ``pyaml-env`` and
``python-dotenv`` because ALTI's modules import them at their top)::

    /usr/bin/python3.11 -m venv /tmp/authorsenv
    /tmp/authorsenv/bin/pip install torch==2.13.0
    /tmp/authorsenv/bin/pip install --no-deps transformers==4.18.0 captum==0.4.1 pyaml-env==1.1.5
    /tmp/authorsenv/bin/pip install "huggingface-hub<0.30" numpy packaging pyyaml regex requests sacremoses \\
        tqdm filelock scikit-learn safetensors matplotlib pandas python-dotenv

ALTI's ``src/utils_contributions.py`` also imports ``datasets``, ``ipywidgets`` and ``transformers.AutoTokenizer``
at its top for functions not called here; where they are not installed (``AutoTokenizer``'s module needs
``tokenizers``) each is stood in for by a placeholder (``datasets.load_dataset``, ``ipywidgets.IntProgress``
and ``AutoTokenizer.from_pretrained`` raise if called). Its ``contributions.py`` reads ``./src/config.yaml`` at import, so
it is imported from its checkout's folder.

The authors' code, from their GitHub repositories, extracted outside this repository::

    mkdir -p /tmp/authors/globenc && cd /tmp/authors/globenc && git clone https://github.com/mohsenfayyaz/GlobEnc . \\
        && git checkout a26b38bfdc00e01a994a0f07740f059d0431dca5      # and likewise:
    # alti:          mt-upc/transformer-contributions 4f89039821c95fe618fa0f63beb783ba72b49485
    # value_zeroing: hmohebbi/ValueZeroing            57d448daf9541e88062883f8374341566e4c06ee
    # decompx:       mohsenfayyaz/DecompX             b6bddf0b185f729c029b08d0f37108a5fcc85a4c

Usage (the model and ids from ``authors_compare.py prepare``)::

    OMP_NUM_THREADS=1 /tmp/authorsenv/bin/python benchmarks/peers/authors_methods.py \\
        --model /tmp/authors/model --ids /tmp/authors/model/ids.json \\
        --code globenc=/tmp/authors/globenc --code alti=/tmp/authors/alti \\
        --code value_zeroing=/tmp/authors/value_zeroing --code decompx=/tmp/authors/decompx \\
        --methods globenc alti value_zeroing decompx --rows 16 --out /tmp/authors/authors.json
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):  # before numpy and torch load
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import ast  # noqa: E402
import contextlib  # noqa: E402
import hashlib  # noqa: E402
import importlib  # noqa: E402
import importlib.machinery  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import types  # noqa: E402
from importlib.metadata import version  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

METHODS = ("globenc", "alti", "value_zeroing", "decompx")

#: the commit each method's lines were read at (the docstring's line numbers); another is run with a warning
EXPECTED_COMMITS = {
    "globenc": "a26b38bfdc00e01a994a0f07740f059d0431dca5",
    "alti": "4f89039821c95fe618fa0f63beb783ba72b49485",
    "value_zeroing": "57d448daf9541e88062883f8374341566e4c06ee",
    "decompx": "b6bddf0b185f729c029b08d0f37108a5fcc85a4c",
}

#: the files of each checkout that a method runs
FILES = {
    "globenc": ["src/modeling/modeling_bert.py", "src/attention_rollout.py", "GlobEnc_Demo.ipynb"],
    "alti": ["src/contributions.py", "src/utils_contributions.py", "src/config.yaml", "Text_classification.ipynb"],
    "value_zeroing": ["modeling/customized_modeling_bert.py", "demo.py"],
    "decompx": ["src/modeling_bert.py", "src/decompx_utils.py", "DecompX_Colab_Demo.ipynb"],
}


# ---- inputs -------------------------------------------------------------------------------------


def read_rows(path: Path, rows: int | None) -> list[list[int]]:
    """The id rows of ``path`` (``{"rows": [[101, ..., 102], ...]}``), the first ``rows`` of them."""
    data = json.loads(path.read_text())
    out = [list(map(int, r)) for r in data["rows"]]
    for i, r in enumerate(out):
        if len(r) < 2 or r[0] != 101 or r[-1] != 102:
            raise ValueError(f"{path}: row {i} is not [CLS]=101 ... [SEP]=102")
    return out[:rows] if rows else out


def ids_digest(rows: list[list[int]]) -> str:
    """sha256 of the rows as compact JSON: both sides check they ran the same ids."""
    return hashlib.sha256(json.dumps(rows, separators=(",", ":")).encode()).hexdigest()


def padded(rows: list[list[int]]) -> dict[str, torch.Tensor]:
    """A right-padded batch (pad id 0) as a tokenizer would give it."""
    width = max(map(len, rows))
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for b, r in enumerate(rows):
        ids[b, : len(r)] = torch.tensor(r)
        mask[b, : len(r)] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}


def chunks(rows: list, size: int):
    for start in range(0, len(rows), size):
        yield rows[start : start + size]


# ---- the authors' code --------------------------------------------------------------------------


def commit_of(folder: Path) -> str:
    """The checkout's commit: ``.commit`` (an extracted archive), else ``git rev-parse HEAD``."""
    marker = folder / ".commit"
    if marker.is_file():
        return marker.read_text().strip()
    try:
        return subprocess.run(
            ["git", "-C", str(folder), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


@contextlib.contextmanager
def importing_from(folder: Path):
    """``folder`` first on sys.path and the working directory while its modules import (ALTI reads
    ``./src/config.yaml`` at import); the authors' ``src`` packages share a name, so each method's ``src``
    modules are dropped from sys.modules before and after (the loaded objects are kept by the caller)."""

    def forget():
        for name in [
            n for n in sys.modules if n in ("src", "modeling", "utils") or n.split(".")[0] in ("src", "modeling")
        ]:
            del sys.modules[name]

    forget()
    cwd = os.getcwd()
    sys.path.insert(0, str(folder))
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(cwd)
        sys.path.remove(str(folder))
        forget()


def load_weights(cls, model_dir: Path):
    """``cls`` (a ``BertForSequenceClassification``, theirs or transformers') built from the saved config and
    given the saved tensors; eval mode, float32. Every parameter must be in the file."""
    from safetensors.torch import load_file
    from transformers import BertConfig

    config = BertConfig.from_json_file(str(model_dir / "config.json"))
    config.torch_dtype = torch.float32
    model = cls(config)
    state = load_file(str(model_dir / "model.safetensors"))
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith("position_ids")]
    if missing or unexpected:
        raise ValueError(f"{cls.__module__}.{cls.__name__}: missing {missing}, unexpected {unexpected} weights")
    return model.float().eval()


def stock_model(model_dir: Path):
    """transformers' own ``BertForSequenceClassification`` (eager attention: the only one 4.18 has)."""
    from transformers import BertForSequenceClassification

    return load_weights(BertForSequenceClassification, model_dir)


class Method:
    """One method's authors' code, loaded: ``variants`` maps a variant's name to ``(run, per_call)`` where
    ``run(rows)`` returns ``(scores, logits)`` per row and ``per_call`` is the rows one call takes (1, or
    ``--batch``)."""

    def __init__(self, name: str, folder: Path, model_dir: Path, batch: int):
        self.name, self.folder, self.batch = name, folder, batch
        self.commit = commit_of(folder)
        self.variants = getattr(self, f"_load_{name}")(model_dir)

    # GlobEnc ----------------------------------------------------------------------------------------
    def _load_globenc(self, model_dir):
        with importing_from(self.folder):
            modeling = importlib.import_module("src.modeling.modeling_bert")
            rollout = importlib.import_module("src.attention_rollout")
        model = load_weights(modeling.BertForSequenceClassification, model_dir)
        AttentionRollout = rollout.AttentionRollout

        def one(rows):  # GlobEnc_Demo.ipynb, cell "Compute GlobEnc"
            scores, logits_out = [], []
            for r in rows:
                tokenized_sentence = padded([r])
                with torch.no_grad():
                    logits, attentions, norms = model(
                        **tokenized_sentence, output_attentions=True, output_norms=True, return_dict=False
                    )
                    num_layers = len(attentions)
                    norm_nenc = torch.stack([norms[i][4] for i in range(num_layers)]).squeeze().cpu().numpy()
                    globenc = AttentionRollout().compute_flows(
                        [norm_nenc], output_hidden_states=True, disable_tqdm=True
                    )[0]
                    globenc = np.array(globenc)
                scores.append(globenc[-1, 0])
                logits_out.append(logits[0])
            return scores, logits_out

        def batched(rows):  # their encoder's own rollout (output_globenc=True), padded chunks
            scores, logits_out = [], []
            for part in chunks(rows, self.batch):
                inputs = padded(part)
                with torch.no_grad():
                    logits, globenc = model(**inputs, output_globenc=True, return_dict=False)
                for b, r in enumerate(part):
                    scores.append(globenc[b, 0, : len(r)])
                    logits_out.append(logits[b])
            return scores, logits_out

        return {"one_per_call": (one, 1), "batched": (batched, self.batch)}

    # ALTI ---------------------------------------------------------------------------------------------
    def _load_alti(self, model_dir):
        import transformers  # before the stand-ins below: its import asks for datasets' spec

        for name, attr in (("datasets", "load_dataset"), ("ipywidgets", "IntProgress")):
            if name not in sys.modules and importlib.util.find_spec(name) is None:  # unused here

                def unavailable(*a, _n=f"{name}.{attr}", **k):
                    raise RuntimeError(f"{_n} is a stand-in here (authors_methods.py)")

                stub = types.ModuleType(name)
                stub.__spec__ = importlib.machinery.ModuleSpec(name, None)
                setattr(stub, attr, unavailable)
                sys.modules[name] = stub
        if importlib.util.find_spec("tokenizers") is None:  # AutoTokenizer's module needs it; unused here

            def no_tokenizer(*a, **k):
                raise RuntimeError("transformers.AutoTokenizer is a stand-in here (authors_methods.py)")

            transformers.AutoTokenizer = types.SimpleNamespace(from_pretrained=no_tokenizer)
        with importing_from(self.folder):
            contributions = importlib.import_module("src.contributions")
            utils = importlib.import_module("src.utils_contributions")
        ModelWrapper = contributions.ModelWrapper
        normalize_contributions, compute_joint_attention = utils.normalize_contributions, utils.compute_joint_attention
        model = stock_model(model_dir)

        def cell(rows, wrapper_cls):  # Text_classification.ipynb's cells, one sentence each
            scores, logits_out = [], []
            for r in rows:
                pt_batch = padded([r])
                del pt_batch["token_type_ids"]  # the notebook: return_token_type_ids=False
                model_wrapped = wrapper_cls(model)
                prediction_scores, hidden_states, attentions, contributions_data = model_wrapped(pt_batch)
                resultant_norm = torch.norm(torch.squeeze(contributions_data["resultants"]), p=1, dim=-1)
                normalized_contributions = normalize_contributions(
                    contributions_data["contributions"], scaling="min_sum", resultant_norm=resultant_norm
                )
                contributions_mix = compute_joint_attention(normalized_contributions)
                scores.append(contributions_mix[-1][0])
                logits_out.append(prediction_scores[0])
            return scores, logits_out

        class Once(ModelWrapper):
            """``get_contributions``'s second call in ``__call__`` (line 306) answered from its first (303)."""

            def get_contributions(self, *args):
                if getattr(self, "_seen", None) is not None and all(a is b for a, b in zip(self._seen[0], args)):
                    return self._seen[1]
                out = super().get_contributions(*args)
                self._seen = (args, out)
                return out

        return {
            "one_per_call": (lambda rows: cell(rows, ModelWrapper), 1),
            "contributions_once": (lambda rows: cell(rows, Once), 1),
        }

    # Value Zeroing ------------------------------------------------------------------------------------
    def _load_value_zeroing(self, model_dir):
        with importing_from(self.folder):
            modeling = importlib.import_module("modeling.customized_modeling_bert")
        model = load_weights(modeling.BertForSequenceClassification, model_dir)
        source = (self.folder / "demo.py").read_text()
        tree = ast.parse(source)
        helpers = [
            s for s in tree.body if s.lineno == 5 or 27 <= s.lineno <= 43
        ]  # METRIC, compute_joint_attention, DISTANCE_FUNC
        loop = [s for s in tree.body if 75 <= s.lineno <= 107]  # the forward, the zeroing loop, the rollout
        text = "\n".join(ast.get_source_segment(source, s) for s in helpers + loop)
        for needle in ("METRIC = 'cosine'", "def compute_joint_attention", "zero_value_index=t", "cosine_distances",
                       "compute_joint_attention(valuezeroing_scores, res=False)"):  # fmt: skip
            if needle not in text:
                raise ValueError(
                    f"value_zeroing: demo.py lines 5, 27-43 and 75-107 lack {needle!r} (commit {self.commit})"
                )
        from sklearn.metrics.pairwise import cosine_distances

        namespace = {"np": np, "torch": torch, "cosine_distances": cosine_distances}
        exec(compile(ast.Module(body=helpers, type_ignores=[]), str(self.folder / "demo.py"), "exec"), namespace)
        body = compile(ast.Module(body=loop, type_ignores=[]), str(self.folder / "demo.py"), "exec")

        def one(rows):
            scores, logits_out = [], []
            for r in rows:
                scope = dict(
                    namespace, model=model, config=model.config, device=torch.device("cpu"), inputs=padded([r])
                )
                exec(body, scope)
                scores.append(scope["rollout_valuezeroing_scores"][-1, 0])
                logits_out.append(scope["outputs"]["logits"][0])
            return scores, logits_out

        return {"one_per_call": (one, 1)}

    # DecompX ------------------------------------------------------------------------------------------
    def _load_decompx(self, model_dir):
        with importing_from(self.folder):
            modeling = importlib.import_module("src.modeling_bert")
            utils = importlib.import_module("src.decompx_utils")
        model = load_weights(modeling.BertForSequenceClassification, model_dir)
        config = utils.DecompXConfig(  # DecompX_Colab_Demo.ipynb, CONFIGS["DecompX"]
            include_biases=True,
            bias_decomp_type="absdot",
            include_LN1=True,
            include_FFN=True,
            FFN_approx_type="GeLU_ZO",
            include_LN2=True,
            aggregation="vector",
            include_classifier_w_pooler=True,
            tanh_approx_type="ZO",
            output_all_layers=True,
            output_attention=None,
            output_res1=None,
            output_LN1=None,
            output_FFN=None,
            output_res2=None,
            output_encoder=None,
            output_aggregated="norm",
            output_pooler="norm",
            output_classifier=True,
        )

        def run(rows, size):
            scores, logits_out = [], []
            for part in chunks(rows, size):
                tokenized_sentence = padded(part)
                with torch.no_grad():
                    model.eval()
                    logits, hidden_states, decompx_last_layer_outputs, decompx_all_layers_outputs = model(
                        **tokenized_sentence,
                        output_attentions=False,
                        return_dict=False,
                        output_hidden_states=True,
                        decompx_config=config,
                    )
                classifier = decompx_last_layer_outputs.classifier  # [b, T, C]
                for b, r in enumerate(part):
                    predicted = int(logits[b].argmax())
                    scores.append(classifier[b, : len(r), predicted])
                    logits_out.append(logits[b])
            return scores, logits_out

        return {
            "one_per_call": (lambda rows: run(rows, 1), 1),
            "batched": (lambda rows: run(rows, self.batch), self.batch),
        }


# ---- running --------------------------------------------------------------------------------------


def as_lists(values) -> list[list[float]]:
    """Tensors or arrays -> lists of floats (float64, as their values are)."""
    return [
        (v.detach().double().numpy() if torch.is_tensor(v) else np.asarray(v, dtype=float)).tolist() for v in values
    ]


def time_variant(run, rows: list[list[int]]) -> dict:
    """One warm-up call on the first row, then all rows timed."""
    run(rows[:1])
    start = time.perf_counter()
    scores, logits = run(rows)
    seconds = time.perf_counter() - start
    return {
        "seconds": seconds,
        "seconds_per_row": seconds / len(rows),
        "scores": as_lists(scores),
        "logits": as_lists(logits),
    }


def write_json(path: Path, data: dict) -> None:
    """Atomically: a temporary file in the same folder, then ``os.replace``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, required=True, help="a saved BertForSequenceClassification folder")
    parser.add_argument("--ids", type=Path, required=True, help='{"rows": [[101, ..., 102], ...]}')
    parser.add_argument("--code", action="append", default=[], metavar="NAME=DIR", help="an author's checkout")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--rows", type=int, default=None, help="only the first N rows")
    parser.add_argument("--batch", type=int, default=16, help="rows a padded call takes (the batched variants)")
    parser.add_argument(
        "--logits-only", action="store_true", help="the stock model's logits on every row, nothing else"
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)

    torch.set_num_threads(1)
    torch.set_grad_enabled(False)
    rows = read_rows(args.ids, args.rows)
    result = {
        "model_dir": str(args.model.resolve()),
        "ids_file": str(args.ids.resolve()),
        "ids_sha256": ids_digest(rows),
        "rows": len(rows),
        "tokens": sum(map(len, rows)),
        "threads": torch.get_num_threads(),
        "versions": {p: version(p) for p in ("torch", "transformers", "numpy", "scikit-learn")},
        "python": sys.version.split()[0],
        "load_average": os.getloadavg()[0],
        "methods": {},
    }
    if args.logits_only:
        model = stock_model(args.model)
        with torch.no_grad():
            result["logits"] = [model(**padded([r])).logits[0].tolist() for r in rows]
        for i, lg in enumerate(result["logits"][:2]):
            print(f"transformers {version('transformers')} logits of row {i}: {lg}")
        write_json(args.out, result)
        return 0

    code = dict(item.split("=", 1) for item in args.code)
    for name in args.methods:
        if name not in code:
            parser.error(f"--code {name}=DIR is needed for {name}")
        folder = Path(code[name]).resolve()
        method = Method(name, folder, args.model, args.batch)
        if method.commit != EXPECTED_COMMITS[name]:
            print(
                f"warning: {name} at {method.commit}, the docstring's lines are of {EXPECTED_COMMITS[name]}",
                file=sys.stderr,
            )
        entry = {"code": {"dir": str(folder), "commit": method.commit, "files": FILES[name]}, "variants": {}}
        for variant, (run, per_call) in method.variants.items():
            timed = time_variant(run, rows)
            timed.update(rows_per_call=per_call, calls=-(-len(rows) // per_call))
            entry["variants"][variant] = timed
            print(
                f"{name:>14} {variant:<20} {timed['seconds']:9.3f} s  {timed['seconds_per_row'] * 1e3:9.2f} ms/row",
                flush=True,
            )
        result["methods"][name] = entry
    write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
