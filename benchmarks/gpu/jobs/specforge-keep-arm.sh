# Superseded: SpecForge runs inside the pipeline now, as the arm specforge-keep of
# config/demo-gpu-specforge.yaml (the demo-gpu-loop-specforge job). Kept as the record of the 2026-12-04 H200 run
# in benchmarks/RESULTS.md ("The GPU SpecForge run") and as its CPU rehearsal.
# specforge-keep-arm: SpecForge 0.2.0 trains the `keep` arm of demo-gpu on one GPU, offline: no capture server,
# no Mooncake. draftlab dumps the target's features, files them as SpecForge's .ckpt samples, writes the offline
# run config (data.hidden_states_path, deployment local_colocated; warm start from the patched drafter, its own
# mapping pinned), SpecForge trains for the builtin keep arm's steps, `draftlab import-specforge` reads the
# checkpoint back, eval-drafter scores both keep drafters on the same tokens (per-TTT-step accuracy), and the
# SpecForge drafter is served with the arm's own serve-bench plan (accept length, tok/s) when time is left.
#
# Needs: a finished `snakemake --profile gpu1 --configfile config/demo-gpu.yaml all` in this checkout
# (bash benchmarks/gpu/run.sh demo-gpu-loop start): results/demo-gpu with config.json, models/target/model, data/tokens.jsonl,
# drafter/patched, train/finetune-keep and bench/finetune-keep/<spec>/plan.json. Run from the repo root:
#   bash benchmarks/gpu/run.sh specforge-keep-arm run
# Wheels (no network there), both folders at the repo root, both installed --no-deps:
#   ${WHEELS:-.whl}       snakemake 9 and its deps, pydantic, jsonschema -> /tmp/site (benchmarks/gpu/env.sh),
#                         on PYTHONPATH for every step
#   ${SF_WHEELS:-.whl-sf} SpecForge's offline trainer only -> /tmp/site-sf, put in front for the SpecForge steps:
#                         specforge==0.2.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 (py312), ~1.3 MB:
#     python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp -d .whl-sf \
#         specforge==0.2.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
#   Everything else `specforge train` imports on this path is in the image (torch 2.11 = SpecForge's pin,
#   accelerate, triton, transformers, safetensors, numpy, pandas, pyarrow, xxhash, yaml, psutil, PIL) or in .whl
#   (pydantic). SpecForge pins transformers==5.8.1; the image's 5.17.0 is used instead: on this path (draft
#   model build, warm start, offline reader, TargetHead, TTT loop, checkpoint) 5.8.1 and 5.17.0 gave
#   bit-identical weights after 12 CPU steps, and 5.8.1 would need tokenizers<=0.23.0 (the image has 0.23.2).
#   SpecForge imports `datasets` only for a type name on this path: if it does not import here (its pyarrow
#   floor is 24), a stub module stands in and steps.log says so.
# Output: $OUT (the runner's; default /tmp/gpu-out) gets steps.log, results.md (the table for benchmarks/RESULTS.md),
# results.json and logs.tar.gz (every log, the run config, the job file, import and eval JSONs, the bench
# results); the large intermediates (feature dump ~0.6 GB, SpecForge's output dir, the imported drafter) go to
# $SF_WORK (default /tmp/gpu-specforge). BUDGET (default 360 s) bounds the whole script: each step gets a timeout
# from what is left, and the optional steps (bench, held-out eval) are skipped when too little is.
# CPU rehearsal (no CUDA): DEVICE=cpu EXP=results/<smoke experiment> bash benchmarks/gpu/run.sh specforge-keep-arm run
# runs the same steps with `training.fsdp_sharding=NO_SHARD training.attention_backend=sdpa` and
# benchmarks/gpu/specforge_cpu_shim.py (SpecForge's Triton loss kernel swapped for its reference formula).
set -uo pipefail
WORK=${SF_WORK:-/tmp/gpu-specforge}  # the large intermediates (results and steps.log go to $OUT)
WHEELS=${WHEELS:-.whl}
SF_WHEELS=${SF_WHEELS:-.whl-sf}
SF_SITE=${SF_SITE:-/tmp/site-sf}
EXP=${EXP:-results/demo-gpu}
ARM=finetune-keep
DEVICE=${DEVICE:-cuda}
BUDGET=${BUDGET:-360}            # seconds for the whole script (a device command is capped at 600)
if [ "$DEVICE" = cpu ]; then
  SF_TRAIN=${SF_TRAIN:-"python3 benchmarks/gpu/specforge_cpu_shim.py"}
  SF_OVERRIDES=${SF_OVERRIDES:-"training.fsdp_sharding=NO_SHARD training.attention_backend=sdpa"}
else
  SF_TRAIN=${SF_TRAIN:-"python3 -m specforge.cli"}
  SF_OVERRIDES=${SF_OVERRIDES:-}
fi
START=$(date +%s)
SF=$WORK/specforge
LOGS=$WORK/logs
export HF_HUB_OFFLINE=1
rm -rf "$WORK" && mkdir -p "$OUT" "$LOGS" || exit 1
: > "$WORK/timings.txt"
left() { echo $((BUDGET - ($(date +%s) - START))); }
cap() { local l=$(( $(left) - ${2:-10} )); echo $(( l < $1 ? (l > 1 ? l : 1) : $1 )); }  # cap MAX [RESERVE]
log() { echo "[specforge-keep-arm $(date -u +%H:%M:%S) +$(( $(date +%s) - START ))s] $*" | tee -a "$OUT/steps.log"; }
timed() { echo "$1 $2" >> "$WORK/timings.txt"; }

finish() {  # on every exit: the table, the JSON, the logs
  python3 -c "import json,sys; print(json.dumps({l.split()[0]: int(l.split()[1]) for l in open(sys.argv[1]) if l.strip()}))" \
    "$WORK/timings.txt" > "$WORK/timings.json" 2>/dev/null
  python3 benchmarks/gpu/specforge_report.py summary --exp "$EXP" --arm $ARM --work "$WORK" \
    --out-md "$OUT/results.md" --out-json "$OUT/results.json" >> "$OUT/steps.log" 2>&1 || log "summary failed"
  cp "$OUT/steps.log" "$LOGS/" 2>/dev/null
  tar czf "$OUT/logs.tar.gz" -C "$WORK" logs timings.json $( [ -d "$WORK/bench" ] && echo bench ) 2>/dev/null
  log "done in $(( $(date +%s) - START )) s; results in $OUT (results.md, results.json, logs.tar.gz)"
  cat "$OUT/results.md" 2>/dev/null
}
trap finish EXIT

. "$GPU_DIR/env.sh"
gpu_env || { log "wheel install from $WHEELS failed"; tail -5 "$OUT/pip.log"; exit 1; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SF_SITE" \
  "$SF_WHEELS"/*.whl > "$LOGS/pip_sf.log" 2>&1 || { log "wheel install from $SF_WHEELS failed"; tail -5 "$LOGS/pip_sf.log"; exit 1; }
SF_PATH=$SF_SITE:$PYTHONPATH  # only the SpecForge steps see SpecForge's wheels
[ "$DEVICE" = cpu ] || log "$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1)"

# The modules `specforge train` imports on the offline colocated path (all of them, as a CPU run of this
# script loaded them), imported before any GPU time is spent: a missing one is named here.
check_sf() {
  PYTHONPATH=$1 timeout 120 python3 - <<'EOF'
import importlib, sys
mods = """specforge.cli specforge.application.composition specforge.application.planning specforge.launch
specforge.launch_plan specforge.training.assembly specforge.training.trainer specforge.training.backend
specforge.training.controller specforge.training.checkpoint specforge.training.model_loading specforge.training.schedule
specforge.algorithms.eagle3.providers specforge.algorithms.eagle3.model specforge.algorithms.eagle3.data
specforge.algorithms.model_providers specforge.core.loss specforge.core.lk_loss specforge.core.compact_teacher
specforge.core.eagle3_adapters specforge.data.utils specforge.data.loss_mask specforge.modeling.auto
specforge.modeling.draft.llama3_eagle specforge.modeling.draft.flex_attention specforge.modeling.target.target_head
specforge.runtime.data_plane.offline_reader specforge.runtime.data_plane.feature_dataloader
specforge.runtime.data_plane.feature_store specforge.optimizer specforge.lr_scheduler specforge.distributed
accelerate.utils triton datasets""".split()
bad = []
for m in mods:
    try:
        importlib.import_module(m)
    except Exception as exc:  # noqa: BLE001 - every failure is reported, then the step fails
        bad.append(f"{m}: {type(exc).__name__}: {exc}")
import torch, transformers
print("specforge side: torch", torch.__version__, "transformers", transformers.__version__, "cuda",
      torch.cuda.is_available(), "modules", len(mods) - len(bad), "of", len(mods))
for b in bad:
    print("IMPORT FAILED", b)
sys.exit(1 if bad else 0)
EOF
}
if ! PYTHONPATH=$SF_PATH timeout 120 python3 -c 'import datasets' > "$LOGS/datasets_import.log" 2>&1; then
  # on this path SpecForge imports `datasets` for the type name `Dataset` alone (data/utils.py,
  # data/preprocessing.py): where the carried wheel does not import (its pyarrow floor is 24), a stub stands in
  log "datasets does not import here ($(tail -1 "$LOGS/datasets_import.log" | cut -c1-200)); using a stub"
  mkdir -p "$WORK/stub/datasets"
  printf 'class Dataset:  # stub: SpecForge offline training uses the name only\n    pass\n' > "$WORK/stub/datasets/__init__.py"
  SF_PATH=$WORK/stub:$SF_PATH
fi
check_sf "$SF_PATH" > "$LOGS/imports.log" 2>&1
rc=$?
tail -n 3 "$LOGS/imports.log" | tee -a "$OUT/steps.log"
[ $rc -eq 0 ] || { log "SpecForge's offline path does not import (see above)"; exit 1; }
if [ "$DEVICE" != cpu ] && ! python3 -c 'import torch, sys; sys.exit(not torch.cuda.is_available())'; then
  log "no CUDA here (DEVICE=$DEVICE); DEVICE=cpu rehearses on CPU"; exit 1
fi

for p in config.json models/target/model/config.json data/tokens.jsonl drafter/patched/config.json \
         train/$ARM/drafter/config.json; do
  [ -e "$EXP/$p" ] || { log "$EXP/$p missing: run the pipeline first (bash benchmarks/gpu/run.sh demo-gpu-loop start)"; exit 1; }
done
read -r STEPS TTT <<< "$(python3 -c "import json; t=json.load(open('$EXP/config.json'))['train']; print(t['steps'], t['ttt_length'])")"
LOGI=$(( STEPS / 20 > 0 ? STEPS / 20 : 1 ))  # SpecForge's console metrics every LOGI steps (steps/s windows)
log "experiment $EXP: arm $ARM, $STEPS steps, ttt_length $TTT, device $DEVICE, budget $BUDGET s"
[ "$(left)" -ge 150 ] || { log "only $(left) s of BUDGET=$BUDGET left: the steps need 150 s at least"; exit 1; }

t0=$(date +%s)
timeout -k 5 "$(cap 120 130)" draftlab dump-hidden-states --target $EXP/models/target/model --tokens $EXP/data/tokens.jsonl \
  --drafter $EXP/drafter/patched --out "$WORK/dump" --device "$DEVICE" > "$LOGS/dump.log" 2>&1 \
  || { log "dump-hidden-states failed (rc $?, 124 = timed out): $(tail -1 "$LOGS/dump.log")"; exit 1; }
timed dump_s $(( $(date +%s) - t0 ))
t0=$(date +%s)
timeout -k 5 "$(cap 90 120)" draftlab specforge-features --dump "$WORK/dump" --out "$WORK/features" > "$LOGS/features.log" 2>&1 \
  || { log "specforge-features failed (rc $?): $(tail -1 "$LOGS/features.log")"; exit 1; }
timed features_s $(( $(date +%s) - t0 ))
rm -rf "$WORK/dump"
log "features: $(tail -1 "$LOGS/features.log"); $(du -sh "$WORK/features" | cut -f1)"
# keep: warm start from the patched drafter, its own mapping pinned; the merged config's steps, batch, lr, nproc
# (--data is only fingerprinted in offline mode: the features carry the tokens)
timeout -k 5 "$(cap 60 110)" draftlab specforge-command --config $EXP/config.json --target $EXP/models/target/model \
  --draft-config $EXP/drafter/patched/config.json --data $EXP/data/tokens.jsonl --tokens $EXP/data/tokens.jsonl \
  --mapping $EXP/drafter/patched --ckpt-dir $EXP/drafter/patched --hidden-states "$WORK/features" \
  --output-dir "$SF" > "$LOGS/prepare.log" 2>&1 || { log "specforge-command failed"; cat "$LOGS/prepare.log"; exit 1; }
cp "$SF/draftlab_run.yaml" "$SF/draftlab_specforge_job.json" "$LOGS/"

TRAIN_CAP=$(( $(left) - 75 ))  # kept back: import, both evals, the summary
[ "$TRAIN_CAP" -ge 30 ] || { log "only $(left) s left before training: raise BUDGET"; exit 1; }
log "specforge train (cap $TRAIN_CAP s): $SF_TRAIN train --config $SF/draftlab_run.yaml training.log_interval=$LOGI $SF_OVERRIDES"
t0=$(date +%s)
# shellcheck disable=SC2086 # SF_TRAIN and SF_OVERRIDES are word lists
PYTHONPATH=$SF_PATH timeout -k 10 "$TRAIN_CAP" $SF_TRAIN train --config "$SF/draftlab_run.yaml" \
  training.log_interval=$LOGI $SF_OVERRIDES > "$LOGS/specforge_train.log" 2>&1
rc=$?
dt=$(( $(date +%s) - t0 ))
timed specforge_train_s $dt
timed specforge_train_rc $rc
last=$(grep -o '^step [0-9]*' "$LOGS/specforge_train.log" | tail -1)
log "specforge train: rc $rc$( [ $rc -eq 124 ] && echo " (timed out)") in $dt s: ${last:-no step logged} of $STEPS$( [ $rc -eq 0 ] \
  && echo "; $(python3 -c "print(round($STEPS / max($dt, 1), 2))") steps/s including load and compile")"
EXPECT=(--expect-steps "$STEPS")
if [ $rc -ne 0 ]; then
  grep -v '^\[rank0\]:   ' "$LOGS/specforge_train.log" | tail -25 | tee -a "$OUT/steps.log"
  ls -d "$SF"/draftlab-step* >/dev/null 2>&1 || exit 1
  log "importing SpecForge's last checkpoint anyway, labelled partial"
  EXPECT=()
fi
timeout -k 5 "$(cap 60 60)" draftlab import-specforge "$SF" --out "$WORK/sf-keep/drafter" --expect-mapping $EXP/drafter/patched \
  --draft-config $EXP/drafter/patched/config.json "${EXPECT[@]}" --json > "$LOGS/import.json" 2> "$LOGS/import.log" \
  || { log "import-specforge failed: $(tail -1 "$LOGS/import.log")"; exit 1; }
log "import-specforge: $(python3 -c "import json; d=json.load(open('$LOGS/import.json')); print('step', d.get('specforge_step'), 'mapping', d.get('mapping_check'), 'dtype', d.get('dtype'))")"

evaluate() {  # evaluate WHO DRAFTER SPLIT TOKENS [MAX_SAMPLES]
  local t0=$(date +%s)
  timeout -k 5 "$(cap 90 5)" draftlab eval-drafter --drafter "$2" --target $EXP/models/target/model --tokens "$4" \
    --ttt-length "$TTT" --device "$DEVICE" ${5:+--max-samples $5} --json > "$LOGS/eval_$1_$3.json" 2> "$LOGS/eval_$1_$3.log"
  log "eval-drafter $1 on $3: rc $? in $(( $(date +%s) - t0 )) s: acc $(python3 -c "import json; print([round(a, 3) for a in json.load(open('$LOGS/eval_$1_$3.json'))['acc']])" 2>/dev/null)"
}
evaluate specforge "$WORK/sf-keep/drafter" tokens $EXP/data/tokens.jsonl
evaluate builtin "$EXP/train/$ARM/drafter" tokens $EXP/data/tokens.jsonl

# Optional, as time allows: the SpecForge drafter through the arm's own serve-bench plan (the builtin arm's
# result is the pipeline's, same plan), then both drafters on the demo's held-out text.
if [ "$(left)" -ge 70 ]; then
  t0=$(date +%s)
  plan=$(python3 benchmarks/gpu/specforge_report.py plan --exp $EXP --arm $ARM --drafter "$WORK/sf-keep/drafter" \
    --variant $ARM-specforge --out-dir "$WORK/bench" 2> "$LOGS/bench_plan.log") \
    && timeout -k 10 "$(cap 150 12)" draftlab serve-bench --plan "$plan" --no-progress > "$LOGS/serve_bench.log" 2>&1
  rc=$?
  timed bench_s $(( $(date +%s) - t0 ))
  cp "$WORK/bench/server.log" "$LOGS/bench_server.log" 2>/dev/null
  log "serve-bench ($ARM-specforge): rc $rc in $(( $(date +%s) - t0 )) s: $(tail -1 "$LOGS/serve_bench.log")"
else
  log "serve-bench skipped: $(left) s left"
fi
HELDOUT=$(python3 -c "import json; print(json.load(open('$EXP/config.json'))['demo']['out'])" 2>/dev/null)/$(python3 -c \
  "import json; print(json.load(open('$EXP/config.json'))['size'])" 2>/dev/null)/work/data/heldout.tokens.jsonl
if [ -f "$HELDOUT" ] && [ "$(left)" -ge 50 ]; then
  evaluate specforge "$WORK/sf-keep/drafter" heldout "$HELDOUT" 64
  [ "$(left)" -ge 20 ] && evaluate builtin "$EXP/train/$ARM/drafter" heldout "$HELDOUT" 64
else
  log "held-out eval skipped ($HELDOUT: $( [ -f "$HELDOUT" ] && echo "$(left) s left" || echo missing))"
fi
