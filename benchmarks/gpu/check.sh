#!/usr/bin/env bash
# The GPU check of issue 32: build, the CUDA tests, the SST main job on the GPU, the same
# model's battery on one CPU thread and on the GPU (evaluate), the CUDA benchmarks that matter
# most first, then Python-level profiles of training and the battery. Run from a checkout on a
# GPU machine with the SST files in .gpu/sst (ignored by git): bash benchmarks/gpu/check.sh;
# logs and JSON under $OUT (default /tmp/gpu-out). The torch.profiler view of one training
# epoch: python benchmarks/gpu/profile_training.py (OUT set).
set -u
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
export CXX=/usr/bin/g++ CC=/usr/bin/gcc PYTHONPATH=$PWD PYTHONUNBUFFERED=1 MAX_JOBS=16 \
  TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} TORCH_EXTENSIONS_DIR=/tmp/attnmetrics-ext \
  ATTNMETRICS_CUDA=1 ATTNMETRICS_OFFLINE=1
SST=.gpu/sst
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a "$OUT/stages.txt"; }
{ nvidia-smi -L; nvcc --version | tail -1; $CXX --version | head -1; nproc
  python3 -c "import sys, torch; print(sys.version.split()[0], torch.__version__, torch.cuda.get_device_name(0))"; } > "$OUT/env.txt" 2>&1
timeout 240 python3 -c "import attnmetrics._ops as o; o.load(); print('CUDA kernels:', o.CUDA_KERNELS)" > "$OUT/build.log" 2>&1
stamp "build rc=$? $(tail -1 "$OUT/build.log")"
timeout 150 python3 -m pytest tests -q -rfE --tb=short -p no:cacheprovider -n 8 -m cuda > "$OUT/tests-cuda.log" 2>&1
stamp "tests -m cuda rc=$? $(tail -1 "$OUT/tests-cuda.log")"
timeout 120 python3 -m attnmetrics run --dataset sst --data-dir "$SST" --embeddings random --device cuda \
  --out /tmp/sst-cuda --no-progress > "$OUT/sst.log" 2>&1
stamp "sst main job on cuda rc=$? $(tail -1 "$OUT/sst.log")"
cp /tmp/sst-cuda/results.json "$OUT/sst-cuda-results.json" 2>/dev/null
timeout 60 python3 -m attnmetrics evaluate /tmp/sst-cuda --data-dir "$SST" --device cuda --out /tmp/eval-cuda \
  --no-progress > "$OUT/eval-cuda.log" 2>&1
stamp "battery on cuda (evaluate) rc=$? $(tail -1 "$OUT/eval-cuda.log")"
cp /tmp/eval-cuda/results.json "$OUT/eval-cuda-results.json" 2>/dev/null
OMP_NUM_THREADS=1 timeout 100 python3 -m attnmetrics evaluate /tmp/sst-cuda --data-dir "$SST" --device cpu --threads 1 \
  --out /tmp/eval-cpu --no-progress > "$OUT/eval-cpu.log" 2>&1
stamp "battery on one CPU thread (evaluate) rc=$? $(tail -1 "$OUT/eval-cpu.log")"
cp /tmp/eval-cpu/results.json "$OUT/eval-cpu-results.json" 2>/dev/null
timeout 100 python3 -m pytest benchmarks/test_bench_distances.py benchmarks/test_bench_kendall.py benchmarks/test_bench_eraser.py \
  benchmarks/test_bench_loo.py -q -k cuda -p no:cacheprovider --benchmark-json="$OUT/bench-cuda-1.json" \
  --benchmark-max-time=0.3 --benchmark-min-rounds=3 > "$OUT/bench-1.log" 2>&1
stamp "benchmarks (distances, kendall, eraser, loo) -k cuda rc=$? $(tail -1 "$OUT/bench-1.log")"
timeout 50 python3 -m cProfile -s tottime -m attnmetrics evaluate /tmp/sst-cuda --data-dir "$SST" --device cuda \
  --out /tmp/eval-prof --no-progress 2>&1 | head -70 > "$OUT/profile-battery-cuda.txt"
stamp "profile battery"
timeout 45 python3 -m cProfile -s tottime -m attnmetrics train --dataset sst --data-dir "$SST" --embeddings random \
  --device cuda --epochs 1 --out /tmp/train-prof --no-progress 2>&1 | head -70 > "$OUT/profile-train-cuda.txt"
stamp "profile training (1 epoch)"
left=$(( 430 - ($(date +%s) - T0) ))
if [ "$left" -gt 30 ]; then
  timeout "$left" python3 -m pytest benchmarks -q -k cuda -p no:cacheprovider --benchmark-json="$OUT/bench-cuda-2.json" \
    --benchmark-max-time=0.3 --benchmark-min-rounds=3 \
    --deselect benchmarks/test_bench_distances.py --deselect benchmarks/test_bench_kendall.py \
    --deselect benchmarks/test_bench_eraser.py --deselect benchmarks/test_bench_loo.py > "$OUT/bench-2.log" 2>&1
  stamp "other benchmarks -k cuda rc=$? $(tail -1 "$OUT/bench-2.log")"
fi
stamp "done"
