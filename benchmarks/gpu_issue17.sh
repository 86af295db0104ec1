#!/usr/bin/env bash
# Issue 17 on one GPU host without network, in one device command (as run on the lent H200):
#   1. the gpu demo pair (draftlab demo-models --size gpu --device cuda), timed;
#   2. benchmarks/server_batching.py: the builtin server at concurrency 1 vs 8, plain and speculative;
#   3. benchmarks/generate_data.py: generate-data through the builtin server vs the engine's own batched
#      loop (64 in flight), and SIGKILL/resume;
#   4. with the time left: the smoke-size loop through the gpu1 profile (generate_data through the
#      builtin server on CUDA inside the pipeline).
# Wheels for what the host's image lacks (snakemake 9 and its deps) are read from ${WHEELS:-.whl};
# draftlab runs from ./src through PYTHONPATH. Results and logs go to ${OUT:-/tmp/gpu17-out}.
set -uo pipefail
OUT=${OUT:-/tmp/gpu17-out}
WHEELS=${WHEELS:-.whl}
BUDGET=${BUDGET:-570}
START=$(date +%s)
mkdir -p "$OUT"
left() { echo $((BUDGET - ($(date +%s) - START))); }
log() { echo "[gpu17 $(date -u +%H:%M:%S) +$(( $(date +%s) - START ))s] $*" | tee -a "$OUT/steps.log"; }

. "$(dirname "$0")/gpu_env.sh"
EXTRA_PYTHONPATH=$PWD/benchmarks gpu_env || { log "wheel install failed (the smoke loop needs them)"; tail -5 "$OUT/pip.log"; }
log "$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader)"
python3 -c 'import torch, transformers, draftlab; print("torch", torch.__version__, "transformers", transformers.__version__, "cuda", torch.cuda.is_available())' 2>&1 | tee -a "$OUT/steps.log"

t0=$(date +%s)
mkdir -p resources/demo
if [ ! -f resources/demo/gpu/demo.json ]; then  # demo-models writes only into a folder of its own: JSON beside it
  timeout 300 draftlab demo-models --out resources/demo/gpu --size gpu --device cuda --threads 2 --json \
    > resources/demo/gpu-demo.json.tmp 2> "$OUT/demo_gpu.log" && mv resources/demo/gpu-demo.json.tmp resources/demo/gpu/demo.json
  log "demo-models --size gpu --device cuda: rc $? in $(( $(date +%s) - t0 )) s"
fi

t0=$(date +%s)
timeout 100 python3 benchmarks/server_batching.py --device cuda --size gpu --prompts 16 --max-new 128 \
  --out "$OUT/server_batching_gpu.json" > /dev/null 2> "$OUT/server_batching_gpu.log"
log "server_batching.py: rc $? in $(( $(date +%s) - t0 )) s: $(grep -E '^(plain|speculative):' "$OUT/server_batching_gpu.log" | tr '\n' ' ')"

t0=$(date +%s)
timeout 150 python3 benchmarks/generate_data.py --device cuda --size gpu --prompts ${GEN_PROMPTS:-256} --concurrency 64 --max-new 128 --trials ${GEN_TRIALS:-2} \
  --kills 5 --out "$OUT/generate_data_gpu.json" > /dev/null 2> "$OUT/generate_data_gpu.log"
log "generate_data.py: rc $? in $(( $(date +%s) - t0 )) s"

if [ "${SMOKE_LOOP:-1}" = 1 ] && [ "$(left)" -gt 90 ]; then
  t0=$(date +%s)
  rm -rf results/demo-gpu-smoke resources/demo/smoke .snakemake
  timeout $(( $(left) - 20 )) python3 -m snakemake all --profile gpu1 --configfile config/demo-gpu.yaml \
    --config size=smoke > "$OUT/smoke_loop.log" 2>&1
  log "smoke loop (gpu1, demo-gpu, size=smoke): rc $? in $(( $(date +%s) - t0 )) s"
  cp results/demo-gpu-smoke/data/generate-stats.json "$OUT/smoke_generate_stats.json" 2>/dev/null
  cp results/demo-gpu-smoke/report/summary.md "$OUT/smoke_summary.md" 2>/dev/null
  tail -n +1 results/demo-gpu-smoke/benchmarks/*.tsv > "$OUT/smoke_job_seconds.txt" 2>/dev/null
fi
log "done"
