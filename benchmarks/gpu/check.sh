#!/usr/bin/env bash
# The GPU check of issue 32, in about 5 minutes: build, the CUDA tests, the SST main job on the GPU
# and (in the background, one thread) on the same machine's CPU, the same model's battery on the GPU
# and on one CPU thread (evaluate), the MiniLM battery on the GPU (when .gpu/minilm16 holds
# all-MiniLM-L6-v2's folder, its weights stored as float16 to fit the device tool's carry limit and
# widened back to float32 here), then the CUDA benchmarks of the distances and Kendall τ.
# Run from a checkout on a GPU machine with the SST files in .gpu/sst (ignored by git):
#   bash benchmarks/gpu/check.sh
# Logs and JSON under $OUT (default /tmp/gpu-out), also packed into $OUT/all.tgz. Optional:
# .gpu/wheels/captum-*.whl is installed (--no-deps) for the MiniLM battery's integrated gradients;
# SST=DIR reads the SST files from DIR; CHECK_CPU=0 skips the CPU side (the main job and battery on
# one CPU thread), CHECK_MINILM=0 the MiniLM battery (its widened weights are still written to /tmp/minilm).
# With captum installed, benchmarks/gpu/peers_cuda.py runs last (CHECK_PEERS=0 skips it).
# The tree and the carried files must stay under 64 MiB together: .gpu/sst.tar.xz and
# .gpu/minilm16/model.safetensors.xz (xz of the float16 file) are unpacked by prepare.sh when present;
# the MiniLM stage is benchmarks/gpu/minilm.sh.
# The device tool returns at most 8 files: everything is also in $OUT/all.tgz.
# Back here: python benchmarks/gpu/collect.py <the unpacked all.tgz> --commit <short hash> writes
# benchmarks/results/gpu-check-<gpu>-<date>-<commit>.json and cuda-<gpu>-<date>-<commit>.json.
# The torch.profiler view of 40 training steps: python benchmarks/gpu/profile_training.py (OUT set).
set -u
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
. benchmarks/gpu/env.sh
SST=${SST:-.gpu/sst}
CHECK_PEERS=${CHECK_PEERS:-1}
. benchmarks/gpu/prepare.sh
CHECK_CPU=${CHECK_CPU:-1}
CHECK_MINILM=${CHECK_MINILM:-1}
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a "$OUT/stages.txt"; }
{ nvidia-smi -L; nvcc --version | tail -1; $CXX --version | head -1; nproc; lscpu | grep -m1 "Model name"
  python3 -c "import sys, torch; print(sys.version.split()[0], torch.__version__, torch.cuda.get_device_name(0))"; } > "$OUT/env.txt" 2>&1
timeout 240 python3 -c "import attnmetrics._ops as o; o.load(); print('CUDA kernels:', o.CUDA_KERNELS)" > "$OUT/build.log" 2>&1
stamp "build rc=$? $(tail -1 "$OUT/build.log")"
timeout 100 python3 -m pytest tests -q -rfE --tb=short -p no:cacheprovider -n 8 -m cuda > "$OUT/tests-cuda.log" 2>&1
stamp "tests -m cuda rc=$? $(tail -1 "$OUT/tests-cuda.log")"
# the same main job on one CPU thread of this machine, beside the GPU stages (one core of many)
CPU_JOB=
[ "$CHECK_CPU" = 1 ] && ( OMP_NUM_THREADS=1 timeout 400 python3 -m attnmetrics run --dataset sst --data-dir "$SST" --embeddings random \
    --device cpu --threads 1 --out /tmp/sst-cpu --no-progress > "$OUT/sst-cpu.log" 2>&1
  echo "rc=$?" >> "$OUT/sst-cpu.log"; cp /tmp/sst-cpu/results.json "$OUT/sst-cpu-results.json" 2>/dev/null ) &
CPU_JOB=$!
timeout 120 python3 -m attnmetrics run --dataset sst --data-dir "$SST" --embeddings random --device cuda \
  --out /tmp/sst-cuda --no-progress > "$OUT/sst.log" 2>&1
stamp "sst main job on cuda rc=$? $(tail -1 "$OUT/sst.log")"
cp /tmp/sst-cuda/results.json "$OUT/sst-cuda-results.json" 2>/dev/null
timeout 60 python3 -m attnmetrics evaluate /tmp/sst-cuda --data-dir "$SST" --device cuda --out /tmp/eval-cuda \
  --no-progress > "$OUT/eval-cuda.log" 2>&1
stamp "battery on cuda (evaluate) rc=$? $(tail -1 "$OUT/eval-cuda.log")"
cp /tmp/eval-cuda/results.json "$OUT/eval-cuda-results.json" 2>/dev/null
if [ "$CHECK_CPU" = 1 ]; then
  OMP_NUM_THREADS=1 timeout 100 python3 -m attnmetrics evaluate /tmp/sst-cuda --data-dir "$SST" --device cpu --threads 1 \
    --out /tmp/eval-cpu --no-progress > "$OUT/eval-cpu.log" 2>&1
  stamp "battery on one CPU thread (evaluate) rc=$? $(tail -1 "$OUT/eval-cpu.log")"
  cp /tmp/eval-cpu/results.json "$OUT/eval-cpu-results.json" 2>/dev/null
fi
if [ -f /tmp/minilm/model.safetensors ] && [ "$CHECK_MINILM" = 1 ]; then
  OUT="$OUT" SST="$SST" bash benchmarks/gpu/minilm.sh
  cp /tmp/minilm-cuda/results.json "$OUT/minilm-cuda-results.json" 2>/dev/null
fi
timeout 60 python3 -m pytest benchmarks/test_bench_distances.py benchmarks/test_bench_kendall.py -q -k cuda -p no:cacheprovider \
  --benchmark-json="$OUT/bench-cuda.json" --benchmark-max-time=0.3 --benchmark-min-rounds=3 > "$OUT/bench.log" 2>&1
stamp "benchmarks (distances, kendall) -k cuda rc=$? $(tail -1 "$OUT/bench.log")"
if [ "$CHECK_CPU" = 1 ]; then
  left=$(( 330 - ($(date +%s) - T0) ))
  timeout "$(( left > 5 ? left : 5 ))" tail --pid=$CPU_JOB -f /dev/null || pkill -f "/tmp/sst-cpu --no-progress"
  stamp "sst main job on one CPU thread: $(tail -2 "$OUT/sst-cpu.log" | tr '\n' ' ')"
fi
if [ "$CHECK_PEERS" = 1 ] && [ -f /tmp/minilm/model.safetensors ] && python3 -c "import captum" 2> /dev/null; then
  timeout 110 python3 benchmarks/gpu/peers_cuda.py /tmp/minilm "$SST" "$OUT/peers-cuda.json" > "$OUT/peers.log" 2>&1
  stamp "peers (leave-one-out, integrated gradients against Captum) rc=$? $(tail -1 "$OUT/peers.log")"
fi
tar czf /tmp/all.tgz -C "$OUT" . && mv /tmp/all.tgz "$OUT/all.tgz"
stamp "done"
