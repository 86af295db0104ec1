#!/usr/bin/env bash
# Issue 26 on one GPU host without network, in one device command (as run on the lent H200):
#   1. pytest -m gpu -k static: graph capture per bucket and replay = the engine's tokens (stops here if red);
#   2. the gpu demo pair (draftlab demo-models --size gpu --device cuda), unless resources/demo/gpu exists;
#   3. benchmarks/server_batching.py: the builtin server (static cache + graphs) at concurrency 1 vs 8;
#   4. benchmarks/server_batching.py --single-stream: concurrency 1 in-process, Engine.generate (dynamic
#      cache, eager) vs the static decoder with its CUDA graphs, plain and speculative, and the memory floor.
# draftlab runs from ./src through PYTHONPATH (the image has torch and transformers). Results and logs go
# to ${OUT:-/tmp/gpu26-out}; one line per step in $OUT/steps.log.
set -uo pipefail
OUT=${OUT:-/tmp/gpu26-out}
BUDGET=${BUDGET:-480}
START=$(date +%s)
mkdir -p "$OUT"
left() { echo $((BUDGET - ($(date +%s) - START))); }
log() { echo "[gpu26 $(date -u +%H:%M:%S) +$(( $(date +%s) - START ))s] $*" | tee -a "$OUT/steps.log"; }
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
log "$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader)"
python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)' \
  2>&1 | tee -a "$OUT/steps.log"

t0=$(date +%s)
timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu.py -k "static or engine_greedy" \
  > "$OUT/pytest_gpu.log" 2>&1
rc=$?
log "pytest -m gpu -k static: rc $rc in $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/pytest_gpu.log")"
[ $rc -eq 0 ] || { tail -60 "$OUT/pytest_gpu.log"; exit $rc; }

t0=$(date +%s)
mkdir -p resources/demo
if [ ! -f resources/demo/gpu/demo.json ]; then  # demo-models writes only into a folder of its own: JSON beside it
  timeout 300 python3 -m draftlab.cli demo-models --out resources/demo/gpu --size gpu --device cuda --threads 2 --json \
    > resources/demo/gpu-demo.json.tmp 2> /tmp/demo_gpu.log && mv resources/demo/gpu-demo.json.tmp resources/demo/gpu/demo.json
  log "demo-models --size gpu --device cuda: rc $? in $(( $(date +%s) - t0 )) s"
  [ -f resources/demo/gpu/demo.json ] || tail -20 /tmp/demo_gpu.log
fi

t0=$(date +%s)
timeout $(( $(left) - 90 )) python3 benchmarks/server_batching.py --device cuda --size gpu --prompts 16 --max-new 128 \
  --out "$OUT/server_batching_gpu.json" > /dev/null 2> "$OUT/server_batching_gpu.log"
log "server_batching.py: rc $? in $(( $(date +%s) - t0 )) s: $(grep -E '^(plain|speculative):' "$OUT/server_batching_gpu.log" | tr '\n' ' ')"
t0=$(date +%s)
timeout $(( $(left) - 5 )) python3 benchmarks/server_batching.py --single-stream --device cuda --size gpu --prompts 4 \
  --max-new 128 --rounds 2 --arms scheduler_static --out "$OUT/single_stream_gpu.json" > /dev/null 2> "$OUT/single_stream_gpu.log"
log "server_batching.py --single-stream: rc $? in $(( $(date +%s) - t0 )) s: $(grep -E '^(plain|speculative):' "$OUT/single_stream_gpu.log" | tr '\n' ' ')"

grep -h "CUDA graphs" "$OUT"/*.log 2>/dev/null | sort | uniq -c | tee -a "$OUT/steps.log"
