#!/usr/bin/env bash
# SmolLM2-135M-Instruct on one GPU (issue 46, items 6 and 7), offline, in about BUDGET seconds: the decoder
# path's CUDA tests (tests/test_llm_cuda.py), then configs/smollm2-sst-gpu.toml (the SST battery with every
# method on the whole test split through three prompt templates): the first template alone, so its wall
# time is the battery's on one otherwise idle GPU, then the other two at once, then the sweep's report.
# With CPU_CELL=1, beside them on the machine's CPU cores (one thread a rank), the CPU config's cell
# battery/sst-prompted-s0-psentiment-plain (configs/smollm2-sst.toml) through torchrun: its finished
# --resumable blocks come back and continue on any machine (the same flags, weights and instances). Each
# rank computes whole blocks of 32 sentences (about 500 s of one thread): on 2026-11-29, 10 ranks finished
# none in 440 s, so it is off by default.
# From a checkout with .gpu/ laid out (prepare.sh: SST, the gguf and captum wheels, the GGUF in parts,
# .gpu/gguf.sha256):
#   BUDGET=470 bash benchmarks/gpu/smollm2.sh      (logs and archives under $OUT, default /tmp/gpu-out)
# Back here: tar xzf smollm2.tgz (split in parts of 15 MiB: cat smollm2.tgz.part-* | tar xzf -).
set -u
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
. benchmarks/gpu/env.sh
. benchmarks/gpu/prepare.sh
BUDGET=${BUDGET:-470}; CPU_CELL=${CPU_CELL:-0}; RANKS=${RANKS:-10}
T0=$(date +%s)
stamp() { echo "[smollm2 $(( $(date +%s) - T0 )) s] $*" | tee -a "$OUT/stages.txt"; }
left() { local l=$(( BUDGET - ($(date +%s) - T0) )); echo $(( l > 5 ? l : 5 )); }
# the SST folder (its path is not in --resumable's fingerprint: blocks made here continue elsewhere)
SST=$(realpath "${SST:-.gpu/sst}")
{ nvidia-smi -L; python3 -c "import sys, torch, transformers; print(sys.version.split()[0], torch.__version__, transformers.__version__, torch.cuda.get_device_name(0))"
  nproc; lscpu | grep -m1 "Model name"; ls -l "$SMOL_GGUF"; echo "SST=$SST"; } > "$OUT/env.txt" 2>&1
timeout 200 python3 -c "import attnmetrics._ops as o; o.load(); print('CUDA kernels:', o.CUDA_KERNELS)" > "$OUT/build.log" 2>&1
stamp "build rc=$? $(tail -1 "$OUT/build.log")"
W=/tmp/smol
mkdir -p $W
CPU_JOB=
if [ "$CPU_CELL" = 1 ]; then
  CMD=$(python3 -m attnmetrics sweep configs/smollm2-sst.toml --data-dir sst=$SST --out $W/cpu --dry-run 2> /dev/null \
    | awk -F'\t' '$2 == "battery/sst-prompted-s0-psentiment-plain" {print $3}')
  mkdir -p $W/cpu/battery
  ( OMP_NUM_THREADS=1 timeout "$(( $(left) - 30 ))" python3 -m torch.distributed.run --standalone --nproc-per-node "$RANKS" \
      -m attnmetrics $CMD > "$OUT/cpu-cell.log" 2>&1; echo "rc=$?" >> "$OUT/cpu-cell.log" ) &
  CPU_JOB=$!
  stamp "CPU cell started ($RANKS ranks): $CMD"
fi
timeout 90 python3 -m pytest tests/test_llm_cuda.py -q -rfE --tb=short -p no:cacheprovider -n 4 > "$OUT/tests-llm-cuda.log" 2>&1
stamp "tests/test_llm_cuda.py rc=$? $(tail -1 "$OUT/tests-llm-cuda.log")"
sed -e 's|^prompts = .*|prompts = ["sentiment"]|' configs/smollm2-sst-gpu.toml > $W/first.toml
timeout "$(( $(left) < 300 ? $(left) : 300 ))" python3 -m attnmetrics sweep $W/first.toml --data-dir sst=$SST --out $W/gpu \
  --jobs 1 --no-progress > "$OUT/gpu-first.log" 2>&1
stamp "GPU sweep, first template alone rc=$? $(tail -1 "$OUT/gpu-first.log")"
timeout "$(( $(left) - 35 ))" python3 -m attnmetrics sweep configs/smollm2-sst-gpu.toml --data-dir sst=$SST --out $W/gpu \
  --jobs 2 --no-progress > "$OUT/gpu-rest.log" 2>&1
stamp "GPU sweep, the other two templates at once rc=$? $(tail -1 "$OUT/gpu-rest.log")"
timeout 25 python3 -m attnmetrics sweep configs/smollm2-sst-gpu.toml --data-dir sst=$SST --out $W/gpu --report-only \
  > "$OUT/gpu-report.log" 2>&1
stamp "GPU sweep report rc=$? $(tail -1 "$OUT/gpu-report.log")"
if [ -n "$CPU_JOB" ]; then
  wait $CPU_JOB
  stamp "CPU cell: $(tail -2 "$OUT/cpu-cell.log" | tr '\n' ' ') blocks: $(ls $W/cpu/battery/.*.battery 2> /dev/null | grep -c npz)"
fi
W=$W python3 - > "$OUT/times.json" 2>&1 <<'PY'
import glob, json, os
keys = ("command", "device", "threads", "versions", "machine", "wall_time_s", "test")
runs = glob.glob(os.environ["W"] + "/gpu/battery/*/results.json")
print(json.dumps({p: {k: json.load(open(p)).get(k) for k in keys} for p in runs}, indent=1))
PY
tar czf $W/smollm2.tgz -C $W --exclude='*.safetensors' gpu cpu 2>> "$OUT/stages.txt"
split -b 15M $W/smollm2.tgz "$OUT/smollm2.tgz.part-"
stamp "packed $(du -h $W/smollm2.tgz | cut -f1)"
