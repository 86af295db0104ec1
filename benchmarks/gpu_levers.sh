#!/usr/bin/env bash
# Issue 26's levers on one GPU host without network (as run on the lent H200), in the background so that
# it can outlast one device command:
#   bash benchmarks/gpu_levers.sh start    # setsid: the steps below, one after the other
#   bash benchmarks/gpu_levers.sh wait N   # wait up to N s for it, then pack what there is into $OUT
# Steps (each logs one line to steps.log):
#  1. benchmarks/gemm_layouts_gpu.py: each decode projection of the demo-gpu shapes written six ways;
#  2. benchmarks/static_decode_gpu.py: the static decoder, each piece of a cycle timed and profiled;
#  3. the demo-gpu pipeline up to its fine-tune data, from clean, with every v2 prompt answered
#     (--until tokenize patch_config, data.limit=${LIMIT:-969});
#  4. benchmarks/drafter_levers.py: the keep arm trained under $VARIANTS, two at a time, each served in
#     process on the bench's prompts at k = 1..4 against plain decoding.
# Optional: SKIP_PROFILE=1 skips steps 1-2; DATA_EXTRA / TRAIN_CONFIG add keys to the run's data / train
# settings (e.g. DATA_EXTRA='max_new_tokens: 384' TRAIN_CONFIG='max_length: 640'); KS the chain lengths served.
# Wheels for what the image lacks (snakemake 9 and its deps) are read from ${WHEELS:-.whl}.
set -uo pipefail
WORK=${WORK:-/tmp/levers}
WHEELS=${WHEELS:-.whl}
mode=${1:-start}
. benchmarks/gpu_env.sh
[ "$mode" = run ] || gpu_background "$mode" "${2:-300}" "$0" levers.tar.gz

# mode run: the work itself
gpu_job_begin levers

if [ -z "${SKIP_PROFILE:-}" ]; then
t0=$(date +%s)
timeout 120 python3 benchmarks/gemm_layouts_gpu.py > "$WORK/gemm_layouts_gpu.json" 2> "$WORK/gemm_layouts_gpu.log"
log "gemm_layouts_gpu.py: rc $? in $(( $(date +%s) - t0 )) s"

t0=$(date +%s)
timeout 240 python3 benchmarks/static_decode_gpu.py --device cuda > "$WORK/static_decode_gpu.json" 2> "$WORK/static_decode_gpu.log"
log "static_decode_gpu.py: rc $? in $(( $(date +%s) - t0 )) s"
fi

rm -rf results/demo-gpu resources/demo/gpu .snakemake
t0=$(date +%s)
python3 -m snakemake --until tokenize patch_config --profile gpu1 --configfile config/demo-gpu.yaml \
  --config "data={limit: ${LIMIT:-969}${DATA_EXTRA:+, $DATA_EXTRA}}" ${TRAIN_CONFIG:+"train={$TRAIN_CONFIG}"} \
  > "$WORK/until.log" 2>&1
log "snakemake tokenize patch_config (data.limit=${LIMIT:-969} ${DATA_EXTRA:-} ${TRAIN_CONFIG:-}): rc $? in $(( $(date +%s) - t0 )) s"
grep -h "demo-models:" results/demo-gpu/logs/demo_models.log >> "$WORK/steps.log" 2>/dev/null
cp -r results/demo-gpu/benchmarks "$WORK/job_seconds" 2>/dev/null

VARIANTS=${VARIANTS:-'[{"name": "now", "samples": 384},
 {"name": "lr1e-3", "samples": 384, "lr": 0.001},
 {"name": "all-lr1e-3", "lr": 0.001},
 {"name": "all-lr1e-3-b32", "lr": 0.001, "batch_size": 32},
 {"name": "all-lr3e-3-b32", "lr": 0.003, "batch_size": 32},
 {"name": "all-lr1e-3-b32-s400", "lr": 0.001, "batch_size": 32, "steps": 400}]'}
t0=$(date +%s)
timeout ${LEVERS_TIMEOUT:-420} python3 benchmarks/drafter_levers.py --configfile config/demo-gpu.yaml \
  --variants "$VARIANTS" --ks ${KS:-1 2 3 4} --parallel 2 --work "$WORK/levers-work" --out "$WORK/levers.json" > /dev/null 2> "$WORK/levers.log"
log "drafter_levers.py: rc $? in $(( $(date +%s) - t0 )) s"
grep -h "levers:" "$WORK/levers.log" >> "$WORK/steps.log"
for f in "$WORK"/levers-work/*.log; do tail -2 "$f" > "$WORK/$(basename "$f" .log).train.tail"; done 2>/dev/null
log "done"
touch "$WORK/done"
