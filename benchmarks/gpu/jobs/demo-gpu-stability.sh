# demo-gpu-stability: one more clean demo-gpu run for issue 38's "does the verdict hold" check, through
# benchmarks/verdict_stability.sh (a fresh copy of the checkout, its own demo build, `snakemake all --profile gpu1
# --configfile config/demo-gpu.yaml`). Runs accumulate in $VS_OUT (default /tmp/vs-gpu) while the machine stays:
# start it once per run (one run ~6-9 min, so start, then wait; VS_RUNS=N runs N, KEEP_DEMO=1 gives runs after
# the first run-1's demo pair: benchmarks/verdict_stability.sh), and the table over every run there ends
# steps.log. Each run's recommendation.json, summary.md, launch records, wall time and log tail are kept under
# $WORK/run-N/.
. "$GPU_DIR/env.sh"
gpu_job_begin
export PATH=/tmp/site/bin:$PATH  # snakemake's own entry point (verdict_stability.sh calls `snakemake`)
vs=${VS_OUT:-/tmp/vs-gpu}
t0=$(date +%s)
OUT=$vs bash benchmarks/verdict_stability.sh "${VS_RUNS:-1}" --profile gpu1 --configfile config/demo-gpu.yaml \
  > "$WORK/table.md" 2> "$WORK/verdict_stability.log"
log "verdict_stability.sh ${VS_RUNS:-1} (KEEP_DEMO=${KEEP_DEMO:-0}) --profile gpu1 --configfile config/demo-gpu.yaml: rc $? in $(( $(date +%s) - t0 )) s"
n=$(find "$vs" -maxdepth 1 -name 'run-*' -type d | wc -l)
for i in $(seq 1 "$n"); do
  src=$vs/run-$i keep=$WORK/run-$i
  mkdir -p "$keep"
  cp "$src/wall_s" "$keep/" 2>/dev/null
  tail -60 "$src/run.log" > "$keep/run.log.tail" 2>/dev/null
  for f in "$src"/results/*/report/recommendation.json "$src"/results/*/report/summary.md \
           "$src"/results/*/launch/*/launch.json "$src"/results/*/records/merged.json; do
    [ -f "$f" ] && cp "$f" "$keep/$(echo "${f#"$src"/results/*/}" | tr / _)"
  done
done
cat "$WORK/table.md" >> "$WORK/steps.log"
