# demo-gpu-loop: the whole loop on one GPU from clean, `snakemake all --profile gpu1 --configfile config/demo-gpu.yaml`
# (its wall time, the decision, the paired intervals, the recommendation), then the static decoder's GPU tests.
# LOOP_CONFIG (optional) is passed as --config, e.g. a tree setting beside the chain:
#   LOOP_CONFIG='speculative=[{num_steps: 3, topk: 1, num_draft_tokens: 4}, {num_steps: 3, topk: 4, num_draft_tokens: 8}]'
# Run by benchmarks/gpu/run.sh (demo-gpu-loop start, then wait N: it outlasts one device command).
. "$GPU_DIR/env.sh"
gpu_job_begin
rm -rf results/demo-gpu resources/demo/gpu .snakemake
t0=$(date +%s)
python3 -m snakemake all --profile gpu1 --configfile config/demo-gpu.yaml ${LOOP_CONFIG:+--config "$LOOP_CONFIG"} \
  > "$WORK/full.log" 2>&1
log "snakemake --profile gpu1 --configfile config/demo-gpu.yaml all ${LOOP_CONFIG:+--config '$LOOP_CONFIG'}: rc $? in $(( $(date +%s) - t0 )) s"
r=results/demo-gpu
tar czf "$WORK/demo-gpu-results.tar.gz" --ignore-failed-read $r/report $r/records $r/gate $r/bench/*/*/*.json \
  $r/train/*/summary.json $r/train/*/validation.json $r/train/*/metrics.csv $r/benchmarks $r/logs \
  $r/data/vocab.json resources/demo/gpu/manifest.json 2>/dev/null
cp $r/report/summary.md "$WORK/summary.md" 2>/dev/null
grep -h -A3 "^\*\*Deploy" $r/report/summary.md >> "$WORK/steps.log" 2>/dev/null

t0=$(date +%s)
timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider -k "static or engine_greedy" tests/test_gpu.py > "$WORK/pytest_gpu.log" 2>&1
log "pytest -m gpu -k 'static or engine_greedy': rc $? in $(( $(date +%s) - t0 )) s: $(tail -1 "$WORK/pytest_gpu.log")"
