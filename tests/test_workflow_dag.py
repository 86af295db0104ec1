"""The Snakemake workflow as a DAG: dry runs of both configs, the printed commands, lint and format."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from gate_seed import SEEDED_DRY_RUN, seed_past_gate
from helpers import copy_workflow, snakemake

ROOT = Path(__file__).resolve().parents[1]


def _env(**extra) -> dict:
    env = dict(os.environ)
    # no network and no GPU: any attempt to reach the Hub fails through a dead proxy
    env.update(HF_HUB_OFFLINE="1", CUDA_VISIBLE_DEVICES="", https_proxy="http://127.0.0.1:9",
               http_proxy="http://127.0.0.1:9", HTTPS_PROXY="http://127.0.0.1:9", HTTP_PROXY="http://127.0.0.1:9")
    env.update(extra)
    return env


def _run(args: list[str], cwd: Path = ROOT, check: bool = True, **kw) -> subprocess.CompletedProcess:
    """A Snakemake run (a dry run, mostly) offline and without GPUs; ``kw`` as helpers.snakemake takes."""
    return snakemake(cwd, *args, env=_env(), timeout=120, check=check, **kw)


def job_blocks(text: str) -> list[str]:
    """The text of each job of a dry run (Snakemake starts every job with a [date] line)."""
    return [b for b in re.split(r"^\[\w{3} \w{3} .*\]$", text, flags=re.M)[1:] if re.search(r"rule \w+:", b)]


def launch_jobs(counts: dict[str, int]) -> int:
    """Starts of the target a dry run plans: its launch_<id> jobs (rule launch_plan only writes a plan)."""
    return sum(n for rule, n in counts.items() if rule.startswith("launch_") and rule != "launch_plan")


def job_counts(text: str) -> dict[str, int]:
    """The 'Job stats' table of a dry run as {rule: count}."""
    counts: dict[str, int] = {}
    block = text.split("Job stats:", 1)[1]
    for line in block.splitlines()[3:]:
        m = re.match(r"^(\w+)\s+(\d+)$", line.strip())
        if not m:
            break
        counts[m.group(1)] = int(m.group(2))
    return counts


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return copy_workflow(tmp_path_factory.mktemp("wf"))


def past_gate(tmp_path: Path, args: list[str], passed: bool = True) -> str:
    """The dry run ``args`` (with -n) of a fresh copy in ``tmp_path`` once the probe gate has decided."""
    return gate_plans(tmp_path, args, passed)[1].stdout


def gate_plans(tmp_path: Path, args: list[str], passed: bool = True):
    """The dry runs ``args`` of a fresh copy in ``tmp_path``: before the probe gate (up to it) and after
    it decided (``passed``): what follows it."""
    cwd = copy_workflow(tmp_path)
    before = _run(args, cwd=cwd)
    seed_past_gate(cwd, before.stdout, passed)
    return before, _run(SEEDED_DRY_RUN + args, cwd=cwd)


def test_default_dag_has_every_stage(workdir, tmp_path):
    out = _run(["-n", "--cores", "2", "all"], cwd=workdir)
    counts = job_counts(out.stdout)
    # the probe gate is a checkpoint: before it has decided, the plan ends at it (the probe's launch per
    # setting) and at the plain launch after it (baseline + fine-tune data: tokenize and d2t read the data)
    assert counts["launch_probe_s2_k1_d3"] == counts["launch_probe_s4_k1_d5"] == counts["launch_plain"] == 1
    assert launch_jobs(counts) == 3 and counts["probe_gate"] == 1 and counts["doctor"] == 1
    assert "train" not in counts and "breakeven" not in counts
    assert "DAG of jobs will be updated after completion" in out.stdout
    for rule in ("demo_models", "resolve_target", "acquire", "inspect", "patch_config", "compare", "d2t_diff",
                 "d2t_coverage", "tokenize", "vocab_mapping", "records", "records_merge", "report"):
        assert counts.get(rule) == (2 if rule == "inspect" else 1), rule
    assert "sglang" not in out.stdout
    assert "generate_data" not in counts  # the plain launch answers the prompts
    # once it passed: one arms launch per setting benches the 4 trained arms in turn (5 launches in all, 11
    # before issue 35), the arms' training and doctor, and break-even per (setting, client)
    after = job_counts(past_gate(tmp_path, ["-n", "--cores", "2", "all"]))
    assert after["launch_arms_s2_k1_d3"] == after["launch_arms_s4_k1_d5"] == 1 and launch_jobs(after) == 2
    assert after["train"] == 4 and after["doctor"] == 4 and after["breakeven"] == 2
    assert "probe_gate" not in after


def test_closed_gate_leaves_the_arms_out_of_the_dag_and_the_report_is_told_why(tmp_path):
    """Issue 25: the gate decides which arms exist. Closed: no train, no arm doctor or server; the report
    is handed the gate decision (its reason is what the summary says) and no train folder."""
    out = past_gate(tmp_path, ["-n", "-p", "--cores", "2", "all"], passed=False)
    counts = job_counts(out)
    assert launch_jobs(counts) == 0 and counts["breakeven"] == 2 and counts["report"] == 1
    assert {"train", "doctor", "experiment_config"}.isdisjoint(counts)
    assert not re.search(r"bench/(finetune-|scratch)", out)
    report = next(l for l in out.splitlines() if "draftlab report " in l)
    assert "--gate results/demo-k2-to-k25/gate/gate.json" in report
    assert re.search(r"--train --", report) and "doctor-finetune" not in report
    # rule records is handed its files as declared inputs: the baseline's and probe's results, the gate
    records = next(b for b in job_blocks(out) if "rule records:" in b)
    inputs = re.search(r"^\s+input: (.+)$", records, re.M).group(1).split(", ")
    exp = "results/demo-k2-to-k25"
    assert f"{exp}/bench/baseline/plain/default.json" in inputs and f"{exp}/gate/gate.json" in inputs
    assert f"{exp}/bench/probe/s2-k1-d3/serve.json" in inputs and not any("/train/" in i for i in inputs)


def test_kimi_dag_on_gpu8_prints_real_sglang_and_training_commands(tmp_path):
    """Exactly as a user types it (in a copy of the repository), on a machine with no GPU and no network:
    first up to the probe gate, then (the gate passed) the arms."""
    before, after = gate_plans(tmp_path, ["--profile", "gpu8", "--configfile", "config/kimi-k25.yaml", "-n", "-p",
                                          "all"])
    text = before.stdout + after.stdout
    assert "Using profile gpu8" in before.stdout + before.stderr
    launches = [l for l in text.splitlines() if "python -m sglang.launch_server" in l and "serve-launch" in l]
    # probe; the reference (its own d2t map: a launch of its own); plain (baseline + data); after the gate one
    # launch per d2t map: finetune-keep (the drafter's map), finetune-regenerate then scratch (the corpus map);
    # then bench.launch_replicates 2: both arms launches and the plain launch again (plain, arms | arms, plain)
    assert len(launches) == 5 + 3
    # -n -p says what the plan can tell before it runs, and the setting that would lower it
    assert re.search(r"# power: this plan \(8 launches .* tells a speed-up of 1\.\d\dx or more from 1\.0 with 90% power", text)
    assert "# power: bench.launch_replicates: 3 (11 launches" in text
    # the fine-tune data: K2.5 answers the prompts through the plain launch's SGLang server (tp 8, no drafter)
    gen = [l for l in text.splitlines() if "draftlab generate-data " in l]
    assert len(gen) == 1 and "--prompts data/kimi-k25-prompts.jsonl" in gen[0] and "--concurrency 128" in gen[0]
    assert gen[0].strip().startswith("# then answers the fine-tune prompts through the same server")
    assert gen[0].rstrip().endswith("--url '{url}'")
    plain = next(b for b in job_blocks(text) if re.search(r"^rule launch_plain:", b.strip()))
    assert "results/kimi-k25/data/generated.jsonl" in plain and re.search(r"resources: [^\n]*\bgpu=8\b", plain)
    assert "python -m sglang.launch_server --model-path results/kimi-k25/models/target/model --tp-size 8 " in plain
    assert "--speculative" not in plain.split("serve-launch", 1)[1].split("\n", 1)[0]
    probe = next(l for l in launches if "launch/probe-" in l)
    for flag in ("--model-path results/kimi-k25/models/target/model", "--speculative-algorithm EAGLE3",
                 "--speculative-draft-model-path results/kimi-k25/drafter/patched", "--speculative-num-steps 2",
                 "--speculative-eagle-topk 1", "--speculative-num-draft-tokens 3", "--tp-size 8",
                 "--mem-fraction-static 0.85", "--cuda-graph-max-bs-decode 16", "--trust-remote-code",
                 "--host 127.0.0.1", "--port 30000"):
        assert flag in probe, flag
    baseline = next(l for l in launches if "launch/plain/" in l)
    assert "--speculative" not in baseline and "--tp-size 8" in baseline
    # one host (issue 34): no capture host, no Mooncake; the features are captured once, under torchrun on the
    # whole host (SpecForge's scripts/prepare_hidden_states.py, --tp-size 8), with the disk estimate in the plan
    assert not re.search(r"capture-host|mooncake|specforge-preflight|disaggregated", text, re.I)
    assert job_counts(after.stdout)["capture"] == 1
    cap = next(b for b in job_blocks(after.stdout) if "rule capture:" in b)
    assert re.search(r"output: results/kimi-k25/capture/capture.json", cap)
    run = next(l for l in cap.splitlines() if "torchrun" in l)
    assert re.search(r"DATA=\$\(draftlab capture-preflight --engine specforge .*--checkout SpecForge 2>> "
                     r"results/kimi-k25/logs/capture.log\) && torchrun --standalone --nproc_per_node 8 "
                     r"SpecForge/scripts/prepare_hidden_states.py --strategy eagle3 ", run), run
    for flag in ("--target-model-path results/kimi-k25/models/target/model", "--tp-size 8",
                 "--draft-model-config results/kimi-k25/capture-state/draft_config.json", '--data-path "$DATA"',
                 "--output-path results/kimi-k25/capture-state/features", "--chat-template kimi-k2-instruct",
                 "--max-length 2048", "--trust-remote-code", "&& draftlab capture-record "):
        assert flag in run, flag
    assert re.search(r"^# capture: aux layer ids.*eagle_aux_hidden_state_layer_ids", cap, re.M)
    assert re.search(r"^# capture: disk estimate: tokens of results/kimi-k25/data/tokens.jsonl x \(aux layers \+ 1\) "
                     r"x hidden x dtype bytes", cap, re.M)
    assert re.search(r"resources: .*\bgpu=8\b", cap)
    # training: SpecForge 0.2.0's own launcher on the run config the prepare step writes from the merged
    # experiment config, over the capture's features (local_colocated: tests/test_contract_specforge.py);
    # the drafter config is the same file in the plan and at run time; mapping pinned
    jobs_text = "\n".join(l for l in text.splitlines() if not l.startswith("# plan: "))  # the gate's notes aside
    train = [l for l in jobs_text.splitlines() if "draftlab specforge-command" in l]
    assert len(train) == 3 and jobs_text.count("torchrun") == 1 and "train_eagle3.py" not in text
    for l in train:
        arm = re.search(r"--out results/kimi-k25/train/([\w-]+)/drafter ", l).group(1)
        out = f"results/kimi-k25/train-state/{arm}/specforge"
        assert re.search(r"(^|: |\( )draftlab specforge-command --config results/kimi-k25/config.json "
                         "--target results/kimi-k25/models/target/model "
                         "--draft-config results/kimi-k25/drafter/patched/config.json ", l.strip()), l
        assert f"--output-dir {out}" in l and "--tokens results/kimi-k25/data/tokens.jsonl" in l
        assert "--capture results/kimi-k25/capture/capture.json" in l
        assert (f"# train {arm} with SpecForge 0.2.0 on this host: data.hidden_states_path "
                "results/kimi-k25/capture-state/features (rule capture), deployment.mode local_colocated, "
                "trainer.nproc_per_node 8") in text
        assert f"&& specforge train --config {out}/draftlab_run.yaml &&" in l
        assert (f"&& draftlab import-specforge {out} --out results/kimi-k25/train/{arm}/drafter "
                "--expect-mapping ") in l and "--expect-steps 20000" in l
        assert "draftlab gated" not in l  # the arm exists only because the gate opened
        assert ("--ckpt-dir results/kimi-k25/drafter/patched" in l) == (arm != "scratch")
        pinned = "results/kimi-k25/drafter/patched" if arm == "finetune-keep" else "results/kimi-k25/capture/vocab.safetensors"
        assert f"--mapping {pinned} " in l
    for block in job_blocks(after.stdout):
        if re.search(r"^rule train:", block.strip()):
            assert re.search(r"input: .*results/kimi-k25/capture/capture.json", block), block
    assert re.search(r"rule experiment_config:\s+output: results/kimi-k25/config.json", text)
    # the doctor report precedes every launch of a drafter; GPU jobs reserve the whole host
    probe_job = next(b for b in job_blocks(before.stdout) if "rule launch_probe_" in b)
    assert re.search(r"input: .*results/kimi-k25/static/doctor-probe\.json", probe_job)
    gpu_jobs = [b for t in (before.stdout, after.stdout) for b in job_blocks(t)
                if re.search(r"^rule (launch_(?!plan)\w+|train|capture):", b.strip())]
    assert len(gpu_jobs) == 5 + 3 + 3 + 1
    for block in gpu_jobs:
        assert re.search(r"resources: .*\bgpu=8\b", block), block
    cpu_jobs = [b for b in job_blocks(text) if re.search(r"^(local)?rule (doctor|inspect|records):", b.strip())]
    assert cpu_jobs and all(not re.search(r"\bgpu=[1-9]", b) for b in cpu_jobs)


def test_sweep_shares_one_launch_per_server_configuration(workdir, tmp_path):
    """Client variants never multiply servers, nor do drafters on the builtin server (swapped in): launches =
    1 + 2 x speculative settings (the probe's with the reference, the arms'). A draft tree is one more setting,
    its builtin server launched with SGLang's numbers under the builtin's flags."""
    cfg = yaml.safe_load((workdir / "config" / "config.yaml").read_text())
    cfg["speculative"] = [{"num_steps": k, "topk": 1, "num_draft_tokens": k + 1} for k in (1, 2)]
    cfg["speculative"].append({"num_steps": 3, "topk": 2, "num_draft_tokens": 5})
    cfg["bench"]["clients"] = [{"name": "a"}, {"name": "b", "concurrency": 4}, {"name": "c", "max_new_tokens": 8}]
    cfg["train"]["finetune_modes"] = ["remap"]
    cfg["reference"] = {"source": "hf:draftlab-demo/drafter-v1", "revision": "main"}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(cfg))
    out, after = gate_plans(tmp_path / "wf", ["-n", "-p", "--cores", "2", "all", "--configfile", str(path)])
    counts, after = job_counts(out.stdout), job_counts(after.stdout)
    # before the gate: probe + reference per setting, and the plain launch; after it: remap + scratch per setting
    assert launch_jobs(counts) == 3 + 1 and launch_jobs(counts) + launch_jobs(after) == 1 + 2 * 3
    assert counts["acquire"] == 2 and counts["compare"] == 2
    # every result of a server comes from that server's single job
    assert out.stdout.count("bench/probe/s2-k1-d3/a.json") >= 1
    job = next(b for b in job_blocks(out.stdout) if "rule launch_probe_s2_k1_d3:" in b)
    assert all(f"{v}/s2-k1-d3/{c}.json" in job for c in "abc" for v in ("probe", "reference"))
    assert "benches probe (launched with), then swaps in reference" in job
    tree = next(b for b in job_blocks(out.stdout) if "rule launch_probe_s3_k2_d5:" in b)
    assert re.search(r"-m draftlab\.cli serve .*--num-steps 3 --topk 2 --num-draft-tokens 5 ", tree), tree


def test_report_is_handed_exactly_the_configured_arms(workdir, tmp_path):
    """Issue 14: with train.scratch: false the report listed a scratch arm found by globbing; its rule now
    declares the doctor reports and train folders of the configured arms and names them on its command line."""
    path = tmp_path / "noscratch.yaml"
    path.write_text(yaml.safe_dump({"train": {"scratch": False, "finetune_modes": ["keep"]}}))
    out = past_gate(tmp_path / "wf", ["-n", "-p", "--cores", "1", "all", "--configfile", str(path)])
    report = next(l for l in out.splitlines() if l.startswith("draftlab report ") or " draftlab report " in l)
    doctor = report.split("--doctor ", 1)[1].split(" --", 1)[0].split()
    train = report.split("--train ", 1)[1].split(" --", 1)[0].split()
    exp = "results/demo-k2-to-k25"
    assert doctor == [f"{exp}/static/doctor-probe.json", f"{exp}/static/doctor-finetune-keep.json"]
    assert train == [f"{exp}/train/finetune-keep"] and "scratch" not in report
    assert job_counts(out)["train"] == 1
    # issue 22: the per-request results (paired speedups) and the plans (the recommendation's launch
    # command) of exactly the configured servers; the recommendation is the rule's output
    bench = report.split("--bench ", 1)[1].split(" --", 1)[0].split()
    plans = report.split("--plans ", 1)[1].split(" --launches", 1)[0].split()
    assert f"{exp}/bench/baseline/plain/default.json" in bench and all("scratch" not in b for b in bench)
    # issue 38: the baseline's plan too, the plain server a plain or cannot-tell verdict's deploy block names
    assert f"{exp}/bench/finetune-keep/s2-k1-d3/plan.json" in plans and f"{exp}/bench/baseline/plain/plan.json" in plans
    job = next(b for b in job_blocks(out) if "rule report:" in b)
    assert f"{exp}/report/recommendation.json" in job
    # issue 38: every arms launch's summary, whose launch_check sets the launch noise the decision carries
    launches = report.split("--launches ", 1)[1].split(" >", 1)[0].split()
    assert launches == [f"{exp}/launch/arms-{spec}/launch.json" for spec in ("s2-k1-d3", "s4-k1-d5")]


def test_unknown_config_key_stops_the_workflow(workdir, tmp_path):
    path = tmp_path / "typo.yaml"
    path.write_text(yaml.safe_dump({"gate": {"min_accept_lenght": 1.5}}))
    out = _run(["-n", "--cores", "1", "all", "--configfile", str(path)], cwd=workdir, check=False)
    assert out.returncode != 0
    assert "unknown key 'gate.min_accept_lenght'" in out.stdout + out.stderr


def test_lint_reports_nothing():
    out = _run(["--lint"])
    assert "Congratulations, your workflow is in a good condition!" in out.stdout + out.stderr
    assert "Lints for" not in out.stdout + out.stderr


def test_rules_are_snakefmt_formatted():
    snakefmt = shutil.which("snakefmt")
    if snakefmt is None:
        pytest.skip("snakefmt not installed (pip install -e '.[test]')")
    files = ["Snakefile"] + sorted(str(p.relative_to(ROOT)) for p in (ROOT / "workflow" / "rules").glob("*.smk"))
    out = subprocess.run([snakefmt, "--check", *files], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_gpu8_profile_resolves_from_the_repository_root():
    link = ROOT / "gpu8"
    assert link.is_symlink() and link.resolve() == (ROOT / "profiles" / "gpu8").resolve()
    prof = yaml.safe_load((ROOT / "profiles" / "gpu8" / "config.yaml").read_text())
    assert prof["resources"] == {"gpu": 8, "bench_slot": 1} and prof["keep-going"] is True and prof["retries"] >= 1
    assert prof["printshellcmds"] is True
    # profiles/default would be merged into every run (and override gpu8); there must not be one
    assert not (ROOT / "profiles" / "default").exists()


def test_local_profile_runs_the_default(workdir):
    out = _run(["--profile", "profiles/local", "-n", "all"], cwd=workdir)
    assert launch_jobs(job_counts(out.stdout)) == 3  # the probe's two, up to the gate, and the plain one


def test_specforge_reads_the_merged_config_of_every_configfile_and_override(tmp_path):
    """Two config files and a --config override: the prepare step reads what Snakemake merged, not the last file."""
    more = tmp_path / "more.yaml"
    more.write_text("train:\n  max_length: 3072\n  steps: 77\n")
    args = ["--configfile", "config/kimi-k25.yaml", str(more), "--config", "experiment=k25-merged"]
    workdir = tmp_path / "wf"
    plan = past_gate(workdir, args + ["-n", "-p", "all"])
    prepare = [l for l in plan.splitlines() if "draftlab specforge-command" in l]
    assert prepare and all("--config results/k25-merged/config.json " in l for l in prepare)
    _run(args + ["--cores", "1", "results/k25-merged/config.json"], cwd=workdir)
    merged = (workdir / "results/k25-merged/config.json").read_text()
    from draftlab.settings.config import load_config
    from draftlab.training.specforge import job_from_experiment

    cfg = load_config(workdir / "results/k25-merged/config.json")
    assert cfg["experiment"] == "k25-merged" and cfg["train"]["max_length"] == 3072
    job = job_from_experiment(cfg, target_model_path="t", draft_model_config="d.json", train_data_path="x",
                              output_dir="o", vocab_mapping=None)
    assert (job.max_length, job.steps, job.trust_remote_code) == (3072, 77, True)
    # unchanged config: the file is not rewritten (the train jobs do not rerun)
    before = (workdir / "results/k25-merged/config.json").stat().st_mtime_ns
    again = _run(args + ["-n", "all"], cwd=workdir).stdout
    assert "rule experiment_config" not in again
    assert (workdir / "results/k25-merged/config.json").stat().st_mtime_ns == before and merged


def test_demo_gpu_dag_on_gpu1_runs_every_stage_on_the_one_gpu(tmp_path):
    """`snakemake --profile gpu1 --configfile config/demo-gpu.yaml all`, dry, on a machine with no GPU:
    the whole loop (demo build included) with every GPU job holding the one GPU and CPU jobs beside."""
    link = ROOT / "gpu1"
    assert link.is_symlink() and link.resolve() == (ROOT / "profiles" / "gpu1").resolve()
    prof = yaml.safe_load((ROOT / "profiles" / "gpu1" / "config.yaml").read_text())
    assert prof["resources"]["gpu"] == 1 and prof["cores"] >= 2
    out, after = gate_plans(tmp_path / "wf", ["--profile", "gpu1", "--configfile", "config/demo-gpu.yaml", "-n",
                                              "-p", "all"])
    text = out.stdout + after.stdout
    assert "Using profile gpu1" in out.stdout + out.stderr
    counts, later = job_counts(out.stdout), job_counts(after.stdout)
    # the probe and the plain launch up to the gate, then one launch for the 3 fine-tune arms + scratch, and
    # (bench.launch_replicates 2) that arms launch and the plain launch again
    assert launch_jobs(counts) == 2 and launch_jobs(later) == 3
    assert "# power: this plan (5 launches" in text and "bench.launch_replicates: 3" in text
    assert later["train"] == 4 and counts["demo_models"] == 1 and "generate_data" not in counts
    for rule in ("resolve_target", "acquire", "inspect", "patch_config", "doctor", "probe_gate", "tokenize",
                 "vocab_mapping", "records", "records_merge", "report"):
        assert counts.get(rule), rule
    assert later.get("breakeven")
    lines = text.splitlines()
    assert any("draftlab demo-models --out resources/demo/gpu --size gpu" in l and "--device cuda" in l
               for l in lines)
    # the fine-tune data: the builtin server on the GPU answers 64 prompts at a time
    gen = next(l for l in lines if "draftlab generate-data " in l)
    assert "--concurrency 64" in gen and "--url '{url}'" in gen
    plain = next(l for l in lines if "draftlab serve-launch --plan results/demo-gpu/launch/plain/" in l)
    assert plain.split(" -- ")[1].startswith("python -m draftlab.cli serve --target results/demo-gpu/models/target/model "
                                            "--device cuda --max-batch-size 64 ")
    trains = [l for l in lines if re.search("(^|: )draftlab train ", l.strip())]
    assert len(trains) == 4 and all("--device cuda" in l for l in trains)
    serves = [l for l in lines if "draftlab serve-launch" in l]
    assert len(serves) == 5 and all("--device cuda" in l for l in serves)
    blocks = job_blocks(text)
    gpu_jobs = [b for b in blocks if re.search(r"^rule (demo_models|launch_(?!plan)\w+):", b.strip())]
    train_jobs = [b for b in blocks if re.search(r"^rule train:", b.strip())]
    assert len(gpu_jobs) == 1 + 5 and len(train_jobs) == 4
    # train.arms_per_gpu: 4: the arms share the GPU (a quarter of it each), every other GPU job holds it whole
    for block in gpu_jobs:
        assert re.search(r"resources: .*\bgpu=1, gpu_share=4\b", block), block
    for block in train_jobs:
        assert re.search(r"resources: .*\bgpu=0, gpu_share=1\b", block), block
    cpu_jobs = [b for b in blocks if re.search(r"^(local)?rule (doctor|inspect|records|report|tokenize):", b.strip())]
    assert cpu_jobs and all(not re.search(r"\bgpu=[1-9]", b) for b in cpu_jobs)
    # the quick GPU check: the smoke pair, built on the GPU too
    # (--forcerun: another test may have built the smoke demo in this checkout already)
    smoke = _run(["--profile", "gpu1", "--configfile", "config/demo-gpu.yaml", "--config", "size=smoke", "-n",
                  "-p", "--forcerun", "demo_models", "--", "all"])
    assert "--size smoke --threads" in smoke.stdout and job_counts(smoke.stdout)["probe_gate"] == 1


def _dag_files(text: str) -> set[str]:
    """Every output, log and benchmark file a dry run's jobs would write."""
    files: set[str] = set()
    for block in job_blocks(text):
        for m in re.finditer(r"^\s+(?:output|log|benchmark): (.+)$", block, flags=re.M):
            files.update(f.strip() for f in m.group(1).split(","))
    return files


def test_smoke_size_writes_nothing_into_the_default_runs_folder(workdir):
    """Issue 22: `--config size=smoke` (the README's quick version) wrote into results/<experiment>/ and
    replaced the full run's report; it is now the experiment <experiment>-smoke, with a folder of its own."""
    default = _dag_files(_run(["-n", "--cores", "2", "all"], cwd=workdir).stdout)
    smoke = _dag_files(_run(["-n", "--cores", "2", "all", "--config", "size=smoke"], cwd=workdir).stdout)
    assert "results/demo-k2-to-k25/report/summary.md" in default
    assert "results/demo-k2-to-k25-smoke/report/summary.md" in smoke
    assert len(default) > 50 and len(smoke) > 30
    assert default & smoke == set()
    assert not [f for f in smoke if f.startswith("results/demo-k2-to-k25/")]


_SHARING_SNAKEFILE = '''
from draftlab.experiment.jobs import register_gpu_shares, rule_gpu_resources
register_gpu_shares(workflow, config["arms_per_gpu"])
SPAN = "date +%s.%N > {output}; sleep 1.5; date +%s.%N >> {output}"
rule all:
    input: expand("train{i}", i=range(4)), expand("serve{i}", i=range(2))
rule train:
    output: "train{i}"
    resources: **rule_gpu_resources(workflow, 1, config["arms_per_gpu"], shared=True)
    shell: SPAN
rule serve:
    output: "serve{i}"
    resources: **rule_gpu_resources(workflow, 1, config["arms_per_gpu"])
    shell: SPAN
'''


@pytest.mark.parametrize("arms_per_gpu", [1, 2])
def test_arms_share_the_gpu_and_servers_hold_it_alone(tmp_path, arms_per_gpu):
    """train.arms_per_gpu on a real Snakemake run with one GPU (`--resources gpu=1`, as profile gpu1): at
    most that many training jobs at once, and a server job never beside anything."""
    (tmp_path / "Snakefile").write_text(_SHARING_SNAKEFILE)
    snakemake(tmp_path, "--cores", "8", "--resources", "gpu=1", "--config", f"arms_per_gpu={arms_per_gpu}",
              timeout=120)
    spans = {p.name: tuple(map(float, p.read_text().split())) for p in tmp_path.iterdir()
             if re.fullmatch(r"(train|serve)\d", p.name)}
    assert len(spans) == 6

    def beside(name: str) -> list[str]:
        a, b = spans[name]
        return [o for o, (c, d) in spans.items() if o != name and c < b - 0.1 and a < d - 0.1]

    assert all(beside(s) == [] for s in spans if s.startswith("serve"))
    # the most arms running at one instant (each arm's start is such an instant): 2 with 2, 1 with 1
    most = max(1 + sum(1 for o in beside(t) if spans[o][0] <= spans[t][0]) for t in spans if t.startswith("train"))
    assert most == arms_per_gpu


def test_smoke_plan_starts_the_target_five_times_and_says_what_each_launch_benches(tmp_path):
    """Issue 35: probe launch -> gate -> one plain launch (baseline + data) -> one arms launch per setting,
    every post-gate drafter swapped in; `-n -p` lists each launch's results and what it swaps. The smoke preset
    replicates (bench.launch_replicates 2): the arms launch again, then the plain launch, each after the last."""
    before, after = gate_plans(tmp_path, ["-n", "-p", "--cores", "2", "all", "--config", "size=smoke"])
    counts, later = job_counts(before.stdout), job_counts(after.stdout)
    assert launch_jobs(counts) + launch_jobs(later) == 5
    exp = "results/demo-k2-to-k25-smoke"
    again = next(b for b in job_blocks(after.stdout) if "rule launch_arms_s2_k1_d3_r2:" in b)
    assert f"{exp}/launch/arms-s2-k1-d3/launch.json" in again  # ordered after the first arms launch
    assert f"{exp}/launch/arms-s2-k1-d3-r2/finetune-keep-short.json" in again
    assert "replicate 2 of arms-s2-k1-d3" in again
    last = next(b for b in job_blocks(after.stdout) if "rule launch_plain_r2:" in b)
    assert f"{exp}/launch/arms-s2-k1-d3-r2/launch.json" in last and f"{exp}/launch/plain-r2/baseline-short.json" in last
    report = next(b for b in job_blocks(after.stdout) if re.search(r"^rule report:", b.strip()))
    assert f"{exp}/launch/plain-r2/launch.json" in report and f"{exp}/launch/arms-s2-k1-d3-r2/launch.json" in report
    arms = next(b for b in job_blocks(after.stdout) if "rule launch_arms_s2_k1_d3:" in b)
    for arm in ("finetune-keep", "finetune-remap", "finetune-regenerate", "scratch"):
        assert f"{exp}/bench/{arm}/s2-k1-d3/short.json" in arms and f"{exp}/bench/{arm}/s2-k1-d3/serve.json" in arms
    assert ("benches finetune-keep (launched with), then swaps in finetune-remap, finetune-regenerate, scratch"
            in arms)
    assert "trust: drafter checksum before each bench; finetune-keep measured again after the swaps" in arms
    assert f"{exp}/bench/baseline/plain/short.json" in arms  # plain decoding's answers, compared
    plain = next(b for b in job_blocks(before.stdout) if "rule launch_plain:" in b)
    assert f"{exp}/data/generated.jsonl" in plain and f"{exp}/gate/gate.json" in plain
    assert f"{exp}/bench/baseline/plain/short.json" in plain


def test_kimi_plan_groups_sglang_launches_by_d2t_map_and_names_the_deciding_files(tmp_path):
    """SGLang keeps its launch's d2t map (llama_eagle3.load_weights, eagle_worker_v2.init_lm_head): the
    post-gate drafters group by map, statically from their kind; the plan says why."""
    before, after = gate_plans(tmp_path, ["--profile", "gpu8", "--configfile", "config/kimi-k25.yaml", "-n", "-p",
                                          "all"])
    later = job_counts(after.stdout)
    assert later["launch_drafter_map_s2_k1_d3"] == later["launch_corpus_map_s2_k1_d3"] == 1
    assert launch_jobs(job_counts(before.stdout)) + launch_jobs(later) == 3 + 1 * 2 + 3  # the reference's launch, the replicates
    corpus = next(b for b in job_blocks(after.stdout) if "rule launch_corpus_map_s2_k1_d3:" in b)
    assert "benches finetune-regenerate (launched with), then swaps in scratch" in corpus
    assert "sglang/srt/models/llama_eagle3.py (load_weights: hot_token_id)" in corpus
    assert "sglang/srt/speculative/eagle_worker_v2.py (init_lm_head" in corpus
    keep = next(b for b in job_blocks(after.stdout) if "rule launch_drafter_map_s2_k1_d3:" in b)
    assert "--speculative-draft-model-path results/kimi-k25/train/finetune-keep/drafter" in keep
    assert "swaps in" not in keep  # alone in its group: no swap, no fresh-launch check
