# demo-gpu-loop-specforge: the whole loop on one GPU from clean with a SpecForge arm inside the pipeline,
# `snakemake all --profile gpu1 --configfile config/demo-gpu.yaml config/demo-gpu-specforge.yaml`: the arm
# specforge-keep is trained by SpecForge 0.2.0's own trainer (its defaults: FSDP, flex attention, Triton loss) from
# the one capture (draftlab's dump filed in SpecForge's offline format: the demo has no SGLang), then served,
# benched, recorded and reported beside the builtin finetune-keep arm. Its accept length and paired speed-up beside
# the builtin keep arm's are the figures (steps.log). It replaces specforge-keep-arm, which ran SpecForge beside the
# pipeline. Run by benchmarks/gpu/run.sh (demo-gpu-loop-specforge start, then wait N: it outlasts one device command).
# Wheels (no network there), both folders at the repo root, both installed --no-deps:
#   ${WHEELS:-.whl}       snakemake 9 and its deps, pydantic, jsonschema -> /tmp/site (gpu/env.sh)
#   ${SF_WHEELS:-.whl-sf} SpecForge's offline trainer -> /tmp/site-sf, seen only by the `specforge` command:
#     python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp -d .whl-sf \
#         specforge==0.2.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
#   (the rest of what `specforge train` imports on this path is in the image or in .whl: see specforge-keep-arm.sh)
. "$GPU_DIR/env.sh"
gpu_job_begin
SF_WHEELS=${SF_WHEELS:-.whl-sf}
SF_SITE=${SF_SITE:-/tmp/site-sf}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SF_SITE" \
  "$SF_WHEELS"/*.whl > "$WORK/pip_sf.log" 2>&1 || { log "wheel install from $SF_WHEELS failed: $(tail -1 "$WORK/pip_sf.log")"; exit 1; }
SF_PATH=$SF_SITE:$PYTHONPATH
if ! PYTHONPATH=$SF_PATH python3 -c 'import datasets' > "$WORK/datasets_import.log" 2>&1; then
  # SpecForge imports `datasets` for the type name `Dataset` alone on this path (as specforge-keep-arm found)
  mkdir -p "$WORK/stub/datasets"
  printf 'class Dataset:  # stub: SpecForge offline training uses the name only\n    pass\n' > "$WORK/stub/datasets/__init__.py"
  SF_PATH=$WORK/stub:$SF_PATH
  log "datasets does not import here; a stub stands in"
fi
# `specforge` on PATH for the arm's train job: SpecForge's own CLI with its wheels in front
printf '#!/bin/sh\nPYTHONPATH=%s exec python3 -m specforge.cli "$@"\n' "$SF_PATH" > /tmp/bin/specforge && chmod +x /tmp/bin/specforge
PYTHONPATH=$SF_PATH timeout 120 python3 -c 'import specforge.cli, specforge.training.trainer, specforge.runtime.data_plane.offline_reader' \
  > "$WORK/sf_import.log" 2>&1 || { log "SpecForge does not import: $(tail -1 "$WORK/sf_import.log")"; exit 1; }
rm -rf results/demo-gpu resources/demo/gpu .snakemake
t0=$(date +%s)
python3 -m snakemake all --profile gpu1 --configfile config/demo-gpu.yaml config/demo-gpu-specforge.yaml > "$WORK/full.log" 2>&1
log "snakemake --profile gpu1 --configfile config/demo-gpu.yaml config/demo-gpu-specforge.yaml all: rc $? in $(( $(date +%s) - t0 )) s"
r=results/demo-gpu
tar czf "$WORK/demo-gpu-results.tar.gz" --ignore-failed-read $r/report $r/records $r/gate $r/bench/*/*/*.json \
  $r/train/*/summary.json $r/train/*/validation.json $r/train/*/drafter/draftlab_import.json $r/capture $r/benchmarks \
  $r/logs $r/train-state/specforge-keep/specforge/draftlab_run.yaml resources/demo/gpu/manifest.json 2>/dev/null
cp $r/report/summary.md "$WORK/summary.md" 2>/dev/null
grep -h -A3 "^\*\*Deploy" $r/report/summary.md >> "$WORK/steps.log" 2>/dev/null
python3 - "$r" >> "$WORK/steps.log" 2>&1 <<'PY'
import csv, json, sys
from pathlib import Path
r = Path(sys.argv[1])
for row in csv.DictReader(open(r / "records/records.csv")):
    if row.get("variant") in ("baseline", "finetune-keep", "specforge-keep"):
        print(row["variant"], {k: row.get(k) for k in ("num_steps", "client", "accept_length", "tps_median",
                                                       "val_acc_per_step", "train_device")})
cap = json.loads((r / "capture/capture.json").read_text())
print("capture:", {k: cap[k] for k in ("engine", "samples", "tokens", "bytes", "seconds_last_attempt")})
for line in (r / "report/summary.md").read_text().splitlines():  # the paired speed-ups of both keep arms
    if "finetune-keep" in line or "specforge-keep" in line:
        print("summary:", line[:300])
PY
