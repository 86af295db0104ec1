# static-decode: the builtin engine's decode speed on this GPU without the demo build. First its graphs replay
# token-identically (pytest -m gpu -k static; stops here if red), then benchmarks/static_decode_gpu.py: a Llama
# of the demo-gpu target's shape with random weights, plain decoding at concurrency 1 and 8 through the static
# decoder's CUDA graphs against Engine.generate, its fused layers against transformers' own (kernels per step,
# each piece of a cycle timed), the speculative cycle at k = 3, and what each $TREES setting's cycle costs in
# plain steps (TREES="" skips the trees).
# Run by benchmarks/gpu/run.sh (static-decode run: a few minutes).
. "$GPU_DIR/env.sh"
gpu_job_begin
TREES=${TREES-s3-k2-d6 s3-k4-d8 s3-k4-d12 s4-k4-d10 s5-k4-d12 s4-k8-d16 s6-k4-d16}

t0=$(date +%s)
timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider -k "static or engine_greedy" tests/test_gpu.py > "$WORK/pytest_gpu.log" 2>&1
rc=$?
log "pytest -m gpu -k 'static or engine_greedy': rc $rc in $(( $(date +%s) - t0 )) s: $(tail -1 "$WORK/pytest_gpu.log")"
[ $rc -eq 0 ] || exit $rc

t0=$(date +%s)
timeout 300 python3 benchmarks/static_decode_gpu.py --device cuda ${TREES:+--trees $TREES} \
  > "$WORK/static_decode_gpu.json" 2> "$WORK/static_decode_gpu.log"
log "static_decode_gpu.py: rc $? in $(( $(date +%s) - t0 )) s: $(python3 -c "import json; d=json.load(open('$WORK/static_decode_gpu.json')); print('plain step', d['t_plain_step_ms'], 'ms; chain cycle', d['t_cycle_c1_ms'], 'ms', {k: v['cycle_in_plain_steps'] for k, v in d.get('trees', {}).items()})" 2>&1 | tail -1)"
