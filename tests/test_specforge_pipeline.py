"""A SpecForge arm inside the pipeline (issue 34): trained by SpecForge 0.2.0's own trainer from the one capture,
beside the builtin keep arm, and served, benched, recorded and reported like every arm.

The real ``snakemake all`` of the smoke experiment on CPU, with ``train.specforge.arms: [keep]`` and the capture by
draftlab's dump (the demo has no SGLang). ``specforge`` on PATH is SpecForge's own CLI from its wheel
(tests/test_contract_specforge.py::specforge_python) through benchmarks/gpu/specforge_cpu_shim.py, which swaps the one
CUDA-only kernel (its Triton loss) for the reference formula of the same file; FSDP and flex attention's backward
are settings (``train.specforge.overrides``). Everything else the arm runs is SpecForge's code.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import yaml
from smoke_run import EXP, copy_workflow, snakemake

from test_contract_specforge import specforge_python

pytestmark = [pytest.mark.contract, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
CPU = {"training": {"fsdp_sharding": "NO_SHARD", "attention_backend": "sdpa", "log_interval": 1}}


def test_the_offline_specforge_arm_runs_through_the_pipeline_beside_the_builtin_keep_arm(smoke_demo, tmp_path):
    wd = copy_workflow(tmp_path / "wf", smoke_demo["out"])
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "specforge"
    wrapper.write_text(f"#!/bin/sh\nexec {specforge_python()} {ROOT / 'benchmarks/gpu/specforge_cpu_shim.py'} \"$@\"\n")
    wrapper.chmod(0o755)
    (wd / "sf.yaml").write_text(yaml.safe_dump({"train": {"finetune_modes": ["keep"], "scratch": False, "specforge": {
        "arms": ["keep"], "capture": "draftlab", "overrides": CPU}}}))
    snakemake(wd, "all", extra_config=wd / "sf.yaml", timeout=1500, log=tmp_path / "run.txt",
              env={"PATH": f"{bin_dir}:{os.environ['PATH']}", "CUDA_VISIBLE_DEVICES": ""})
    exp = wd / "results" / EXP
    # the one capture: draftlab's dump in SpecForge's offline format, recorded
    rec = json.loads((exp / "capture/capture.json").read_text())
    tokens = [json.loads(line) for line in (exp / "data/tokens.jsonl").read_text().splitlines() if line.strip()]
    assert rec["engine"] == "draftlab" and rec["samples"] == len(tokens) and rec["specforge"] is None
    assert rec["tokens"] == sum(len(t["input_ids"]) for t in tokens) and rec["bytes"] > 0
    # SpecForge's trainer ran every step of the arm, from the features, and its checkpoint was imported
    cfg = json.loads((exp / "config.json").read_text())
    log = (exp / "logs/train/specforge-keep.log").read_text()
    assert [int(n) for n in re.findall(r"^step (\d+): ", log, re.M)] == list(range(1, cfg["train"]["steps"] + 1))
    run = yaml.safe_load((exp / "train-state/specforge-keep/specforge/draftlab_run.yaml").read_text())
    assert run["deployment"]["mode"] == "local_colocated" and run["data"]["hidden_states_path"] == rec["features"]
    imported = json.loads((exp / "train/specforge-keep/drafter/draftlab_import.json").read_text())
    assert imported["specforge_step"] == cfg["train"]["steps"] and imported["mapping_check"] == "matches"
    # served and benched like every arm, in the records and the report beside the builtin keep arm
    spec = next(iter((exp / "bench/specforge-keep").iterdir())).name
    for arm in ("specforge-keep", "finetune-keep"):
        result = json.loads((exp / f"bench/{arm}/{spec}/{cfg['bench']['clients'][0]['name']}.json").read_text())
        assert result["summary"]["accept_length"] >= 1.0, arm
    records = (exp / "records/records.csv").read_text()
    assert "specforge-keep" in records and "finetune-keep" in records
    assert "specforge-keep" in (exp / "report/summary.md").read_text()
