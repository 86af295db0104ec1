#!/usr/bin/env bash
# Issues 22 and 26 on one GPU host without network (as run on the lent H200), in the background so that
# it can outlast one device command:
#   bash benchmarks/gpu_issue22.sh start    # setsid: the whole loop from clean, then the benchmarks below
#   bash benchmarks/gpu_issue22.sh wait N   # wait up to N s for it, then pack what there is into $OUT
# Steps: 1. snakemake --profile gpu1 --configfile config/demo-gpu.yaml all from clean (the decision, the
# paired intervals, the recommendation; the pipeline's wall time); 2. benchmarks/chain_prediction.py on
# CUDA on the demo pair that run built (predicted vs measured k = 1..4); 3. benchmarks/server_batching.py
# on CUDA (concurrency 1 vs 8 through the builtin server, static cache + CUDA graphs).
# Wheels for what the image lacks (snakemake 9 and its deps) are read from ${WHEELS:-.whl}.
set -uo pipefail
WORK=${WORK:-/tmp/gpu22}
WHEELS=${WHEELS:-.whl}
mode=${1:-start}

if [ "$mode" = start ]; then
  rm -rf "$WORK" && mkdir -p "$WORK"
  setsid nohup bash "$0" run > "$WORK/run.log" 2>&1 < /dev/null &
  echo "started pid $!"
  exit 0
fi

if [ "$mode" = wait ]; then
  deadline=$(( $(date +%s) + ${2:-300} ))
  while [ ! -f "$WORK/done" ] && [ "$(date +%s)" -lt "$deadline" ]; do sleep 5; done
  [ -f "$WORK/done" ] && echo "finished" || echo "still running"
  cat "$WORK/steps.log" 2>/dev/null
  tar czf "$OUT/gpu22.tar.gz" -C "$WORK" --exclude='*.tar.gz.tmp' . 2>/dev/null
  cp "$WORK/steps.log" "$OUT/" 2>/dev/null
  exit 0
fi

# mode run: the work itself
OUT=$WORK
START=$(date +%s)
log() { echo "[gpu22 $(date -u +%H:%M:%S) +$(( $(date +%s) - START ))s] $*" >> "$WORK/steps.log"; }
. "$(dirname "$0")/gpu_env.sh"
gpu_env || { log "wheel install failed: $(tail -3 "$WORK/pip.log")"; touch "$WORK/done"; exit 1; }
log "$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader)"
log "$(python3 -c 'import torch, transformers, snakemake; print("torch", torch.__version__, "transformers", transformers.__version__, "snakemake", snakemake.__version__)' 2>&1)"

rm -rf results/demo-gpu resources/demo/gpu .snakemake
t0=$(date +%s)
python3 -m snakemake all --profile gpu1 --configfile config/demo-gpu.yaml > "$WORK/full.log" 2>&1
log "snakemake --profile gpu1 --configfile config/demo-gpu.yaml all: rc $? in $(( $(date +%s) - t0 )) s"
r=results/demo-gpu
tar czf "$WORK/demo-gpu-results.tar.gz" --ignore-failed-read $r/report $r/records $r/gate $r/bench/*/*/*.json \
  $r/train/*/summary.json $r/train/*/validation.json $r/benchmarks $r/logs 2>/dev/null
log "results packed"

t0=$(date +%s)
timeout 240 python3 benchmarks/chain_prediction.py --demo resources/demo/gpu --device cuda --max-k 4 --limit 12 \
  --max-new-tokens 128 --repeats 5 --threads 0 --out "$WORK/chain_gpu.json" > "$WORK/chain_gpu.log" 2>&1
log "chain_prediction.py --device cuda: rc $? in $(( $(date +%s) - t0 )) s"

t0=$(date +%s)
timeout 200 python3 benchmarks/server_batching.py --device cuda --size gpu --prompts 16 --max-new 128 \
  --out "$WORK/server_batching_gpu.json" > /dev/null 2> "$WORK/server_batching_gpu.log"
log "server_batching.py --device cuda: rc $? in $(( $(date +%s) - t0 )) s: $(grep -E '^(plain|speculative):' "$WORK/server_batching_gpu.log" | tr '\n' ' ')"
log "done"
touch "$WORK/done"
