#!/usr/bin/env bash
# Wall time and target launches of the smoke run before vs after the launch plan, in one run.
#   benchmarks/launch_plan_walltime.sh BASE [CORES]      e.g. benchmarks/launch_plan_walltime.sh main 2
# BASE (a commit before the launch plan, e.g. 0ee33a5) and HEAD are each exported (git archive) into a temporary folder and run
# `snakemake --cores CORES all --config size=smoke` from clean, BASE first, with PYTHONPATH at that tree's
# src/ (a venv with draftlab installed editable elsewhere is overridden). DEMO_OUT=<dir> (a folder holding
# smoke/demo.json, e.g. /work/demo-cache) shares one prebuilt demo pair, so only the pipeline is timed;
# without it each run builds its own. Prints, per side, the wall seconds, the jobs and the target's starts
# (the servers' "listening on" lines under results/<experiment>/logs/), then the after/before ratio.
set -euo pipefail
BASE="${1:?usage: $0 BASE [CORES]}"
CORES="${2:-2}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
WORK="$(mktemp -d /tmp/draftlab-launch-plan.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
echo "# $(date -u +%FT%TZ) base=$(git -C "$ROOT" rev-parse --short "$BASE") head=$(git -C "$ROOT" rev-parse --short HEAD)" \
     "cores=$CORES nproc=$(nproc) load=$(cut -d' ' -f1-3 /proc/loadavg) demo_out=${DEMO_OUT:-built per run}"

run_side() {  # run_side NAME COMMIT: prints "NAME seconds jobs launches"
  local name="$1" commit="$2" dir="$WORK/$1"
  mkdir -p "$dir"
  git -C "$ROOT" archive "$commit" | tar -x -C "$dir"
  if [ -n "${DEMO_OUT:-}" ]; then
    printf 'size: smoke\ndemo:\n  out: %s\n' "$DEMO_OUT" > "$dir/smoke.yaml"
  else
    printf 'size: smoke\n' > "$dir/smoke.yaml"
  fi
  local t0 t1
  t0=$(date +%s.%N)
  (cd "$dir" && PYTHONPATH="$dir/src" HF_HUB_OFFLINE=1 snakemake --cores "$CORES" all --configfile smoke.yaml \
      > run.log 2>&1) || { tail -40 "$dir/run.log"; exit 1; }
  t1=$(date +%s.%N)
  local jobs launches
  jobs=$(grep -c '^Finished jobid' "$dir/run.log" || true)
  launches=$(grep -rh "listening on" "$dir"/results/*/logs | wc -l)
  echo "$name $(echo "$t1 - $t0" | bc) $jobs $launches"
}

before=$(run_side before "$BASE")
echo "before (${BASE}): ${before#before }   (wall s, jobs, target starts)"
after=$(run_side after HEAD)
echo "after  (HEAD):  ${after#after }"
b=$(echo "$before" | cut -d' ' -f2)
a=$(echo "$after" | cut -d' ' -f2)
echo "wall time after/before: $(echo "scale=3; $a / $b" | bc)"
