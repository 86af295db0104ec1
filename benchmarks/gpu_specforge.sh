#!/usr/bin/env bash
# SpecForge 0.2.0 trains the `keep` arm of demo-gpu on one GPU, offline (issue 23, item 4): no capture server,
# no Mooncake. draftlab dumps the target's features, files them as SpecForge's .ckpt samples, writes the offline
# run config (data.hidden_states_path, deployment local_colocated; warm start from the patched drafter, its own
# mapping pinned), SpecForge trains for the builtin keep arm's steps, `draftlab import-specforge` reads the
# checkpoint back, and eval-drafter scores both keep drafters on the same tokens (per-TTT-step accuracy).
#
# Needs: a finished `bash benchmarks/gpu_loop.sh full` in this checkout (results/demo-gpu: target, tokens,
# patched drafter, the builtin finetune-keep arm). The host's image has torch 2.11 (SpecForge's pin).
# Wheels in ${WHEELS:-../.whl} (no network; installed --no-deps into /tmp/site by gpu_env.sh), about 20 MB:
#   pip download --no-deps -d ../.whl specforge==0.2.0 transformers==5.8.1 accelerate datasets dill \
#       multiprocess xxhash pydantic pydantic-core annotated-types typing-inspection
#   plus the snakemake wheels gpu_loop.sh already carries. The first step below imports SpecForge's offline
#   training path and stops naming any module still missing.
#   bash benchmarks/gpu_specforge.sh       # logs and small results in ${OUT:-/tmp/gpu-specforge-out}
set -uo pipefail
OUT=${OUT:-/tmp/gpu-specforge-out}
WHEELS=${WHEELS:-../.whl}
EXP=results/demo-gpu
SF=$EXP/train-state/finetune-keep-specforge-offline/specforge
mkdir -p "$OUT"
log() { echo "[gpu_specforge $(date -u +%H:%M:%S)] $*" | tee -a "$OUT/steps.log"; }

. "$(dirname "$0")/gpu_env.sh"
gpu_env || { log "wheel install failed"; tail -5 "$OUT/pip.log"; exit 1; }
python3 - <<'EOF' 2>&1 | tee -a "$OUT/steps.log" || exit 1
import importlib, torch
for m in ("specforge.cli", "specforge.launch", "specforge.training.assembly", "specforge.algorithms.eagle3.providers",
          "specforge.data.utils", "specforge.modeling.target.target_head", "specforge.runtime.data_plane.offline_reader"):
    importlib.import_module(m)
import specforge, transformers
print("torch", torch.__version__, "transformers", transformers.__version__, "cuda", torch.cuda.is_available())
EOF
[ -d "$EXP/train/finetune-keep" ] || { log "$EXP/train/finetune-keep missing: run benchmarks/gpu_loop.sh full first"; exit 1; }

STEPS=$(python3 -c "import json; print(json.load(open('$EXP/config.json'))['train']['steps'])")
t0=$(date +%s)
draftlab dump-hidden-states --target $EXP/models/target/model --tokens $EXP/data/tokens.jsonl \
  --drafter $EXP/drafter/patched --out /tmp/sf-dump --device cuda > "$OUT/dump.log" 2>&1 || { log "dump failed"; exit 1; }
draftlab specforge-features --dump /tmp/sf-dump --out /tmp/sf-features > "$OUT/features.log" 2>&1 || { log "features failed"; exit 1; }
log "features: $(tail -1 "$OUT/features.log") in $(( $(date +%s) - t0 )) s"
# keep: warm start from the patched drafter, its own mapping pinned; the merged config's steps, batch, lr, nproc
# (--data is only fingerprinted in offline mode: the features carry the tokens)
draftlab specforge-command --config $EXP/config.json --target $EXP/models/target/model \
  --draft-config $EXP/drafter/patched/config.json --data $EXP/data/tokens.jsonl --tokens $EXP/data/tokens.jsonl \
  --mapping $EXP/drafter/patched --ckpt-dir $EXP/drafter/patched --hidden-states /tmp/sf-features \
  --output-dir $SF > "$OUT/prepare.log" 2>&1 || { log "specforge-command failed"; cat "$OUT/prepare.log"; exit 1; }
cp $SF/draftlab_run.yaml "$OUT/"
t0=$(date +%s)
python3 -m specforge.cli train --config $SF/draftlab_run.yaml > "$OUT/specforge_train.log" 2>&1
rc=$?
dt=$(( $(date +%s) - t0 ))
log "specforge train: rc $rc in $dt s for $STEPS steps ($(python3 -c "print(round($STEPS / max($dt, 1), 2))") steps/s incl. load)"
[ $rc -eq 0 ] || { tail -30 "$OUT/specforge_train.log"; exit 1; }
draftlab import-specforge $SF --out /tmp/sf-keep/drafter --expect-mapping $EXP/drafter/patched \
  --draft-config $EXP/drafter/patched/config.json --expect-steps "$STEPS" --json > "$OUT/import.json" 2> "$OUT/import.log" \
  || { log "import-specforge failed: $(tail -1 "$OUT/import.log")"; exit 1; }
log "import-specforge: $(python3 -c "import json; d=json.load(open('$OUT/import.json')); print(d.get('specforge_step'), d.get('mapping_check'))")"
for who in specforge:/tmp/sf-keep/drafter builtin:$EXP/train/finetune-keep/drafter; do
  draftlab eval-drafter --drafter "${who#*:}" --target $EXP/models/target/model --tokens $EXP/data/tokens.jsonl --json \
    > "$OUT/eval_${who%%:*}.json" 2> "$OUT/eval_${who%%:*}.log"
  log "eval-drafter ${who%%:*}: rc $? $(python3 -c "import json; print(json.load(open('$OUT/eval_${who%%:*}.json')).get('acc'))" 2>/dev/null)"
done
