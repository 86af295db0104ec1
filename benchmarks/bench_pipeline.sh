#!/usr/bin/env bash
# Pipeline timings (issue 5): the embedded default from a clean copy, then a no-op rerun.
#   benchmarks/bench_pipeline.sh [default|smoke] [CORES]
# Runs in a fresh temporary copy of the workflow (demo models built from scratch, no results, no
# .snakemake), so it measures a clean checkout; prints one line per measurement and the job counts.
set -euo pipefail
SIZE="${1:-default}"
CORES="${2:-2}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
WORK="$(mktemp -d /tmp/draftlab-bench-pipeline.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
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

for f in results/*/benchmarks/*.tsv results/*/benchmarks/*/*.tsv; do
  printf '%-60s %s s\n' "${f#results/}" "$(awk 'NR==2 {print $1}' "$f")"
done
echo "--- records"
python - <<'PY'
import pandas as pd
df = pd.read_csv("results/records.csv")
cols = ["variant", "spec_id", "status", "tps_median", "accept_length", "speedup", "val_acc_mean"]
print(df[cols].to_string(index=False))
PY
sed -n '/## Decision/,/## Comparison/p' results/*/report/summary.md
