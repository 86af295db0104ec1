# demo-gpu-stability: one more clean demo-gpu run for the "does the verdict hold" check, through
# benchmarks/verdict_stability.sh (a fresh copy of the checkout, its own demo build, `snakemake all --profile gpu1
# --configfile config/demo-gpu.yaml`). Runs accumulate in $VS_OUT (default /tmp/vs-gpu) while the machine stays:
# start it, then wait (a run from clean took 401 s at 3d1446f, 438 s and 577 s before on two H100 hosts, 860 s once on an H200; about
# 290 s on a kept demo pair; VS_RUNS=N runs N one after another, KEEP_DEMO=1 gives runs after the first run-1's
# demo pair: benchmarks/verdict_stability.sh). Each run's verdict line joins steps.log as it ends, and its
# recommendation.json, summary.md, launch records, per-request bench results, demo log, per-rule seconds, wall
# time and log tail are kept under $WORK/run-N/ (packed by `wait`); the table over every run ends steps.log.
# LEVERS=1: after the runs, benchmarks/demo_build_levers.py on run 1's demo pair (same-host A/B of the demo
# build's GPU levers: $WORK/levers.json). BASELINE_SRC=DIR (e.g. `git archive REV src` unpacked and carried):
# after the runs, that source's `demo-models --size gpu` from clean on this host, its stage lines in
# $WORK/baseline_demo.log beside run 1's (the build before and after, one host).
. "$GPU_DIR/env.sh"
gpu_job_begin
export PATH=/tmp/site/bin:$PATH  # snakemake's own entry point (verdict_stability.sh calls `snakemake`)
vs=${VS_OUT:-/tmp/vs-gpu}
# keep_run N: run N's answer and timings under $WORK/run-N (what `wait` packs), as soon as it ends: a device
# session's time can run out before the next run does
keep_run() {
  local src=$vs/run-$1 keep=$WORK/run-$1 f
  mkdir -p "$keep"
  cp "$src/wall_s" "$src/demo_from" "$keep/" 2>/dev/null
  tail -60 "$src/run.log" > "$keep/run.log.tail" 2>/dev/null
  for f in "$src"/results/*/report/recommendation.json "$src"/results/*/report/summary.md \
           "$src"/results/*/launch/*/launch.json "$src"/results/*/records/merged.json \
           "$src"/results/*/logs/demo_models.log; do
    [ -f "$f" ] && cp "$f" "$keep/$(echo "${f#"$src"/results/*/}" | tr / _)"
  done
  # the per-request bench results (results/*/bench/VARIANT/SPEC/CLIENT.json): what a later decision rule can
  # re-decide the run from without the device
  (cd "$src"/results/*/ 2>/dev/null && find bench -name '*.json' -print0 | tar --null -T - -cf -) \
    | tar -xf - -C "$keep" 2>/dev/null
  # every rule's time (Snakemake's benchmark files): where a slow run spent it
  (cd "$src"/results/*/benchmarks 2>/dev/null && grep -r -m1 -v '^s' --include='*.tsv' . | cut -f1 \
    | sed 's/:/\t/' | sort -k2 -rn) > "$keep/rule_seconds.tsv" 2>/dev/null
}
for k in $(seq 1 "${VS_RUNS:-1}"); do
  t0=$(date +%s)
  OUT=$vs bash benchmarks/verdict_stability.sh 1 --profile gpu1 --configfile config/demo-gpu.yaml \
    > "$WORK/table.md" 2>> "$WORK/verdict_stability.log"
  rc=$?
  n=$(find "$vs" -maxdepth 1 -name 'run-*' -type d | wc -l)
  keep_run "$n"
  log "run $n (KEEP_DEMO=${KEEP_DEMO:-0}): verdict_stability.sh 1 --profile gpu1 --configfile config/demo-gpu.yaml: rc $rc in $(( $(date +%s) - t0 )) s: $(tail -1 "$WORK/table.md")"
done
cat "$WORK/table.md" >> "$WORK/steps.log"
if [ "${LEVERS:-0}" = 1 ]; then
  t0=$(date +%s)
  timeout 400 python3 benchmarks/demo_build_levers.py --demo "$vs/run-1/resources/demo/gpu" --json "$WORK/levers.json" \
    > "$WORK/levers.log" 2>&1
  log "demo_build_levers.py: rc $? in $(( $(date +%s) - t0 )) s: $(tr -d ' \n' < "$WORK/levers.json" 2>/dev/null)"
fi
if [ -n "${BASELINE_SRC:-}" ]; then
  t0=$(date +%s)
  rm -rf /tmp/baseline-demo
  PYTHONPATH=/tmp/site:$(cd "$BASELINE_SRC" && pwd) timeout 400 python3 -m draftlab.cli demo-models \
    --out /tmp/baseline-demo --size gpu --device cuda --threads 2 > /dev/null 2> "$WORK/baseline_demo.log"
  log "demo-models of $BASELINE_SRC from clean: rc $? in $(( $(date +%s) - t0 )) s: $(grep -o 'demo-models: [a-z_0-9]* took [0-9.]* s' "$WORK/baseline_demo.log" | tr '\n' ';')"
fi
