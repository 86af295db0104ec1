#!/usr/bin/env bash
# The demo-gpu loop from clean on one GPU host without network (as run on the lent H200), in the background
# so that it can outlast one device command:
#   bash benchmarks/gpu_loop_bg.sh start    # setsid: snakemake all --profile gpu1 --configfile config/demo-gpu.yaml
#   bash benchmarks/gpu_loop_bg.sh wait N   # wait up to N s for it, then pack the run's record into $OUT
# then the static decoder's GPU tests (pytest -m gpu -k "static or engine_greedy").
# LOOP_CONFIG (optional) is passed as snakemake --config, e.g. a tree setting beside the chain:
#   LOOP_CONFIG='speculative=[{num_steps: 3, topk: 1, num_draft_tokens: 4}, {num_steps: 3, topk: 4, num_draft_tokens: 8}]'
# Wheels for what the image lacks (snakemake 9 and its deps) are read from ${WHEELS:-.whl}.
set -uo pipefail
WORK=${WORK:-/tmp/loop}
WHEELS=${WHEELS:-.whl}
mode=${1:-start}
. benchmarks/gpu_env.sh
[ "$mode" = run ] || gpu_background "$mode" "${2:-300}" "$0" loop.tar.gz

# mode run: the work itself
gpu_job_begin loop
rm -rf results/demo-gpu resources/demo/gpu .snakemake
t0=$(date +%s)
if [ -n "${LOOP_CONFIG:-}" ]; then
  python3 -m snakemake all --profile gpu1 --configfile config/demo-gpu.yaml --config "$LOOP_CONFIG" > "$WORK/full.log" 2>&1
else
  python3 -m snakemake all --profile gpu1 --configfile config/demo-gpu.yaml > "$WORK/full.log" 2>&1
fi
log "snakemake --profile gpu1 --configfile config/demo-gpu.yaml all ${LOOP_CONFIG:+--config '$LOOP_CONFIG'}: rc $? in $(( $(date +%s) - t0 )) s"
r=results/demo-gpu
tar czf "$WORK/demo-gpu-results.tar.gz" --ignore-failed-read $r/report $r/records $r/gate $r/bench/*/*/*.json \
  $r/train/*/summary.json $r/train/*/validation.json $r/benchmarks $r/logs resources/demo/gpu/manifest.json 2>/dev/null
grep -h -A3 "^\*\*Deploy" $r/report/summary.md >> "$WORK/steps.log" 2>/dev/null
t0=$(date +%s)
timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider -k "static or engine_greedy" tests/test_gpu.py > "$WORK/pytest_gpu.log" 2>&1
log "pytest -m gpu -k 'static or engine_greedy': rc $? in $(( $(date +%s) - t0 )) s: $(tail -1 "$WORK/pytest_gpu.log")"
log "done"
touch "$WORK/done"
