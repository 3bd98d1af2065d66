#!/usr/bin/env bash
# The methods tables over three seeds on one GPU (issues 28 and 29): the MiniLM sweep
# (configs/minilm-methods.toml) beside the small GPT's pre-training on the Gutenberg books, then the
# GPT sweep (configs/gpt-methods.toml) on that checkpoint. Offline: the model is read from
# /tmp/minilm (benchmarks/gpu/check.sh writes it from .gpu/minilm16), the books from $CORPUS (a
# folder of UTF-8 .txt files: load_gutenberg's books written out), SST from $SST.
#   SST=DIR CORPUS=DIR bash benchmarks/gpu/methods.sh
# Sweep folders under /tmp/methods, logs and stages under $OUT (default /tmp/gpu-out).
set -u
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
. benchmarks/gpu/env.sh
export OMP_NUM_THREADS=2
SST=${SST:-.gpu/sst}
CORPUS=${CORPUS:-/tmp/gutenberg}
STEPS=${STEPS:-5000}
BUDGET=${BUDGET:-330}  # seconds for both sweeps, the pre-training included
W=/tmp/methods
mkdir -p "$W"
T0=$(date +%s)
stamp() { echo "[methods $(( $(date +%s) - T0 )) s] $*" | tee -a "$OUT/stages.txt"; }
left() { local l=$(( BUDGET - ($(date +%s) - T0) )); echo $(( l > 5 ? l : 5 )); }

sed -e 's|^out = .*|out = "/tmp/methods/minilm"|' -e 's|^model = .*|model = "hf:/tmp/minilm"|' \
  configs/minilm-methods.toml > "$W/minilm.toml"
sed -e 's|^out = .*|out = "/tmp/methods/gpt"|' -e 's|^pretrained = .*|pretrained = "/tmp/methods/gpt-pre"|' \
  configs/gpt-methods.toml > "$W/gpt.toml"

timeout "$(left)" python3 -m attnmetrics sweep "$W/minilm.toml" --data-dir sst="$SST" > "$OUT/minilm-sweep.log" 2>&1 &
MINILM=$!
timeout $(( $(left) < 130 ? $(left) : 130 )) python3 -m attnmetrics pretrain --corpus "$CORPUS" --device cuda --steps "$STEPS" --batch-size 32 \
  --out "$W/gpt-pre" --no-progress > "$OUT/gpt-pretrain.log" 2>&1
stamp "GPT pre-training rc=$? $(tail -1 "$OUT/gpt-pretrain.log")"
timeout "$(left)" python3 -m attnmetrics sweep "$W/gpt.toml" --data-dir sst="$SST" > "$OUT/gpt-sweep.log" 2>&1
stamp "GPT sweep rc=$? $(tail -1 "$OUT/gpt-sweep.log")"
wait $MINILM
stamp "MiniLM sweep rc=$? $(tail -1 "$OUT/minilm-sweep.log")"
# the sweeps' reports and run folders (less the models' weights), one archive each, split in parts of 15 MiB
# (the device tool brings back files of at most 16 MiB, 64 MiB a call: fetch what is left in another call;
# reassemble with `cat NAME.tgz.part-* | tar xzf -`)
for name in minilm gpt; do
  tar czf "$W/$name.tgz" -C "$W" --exclude='*.safetensors' --exclude='*.pt' --exclude='*.bin' \
    --exclude='*.tokens' "$name" $([ $name = gpt ] && echo gpt-pre) 2>> "$OUT/stages.txt"
  split -b 15M "$W/$name.tgz" "$OUT/$name.tgz.part-"
done
stamp "packed $(du -h "$W"/minilm.tgz "$W"/gpt.tgz | cut -f1 | tr '\n' ' ')"
