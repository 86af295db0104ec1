"""The slurm profile on a real one-node SLURM cluster (tests/slurm/cluster.sh, started by .ci/run).

One smoke slice of the pipeline (acquire -> inspect -> patch config -> doctor -> serve + benchmark)
runs twice in temporary copies of the workflow: once with Snakemake's local executor, once through
`--profile profiles/slurm`. Both copies read the session's one smoke demo build (conftest
``smoke_demo``), so the only difference is where the jobs ran; the SLURM run must make the same files
with the same deterministic content.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from helpers import copy_workflow, snakemake

REPO = Path(__file__).resolve().parents[1]
# Laid over config/config.yaml: the smoke size, and serve_bench jobs that ask SLURM for one (fake)
# GPU each, as a GPU config would (the builtin server still runs on the CPU); demo.out is added per run.
OVERLAY = "size: smoke\nserve:\n  gpus: 1\n"
# Sized for a laptop or a 2-core CI runner; a user's own settings win.
SMALL_CLUSTER_ENV = {
    "DRAFTLAB_SLURM_JOBS": "4",
    "DRAFTLAB_SLURM_MEM_MB": "1000",
    "DRAFTLAB_SLURM_RUNTIME": "30",
    "DRAFTLAB_SLURM_GPU_MEM_MB": "3000",
    "DRAFTLAB_SLURM_GPU_RUNTIME": "30",
    "DRAFTLAB_SLURM_GPU_CPUS": "1",
}
SLURM_BUDGET_S = 300  # issue 6: the SLURM part stays within 5 minutes


def _cluster_problem() -> str | None:
    if not os.environ.get("SLURM_CONF"):
        return "SLURM_CONF is unset: start the test cluster with `eval \"$(tests/slurm/cluster.sh start)\"`"
    if shutil.which("sinfo") is None or shutil.which("sbatch") is None:
        return "sinfo/sbatch not found: install the cluster with `tests/slurm/cluster.sh install`"
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        return "sinfo timed out: is slurmctld running?"
    if out.returncode != 0:
        return f"sinfo failed (exit {out.returncode}): {out.stderr.strip()[:300]}"
    if not re.search(r"^(idle|mixed|allocated)", out.stdout, re.M):
        return f"no usable SLURM node: sinfo says {out.stdout.strip()!r}"
    try:
        import snakemake_executor_plugin_slurm  # noqa: F401
    except ImportError:
        return "snakemake-executor-plugin-slurm is not installed (pip install -e '.[test]')"
    return None


_PROBLEM = _cluster_problem()


def cluster_test(fn):
    """A test that submits jobs: marked `slurm` and `slow`, skipped with the reason when no cluster answers."""
    return pytest.mark.slurm(pytest.mark.slow(pytest.mark.skipif(_PROBLEM is not None, reason=_PROBLEM or "")(fn)))


def _default_partition() -> str:
    out = subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True, text=True, check=True).stdout
    names = out.split()
    return next((p.rstrip("*") for p in names if p.endswith("*")), names[0].rstrip("*"))


def _slice(workdir: Path) -> tuple[str, list[str], str, str]:
    """(results dir, target files, client name, spec id) of the smoke slice, from the config."""
    import yaml
    from draftlab.settings.config import load_config
    from draftlab.settings.model import spec_id

    raw = yaml.safe_load((workdir / "config/config.yaml").read_text())
    raw["size"] = "smoke"
    cfg = load_config(raw, source="config/config.yaml")
    r = f"results/{cfg['experiment']}"
    client = cfg["bench"]["clients"][0]["name"]
    spec = spec_id(cfg["speculative"][0])
    targets = [
        f"{r}/static/inspect-target.json",
        f"{r}/static/inspect-drafter.json",
        f"{r}/static/doctor-probe.json",
        f"{r}/bench/baseline/plain/{client}.json",
        f"{r}/bench/probe/{spec}/{client}.json",
    ]
    return r, targets, client, spec


def _snakemake(workdir: Path, args: list[str], env: dict[str, str], log: Path, timeout: int, demo_out: Path) -> float:
    """Run snakemake in `workdir` on the demo build in `demo_out` (helpers.snakemake: a timeout or a
    failure fails the test with the tail of its output, all of it in `log`). Returns the wall time."""
    (workdir / "overlay.yaml").write_text(f"{OVERLAY}demo: {{out: {json.dumps(str(demo_out))}}}\n")
    t0 = time.monotonic()
    snakemake(workdir, *args, configfiles=("config/config.yaml", "overlay.yaml"), env=env, timeout=timeout, log=log,
              merge_output=True)
    return time.monotonic() - t0


@pytest.fixture(scope="module")
def runs(tmp_path_factory, smoke_demo):
    """The smoke slice run locally, then through the slurm profile; yields both work dirs and timings."""
    base = tmp_path_factory.mktemp("slurm")
    env = dict(os.environ)
    env.pop("SLURM_JOB_ID", None)  # the plugin refuses to nest inside an allocation
    demo = smoke_demo["out"]  # the demo pair: an input of the slice, built before either run, by neither

    # 1. the local executor
    local = copy_workflow(base / "local", profiles=())
    r, targets, client, spec = _slice(local)
    local_s = _snakemake(local, [*targets, "--cores", "2"], env, base / "local.log", timeout=900, demo_out=demo)

    # 2. the slurm profile
    remote = copy_workflow(base / "slurm", profiles=())
    partition = _default_partition()
    slurm_env = {**env, **{k: v for k, v in SMALL_CLUSTER_ENV.items() if k not in os.environ}}
    slurm_env["DRAFTLAB_SLURM_PARTITION"] = partition
    slurm_s = _snakemake(remote, [*targets, "--profile", "profiles/slurm", "--latency-wait", "5"],
                         slurm_env, base / "slurm.log", timeout=SLURM_BUDGET_S + 120, demo_out=demo)
    print(f"\nsmoke slice: local {local_s:.1f} s, slurm {slurm_s:.1f} s")
    yield {
        "local": local, "slurm": remote, "r": r, "client": client, "spec": spec, "targets": targets,
        "local_s": local_s, "slurm_s": slurm_s, "slurm_log": (base / "slurm.log").read_text(),
        "partition": partition,
    }


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() or p.is_symlink()}


def _normalised(path: Path, workdir: Path) -> str:
    """File text with the work dir replaced, so two copies of the workflow compare equal."""
    return path.read_text().replace(str(workdir.resolve()), "<workdir>").replace(str(workdir), "<workdir>")


def _shape(obj):
    """The key structure of a JSON value (keys and types, not values)."""
    if isinstance(obj, dict):
        return {k: _shape(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_shape(v) for v in obj[:1]]
    return type(obj).__name__ if obj is not None else "null"


@cluster_test
def test_slurm_run_makes_the_same_result_files_as_a_local_run(runs):
    local, remote, r = runs["local"], runs["slurm"], runs["r"]
    for t in runs["targets"]:
        assert (remote / t).is_file(), f"{t} missing after the slurm run"
    assert _files(remote / r) == _files(local / r)
    assert runs["slurm_s"] <= SLURM_BUDGET_S, f"slurm part took {runs['slurm_s']:.0f} s"


@cluster_test
def test_static_analysis_is_byte_for_byte_the_same(runs):
    local, remote, r = runs["local"], runs["slurm"], runs["r"]
    static = sorted(p.name for p in (local / r / "static").iterdir())
    assert {"inspect-target.json", "inspect-drafter.json", "doctor-probe.json"} <= set(static)
    for name in static:
        assert _normalised(remote / r / "static" / name, remote) == _normalised(local / r / "static" / name, local), name
    doctor = json.loads((remote / r / "static/doctor-probe.json").read_text())
    assert doctor, "doctor report is empty"
    assert _normalised(remote / r / "drafter/patched/patch.json", remote) == \
        _normalised(local / r / "drafter/patched/patch.json", local)


def _token_counts(result: dict) -> dict:
    """Everything in a benchmark result that is a token or cycle count (deterministic: greedy decoding)."""
    out = {}

    def walk(obj, path):
        if isinstance(obj, dict):
            for k, v in obj.items():
                walk(v, f"{path}.{k}")
        elif isinstance(obj, list):
            for i, v in enumerate(obj):
                walk(v, f"{path}[{i}]")
        elif re.search(r"(tokens|_ct|verify|accept_length|prompts|requests)$", path.rsplit(".", 1)[-1]) \
                and isinstance(obj, (int, float)) and not isinstance(obj, bool):
            out[path] = obj

    walk(result, "")
    return out


@cluster_test
def test_benchmarks_have_the_same_keys_and_token_counts(runs):
    local, remote, r, client = runs["local"], runs["slurm"], runs["r"], runs["client"]
    for sub in ("baseline/plain", f"probe/{runs['spec']}"):
        a = json.loads((local / r / "bench" / sub / f"{client}.json").read_text())
        b = json.loads((remote / r / "bench" / sub / f"{client}.json").read_text())
        assert _shape(b) == _shape(a), sub
        counts = _token_counts(a)
        assert any("completion_tokens" in k for k in counts), f"no completion token count in {sub}: {sorted(a)}"
        assert _token_counts(b) == counts, sub


def _slurm_jobs(log: str) -> dict[str, list[str]]:
    """rule -> SLURM job ids, from the plugin's 'submitted with SLURM jobid N (log: .../rule_X/...)' lines."""
    jobs: dict[str, list[str]] = {}
    for jobid, rule in re.findall(r"submitted with SLURM jobid (\d+) \(log: \S*/rule_([A-Za-z0-9_]+)/", log):
        jobs.setdefault(rule, []).append(jobid)
    return jobs


def _scontrol(jobid: str) -> str:
    return subprocess.run(["scontrol", "-d", "show", "job", jobid], capture_output=True, text=True).stdout


@cluster_test
def test_each_server_and_its_benchmarks_ran_in_one_gpu_allocation(runs):
    jobs = _slurm_jobs(runs["slurm_log"])
    assert "bench_plan" not in jobs, "bench_plan is a local rule"
    launch_jobs = [j for rule, ids in jobs.items() if rule.startswith("launch_") and rule != "launch_plan" for j in ids]
    assert {"acquire", "inspect", "patch_config", "doctor", "launch_plain"} <= set(jobs), jobs
    # one SLURM job per launch: the server and every client share it (127.0.0.1)
    assert len(launch_jobs) == 2, jobs
    for jobid in launch_jobs:
        info = _scontrol(jobid)
        if not info:  # finished jobs leave slurmctld after MinJobAge (300 s by default)
            pytest.skip(f"SLURM job {jobid} already purged by slurmctld")
        assert "JobState=COMPLETED" in info, info
        assert re.search(r"JOB_GRES=gpu:1\b", info), f"launch job {jobid} got no GPU:\n{info}"
        assert f"Partition={runs['partition']}" in info
    for jobid in jobs["inspect"]:
        assert "JOB_GRES=(null)" in _scontrol(jobid), f"CPU job {jobid} (inspect) held a GPU"
    r, spec = runs["r"], runs["spec"]
    serve = json.loads((runs["slurm"] / r / "bench/probe" / spec / "serve.json").read_text())
    assert serve["launches"] == 1, "one server launch per launch job"
    assert "127.0.0.1" in json.dumps(serve), "the benchmark client did not talk to a server on its own node"


GPU_PROBE = """
rule all:
    input: "gpu.txt", "cpu.txt"

rule serve_launch:  # the profile's name for every launch job (common.smk launch_cluster_resources)
    output: "gpu.txt"
    resources: gpu=2
    shell: "echo ${{CUDA_VISIBLE_DEVICES:-unset}} > {output}"

rule cpu:
    output: "cpu.txt"
    shell: "echo ${{CUDA_VISIBLE_DEVICES:-unset}} > {output}"
"""


def _submit_probe(workdir: Path, snakefile: str) -> str:
    """Run ``snakefile`` in ``workdir`` through the slurm profile on the test cluster; its merged output."""
    (workdir / "Snakefile").write_text(snakefile)
    shutil.copytree(REPO / "profiles/slurm", workdir / "profiles/slurm")
    env = {**os.environ, **{k: v for k, v in SMALL_CLUSTER_ENV.items() if k not in os.environ}}
    env.pop("SLURM_JOB_ID", None)
    return snakemake(workdir, "--profile", "profiles/slurm", "--latency-wait", "5", env=env, merge_output=True).stdout


@cluster_test
def test_gpu_resource_becomes_cuda_visible_devices_in_the_job(tmp_path):
    _submit_probe(tmp_path, GPU_PROBE)
    gpus = (tmp_path / "gpu.txt").read_text().strip()
    assert len(gpus.split(",")) == 2 and all(g.isdigit() for g in gpus.split(",")), gpus
    assert (tmp_path / "cpu.txt").read_text().strip() == "unset"


ARMS_PROBE = """
from draftlab.experiment.jobs import rule_gpu_resources

rule train:  # named as the real rule, so the profile's GPU-job settings apply
    output: "train.txt"
    resources: **rule_gpu_resources(workflow, 1, 4, shared=True)
    shell: "echo ${{CUDA_VISIBLE_DEVICES:-unset}} > {output}"
"""


@cluster_test
def test_arms_that_share_a_gpu_on_one_host_each_get_a_gpu_under_slurm(tmp_path):
    """train.arms_per_gpu: 4 (config/demo-gpu.yaml) makes each arm a quarter of one host's GPU, `gpu=0`; submitted
    as is, under the slurm profile an arm would get an allocation without a GPU. There each arm asks for one."""
    out = _submit_probe(tmp_path, ARMS_PROBE)
    gpus = (tmp_path / "train.txt").read_text().strip()
    assert gpus.isdigit(), f"the training arm ran without a GPU (CUDA_VISIBLE_DEVICES={gpus})"
    assert out.count("train.arms_per_gpu 4 shares one host's GPU") == 1, out[-3000:]


def test_profile_resolves_partition_account_and_gpu_settings_from_the_environment(tmp_path):
    """No cluster needed: a dry run shows the resources each job would be submitted with."""
    (tmp_path / "Snakefile").write_text(GPU_PROBE)
    shutil.copytree(REPO / "profiles/slurm", tmp_path / "profiles/slurm")
    base = {k: v for k, v in os.environ.items() if not k.startswith(("DRAFTLAB_SLURM_", "SBATCH_"))}

    def dry(**env) -> dict[str, str]:
        proc = snakemake(tmp_path, "-n", "--profile", "profiles/slurm", env={**base, **env}, timeout=120)
        out = proc.stdout + proc.stderr
        rules = re.findall(r"^rule (\w+):.*?^\s+resources: (.*?)$", out, re.M | re.S)
        return {rule: res for rule, res in rules}

    plain = dry()
    assert "slurm_partition" not in plain["cpu"] and "slurm_account" not in plain["cpu"]
    assert "mem_mb=4000" in plain["cpu"] and "runtime=60" in plain["cpu"]
    assert "gpu=2" in plain["serve_launch"] and "cpus_per_task=16" in plain["serve_launch"]
    assert "gpu_model" not in plain["serve_launch"]

    # a partition named like a Python builtin stays a string; GPU jobs get their own partition and model
    site = dry(DRAFTLAB_SLURM_PARTITION="all", DRAFTLAB_SLURM_GPU_PARTITION="gpu-h100", DRAFTLAB_SLURM_GPU_MODEL="h100",
               SBATCH_ACCOUNT="proj42", DRAFTLAB_SLURM_MEM_MB="2000", DRAFTLAB_SLURM_GPU_CPUS="8")
    assert "slurm_partition=all" in site["cpu"] and "slurm_account=proj42" in site["cpu"]
    assert "mem_mb=2000" in site["cpu"]
    assert "slurm_partition=gpu-h100" in site["serve_launch"] and "gpu_model=h100" in site["serve_launch"]
    assert "cpus_per_task=8" in site["serve_launch"]


def test_every_launch_job_of_the_workflow_gets_the_profiles_gpu_job_settings(tmp_path):
    """The launch rules are named per launch (launch_<id>); the profile's `serve_launch` settings reach each
    one (a dry run of the real workflow, no cluster needed)."""
    work = copy_workflow(tmp_path / "wf")
    shutil.copytree(REPO / "profiles/slurm", work / "profiles/slurm", dirs_exist_ok=True)
    base = {k: v for k, v in os.environ.items() if not k.startswith(("DRAFTLAB_SLURM_", "SBATCH_"))}
    proc = snakemake(work, "-n", "--profile", "profiles/slurm", "all", "--config", "size=smoke",
                     env={**base, "DRAFTLAB_SLURM_GPU_PARTITION": "gpu-h100", "HF_HUB_OFFLINE": "1"}, timeout=180)
    out = proc.stdout + proc.stderr
    rules = re.findall(r"^rule (\w+):.*?^\s+resources: (.*?)$", out, re.M | re.S)
    launches = {rule: res for rule, res in rules if rule.startswith("launch_") and rule != "launch_plan"}
    assert set(launches) == {"launch_probe_s2_k1_d3", "launch_plain"}, sorted(launches)  # up to the gate
    for rule, res in launches.items():
        # the partition as sbatch must get it: the value, not the profile's quoted expression ('gpu-h100', which
        # sbatch refused as an invalid partition: every launch failed under the slurm profile)
        assert "mem_mb=128000" in res and "cpus_per_task=16" in res and "slurm_partition=gpu-h100," in res, (rule, res)
    inspect = dict(rules)["inspect"]
    assert "gpu-h100" not in inspect and "mem_mb=4000" in inspect
