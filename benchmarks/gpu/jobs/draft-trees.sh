# draft-trees: what SGLang-style draft trees buy over chains with trained drafters on this GPU. The demo-gpu
# pipeline up to its four trained arms, from clean; then benchmarks/drafter_levers.py --serve: every arm served
# in process on the bench's prompts under each chain and tree setting in $SETTINGS (accept length, speed-up
# over plain decoding, identical tokens). What a tree cycle costs alone: the static-decode job.
# Run by benchmarks/gpu/run.sh (draft-trees start, then wait N).
. "$GPU_DIR/env.sh"
gpu_job_begin
SETTINGS=${SETTINGS:-3 5 s3-k2-d6 s3-k4-d8 s3-k4-d12 s4-k4-d10 s5-k4-d12 s4-k8-d16 s6-k4-d16}

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
