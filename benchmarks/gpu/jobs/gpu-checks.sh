# gpu-checks: does draftlab work on this GPU? `pytest -m gpu` (tests/test_gpu.py: graphs replay token-identically,
# flex attention against the dense path, fp32 and bf16), the smoke-size loop through the gpu1 profile
# (results/demo-gpu-smoke: every stage on CUDA), and the gpu-size demo build alone, timed (/tmp/demo-gpu-size).
# Run by benchmarks/gpu/run.sh (gpu-checks start, then wait N: up to ~19 min with its timeouts).
. "$GPU_DIR/env.sh"
gpu_job_begin
python3 -c 'import torch, transformers, snakemake, draftlab; print("torch", torch.__version__, "transformers", transformers.__version__, "snakemake", snakemake.__version__, "cuda", torch.cuda.is_available())' \
  >> "$WORK/steps.log" 2>&1

t0=$(date +%s)
timeout 240 python3 -m pytest -m gpu -q -s -p no:cacheprovider tests/test_gpu.py > "$WORK/pytest_gpu.log" 2>&1
log "pytest -m gpu: rc $? in $(( $(date +%s) - t0 )) s: $(tail -1 "$WORK/pytest_gpu.log")"

rm -rf results/demo-gpu-smoke resources/demo/smoke  # size smoke runs as <experiment>-smoke
t0=$(date +%s)
timeout 600 python3 -m snakemake all --profile gpu1 --configfile config/demo-gpu.yaml --config size=smoke \
  > "$WORK/smoke.log" 2>&1
log "smoke loop (gpu1, demo-gpu, size=smoke): rc $? in $(( $(date +%s) - t0 )) s"
r=results/demo-gpu-smoke
tar czf "$WORK/smoke.tar.gz" --ignore-failed-read $r/report $r/records $r/gate $r/bench/*/*/*.json $r/train/*/summary.json \
  $r/train/*/validation.json $r/benchmarks $r/logs $r/data/generate-stats.json resources/demo/smoke/manifest.json 2>/dev/null

t0=$(date +%s)
timeout 300 draftlab demo-models --out /tmp/demo-gpu-size --size gpu --device cuda --threads 2 --json \
  > "$WORK/demo_gpu.json" 2> "$WORK/demo_gpu.log"
log "demo-models --size gpu --device cuda: rc $? in $(( $(date +%s) - t0 )) s"
cp /tmp/demo-gpu-size/manifest.json "$WORK/demo_gpu_manifest.json" 2>/dev/null
