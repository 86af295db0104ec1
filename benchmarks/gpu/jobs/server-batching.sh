# server-batching: the builtin server on this GPU, with the gpu-size demo pair (built first unless
# resources/demo/gpu is there): benchmarks/server_batching.py at concurrency 1 vs 8, plain and speculative
# (static cache, CUDA graphs; outputs compared), then --single-stream (concurrency 1 in process, the static
# decoder's graphs), then benchmarks/streaming_cost.py (tok/s streamed over whole), then with GENERATE=1 (the default) benchmarks/generate_data.py: generate-data through the
# builtin server against the engine's own batched loop (64 in flight), and SIGKILL/resume.
# Run by benchmarks/gpu/run.sh (server-batching start, then wait N: about 8 minutes with the demo build).
. "$GPU_DIR/env.sh"
gpu_job_begin
gpu_demo

t0=$(date +%s)
timeout 240 python3 benchmarks/server_batching.py --device cuda --size gpu --prompts 16 --max-new 128 \
  --out "$WORK/server_batching_gpu.json" > /dev/null 2> "$WORK/server_batching_gpu.log"
log "server_batching.py: rc $? in $(( $(date +%s) - t0 )) s: $(grep -E '^(plain|speculative):' "$WORK/server_batching_gpu.log" | tr '\n' ' ')"

t0=$(date +%s)
timeout 240 python3 benchmarks/server_batching.py --single-stream --device cuda --size gpu --prompts 4 \
  --max-new 128 --rounds 2 --arms scheduler_static --out "$WORK/single_stream_gpu.json" > /dev/null 2> "$WORK/single_stream_gpu.log"
log "server_batching.py --single-stream: rc $? in $(( $(date +%s) - t0 )) s: $(grep -E '^(plain|speculative):' "$WORK/single_stream_gpu.log" | tr '\n' ' ')"
grep -h "CUDA graphs" "$WORK"/*.log 2>/dev/null | sort | uniq -c >> "$WORK/steps.log"

t0=$(date +%s)
timeout 300 python3 benchmarks/streaming_cost.py --device cuda --size gpu --rounds 5 --max-new-tokens 256 \
  --out "$WORK/streaming_cost_gpu.json" > /dev/null 2> "$WORK/streaming_cost_gpu.log"
log "streaming_cost.py: rc $? in $(( $(date +%s) - t0 )) s: $(python3 -c 'import json, sys; print([(r["concurrency"], r["streamed_over_whole_median"]) for r in json.load(open(sys.argv[1]))["runs"]])' "$WORK/streaming_cost_gpu.json" 2>/dev/null)"

if [ "${GENERATE:-1}" = 1 ]; then
  t0=$(date +%s)
  timeout 300 python3 benchmarks/generate_data.py --device cuda --size gpu --prompts ${GEN_PROMPTS:-256} --concurrency 64 \
    --max-new 128 --trials ${GEN_TRIALS:-2} --kills 5 --out "$WORK/generate_data_gpu.json" > /dev/null 2> "$WORK/generate_data_gpu.log"
  log "generate_data.py: rc $? in $(( $(date +%s) - t0 )) s"
fi
