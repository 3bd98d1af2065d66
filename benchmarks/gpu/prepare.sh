# What the GPU scripts beside this one read, laid out once (sourced from the repository root after
# env.sh, with OUT set; every step is skipped when done or when its input is absent): the SST files
# from .gpu/sst.tar.xz; all-MiniLM-L6-v2's float16 weights from .gpu/minilm16 (xz-compressed to fit
# the device tool's 64 MiB carry beside the tree), widened back to float32 in /tmp/minilm; Captum
# from .gpu/wheels (the MiniLM battery's integrated gradients, peers_cuda.py).
[ -f .gpu/sst.tar.xz ] && [ ! -d .gpu/sst ] && tar xJf .gpu/sst.tar.xz -C .gpu
[ -f .gpu/minilm16/model.safetensors.xz ] && xz -d -T8 .gpu/minilm16/model.safetensors.xz
if ls .gpu/wheels/captum-*.whl > /dev/null 2>&1 && ! python3 -c "import captum" 2> /dev/null; then
  python3 -m pip install --no-deps --no-index -q .gpu/wheels/captum-*.whl > "$OUT/pip.log" 2>&1
fi
if [ -f .gpu/minilm16/model.safetensors ] && [ ! -f /tmp/minilm/model.safetensors ]; then
  python3 - <<'PY'
import os, shutil
from safetensors.torch import load_file, save_file
os.makedirs("/tmp/minilm", exist_ok=True)
weights = load_file(".gpu/minilm16/model.safetensors")
save_file({k: v.float() if v.is_floating_point() else v for k, v in weights.items()}, "/tmp/minilm/model.safetensors",
          metadata={"format": "pt"})
for name in os.listdir(".gpu/minilm16"):
    if name != "model.safetensors":
        shutil.copy(f".gpu/minilm16/{name}", "/tmp/minilm/")
PY
fi
# SmolLM2's GGUF (benchmarks/gpu/smollm2.sh): carried in parts .gpu/smol.* over two calls (the tree and one
# call's carry stay under 64 MiB), each part moved to /tmp/gguf-parts as it arrives; once they add up to
# .gpu/gguf.sha256 the file is put where attnmetrics.data.load_smollm2 finds it offline. The gguf package
# from .gpu/wheels; transformers from .gpu/wheels-tf when it is there and imports (the version of the runs
# it is compared with), into /tmp/site-tf, put on PYTHONPATH.
if ls .gpu/smol.* > /dev/null 2>&1; then mkdir -p /tmp/gguf-parts && mv .gpu/smol.* /tmp/gguf-parts/; fi
SMOL_GGUF=${ATTNMETRICS_CACHE:-$HOME/.cache/attnmetrics}/SmolLM2-135M-Instruct/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -f "$SMOL_GGUF" ] && [ -f .gpu/gguf.sha256 ] && ls /tmp/gguf-parts/smol.* > /dev/null 2>&1; then
  mkdir -p "$(dirname "$SMOL_GGUF")"
  cat /tmp/gguf-parts/smol.* > "$SMOL_GGUF.tmp"
  if [ "$(sha256sum < "$SMOL_GGUF.tmp" | cut -d' ' -f1)" = "$(cut -d' ' -f1 .gpu/gguf.sha256)" ]; then
    mv "$SMOL_GGUF.tmp" "$SMOL_GGUF"; else rm -f "$SMOL_GGUF.tmp"; fi
fi
if ls .gpu/wheels/gguf-*.whl > /dev/null 2>&1 && ! python3 -c "import gguf" 2> /dev/null; then
  python3 -m pip install --no-deps --no-index -q .gpu/wheels/gguf-*.whl >> "$OUT/pip.log" 2>&1
fi
if ls .gpu/wheels-tf/transformers-*.whl > /dev/null 2>&1 && [ ! -d /tmp/site-tf ]; then
  python3 -m pip install --no-deps --no-index --no-compile -q --target /tmp/site-tf .gpu/wheels-tf/*.whl >> "$OUT/pip.log" 2>&1
fi
[ -d /tmp/site-tf ] && PYTHONPATH=/tmp/site-tf:$PYTHONPATH python3 -c "import transformers" 2>> "$OUT/pip.log" \
  && export PYTHONPATH=/tmp/site-tf:$PYTHONPATH
