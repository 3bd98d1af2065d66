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
