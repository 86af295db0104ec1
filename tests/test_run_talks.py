"""A run that talks (issue 18): host warnings before any job, typed --config overrides, help screens."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from helpers import cli, cli_process, offline_env

from draftlab.settings.config import load_config
from draftlab.serving.hostcheck import host_warnings
from test_workflow_dag import _run, job_blocks, workdir  # noqa: F401 - fixture

ROOT = Path(__file__).resolve().parents[1]


def test_host_warnings_name_what_does_not_fit():
    assert host_warnings({"gpu": 8}, 32, gpus=8, cpus=64) == []
    lines = host_warnings({"gpu": 8}, 32, gpus=0, cpus=2)
    assert "gpu=8 but this machine has 0 GPU(s)" in lines[0] and "cores=32 but this machine has 2 CPUs" in lines[1]
    assert host_warnings({"gpu": 0}, 2, gpus=0, cpus=2) == []


def test_gpu8_profile_on_a_machine_without_gpus_warns_before_any_job(workdir):  # noqa: F811
    said = _run(["-n", "--profile", "gpu8", "all"], cwd=workdir, merge_output=True).stdout
    assert "draftlab WARNING: the profile declares gpu=8 but this machine has 0 GPU(s)" in said
    # printed while the Snakefile is read, before the DAG is built or anything is scheduled
    assert said.index("draftlab WARNING") < said.index("Building DAG of jobs")
    quiet = _run(["-n", "--cores", "1", "all"], cwd=workdir)
    assert "draftlab WARNING" not in quiet.stderr


def test_benchmarks_comparing_tok_s_run_one_at_a_time(workdir):  # noqa: F811
    out = _run(["-n", "--profile", "profiles/local", "all"], cwd=workdir)
    blocks = [b for b in job_blocks(out.stdout + out.stderr) if re.search(r"rule launch_(?!plan)\w+:", b)]
    assert blocks and all("bench_slot=1" in b for b in blocks)
    for profile in ("local", "gpu8"):
        resources = yaml.safe_load((ROOT / "profiles" / profile / "config.yaml").read_text())["resources"]
        assert resources["bench_slot"] == 1, profile


def test_typed_config_overrides_as_snakemake_users_write_them(workdir, tmp_path):  # noqa: F811
    """`--config train='{steps: 90}'` was refused: value "90" is not valid; expected an integer."""
    cfg = load_config({**yaml.safe_load((ROOT / "config" / "config.yaml").read_text()),
                       "train": {"steps": "90", "lr": "3e-4"}})
    assert cfg["train"]["steps"] == 90 and isinstance(cfg["train"]["steps"], int)
    out = _run(["-n", "--cores", "1", "all", "--config", "train={steps: 90}"], cwd=workdir, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    bad = _run(["-n", "--cores", "1", "all", "--config", "train={steps: ninety}"], cwd=workdir, check=False)
    said = bad.stdout + bad.stderr
    assert bad.returncode != 0 and "'train.steps'" in said and "expected an integer" in said


def test_help_screens_say_what_the_command_does():
    for cmd, words in (("inspect", "safetensors headers only"), ("compare", "says nothing about the values"),
                       ("doctor", "before a server is launched")):
        out = cli(cmd, "--help")
        assert out.returncode == 0 and words in " ".join(out.stdout.split()), cmd
    assert "--cache-dir" in cli("doctor", "--help").stdout
    assert "--hash-weights" in cli("compare", "--help").stdout


def test_compare_says_it_reads_headers_and_can_hash_weights(tmp_path):
    import torch
    from safetensors.torch import save_file

    for name, seed in (("a", 1), ("b", 2)):
        (tmp_path / name).mkdir()
        g = torch.Generator().manual_seed(seed)
        save_file({"fc.weight": torch.randn(4, 12, generator=g), "norm.weight": torch.ones(4)},
                  str(tmp_path / name / "model.safetensors"))
        (tmp_path / name / "config.json").write_text('{"hidden_size": 4}')
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    plain = cli("compare", a, b)
    assert plain.returncode == 0 and "compatible" in plain.stdout
    assert "weights: not compared (headers only; --hash-weights" in plain.stdout
    hashed = cli("compare", a, b, "--hash-weights")
    assert "weights: **1 tensors differ**: `fc.weight`" in hashed.stdout  # names from a file: code spans (textsafe)
    same = cli("compare", a, a, "--hash-weights")
    assert "weights: identical" in same.stdout


def test_doctor_accepts_the_cache_dir_its_error_suggests(tmp_path):
    out = cli_process("doctor", "--drafter", "hf:nobody/drafter", "--target", "hf:nobody/target",
                      "--cache-dir", str(tmp_path / "cache"), env=offline_env())
    assert "unrecognized arguments" not in out.stderr
    assert out.returncode != 0 and "--cache-dir" in out.stderr  # the cache miss, named, with the flag to fix it
