# Sourced by the GPU jobs (benchmarks/gpu/jobs/*.sh, started by benchmarks/gpu/run.sh) on a GPU host without
# network and without Snakemake in its image.
#
# gpu_env: installs the carried wheels from $WHEELS into /tmp/site (none there: nothing to install), runs
# draftlab from ./src through PYTHONPATH (plus $EXTRA_PYTHONPATH), and puts a `draftlab` wrapper and a `python`
# on PATH. Returns 1 when the wheels do not install (pip's output in $OUT/pip.log).
gpu_env() {
  local rc=0
  if compgen -G "$WHEELS/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      "$WHEELS"/*.whl > "$OUT/pip.log" 2>&1 || rc=1
  fi
  export PYTHONPATH=/tmp/site:$PWD/src${EXTRA_PYTHONPATH:+:$EXTRA_PYTHONPATH} PYTHONUNBUFFERED=1
  mkdir -p /tmp/bin
  printf '#!/bin/sh\nexec python3 -m draftlab.cli "$@"\n' > /tmp/bin/draftlab && chmod +x /tmp/bin/draftlab
  command -v python >/dev/null || ln -sf "$(command -v python3)" /tmp/bin/python
  export PATH=/tmp/bin:$PATH
  return $rc
}

# gpu_job_begin: the start of a job's steps. `log` appends "[JOB time +seconds] ..." to $WORK/steps.log,
# `took T0` says "rc R in S s" of the step begun at T0, the wheels install (on failure: logged, exit 1), and the
# GPU's name, driver and memory are the first line.
gpu_job_begin() {
  START=$(date +%s)
  log() { echo "[$GPU_JOB $(date -u +%H:%M:%S) +$(( $(date +%s) - START ))s] $*" >> "$WORK/steps.log"; }
  gpu_env || { log "wheel install failed: $(tail -3 "$OUT/pip.log")"; exit 1; }
  log "$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1)"
}

# gpu_demo: the gpu-size demo pair in resources/demo/gpu (the pipeline's own folder), unless it is there.
gpu_demo() {
  [ -f resources/demo/gpu/demo.json ] && return 0
  local t0=$(date +%s)
  mkdir -p resources/demo  # demo-models writes only into a folder of its own: its JSON is moved in after
  timeout 300 draftlab demo-models --out resources/demo/gpu --size gpu --device cuda --threads 2 --json \
    > resources/demo/gpu-demo.json.tmp 2> "$WORK/demo_gpu.log" && mv resources/demo/gpu-demo.json.tmp resources/demo/gpu/demo.json
  log "demo-models --size gpu --device cuda: rc $? in $(( $(date +%s) - t0 )) s"
}
