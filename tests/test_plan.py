"""The whole plan before anything runs: what the probe gate's notes in `snakemake -n -p all` and `draftlab plan`
say runs past the gate, the capture's disk bound (before the data exists, then from its tokens) and a timeline."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from factories import kimi_k25_config, tiny_drafter_config, write_target_config
from helpers import copy_workflow
from test_workflow_dag import _run, job_blocks, job_counts

from draftlab.cli import main
from draftlab.experiment import plan
from draftlab.experiment.layout import Layout
from draftlab.experiment.jobs import load_settings
from draftlab.settings.config import experiment_layers
from draftlab.training.specforge import human

ROOT = Path(__file__).resolve().parents[1]
KIMI = ROOT / "config" / "kimi-k25.yaml"
PER_TOKEN = (3 + 1) * 7168 * 2 + 16  # K2.5 in bf16: 57,360 B a token


def prompts(path: Path, n: int, multi_every: int = 0) -> Path:
    """``n`` ShareGPT conversations; every ``multi_every``-th has two user turns."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        for i in range(n):
            turns = [{"from": "human", "value": f"question {i}"}, {"from": "gpt", "value": "old answer"}]
            if multi_every and i % multi_every == 0:
                turns += [{"from": "human", "value": "and then?"}]
            fh.write(json.dumps({"id": i, "conversations": turns}) + "\n")
    return path


@pytest.fixture
def kimi(tmp_path, monkeypatch):
    """The K2.5 config as the README runs it, from a fresh working folder."""
    monkeypatch.chdir(tmp_path)

    def load(*overrides: dict):
        files = [str(KIMI)]
        for i, o in enumerate(overrides):
            files.append(str(tmp_path / f"over{i}.yaml"))
            Path(files[-1]).write_text(json.dumps(o))
        settings = load_settings(*experiment_layers(str(ROOT / "config" / "config.yaml"), files))
        return settings, Layout(settings.experiment)
    return load


def test_before_any_data_the_bound_is_the_prompts_times_the_token_limit_times_bytes_a_token(kimi, tmp_path):
    s, layout = kimi()
    prompts(tmp_path / "data/kimi-k25-prompts.jsonl", 30, multi_every=3)
    d = plan.plan(s, layout)
    disk = d["disk"]
    assert disk["data"]["samples"] == 30 and disk["data"]["turns"] == 40  # 10 of them answered twice
    assert disk["per_token"]["bytes_per_token"] == PER_TOKEN and "plan.hidden_size" in disk["per_token"]["source"]
    assert disk["upper_bound_bytes"] == 30 * 2048 * PER_TOKEN and disk["estimate_bytes"] is None
    text = "\n".join(plan.plan_lines(s, layout, d))
    assert (f"plan: capture disk upper bound: 30 samples (data/kimi-k25-prompts.jsonl) x train.max_length "
            f"2048 x (3 aux + 1) x hidden 7168 x 2 B + 16 B ids = 57,360 B a token") in text
    assert f"= {human(30 * 2048 * PER_TOKEN)}" in text and "GB" in human(30 * 2048 * PER_TOKEN)
    assert re.search(r"^plan: free now at results/kimi-k25/capture-state/features: .*; the capture fits$", text, re.M)
    # the timeline: launches x the 30-minute deadline; generation and capture at the stated assumptions
    parts = {p["what"]: p for p in d["timeline"]["parts"]}
    assert parts["launches"]["seconds"] == 5 * 30 * 60
    assert parts["generation"]["seconds"] == pytest.approx(40 * 2048 / 2000)
    assert "assumed (plan.generate_tokens_per_s)" in parts["generation"]["basis"]
    assert parts["capture"]["seconds"] == pytest.approx(30 * 2048 / 10000)
    assert parts["training"]["seconds"] == pytest.approx(3 * 20000 / 1.0)
    assert d["timeline"]["complete"] and "plan: timeline total: about " in text


def test_once_the_tokens_exist_the_estimate_is_theirs_against_the_free_space(kimi, tmp_path):
    s, layout = kimi()
    prompts(tmp_path / "data/kimi-k25-prompts.jsonl", 4)
    write_target_config(Path(layout.target_model), kimi_k25_config(hidden_size=7168, torch_dtype="bfloat16"))
    Path(layout.tokens).parent.mkdir(parents=True, exist_ok=True)
    Path(layout.tokens).write_text("".join(json.dumps({"input_ids": list(range(n)), "loss_mask": [0] + [1] * (n - 1)})
                                           + "\n" for n in (100, 200, 300, 5000)))
    disk = plan.plan(s, layout)["disk"]
    assert disk["per_token"]["source"].endswith("models/target/model/config.json")
    assert disk["tokens"] == 100 + 200 + 300 + 2048 and disk["estimate_bytes"] == disk["tokens"] * PER_TOKEN
    text = "\n".join(plan.plan_lines(s, layout))
    assert f"capture disk estimate from the real tokens: 4 samples, 2,648 tokens of {layout.tokens}" in text
    # an earlier run's records set the rates: the capture's seconds a million tokens, the generation's tokens/s
    Path(layout.generate_stats).write_text(json.dumps({"tokens_per_s": 500.0}))
    Path(layout.capture_record).parent.mkdir(parents=True, exist_ok=True)
    Path(layout.capture_record).write_text(json.dumps({"seconds_per_million_tokens": 250.0}))
    parts = {p["what"]: p for p in plan.plan(s, layout)["timeline"]["parts"]}
    assert parts["generation"]["rate"] == 500.0 and layout.generate_stats in parts["generation"]["basis"]
    assert parts["capture"]["rate"] == 4000.0 and parts["capture"]["seconds"] == pytest.approx(2648 / 4000)


def test_a_capture_that_cannot_fit_says_so_and_a_budget_caps_the_samples(kimi, tmp_path):
    prompts(tmp_path / "data/kimi-k25-prompts.jsonl", 50)
    s, layout = kimi({"train": {"specforge": {"capture_budget_gb": 2048 * PER_TOKEN * 7 / 1e9 + 1e-9}}})
    d = plan.plan(s, layout)["disk"]
    assert d["budget_samples"] == 7 and d["samples"] == 7 and d["upper_bound_bytes"] == 7 * 2048 * PER_TOKEN
    text = "\n".join(plan.plan_lines(s, layout))
    assert "capture disk upper bound: 7 samples (data/kimi-k25-prompts.jsonl: 50 capped by " \
           "train.specforge.capture_budget_gb" in text
    big, _ = kimi({"data": {"limit": 10**9}})
    prompts(tmp_path / "data/kimi-k25-prompts.jsonl", 20000)  # ~2.3 TB, more than a test machine has free
    lines = plan.plan_lines(big, layout)
    free = next(x for x in lines if x.startswith("plan: free now"))
    assert "the capture does not fit: the preflight will refuse it (set train.specforge.capture_budget_gb" in free


def test_the_launch_count_says_what_the_reference_costs(kimi):
    s, layout = kimi()
    launch = plan.launch_plan(s)
    assert launch["total"] == 5 and launch["before_gate"] == 3 and launch["reference_launches"] == 1
    assert [r["id"] for r in launch["launches"]][:3] == ["probe-s2-k1-d3", "reference-s2-k1-d3", "plain"]
    first = plan.plan_lines(s, layout)[0]
    assert first == ("plan: 5 launches of the target: 3 whatever the probe gate says, 2 more if it opens; the reference "
                     "drafter costs 1 of them (its d2t map needs a launch of its own)")
    no_ref, _ = kimi({"reference": {"source": None, "revision": None}})
    assert plan.launch_plan(no_ref)["total"] == 4 and "reference" not in plan.plan_lines(no_ref, layout)[0]


def test_draftlab_plan_prints_the_lines_and_json(kimi, tmp_path, capsys):
    assert main(["plan", str(KIMI)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("plan: 5 launches of the target") and "plan: if the gate opens, the capture runs `torchrun " in out
    assert "capture disk upper bound: 117.5 MB a sample" in out and "11.7 TB for 100,000 samples" in out
    assert main(["plan", "--json", str(KIMI)]) == 0
    d = json.loads(capsys.readouterr().out)
    assert set(d) >= {"launch", "capture", "train", "disk", "timeline"} and d["launch"]["reference_launches"] == 1
    assert sorted(d["train"]) == ["finetune-keep", "finetune-regenerate", "scratch"]


def test_the_readme_dry_run_shows_past_the_gate_as_the_gates_notes(tmp_path):
    """`snakemake --profile gpu8 --configfile config/kimi-k25.yaml -n -p all` as the README gives it, with a prompt
    file and nothing else: the reference's launch, the capture and training commands, the disk bound, the timeline."""
    work = copy_workflow(tmp_path / "w")
    prompts(work / "data/kimi-k25-prompts.jsonl", 1000)
    out = _run(["--profile", "gpu8", "--configfile", "config/kimi-k25.yaml", "-n", "-p", "all"], cwd=work).stdout
    counts = job_counts(out)
    assert counts["launch_reference_s2_k1_d3"] == 1 and counts["doctor"] == 2
    gate = next(b for b in re.split(r"^\[\w{3} \w{3} .*\]$", out, flags=re.M) if "checkpoint probe_gate:" in b)
    notes = [x[2:] for x in gate.splitlines() if x.startswith("# plan: ")]
    assert notes[0].startswith("plan: 5 launches of the target: 3 whatever the probe gate says, 2 more if it opens")
    assert any(x.startswith("plan: if the gate opens, the capture runs `torchrun --standalone --nproc_per_node 8 ")
               for x in notes)
    assert sum(x.startswith("plan: if the gate opens, training ") and "runs `specforge train --config" in x
               for x in notes) == 3
    bound = human(1000 * 2048 * PER_TOKEN)
    assert bound.endswith(" GB") and any(f"capture disk upper bound: 1,000 samples" in x and x.endswith(f"= {bound}")
                                         for x in notes)
    assert any(x.startswith("plan: timeline total: about ") for x in notes)
    ref_doctor = next(b for b in job_blocks(out) if "doctor-reference.json" in b and "rule doctor:" in b)
    assert "--serve-only" in ref_doctor
