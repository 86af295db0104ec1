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
