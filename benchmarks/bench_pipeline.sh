#!/usr/bin/env bash
# Pipeline timings: the embedded default from a clean copy, then a no-op rerun.
#   benchmarks/bench_pipeline.sh [default|smoke] [CORES]
# Runs in a fresh temporary copy of the workflow (demo models built from scratch, no results, no
# .snakemake), so it measures a clean checkout; prints one line per measurement and the job counts.
set -euo pipefail
SIZE="${1:-default}"
CORES="${2:-2}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
WORK="$(mktemp -d /tmp/draftlab-bench-pipeline.XXXXXX)"
# KEEP=<dir>: copy the run's results/ there before the temporary copy goes (report, records, logs)
trap '[ -n "${KEEP:-}" ] && mkdir -p "$KEEP" && cp -r "$WORK/results" "$KEEP/" ; rm -rf "$WORK"' EXIT
cp -r "$ROOT/Snakefile" "$ROOT/workflow" "$ROOT/config" "$ROOT/profiles" "$ROOT/envs" "$WORK/"
cd "$WORK"
echo "# $(date -u +%FT%TZ) size=$SIZE cores=$CORES nproc=$(nproc) load=$(cut -d' ' -f1-3 /proc/loadavg)"

t0=$(date +%s.%N)
snakemake --cores "$CORES" all --config size="$SIZE" > full.log 2>&1 || { tail -50 full.log; exit 1; }
t1=$(date +%s.%N)
echo "full run from clean: $(echo "$t1 - $t0" | bc) s ($(grep -c '^Finished jobid' full.log) jobs)"

t0=$(date +%s.%N)
snakemake --cores "$CORES" all --config size="$SIZE" > noop.log 2>&1
t1=$(date +%s.%N)
grep -q "Nothing to be done" noop.log || { echo "no-op run did something:"; tail -20 noop.log; exit 1; }
echo "no-op snakemake all: $(echo "$t1 - $t0" | bc) s"

# per job: wall s and cpu_time from Snakemake's benchmark: files (CPU time is what load cannot inflate
# much; on 2 idle cores a job's wall is about its CPU time / the cores it uses)
for f in results/*/benchmarks/*.tsv results/*/benchmarks/*/*.tsv; do
  printf '%-60s %s\n' "${f#results/}" "$(awk -F'\t' 'NR==1 {for (i = 1; i <= NF; i++) if ($i == "cpu_time") c = i}
    NR==2 {printf "%s s wall, %s s CPU", $1, $c}' "$f")"
done
awk -F'\t' 'FNR==1 {for (i = 1; i <= NF; i++) if ($i == "cpu_time") c = i} FNR==2 {s += $1; cpu += $c}
  END {printf "all jobs: %.0f s wall summed, %.0f s CPU summed\n", s, cpu}' results/*/benchmarks/*.tsv results/*/benchmarks/*/*.tsv
python -c 'import json, sys; m = json.load(open(sys.argv[1])); print("demo build stages:", {k: round(v, 1) for k, v in m["timings"].items()})' resources/demo/"$SIZE"/manifest.json
echo "--- records"
python - <<'PY'
import pandas as pd
df = pd.read_csv("results/records.csv")
cols = ["variant", "spec_id", "status", "tps_median", "accept_length", "speedup", "val_acc_mean"]
print(df[cols].to_string(index=False))
PY
sed -n '/## Decision/,/## Comparison/p' results/*/report/summary.md
echo "--- recommendation"
cat results/*/report/recommendation.json
