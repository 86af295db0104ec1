#!/usr/bin/env bash
# Issue 26's draft trees on one GPU host without network (as run on the lent H200), in the background so
# that it can outlast one device command:
#   bash benchmarks/gpu_trees.sh start    # setsid: the steps below, one after the other
#   bash benchmarks/gpu_trees.sh wait N   # wait up to N s for it, then pack what there is into $OUT
# Steps (each logs one line to steps.log; a later step runs even if one fails):
#  1. pytest -m gpu tests/test_gpu.py -k "static or engine_greedy": graphs (chain and tree) replay token-identically;
#  2. benchmarks/static_decode_gpu.py --trees $TREES: what a tree cycle costs in plain steps (random weights);
#  3. the demo-gpu pipeline up to its four trained arms, from clean;
#  4. benchmarks/drafter_levers.py --serve: every arm served in process on the bench's prompts under each
#     chain and tree setting in $SETTINGS (accept length, speed-up over plain decoding, identical tokens).
# Wheels for what the image lacks (snakemake 9 and its deps) are read from ${WHEELS:-.whl}.
set -uo pipefail
WORK=${WORK:-/tmp/trees}
WHEELS=${WHEELS:-.whl}
mode=${1:-start}
. benchmarks/gpu_env.sh
[ "$mode" = run ] || gpu_background "$mode" "${2:-300}" "$0" trees.tar.gz

# mode run: the work itself
gpu_job_begin trees
TREES=${TREES:-s3-k2-d6 s3-k4-d8 s3-k4-d12 s4-k4-d10 s5-k4-d12 s4-k8-d16 s6-k4-d16}
SETTINGS=${SETTINGS:-3 5 $TREES}

if [ -z "${ARMS_ONLY:-}" ]; then  # ARMS_ONLY=1: steps 3-4 only
t0=$(date +%s)
timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider -k "static or engine_greedy" tests/test_gpu.py > "$WORK/pytest_gpu.log" 2>&1
log "pytest -m gpu: rc $? in $(( $(date +%s) - t0 )) s: $(tail -1 "$WORK/pytest_gpu.log")"

t0=$(date +%s)
(cd benchmarks && timeout 240 python3 static_decode_gpu.py --device cuda --skip-unfused --trees $TREES) \
  > "$WORK/static_decode_gpu.json" 2> "$WORK/static_decode_gpu.log"
log "static_decode_gpu.py --trees: rc $? in $(( $(date +%s) - t0 )) s: $(python3 -c "import json; d=json.load(open('$WORK/static_decode_gpu.json')); print('plain', d['t_plain_step_ms'], 'chain', d['t_cycle_c1_ms'], {k: v['cycle_in_plain_steps'] for k, v in d['trees'].items()})" 2>&1 | tail -1)"
fi

rm -rf results/demo-gpu resources/demo/gpu .snakemake
t0=$(date +%s)
r=results/demo-gpu
python3 -m snakemake $r/train/{scratch,finetune-keep,finetune-remap,finetune-regenerate} --profile gpu1 \
  --configfile config/demo-gpu.yaml > "$WORK/until.log" 2>&1
log "snakemake (the four trained arms): rc $? in $(( $(date +%s) - t0 )) s"
tar czf "$WORK/arms.tar.gz" --ignore-failed-read $r/train/*/summary.json $r/train/*/validation.json $r/benchmarks \
  $r/logs resources/demo/gpu/manifest.json 2>/dev/null

t0=$(date +%s)
arms=$(for d in $r/train/*/drafter; do a=${d#$r/train/}; echo "${a%/drafter}=$d"; done)
timeout 420 python3 benchmarks/drafter_levers.py --configfile config/demo-gpu.yaml --ks $SETTINGS --serve $arms \
  --out "$WORK/trees_served.json" > /dev/null 2> "$WORK/trees_served.log"
log "drafter_levers.py --serve --ks $SETTINGS: rc $? in $(( $(date +%s) - t0 )) s"
grep -h "levers:" "$WORK/trees_served.log" >> "$WORK/steps.log"
log "done"
touch "$WORK/done"
