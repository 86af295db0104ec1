#!/usr/bin/env bash
# The one runner of draftlab's GPU jobs (benchmarks/README.md: what each measures, its last figure), for a GPU
# host without network; run from the repository root:
#   bash benchmarks/gpu/run.sh JOB run       # in the foreground: results under $OUT (default /tmp/gpu-out)
#   bash benchmarks/gpu/run.sh JOB start     # in the background (setsid), so it can outlast one device command
#   bash benchmarks/gpu/run.sh JOB wait N    # wait up to N s for it, print steps.log, pack it into $OUT/JOB.tar.gz
# JOB is a file of benchmarks/gpu/jobs/ (without .sh): its steps, each logging one line to steps.log (a later
# step runs even if one fails). A background job works in ${WORK:-/tmp/gpu-JOB} from a copy of this folder (a
# later device call may re-copy the working tree under it). Wheels for what the host's image lacks (snakemake 9
# and its deps) are read from ${WHEELS:-.whl} (env.sh); draftlab runs from ./src through PYTHONPATH.
set -uo pipefail
GPU_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
job=${1:-} mode=${2:-}
if [ -z "$job" ] || [ ! -f "$GPU_DIR/jobs/$job.sh" ] || ! [[ "$mode" =~ ^(run|start|wait)$ ]]; then
  known=$(cd "$GPU_DIR/jobs" && ls -- *.sh | sed 's/\.sh$//' | tr '\n' ' ')
  echo "error: usage: bash benchmarks/gpu/run.sh JOB run|start|wait [N], JOB one of: ${known% }" >&2
  exit 2
fi
export GPU_DIR GPU_JOB=$job OUT=${OUT:-/tmp/gpu-out} WHEELS=${WHEELS:-.whl}
mkdir -p "$OUT"
case $mode in
  run)
    export WORK=${WORK:-$OUT}
    mkdir -p "$WORK"
    bash "$GPU_DIR/jobs/$job.sh"
    rc=$?
    [ -f "$WORK/steps.log" ] && echo "[$job] done: rc $rc" >> "$WORK/steps.log"
    touch "$WORK/done"
    exit $rc
    ;;
  start)
    export WORK=${WORK:-/tmp/gpu-$job}
    rm -rf "$WORK" "$WORK.scripts" && mkdir -p "$WORK" && cp -r "$GPU_DIR" "$WORK.scripts"
    OUT=$WORK setsid nohup bash "$WORK.scripts/run.sh" "$job" run > "$WORK.run.log" 2>&1 < /dev/null &
    echo "started $job (pid $!) in $WORK"
    ;;
  wait)
    export WORK=${WORK:-/tmp/gpu-$job}
    deadline=$(( $(date +%s) + ${3:-300} ))
    while [ ! -f "$WORK/done" ] && [ "$(date +%s)" -lt "$deadline" ]; do sleep 5; done
    [ -f "$WORK/done" ] && echo "finished" || echo "still running"
    cat "$WORK/steps.log" 2>/dev/null
    tar czf "$OUT/$job.tar.gz" -C "$WORK" --exclude='*-work' . 2>/dev/null
    cp "$WORK/steps.log" "$OUT/" 2>/dev/null
    ;;
esac
exit 0
