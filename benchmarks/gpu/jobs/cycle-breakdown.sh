# cycle-breakdown: what a speculative cycle of the builtin engine costs, part by part, in plain steps, in process
# and through the server (benchmarks/cycle_breakdown.py, demo-gpu shapes, random weights): first the static
# decoder's GPU tests (greedy answers of plain and speculative decoding identical), then the breakdown with the
# attention's value product in one piece (DRAFTLAB_PV_CHUNK=0) and split over 64-slot chunks (the default), then
# the split at k = 2 (in process). VARIANTS="name:chunk:dtype:extra args"... replaces that list
# (e.g. "pv-split64-bf16:64:bfloat16:--no-server").
# Run by benchmarks/gpu/run.sh (cycle-breakdown run: about 6 minutes).
. "$GPU_DIR/env.sh"
gpu_job_begin

t0=$(date +%s)
timeout 240 python3 -m pytest -q -m gpu -n 0 -p no:cacheprovider -k "static or engine_greedy or fused" tests/test_gpu.py > "$WORK/pytest_gpu.log" 2>&1
log "pytest -m gpu -k 'static or engine_greedy or fused': rc $? in $(( $(date +%s) - t0 )) s: $(tail -1 "$WORK/pytest_gpu.log")"

summary() {
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); r=d['ratios']; print('plain', d['plain_step'], 'ms; verify', d['verify'], '; draft', d['draft_forward'], '; extend', d['extend'], '; cycle graph', d['cycle_graph'], '; step plain/cycle', d['step_plain'], d['step_cycle'], '; server', d.get('server_step_plain'), d.get('server_cycle'), '; served ratios', r['served'], '; identical', d['identical_outputs'])" "$1" 2>&1 | tail -1
}
for variant in ${VARIANTS:-"pv-whole:0:float32:" "pv-split64:64:float32:" "pv-split64-k2:64:float32:--no-server --num-steps 2"}; do
  IFS=: read -r name chunk dtype extra <<< "$variant"
  t0=$(date +%s)
  DRAFTLAB_PV_CHUNK=$chunk timeout 300 python3 benchmarks/cycle_breakdown.py --device cuda --dtype "$dtype" $extra \
    > "$WORK/cycle_breakdown_$name.json" 2> "$WORK/cycle_breakdown_$name.log"
  log "cycle_breakdown.py $name: rc $? in $(( $(date +%s) - t0 )) s: $(summary "$WORK/cycle_breakdown_$name.json")"
done
[ "$WORK" = "$OUT" ] || cp "$WORK"/cycle_breakdown_*.json "$WORK"/pytest_gpu.log "$OUT"/ 2>/dev/null
exit 0
