"""The real Snakefile under faults: two runs on one results folder, a killed run's lock, security.

Each test runs ``snakemake`` (the installed one, as a user would) on the project's Snakefile in a
temporary working directory, with an override config that points the experiment at tiny local or
HF-cache models (no demo build), so only the jobs a test needs run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from gate_seed import SEEDED_DRY_RUN, seed_past_gate
from helpers import snakemake, snakemake_cmd

REPO = Path(__file__).resolve().parents[1]
CANARY = "hf_CANARYreliability0123456789abcdef"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from tiny_models import tiny_pair

    root = tmp_path_factory.mktemp("models")
    return tiny_pair(root / "target", root / "drafter")


def _override(workdir: Path, text: str) -> Path:
    path = workdir / "override.yaml"
    workdir.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _local_config(workdir: Path, target: Path, drafter: Path, extra: str = "") -> Path:
    return _override(workdir, f"""experiment: rel
size: smoke
demo: {{enabled: false}}
target: {{source: {target}, revision: null}}
drafter: {{source: {drafter}, revision: null}}
{extra}""")


def _on(workdir: Path, override: Path) -> dict:
    """The project's Snakefile run in ``workdir``, the default config under ``override``."""
    return {"snakefile": REPO / "Snakefile", "workdir": workdir,
            "configfiles": (REPO / "config" / "config.yaml", override)}


def _run(workdir: Path, override: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return snakemake(workdir, "-c1", *args, check=False, env=env, **_on(workdir, override))


def _start_and_freeze(cmd: list[str], workdir: Path) -> subprocess.Popen:
    """Start a snakemake run and SIGSTOP its whole process group once it holds its lock."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    locks = workdir / ".snakemake" / "locks"
    deadline = time.monotonic() + 120
    while not (locks.is_dir() and any(locks.glob("*.output.lock"))):
        assert proc.poll() is None, proc.stdout.read()
        assert time.monotonic() < deadline, "snakemake never took its lock"
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGSTOP)
    return proc


@pytest.mark.slow  # five snakemake runs: ~40 s on 2 shared cores
def test_second_run_on_one_results_folder_is_refused_and_a_killed_run_needs_unlock(models, tmp_path):
    target, drafter = models
    override = _local_config(tmp_path, target, drafter)
    goal = "results/rel-smoke/static/doctor-probe.json"

    first = _start_and_freeze(snakemake_cmd("-c1", goal, **_on(tmp_path, override)), tmp_path)
    try:
        second = _run(tmp_path, override, goal)
        assert second.returncode != 0
        assert "Directory cannot be locked" in second.stdout + second.stderr
    finally:
        os.killpg(first.pid, signal.SIGCONT)
    out, _ = first.communicate(timeout=300)
    assert first.returncode == 0, out  # the refused run did not disturb the first one
    report = json.loads((tmp_path / goal).read_text())
    assert report["drafter"] and not [f for f in report["findings"] if f["severity"] == "error"]

    # A run killed outright (SIGKILL: no cleanup) leaves its lock: the next run is refused until
    # `snakemake --unlock`, then --rerun-incomplete redoes what the kill interrupted.
    goal2 = "results/rel-smoke/static/inspect-target.json"
    killed = _start_and_freeze(snakemake_cmd("-c1", goal2, **_on(tmp_path, override)), tmp_path)
    os.killpg(killed.pid, signal.SIGKILL)
    killed.wait(timeout=30)
    refused = _run(tmp_path, override, goal2)
    assert refused.returncode != 0 and "Directory cannot be locked" in refused.stdout + refused.stderr
    assert _run(tmp_path, override, "--unlock").returncode == 0
    done = _run(tmp_path, override, goal2, "--rerun-incomplete")
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / goal2).read_text())


def _shell_lines(workdir: Path, override: Path) -> list[str]:
    """The draftlab command lines of a dry run: up to the probe gate, then (it passed) the arms'."""
    proc = _run(workdir, override, "-n", "-p")
    assert proc.returncode == 0, proc.stderr
    seed_past_gate(workdir, proc.stdout, passed=True)
    after = _run(workdir, override, *SEEDED_DRY_RUN, "-n", "-p")
    assert after.returncode == 0, after.stderr
    return [line for line in (proc.stdout + proc.stderr + after.stdout).splitlines() if "draftlab " in line]


def test_trust_remote_code_and_host_only_when_configured(models, tmp_path):
    """Every command that loads the target (serve, generate, tokenize, train) gets
    --trust-remote-code only when target.trust_remote_code is set; servers bind 127.0.0.1 unless
    serve.host says otherwise."""
    target, drafter = models
    plain = _shell_lines(tmp_path / "plain", _local_config(tmp_path / "plain", target, drafter))
    loads_target = [line for line in plain if any(f"draftlab {c} " in line or f"draftlab.cli {c} " in line
                                                  for c in ("serve", "generate", "tokenize", "train"))]
    assert len(loads_target) >= 6
    assert not any("--trust-remote-code" in line for line in plain)
    serves = [line for line in plain if "draftlab.cli serve " in line]
    assert serves and all("--host 127.0.0.1 " in line for line in serves)

    trusted = _shell_lines(tmp_path / "trusted", _local_config(
        tmp_path / "trusted", target, drafter,
        f"target: {{source: {target}, revision: null, trust_remote_code: true}}\nserve: {{host: 0.0.0.0}}\n"))
    t_loads = [line for line in trusted if any(f"draftlab {c} " in line or f"draftlab.cli {c} " in line
                                               for c in ("serve", "generate", "tokenize", "train"))]
    assert len(t_loads) == len(loads_target)
    assert all("--trust-remote-code" in line for line in t_loads)
    assert all("--host 0.0.0.0 " in line for line in trusted if "draftlab.cli serve " in line)


@pytest.mark.slow  # a real partial pipeline run with a server launch: ~30-60 s on 2 shared cores
def test_hf_token_appears_in_no_log_record_or_report_and_commits_are_recorded(models, tmp_path):
    """hf: sources from a real HF cache with a canary token in HF_TOKEN and in HF_HOME/token.
    Runs acquire, resolve, inspect, patch-config, doctor and the probe's serve+bench, then greps
    every file of the run (results/, .snakemake/ logs and metadata) for the token."""
    from draftlab.hf_cache import publish_to_cache

    target, drafter = models
    hf_home = tmp_path / "hf_home"
    cache = hf_home / "hub"
    t_commit = publish_to_cache(target, "draftlab-test/target", cache)
    d_commit = publish_to_cache(drafter, "draftlab-test/drafter", cache)
    (hf_home / "token").write_text(CANARY)
    work = tmp_path / "work"
    work.mkdir()
    override = _override(work, f"""experiment: rel
size: smoke
demo: {{enabled: false}}
hub: {{cache_dir: {cache}, offline: true}}
target: {{source: "hf:draftlab-test/target", revision: main}}
drafter: {{source: "hf:draftlab-test/drafter", revision: main}}
speculative: [{{num_steps: 2, topk: 1, num_draft_tokens: 3}}]
""")
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_TOKEN": CANARY, "HUGGING_FACE_HUB_TOKEN": CANARY}
    goal = "results/rel-smoke/bench/probe/s2-k1-d3/short.json"
    proc = _run(work, override, goal, "results/rel-smoke/static/inspect-drafter.json", "-p", env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert CANARY not in proc.stdout + proc.stderr
    leaks = [str(p) for p in work.rglob("*") if p.is_file() and CANARY.encode() in p.read_bytes()]
    assert leaks == []
    checked = [p for p in work.rglob("*") if p.is_file()]
    assert any("logs" in p.parts for p in checked) and (work / goal).is_file()  # the grep saw logs and records
    # Downloads are pinned and the resolved commits recorded.
    assert json.loads((work / "results/rel-smoke/models/target/model.json").read_text())["resolved_commit"] == t_commit
    acq = json.loads((work / "results/rel-smoke/models/drafter/acquire.json").read_text())
    assert (acq["requested_revision"], acq["resolved_commit"]) == ("main", d_commit)
