#!/usr/bin/env bash
# The MiniLM stage of benchmarks/gpu/check.sh, which calls it, or alone (about 80 s): the build
# (cached), then one run of all-MiniLM-L6-v2 on SST with every importance on the GPU, its weights
# and Captum laid out by prepare.sh. From the repository root:
#   bash benchmarks/gpu/minilm.sh   (logs and the run's times under $OUT, default /tmp/gpu-out)
set -u
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
. benchmarks/gpu/env.sh
. benchmarks/gpu/prepare.sh
T0=$(date +%s)
stamp() { echo "[minilm $(( $(date +%s) - T0 )) s] $*" | tee -a "$OUT/stages.txt"; }
[ -f "$OUT/env.txt" ] || { nvidia-smi -L
  python3 -c "import sys, torch; print(sys.version.split()[0], torch.__version__, torch.cuda.get_device_name(0))"; } > "$OUT/env.txt" 2>&1
timeout 150 python3 -c "import attnmetrics._ops as o; o.load(); print('CUDA kernels:', o.CUDA_KERNELS)" > "$OUT/minilm-build.log" 2>&1
stamp "build rc=$? $(tail -1 "$OUT/minilm-build.log")"
timeout 150 python3 -m attnmetrics run --dataset sst --data-dir "${SST:-.gpu/sst}" --model hf:/tmp/minilm --device cuda --epochs 1 \
  --importances all --integrated-gradients 16 --out /tmp/minilm-cuda --no-progress > "$OUT/minilm.log" 2>&1
stamp "MiniLM run (1 epoch, battery with every importance) on cuda rc=$? $(tail -1 "$OUT/minilm.log")"
python3 - > "$OUT/minilm-times.json" 2>&1 <<'PY'
import json
r = json.load(open("/tmp/minilm-cuda/results.json"))
keys = ("command", "device", "threads", "versions", "machine", "wall_time_s", "test", "training", "methods")
print(json.dumps({k: r[k] for k in keys if k in r}, indent=1))
PY
