#!/usr/bin/env bash
# The MiniLM stage of benchmarks/gpu/check.sh alone, in about 80 s: build, captum from
# .gpu/wheels, the float16 weights (.gpu/minilm16, xz as check.sh takes them) widened to
# /tmp/minilm, one run of MiniLM with every importance on the GPU. From the repository root:
#   bash benchmarks/gpu/minilm.sh   (logs and the run's times under $OUT, default /tmp/gpu-out)
set -u
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
. benchmarks/gpu/env.sh
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a "$OUT/stages.txt"; }
[ -f .gpu/sst.tar.xz ] && [ ! -d .gpu/sst ] && tar xJf .gpu/sst.tar.xz -C .gpu
[ -f .gpu/minilm16/model.safetensors.xz ] && xz -d -T8 .gpu/minilm16/model.safetensors.xz
if ls .gpu/wheels/captum-*.whl > /dev/null 2>&1; then
  python3 -m pip install --no-deps --no-index -q .gpu/wheels/captum-*.whl > "$OUT/pip.log" 2>&1
fi
timeout 150 python3 -c "import attnmetrics._ops as o; o.load(); print('CUDA kernels:', o.CUDA_KERNELS)" > "$OUT/build.log" 2>&1
stamp "build rc=$? $(tail -1 "$OUT/build.log")"
python3 - <<'PY'
import os, shutil
from safetensors.torch import load_file, save_file
os.makedirs("/tmp/minilm", exist_ok=True)
weights = load_file(".gpu/minilm16/model.safetensors")
save_file({k: v.float() if v.is_floating_point() else v for k, v in weights.items()}, "/tmp/minilm/model.safetensors", metadata={"format": "pt"})
for name in os.listdir(".gpu/minilm16"):
    if name != "model.safetensors":
        shutil.copy(f".gpu/minilm16/{name}", "/tmp/minilm/")
PY
timeout 150 python3 -m attnmetrics run --dataset sst --data-dir "${SST:-.gpu/sst}" --model hf:/tmp/minilm --device cuda --epochs 1 \
  --importances all --integrated-gradients 16 --out /tmp/minilm-cuda --no-progress > "$OUT/minilm.log" 2>&1
stamp "MiniLM run (1 epoch, battery with every importance) on cuda rc=$? $(tail -1 "$OUT/minilm.log")"
python3 - > "$OUT/minilm-times.json" <<'PY'
import json
r = json.load(open("/tmp/minilm-cuda/results.json"))
print(json.dumps({k: r[k] for k in ("command", "device", "threads", "versions", "machine", "wall_time_s", "test", "training", "methods") if k in r}, indent=1))
PY
{ nvidia-smi -L; python3 -c "import sys, torch; print(sys.version.split()[0], torch.__version__, torch.cuda.get_device_name(0))"; } > "$OUT/env.txt" 2>&1
stamp done
