#!/usr/bin/env bash
# Issues 22, 23 and 26 on one GPU host without network (as run on the lent H200), in the background so
# that it can outlast one device command:
#   bash benchmarks/gpu_issue22.sh start    # setsid: the steps below, one after the other
#   bash benchmarks/gpu_issue22.sh wait N   # wait up to N s for it, then pack what there is into $OUT
# Steps, most wanted first (each logs one line to steps.log; a later step runs even if one fails):
#  1. benchmarks/static_decode_gpu.py: plain decode at concurrency 1 and 8 and the speculative cycle through
#     the static decoder's CUDA graphs, fused layers against transformers' own (issue 26's 400 tok/s);
#  2. pytest -m gpu tests/test_gpu.py: graphs replay token-identically, fp32 and bf16;
#  3. snakemake --profile gpu1 --configfile config/demo-gpu.yaml all from clean (the decision, the paired
#     intervals, the recommendation; the pipeline's wall time, goal <= 8 min);
#  3b. benchmarks/drafter_levers.py --serve: that run's arms served in process at k = 3, on the bench's prompts
#     and on the demo's held-out prompts (the target's own domain);
#  4. with CHAIN=1 (the default): benchmarks/chain_prediction.py on CUDA on the demo pair that run built
#     (predicted vs measured k = 1..4);
#  5. benchmarks/gpu_specforge.sh: SpecForge 0.2.0 trains the keep arm offline on that run's features (issue 23),
#     once $SF_WHEELS/READY exists (up to SF_WAIT s: the wheels may come with a later device call);
#  6. with SERVER_BATCHING=1: benchmarks/server_batching.py on CUDA (concurrency 1 vs 8 through the server).
# Wheels for what the image lacks (snakemake 9 and its deps) are read from ${WHEELS:-.whl}, SpecForge's
# from ${SF_WHEELS:-.whl-sf}.
set -uo pipefail
WORK=${WORK:-/tmp/gpu22}
WHEELS=${WHEELS:-.whl}
mode=${1:-start}
. benchmarks/gpu_env.sh
[ "$mode" = run ] || gpu_background "$mode" "${2:-300}" "$0" gpu22.tar.gz

# mode run: the work itself
gpu_job_begin gpu22
log "$(python3 -c 'import torch, transformers, snakemake; print("torch", torch.__version__, "transformers", transformers.__version__, "snakemake", snakemake.__version__)' 2>&1)"

t0=$(date +%s)
timeout 240 python3 benchmarks/static_decode_gpu.py --device cuda > "$WORK/static_decode_gpu.json" 2> "$WORK/static_decode_gpu.log"
log "static_decode_gpu.py: rc $? in $(( $(date +%s) - t0 )) s: $(python3 -c "import json; d=json.load(open('$WORK/static_decode_gpu.json')); print({k: (d[k]['static_plain_c1_tok_s'], d[k]['c8_over_c1'], d[k]['t_cycle_c1_ms'], d[k]['kernels_per_plain_step'], d[k]['kernels_per_spec_cycle']) for k in ('fused', 'unfused')})" 2>&1 | tail -1)"

t0=$(date +%s)
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -k "static or engine_greedy" tests/test_gpu.py > "$WORK/pytest_gpu.log" 2>&1
log "pytest -m gpu: rc $? in $(( $(date +%s) - t0 )) s: $(tail -1 "$WORK/pytest_gpu.log")"

rm -rf results/demo-gpu resources/demo/gpu .snakemake
t0=$(date +%s)
python3 -m snakemake all --profile gpu1 --configfile config/demo-gpu.yaml > "$WORK/full.log" 2>&1
log "snakemake --profile gpu1 --configfile config/demo-gpu.yaml all: rc $? in $(( $(date +%s) - t0 )) s"
r=results/demo-gpu
tar czf "$WORK/demo-gpu-results.tar.gz" --ignore-failed-read $r/report $r/records $r/gate $r/bench/*/*/*.json \
  $r/train/*/summary.json $r/train/*/validation.json $r/benchmarks $r/logs resources/demo/gpu/manifest.json 2>/dev/null
log "results packed"

t0=$(date +%s)
arms=$(for d in $r/train/*/drafter; do a=${d#$r/train/}; echo "${a%/drafter}=$d"; done)
for prompts in "" resources/demo/gpu/work/data/heldout.jsonl; do
  name=${prompts:+heldout}
  timeout 120 python3 benchmarks/drafter_levers.py --configfile config/demo-gpu.yaml --ks 3 --serve $arms \
    ${prompts:+--prompts $prompts} --out "$WORK/arms_served${name:+_$name}.json" > /dev/null 2>> "$WORK/arms_served.log"
  log "drafter_levers.py --serve (${name:-bench prompts}): rc $?: $(grep -h "levers:" "$WORK/arms_served.log" | tail -4 | tr '\n' ' ')"
done
log "in-process serving of the arms: $(( $(date +%s) - t0 )) s"

if [ "${CHAIN:-1}" = 1 ]; then
t0=$(date +%s)
timeout 180 python3 benchmarks/chain_prediction.py --demo resources/demo/gpu --device cuda --max-k 4 --limit 6 \
  --max-new-tokens 128 --repeats 2 --threads 0 --out "$WORK/chain_gpu.json" > "$WORK/chain_gpu.log" 2>&1
log "chain_prediction.py --device cuda: rc $? in $(( $(date +%s) - t0 )) s"
fi

# SpecForge's wheels may arrive with a later device call (the steps above take ~15 min): wait for them
SF_WHEELS=${SF_WHEELS:-.whl-sf}
t0=$(date +%s)
while [ ! -f "$SF_WHEELS/READY" ] && [ $(( $(date +%s) - t0 )) -lt "${SF_WAIT:-600}" ]; do sleep 5; done
t0=$(date +%s)
OUT=$WORK/specforge WHEELS=$WHEELS SF_WHEELS=$SF_WHEELS timeout 420 bash benchmarks/gpu_specforge.sh \
  > "$WORK/specforge.log" 2>&1
log "gpu_specforge.sh: rc $? in $(( $(date +%s) - t0 )) s: $(grep -E 'steps/s|eval-drafter|import-specforge' "$WORK/specforge/steps.log" 2>/dev/null | tr '\n' ' ')"

if [ -n "${SERVER_BATCHING:-}" ]; then
t0=$(date +%s)
timeout 200 python3 benchmarks/server_batching.py --device cuda --size gpu --prompts 16 --max-new 128 \
  --out "$WORK/server_batching_gpu.json" > /dev/null 2> "$WORK/server_batching_gpu.log"
log "server_batching.py --device cuda: rc $? in $(( $(date +%s) - t0 )) s: $(grep -E '^(plain|speculative):' "$WORK/server_batching_gpu.log" | tr '\n' ' ')"
fi
log "done"
touch "$WORK/done"
