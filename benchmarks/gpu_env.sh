# Sourced by the scripts that run on the lent GPU host (no network, no Snakemake in its image): installs
# the carried wheels from $WHEELS into /tmp/site, runs draftlab from ./src through PYTHONPATH (plus
# $EXTRA_PYTHONPATH), and puts a `draftlab` wrapper and a `python` on PATH. Returns 1 when the wheels
# do not install (pip's output in $OUT/pip.log).
gpu_env() {
  local rc=0
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$WHEELS"/*.whl > "$OUT/pip.log" 2>&1 || rc=1
  export PYTHONPATH=/tmp/site:$PWD/src${EXTRA_PYTHONPATH:+:$EXTRA_PYTHONPATH} PYTHONUNBUFFERED=1
  mkdir -p /tmp/bin
  printf '#!/bin/sh\nexec python3 -m draftlab.cli "$@"\n' > /tmp/bin/draftlab && chmod +x /tmp/bin/draftlab
  command -v python >/dev/null || ln -sf "$(command -v python3)" /tmp/bin/python
  export PATH=/tmp/bin:$PATH
  return $rc
}

# A job longer than one device command runs in the background: `gpu_background start|wait N SCRIPT TARBALL`.
# start: a fresh $WORK, the script copied there (a later device call re-copies the working tree under it) and
# run as `bash $WORK/job.sh run` in its own session; wait: up to N s for $WORK/done, then steps.log printed and
# $WORK packed into $OUT/TARBALL (large working folders, `*-work`, left out). Exits the calling script.
gpu_background() {
  local mode=$1 wait_s=$2 script=$3 tarball=$4
  if [ "$mode" = start ]; then
    rm -rf "$WORK" && mkdir -p "$WORK"
    cp "$script" "$WORK/job.sh"
    setsid nohup bash "$WORK/job.sh" run > "$WORK/run.log" 2>&1 < /dev/null &
    echo "started pid $!"
    exit 0
  fi
  local deadline=$(( $(date +%s) + wait_s ))
  while [ ! -f "$WORK/done" ] && [ "$(date +%s)" -lt "$deadline" ]; do sleep 5; done
  [ -f "$WORK/done" ] && echo "finished" || echo "still running"
  cat "$WORK/steps.log" 2>/dev/null
  tar czf "$OUT/$tarball" -C "$WORK" --exclude='*-work' . 2>/dev/null
  cp "$WORK/steps.log" "$OUT/" 2>/dev/null
  exit 0
}

# The start of a background job's run mode: `gpu_job_begin NAME`. $OUT becomes $WORK, `log` appends
# "[NAME time +seconds] ..." to $WORK/steps.log, the wheels install (on failure: logged, $WORK/done, exit 1),
# and the GPU's name, driver and memory are the first line.
gpu_job_begin() {
  OUT=$WORK
  START=$(date +%s)
  GPU_JOB=$1
  log() { echo "[$GPU_JOB $(date -u +%H:%M:%S) +$(( $(date +%s) - START ))s] $*" >> "$WORK/steps.log"; }
  gpu_env || { log "wheel install failed: $(tail -3 "$WORK/pip.log")"; touch "$WORK/done"; exit 1; }
  log "$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1)"
}
