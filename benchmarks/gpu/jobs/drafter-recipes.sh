# drafter-recipes: what a fine-tune recipe is worth for the demo-gpu keep arm on this GPU. The demo-gpu pipeline
# up to its fine-tune data, from clean, with every v2 prompt answered (--until tokenize patch_config,
# data.limit=${LIMIT:-969}); then benchmarks/drafter_levers.py trains the keep arm under each of $VARIANTS
# (samples, steps, batch size, learning rate, ...), two at a time, and serves each in process on the bench's
# prompts at the chain lengths $KS against plain decoding (accept length, speed-up, identical tokens).
# DATA_EXTRA / TRAIN_CONFIG add keys to the run's data / train settings (e.g. DATA_EXTRA='max_new_tokens: 384'
# TRAIN_CONFIG='max_length: 640'). Run by benchmarks/gpu/run.sh (drafter-recipes start, then wait N).
. "$GPU_DIR/env.sh"
gpu_job_begin
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
