"""The one-host capture stage (issue 34): the disk estimate, the checkout check, a killed capture and its rerun,
and features of another target or other aux layers, each refused in one line with nothing lost.

The capture itself is SpecForge's ``scripts/prepare_hidden_states.py`` on GPUs (its flags are checked by
tests/test_contract_specforge_capture.py). Where a test runs the rule's real shell line, a stand-in script at the
checkout's script path does what that script does to the disk, read from it at v0.2.0: one ``torch.save`` per
sample at ``rows_<g>-<g+2000>/data_<i>.ckpt`` (``_get_file_path``), every sample whose file exists skipped
(``_check_existing_files_batch``), the mapping at ``vocab_mapping/vocab_mapping.pt``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from factories import kimi_k25_config, target_config, tiny_drafter_config, write_target_config
from helpers import cli, copy_workflow, one_error_line, snakemake

from draftlab.errors import DraftlabError
from draftlab.experiment import jobs
from draftlab.experiment.layout import Layout
from draftlab.settings.model import Settings
from draftlab.training.specforge import local_capture as oc

STAND_IN = r'''
"""Stands in for SpecForge 0.2.0's scripts/prepare_hidden_states.py (CUDA only) in tests: its disk behaviour."""
import argparse, json, os, sys, time
import torch
p = argparse.ArgumentParser()
for flag in ("--target-model-path", "--draft-model-config", "--data-path", "--output-path", "--chat-template",
             "--cache-dir", "--strategy"):
    p.add_argument(flag)
for flag in ("--max-length", "--tp-size", "--batch-size"):
    p.add_argument(flag, type=int)
p.add_argument("--trust-remote-code", action="store_true")
a = p.parse_args()
target = json.load(open(os.path.join(a.target_model_path, "config.json")))
draft = json.load(open(a.draft_model_config))
print("capture layers", draft["eagle_config"]["eagle_aux_hidden_state_layer_ids"], flush=True)
rows = [json.loads(l) for l in open(a.data_path) if l.strip()]
os.makedirs(os.path.join(a.output_path, "vocab_mapping"), exist_ok=True)
m = draft["draft_vocab_size"]
t2d = torch.zeros(target["vocab_size"], dtype=torch.bool); t2d[:m] = True
torch.save({"d2t": torch.zeros(m, dtype=torch.int64), "t2d": t2d}, os.path.join(a.output_path, "vocab_mapping/vocab_mapping.pt"))
skipped = done = 0
for i, row in enumerate(rows):
    path = os.path.join(a.output_path, "rows_0-2000", f"data_{i}.ckpt")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if os.path.exists(path):
        skipped += 1
        continue
    n = 2 + len(row["conversations"][-1]["content"]) % 5
    h = target["hidden_size"]
    torch.save({"input_ids": torch.arange(n), "loss_mask": torch.ones(n, dtype=torch.int64),
                "hidden_state": torch.zeros(1, n, h, dtype=torch.bfloat16),
                "aux_hidden_state": torch.zeros(1, n, 3 * h, dtype=torch.bfloat16)}, path)
    done += 1
    print("wrote", path, flush=True)
    time.sleep(float(os.environ.get("STAND_IN_DELAY", "0")))
print(f"Processed: {done}, Skipped: {skipped}", flush=True)
'''


def _checkout(root: Path, version: str = "0.2.0", script: str = STAND_IN) -> Path:
    (root / "scripts").mkdir(parents=True, exist_ok=True)
    (root / "scripts/prepare_hidden_states.py").write_text(script)
    (root / "version.txt").write_text(version + "\n")
    return root


def _experiment(tmp: Path, n: int = 12, target: dict | None = None, **specforge) -> tuple[Settings, Layout]:
    """A config with a SpecForge arm beside the builtin ones, and the inputs the capture reads, under ``tmp``."""
    os.chdir(tmp)
    s = Settings.load({"experiment": "cap", "target": {"source": "t"}, "drafter": {"source": "d"},
                       "train": {"specforge": {"arms": ["keep"], "checkout": str(tmp / "SpecForge"), **specforge}}},
                      "test config")
    layout = Layout(s.experiment)
    cfg = target or target_config()
    write_target_config(Path(layout.target_model), cfg)
    Path(layout.patched).mkdir(parents=True)
    Path(layout.patched, "config.json").write_text(json.dumps(tiny_drafter_config(cfg.get("text_config", cfg))))
    Path(layout.tokens).parent.mkdir(parents=True, exist_ok=True)
    with open(layout.tokens, "w") as fh:
        for i in range(n):
            fh.write(json.dumps({"input_ids": list(range(2 + i % 5)), "loss_mask": [0] + [1] * (1 + i % 5)}) + "\n")
    with open(layout.generated_data, "w") as fh:
        for i in range(n):
            fh.write(json.dumps({"messages": [{"role": "user", "content": f"q{i}"},
                                              {"role": "assistant", "content": "a" * i}]}) + "\n")
    return s, layout


@pytest.fixture
def here(tmp_path):
    old = os.getcwd()
    yield tmp_path
    os.chdir(old)


def _env(**extra) -> dict:
    src = str(Path(__file__).resolve().parents[1] / "src")
    path = os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", **extra}


def _shell(s: Settings, layout: Layout, delay: float = 0) -> subprocess.Popen:
    log = layout.log("capture.log")
    Path(log).parent.mkdir(parents=True, exist_ok=True)
    line = f"set -euo pipefail; : > {log}; {jobs.capture_shell(s, layout, log)}"
    return subprocess.Popen(["bash", "-c", line], env=_env(STAND_IN_DELAY=str(delay)), start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_the_disk_estimate_is_aux_layers_plus_one_hidden_states_a_token():
    """The issue's arithmetic on K2.5's config: about 57 KB a token in bf16, 37K samples of ~1.5K tokens ~3 TB."""
    per = oc.bytes_per_token(kimi_k25_config(hidden_size=7168, torch_dtype="bfloat16"), 3)
    assert per["bytes_per_token"] == (3 + 1) * 7168 * 2 + 16 == 57360
    assert oc.human(37_000 * 1_500 * per["bytes_per_token"]) == "3.2 TB"
    assert oc.bytes_per_token(target_config(hidden_size=64, torch_dtype="float32"))["bytes_per_token"] == 4 * 64 * 4 + 16


def test_too_little_disk_is_refused_with_both_numbers_and_the_path_and_nothing_written(here):
    s, layout = _experiment(here)
    _checkout(here / "SpecForge")
    pre = jobs.capture_commands(s, layout)[0]
    proc = cli(*pre[1:], "--free-bytes", "100")
    line = one_error_line(proc, "capture-state/features", "100 bytes")
    samples, tokens = oc.count_tokens(layout.tokens, s.train.max_length)
    need = tokens * oc.bytes_per_token(target_config())["bytes_per_token"]
    assert proc.returncode == 2 and f"({need} bytes)" in line and "free" in line
    assert not Path(layout.capture_state).exists()  # nothing written, the GPU never touched


@pytest.mark.parametrize("case", ["unset", "no-script", "other-release"])
def test_a_missing_checkout_or_script_or_another_release_is_refused_in_one_line(here, case):
    s, layout = _experiment(here, checkout=None if case == "unset" else str(here / "SpecForge"))
    if case == "no-script":
        (here / "SpecForge").mkdir()
    if case == "other-release":
        _checkout(here / "SpecForge", version="0.3.0")
    pre = jobs.capture_commands(s, layout)[0]
    proc = cli(*pre[1:])
    want = {"unset": "train.specforge.checkout: not set", "no-script": "scripts/prepare_hidden_states.py not found",
            "other-release": "says '0.3.0'"}[case]
    one_error_line(proc, want)
    assert not Path(layout.capture_state).exists()
    with pytest.raises(DraftlabError, match=want.split(":")[0]):
        jobs.check_capture_ready(s)


def test_a_real_run_refuses_a_missing_checkout_before_any_job(tmp_path):
    """The Snakefile's onstart: before the demo build on the GPU, the probe launch or any GPU work, one line,
    exit 2 (demo-gpu with a SpecForge arm; this machine has no GPU, and no job may start to find that out)."""
    d = copy_workflow(tmp_path / "wf", profiles=("gpu1",))
    (d / "sf.yaml").write_text(json.dumps({"train": {"specforge": {"arms": ["keep"], "checkout": "no/such/SpecForge"}}}))
    files = ("config/demo-gpu.yaml", "sf.yaml")
    proc = snakemake(d, "--profile", "gpu1", "all", configfiles=files, check=False)
    assert proc.returncode != 0
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert errors == ["error: train.specforge.checkout: no/such/SpecForge/scripts/prepare_hidden_states.py not found "
                      "(expected a checkout of SpecForge's repository at its v0.2.0 release: git clone "
                      "https://github.com/sgl-project/SpecForge)"], proc.stderr[-2000:]
    assert not (d / "results").exists() and not (d / "resources").exists()
    # a dry run plans without it (the plan names the checkout it will check)
    plan = snakemake(d, "--profile", "gpu1", "-n", "all", configfiles=files)
    assert plan.returncode == 0
    # a run of CPU jobs only (the merged config) does not need it
    snakemake(d, "--profile", "gpu1", "results/demo-gpu/config.json", configfiles=files)


@pytest.mark.slow  # two captures under torchrun, one killed halfway (about a minute on 2 cores)
def test_a_killed_capture_keeps_its_finished_files_and_the_rerun_captures_only_the_rest(here):
    s, layout = _experiment(here, n=12)
    _checkout(here / "SpecForge")
    features = Path(layout.features)
    proc = _shell(s, layout, delay=0.4)
    deadline = time.time() + 120
    while len(oc.feature_files(features)) < 4 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)  # a hard kill: torchrun's worker (a session of its own) lives on
    proc.communicate(timeout=30)
    pre = jobs.capture_commands(s, layout)[0]
    line = one_error_line(cli(*pre[1:]), "a capture is still writing here")
    orphans = [int(p) for p in line.split("pids [")[1].split("]")[0].split(", ")]
    assert orphans and all(("prepare_hidden_states.py" in Path(f"/proc/{p}/cmdline").read_text()) for p in orphans)
    for pid in orphans:  # the test's own process tree: stopped by pid
        os.kill(pid, signal.SIGKILL)
    while any(Path(f"/proc/{p}").exists() and "Z" not in Path(f"/proc/{p}/stat").read_text().split()[2] for p in orphans):
        time.sleep(0.05)
    done = sorted(oc.feature_files(features), key=lambda p: p.stat().st_mtime_ns)
    assert 4 <= len(done) < 12, len(done)
    # a kill inside torch.save leaves a file without its zip end record: cut the newest one as such a kill does
    torn = done[-1]
    data = torn.read_bytes()
    torn.write_bytes(data[: len(data) // 2])
    kept = {p: p.stat().st_mtime_ns for p in done[:-1]}
    record = jobs.capture_commands(s, layout)[-1]
    one_error_line(cli(*record[1:]), "torn feature file", "rerun the rule")  # the killed run is not recorded
    assert not Path(layout.capture_record).exists()
    rerun = _shell(s, layout)
    out, _ = rerun.communicate(timeout=300)
    log = Path(layout.log("capture.log")).read_text()
    assert rerun.returncode == 0, out + log
    assert f"Processed: {12 - len(kept)}, Skipped: {len(kept)}" in log, log  # existing files skipped
    assert "1 torn feature file(s) of a killed capture moved to" in log
    assert {p: p.stat().st_mtime_ns for p in kept} == kept  # finished files untouched
    moved = list(Path(layout.capture_state).glob(f"torn-*/rows_0-2000/{torn.name}"))
    assert len(moved) == 1 and moved[0].read_bytes() == data[: len(data) // 2]  # kept, never deleted
    assert not oc.is_torn(torn)  # captured again
    rec = json.loads(Path(layout.capture_record).read_text())
    files = oc.feature_files(features)
    assert rec["samples"] == 12 and rec["bytes"] == sum(p.stat().st_size for p in files)
    assert rec["tokens"] == sum(2 + i % 5 for i in range(12)) and rec["attempts"] == 2
    assert rec["listing_sha256"] == oc.listing(features)["listing_sha256"]
    assert rec["specforge"]["release"] == "0.2.0" and rec["specforge"]["path"] == str(here / "SpecForge")
    assert rec["identity"]["aux_layer_ids"] == json.loads(Path(layout.capture_state, "draft_config.json").read_text())[
        "eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    assert f"capture layers {rec['identity']['aux_layer_ids']}" in log  # what the script was handed


def _captured(here: Path, **kw) -> tuple[Settings, Layout]:
    s, layout = _experiment(here, **kw)
    _checkout(here / "SpecForge")
    proc = _shell(s, layout)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out + Path(layout.log("capture.log")).read_text()
    return s, layout


def test_features_of_another_target_or_other_aux_ids_are_refused_and_kept(here):
    s, layout = _captured(here, n=3)
    features = Path(layout.features)
    before = {p: p.read_bytes() for p in oc.feature_files(features)}
    pre = jobs.capture_commands(s, layout)[0]
    drafter_cfg = Path(layout.patched, "config.json")
    cfg = json.loads(drafter_cfg.read_text())
    # the train job: features of other aux ids than this drafter is served with are not trained on
    ids = list(cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [0, 2, 5]
    drafter_cfg.write_text(json.dumps(cfg))
    with pytest.raises(DraftlabError, match=rf"features of aux layer ids \{ids}, this drafter is served with "
                                            r"\[0, 2, 5\]; refused, not trained on"):
        oc.check_capture_for(layout.capture_record, layout.target_model, layout.patched)
    one_error_line(cli(*pre[1:]), "features of another target or other aux layers", "aux_layer_ids")
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = ids
    drafter_cfg.write_text(json.dumps(cfg))
    # another target (its config differs)
    write_target_config(Path(layout.target_model), target_config(rope_theta=5e5))
    with pytest.raises(DraftlabError, match="features of another target"):
        oc.check_capture_for(layout.capture_record, layout.target_model, layout.patched)
    one_error_line(cli(*pre[1:]), "target_config_sha256")
    assert {p: p.read_bytes() for p in oc.feature_files(features)} == before  # nothing lost
    # a file added to the folder after the capture: the record no longer describes it
    write_target_config(Path(layout.target_model), target_config())
    (features / "rows_0-2000/data_99.ckpt").write_bytes(next(iter(before.values())))
    with pytest.raises(DraftlabError, match="4 files now, 3 when captured"):
        oc.check_capture_for(layout.capture_record, layout.target_model, layout.patched)


def test_feature_files_of_unknown_origin_are_refused(here):
    s, layout = _experiment(here, n=3)
    _checkout(here / "SpecForge")
    stray = Path(layout.features, "rows_0-2000/data_0.ckpt")
    stray.parent.mkdir(parents=True)
    torch.save({"input_ids": torch.arange(3)}, stray)
    one_error_line(cli(*jobs.capture_commands(s, layout)[0][1:]), "without draftlab's identity.json")
    assert stray.is_file()


def test_new_data_moves_the_old_features_aside_and_captures_fresh(here):
    s, layout = _captured(here, n=3)
    old = oc.feature_files(layout.features)
    with open(layout.generated_data, "a") as fh:
        fh.write(json.dumps({"messages": [{"role": "user", "content": "new"}, {"role": "assistant", "content": "b"}]})
                 + "\n")
    proc = _shell(s, layout)
    proc.communicate(timeout=300)
    log = Path(layout.log("capture.log")).read_text()
    assert proc.returncode == 0, log
    stale = list(Path(layout.capture_state).glob("features.stale-*"))
    assert len(stale) == 1 and len(oc.feature_files(stale[0])) == len(old)  # kept
    assert "data_sha256 changed" in log and json.loads(Path(layout.capture_record).read_text())["samples"] == 4
    # the data went to the script under a new path: its caches key on the path
    assert len(list(Path(layout.capture_state).glob("conversations-*.jsonl"))) == 2


@pytest.mark.parametrize("train, key", [
    ({"backend": "specforge", "specforge": {"arms": ["keep"]}}, "every arm is SpecForge's already"),
    ({"specforge": {"arms": ["keep"], "mode": "two-host"}}, "train from the one capture"),
])
def test_specforge_arms_beside_builtin_ones_need_the_builtin_backend_and_one_host(tmp_path, train, key):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(json.dumps({"experiment": "x", "target": {"source": "t"}, "drafter": {"source": "d"}, "train": train}))
    one_error_line(cli("check-config", cfg), "train.specforge.arms", key)


def test_the_arms_of_a_specforge_arm_config_and_their_backends():
    s = Settings.load({"experiment": "x", "target": {"source": "t"}, "drafter": {"source": "d"},
                       "train": {"finetune_modes": ["keep"], "specforge": {"arms": ["keep", "scratch"]}}}, "c")
    assert s.arms == ["finetune-keep", "scratch", "specforge-keep", "specforge-scratch"]
    assert [s.train.arm_backend(a) for a in s.arms] == ["builtin", "builtin", "specforge", "specforge"]
    layout = Layout("x")
    keep, scratch = (jobs.train_commands(s, layout, a)[0] for a in ("specforge-keep", "specforge-scratch"))
    assert keep[keep.index("--mapping") + 1] == layout.patched and "--ckpt-dir" in keep
    assert scratch[scratch.index("--mapping") + 1] == layout.capture_mapping and "--ckpt-dir" not in scratch
    assert jobs.train_commands(s, layout, "finetune-keep")[0][:2] == ["draftlab", "train"]


def test_a_disk_budget_caps_the_samples_captured_and_a_capture_still_must_fit_the_free_space(here):
    """train.specforge.capture_budget_gb: the data's first budget / (max_length x bytes a token) samples are
    handed to the capture, so samples of the longest length fit too; the free space is still checked."""
    per_sample = 2048 * oc.bytes_per_token(target_config())["bytes_per_token"]
    s, layout = _experiment(here, capture_budget_gb=(5 * per_sample + 1) / 1e9)
    _checkout(here / "SpecForge")
    pre = jobs.capture_commands(s, layout)[0]
    assert pre[pre.index("--budget-gb") + 1] == f"{(5 * per_sample + 1) / 1e9:g}"
    proc = cli(*pre[1:], "--json")
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert r["estimate"]["budget_samples"] == 5 and r["estimate"]["samples"] == 5
    handed = [json.loads(l) for l in Path(r["data_path"]).read_text().splitlines()]
    assert [row["conversations"][0]["content"] for row in handed] == [f"q{i}" for i in range(5)]
    assert r["estimate"]["bytes"] <= 5 * per_sample
    refused = cli(*pre[1:], "--free-bytes", "100")
    one_error_line(refused, "capture-state/features", "100 bytes")
