#!/usr/bin/env bash
# N clean runs of one experiment, each in a work dir of its own (a copy of this checkout's tracked files, run
# with that copy's src/ first on PYTHONPATH; demo pair rebuilt, nothing cached), then one table: each run's verdict, deployed arm and paired speed-up (
# does the answer hold from run to run?). Runs one after another: they would disturb each other's timings.
#
#   benchmarks/verdict_stability.sh N [snakemake args...]
#   benchmarks/verdict_stability.sh 3                                                   # the CPU default, 2 cores
#   benchmarks/verdict_stability.sh 3 --config size=smoke                               # the smoke size
#   benchmarks/verdict_stability.sh 3 --profile gpu1 --configfile config/demo-gpu.yaml  # demo-gpu, one GPU
#
# OUT (default /tmp/verdict-stability) holds run-1, run-2, ... (each with run.log, wall_s and its results/); a
# second call adds runs after those there (N = 1 three times = three runs, e.g. under a 10-minute limit per
# command; N = 0 only prints the table). CORES (default 2) is passed as --cores unless the args name a --profile.
# The table, over every run in OUT, is also written to OUT/verdicts.md. KEEP_DEMO=1: a run after the first starts
# with run-1's demo pair (resources/, copied with its times, so the pipeline takes it as built) and clean results:
# its stability is the loop's on one target, as a user's real target is fixed, and it saves the demo build's
# minutes where a device's time is short; the table marks such runs.
set -euo pipefail
n="${1:?usage: benchmarks/verdict_stability.sh N [snakemake args...]}"
shift
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${OUT:-/tmp/verdict-stability}"
mkdir -p "$out"
cores=(--cores "${CORES:-2}")
for a in "$@"; do [[ "$a" == --profile* ]] && cores=(); done
have=$(find "$out" -maxdepth 1 -name 'run-*' -type d | wc -l)
for i in $(seq $((have + 1)) $((have + n))); do
  wd="$out/run-$i"
  mkdir "$wd"
  # the checkout's tracked files as they are now (no results, no demo build); without git, all but those
  if git -C "$root" rev-parse --git-dir > /dev/null 2>&1; then
    (cd "$root" && git ls-files -z | tar --null -T - -cf -) | tar -xf - -C "$wd"
  else
    (cd "$root" && tar --exclude=./results --exclude=./resources --exclude=./.snakemake --exclude=./.git -cf - .) \
      | tar -xf - -C "$wd"
  fi
  if [ "${KEEP_DEMO:-0}" = 1 ] && [ "$i" -gt 1 ] && [ -d "$out/run-1/resources" ]; then
    cp -a "$out/run-1/resources" "$wd/" && echo "run-1" > "$wd/demo_from"
  fi
  echo "verdict_stability: run $i ($((i - have)) of $n) in $wd" >&2
  t0=$(date +%s)
  # the run's own copy of the library: every run measures the same code, whatever happens to the checkout meanwhile
  (cd "$wd" && PYTHONPATH="$wd/src${PYTHONPATH:+:$PYTHONPATH}" snakemake all "${cores[@]}" "$@" > run.log 2>&1) \
    || { echo "run $i failed: see $wd/run.log" >&2; exit 1; }
  echo $(( $(date +%s) - t0 )) > "$wd/wall_s"
done
python3 - "$out" <<'PY'
import glob, json, os, sys
out = sys.argv[1]
n = len(glob.glob(os.path.join(out, "run-*")))
lines = ["| run | verdict | deployed arm | setting | paired speed-up [95%] | candidates / why | launch drift / margin | wall s |",
         "|---|---|---|---|---|---|---|---|"]
for i in range(1, n + 1):
    wd = os.path.join(out, f"run-{i}")
    recs = glob.glob(os.path.join(wd, "results", "*", "report", "recommendation.json"))
    if not recs:
        lines.append(f"| {i} | (no recommendation.json) | | | | | | |")
        continue
    r = json.load(open(recs[0]))
    d = r.get("deploy") or {}
    ci = r.get("speedup_ci95")
    sp = f"{r['speedup']:.2f}x" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "") if r.get("speedup") else ""
    if d.get("candidates"):
        need = d.get("prompts_needed")
        note = " vs ".join(f"{c['variant']}@{c['setting']}" for c in d["candidates"]) + \
               (f", ~{need} prompts would tell" if need else ", inside the noise band: more prompts would not tell")
    elif d.get("best_arm"):
        b = d["best_arm"]
        note = f"best {b['variant']}@{b['setting']} {b['speedup']:.2f}x, needs accept {b['accept_length_needed']:.2f}"
    else:
        note = ""
    wall = open(os.path.join(wd, "wall_s")).read().strip() if os.path.exists(os.path.join(wd, "wall_s")) else "–"
    ln, lm = r.get("launch_noise"), r.get("launch_margin")
    noise = f"{ln:.1%} / {lm:.1%}" if isinstance(ln, (int, float)) and isinstance(lm, (int, float)) else \
        (f"{ln:.1%}" if isinstance(ln, (int, float)) else "unmeasured")
    if os.path.exists(os.path.join(wd, "demo_from")):
        wall += " (demo pair of " + open(os.path.join(wd, "demo_from")).read().strip() + ")"
    lines.append(f"| {i} | {r.get('verdict')} | {r.get('winner') or '–'} | {r.get('setting') or '–'} | {sp} | {note} | {noise} | {wall} |")
text = "\n".join(lines)
print(text)
open(os.path.join(out, "verdicts.md"), "w").write(text + "\n")
PY
