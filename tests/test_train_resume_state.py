"""A killed training job resumes from a state folder that outlives its run folder (issue 7 gap).

Unit level: ``train_drafter(..., state_dir=S, resume="auto")`` continues only from a checkpoint of the
same run (settings, input file contents, code), even when the run folder was deleted in between, and
moves another run's state aside. Workflow level (slow): the real Snakefile's ``train`` job is
SIGKILLed with its snakemake after a checkpoint, rerun with ``--rerun-incomplete``, and ends with
the drafter an uninterrupted run of the same command makes.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers import cli_process, offline_env, snakemake, snakemake_cmd
import torch
from safetensors.torch import load_file

from draftlab.cli import main
from draftlab.errors import DraftlabError
from draftlab.training.train import train_drafter

STEPS, EVERY = 10, 3


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from tiny_models import tiny_chat_data, tiny_target

    from draftlab.training.tokenize import tokenize_file

    root = tmp_path_factory.mktemp("resume_state")
    target = tiny_target(root / "target", num_layers=7)  # 7: SGLang's default capture [2, 3, 4] has three distinct layers
    tokenize_file(target, tiny_chat_data(root / "data.jsonl", n=20), root / "tokens.jsonl", max_length=40)
    return root, target, root / "tokens.jsonl"


def _common(target, tokens, **over):
    kw = dict(target=target, tokens=tokens, draft_vocab_size=64, ttt_length=2, max_steps=STEPS, lr=3e-3,
              checkpoint_every=EVERY, val_samples=2, progress=False)
    return {**kw, **over}


@pytest.fixture(scope="module")
def uninterrupted(setup):
    root, target, tokens = setup
    out = root / "full"
    train_drafter(out=out, state_dir=root / "full-state", **_common(target, tokens))
    return out


def _rows(path: Path) -> list[dict]:
    with open(path) as f:
        return [{k: v for k, v in r.items() if k != "tokens_per_s"} for r in csv.DictReader(f)]


def _same_run(a: Path, b: Path) -> None:
    wa, wb = load_file(str(a / "drafter" / "model.safetensors")), load_file(str(b / "drafter" / "model.safetensors"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa), "weights differ"
    assert _rows(a / "metrics.csv") == _rows(b / "metrics.csv")
    assert json.loads((a / "validation.json").read_text()) == json.loads((b / "validation.json").read_text())


def test_auto_resume_survives_a_wiped_run_folder_and_a_finished_state_reemits(setup, uninterrupted, tmp_path,
                                                                               capsys):
    _, target, tokens = setup
    out, state = tmp_path / "run", tmp_path / "state"
    stopped = train_drafter(out=out, state_dir=state, resume="auto", stop_after=7, **_common(target, tokens))
    assert stopped["stopped_at"] == 7
    assert sorted(p.name for p in state.glob("step-*")) == ["step-00000003", "step-00000006"]
    assert not any(p.name == "checkpoints" for p in out.iterdir())  # the state lives outside --out
    shutil.rmtree(out)  # what Snakemake does to an incomplete job's output folder

    capsys.readouterr()
    code = main(["train", "--target", str(target), "--tokens", str(tokens), "--out", str(out),
                 "--state-dir", str(state), "--resume", "auto", "--draft-vocab-size", "64", "--ttt-length", "2",
                 "--max-steps", str(STEPS), "--lr", "3e-3", "--checkpoint-every", str(EVERY),
                 "--val-samples", "2", "--json"])
    cap = capsys.readouterr()
    assert code == 0, cap.err
    summary = json.loads(cap.out)
    assert summary["resumed_from_step"] == 6 and summary["steps"] == STEPS
    assert f"resuming from checkpoint {state / 'step-00000006'}" in cap.err
    assert [r["step"] for r in _rows(out / "metrics.csv")] == [str(i) for i in range(1, STEPS + 1)]
    _same_run(uninterrupted, out)
    assert (state / f"step-{STEPS:08d}" / "state.json").is_file()  # the finished state is kept

    # Finished state, run folder gone again: zero further steps, the same outputs.
    shutil.rmtree(out)
    again = train_drafter(out=out, state_dir=state, resume="auto", **_common(target, tokens))
    assert again["resumed_from_step"] == STEPS and again["last_step"]["step"] == STEPS
    _same_run(uninterrupted, out)
    assert not list(tmp_path.glob("state.stale-*"))


def _stopped_run(target, tokens, tmp_path: Path, **over) -> tuple[Path, Path]:
    out, state = tmp_path / "run", tmp_path / "state"
    train_drafter(out=out, state_dir=state, resume="auto", stop_after=4, **_common(target, tokens, **over))
    assert (state / "step-00000003").is_dir()
    return out, state


def test_changed_lr_starts_fresh_and_moves_the_stale_state_aside(setup, tmp_path, capsys):
    _, target, tokens = setup
    out, state = _stopped_run(target, tokens, tmp_path)
    capsys.readouterr()
    r = train_drafter(out=out, state_dir=state, resume="auto", **_common(target, tokens, lr=1e-3))
    err = capsys.readouterr().err
    assert r["resumed_from_step"] is None and r["steps"] == STEPS
    stale = list(tmp_path.glob("state.stale-*"))
    assert len(stale) == 1 and (stale[0] / "step-00000003" / "state.json").is_file()
    assert re.search(r"another run \(changed: lr\); moved it aside to .*state\.stale-", err), err
    assert [r["step"] for r in _rows(out / "metrics.csv")] == [str(i) for i in range(1, STEPS + 1)]
    assert json.loads((state / "run.json").read_text())["config"]["lr"] == 1e-3


def test_same_path_with_changed_tokens_starts_fresh(setup, tmp_path, capsys):
    """The settings are identical (same --tokens path); only the file's content changed."""
    _, target, tokens = setup
    mine = tmp_path / "tokens.jsonl"
    shutil.copy(tokens, mine)
    out, state = _stopped_run(target, mine, tmp_path)
    lines = mine.read_text().splitlines()
    mine.write_text("\n".join(lines[:-1]) + "\n")  # one sample fewer
    capsys.readouterr()
    r = train_drafter(out=out, state_dir=state, resume="auto", **_common(target, mine))
    err = capsys.readouterr().err
    assert r["resumed_from_step"] is None and r["steps"] == STEPS
    assert "changed: inputs.tokens)" in err
    assert len(list(tmp_path.glob("state.stale-*"))) == 1


def test_plain_and_strict_resume_refuse_foreign_state(setup, tmp_path):
    _, target, tokens = setup
    mine = tmp_path / "tokens.jsonl"
    shutil.copy(tokens, mine)
    out, state = _stopped_run(target, mine, tmp_path)
    with pytest.raises(DraftlabError, match=r"state: has checkpoints from an earlier run; pass --resume"):
        train_drafter(out=out, state_dir=state, **_common(target, mine))
    mine.write_text(mine.read_text().replace("1", "2", 1))
    with pytest.raises(DraftlabError, match=r"run\.json: --resume with changed inputs \['inputs\.tokens'\]"):
        train_drafter(out=out, state_dir=state, resume=True, **_common(target, mine))
    with pytest.raises(DraftlabError, match=r"run\.json: --resume with changed settings \['lr'\]"):
        train_drafter(out=out, state_dir=state, resume=True, **_common(target, mine, lr=1e-3))
    assert (state / "step-00000003").is_dir() and not list(tmp_path.glob("state.stale-*"))  # nothing moved


# ------------------------------------------------------------------------------------------------
# workflow level: the real Snakefile, killed during training, rerun with --rerun-incomplete
# ------------------------------------------------------------------------------------------------
EXP = "demo-k2-to-k25-smoke"  # size smoke runs as <experiment>-smoke
ARM = "finetune-keep"
WF_STEPS, WF_EVERY = 40, 4


def _alive_in_group(pgid: int) -> list[str]:
    """Command lines of live (not zombie) processes in a process group."""
    import psutil

    alive = []
    for p in psutil.process_iter(["pid", "status", "cmdline"]):
        try:
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                alive.append(" ".join(p.info["cmdline"] or []))
        except (ProcessLookupError, psutil.Error):
            pass
    return alive


CONFIGS = ("smoke.yaml", "resume.yaml")  # the copied smoke run's config, then this test's settings


@pytest.mark.slow  # one train job, twice through training, plus a reference run
def test_workflow_train_job_killed_after_a_checkpoint_resumes_to_the_uninterrupted_drafter(tmp_path, smoke_run):
    from smoke_run import copy_finished_run

    # a copy of the session's finished smoke run: only the train job (new settings) is left to run
    wd = copy_finished_run(smoke_run, tmp_path / "wf")
    (wd / "resume.yaml").write_text(json.dumps({
        "sizes": {"smoke": {"train": {"steps": WF_STEPS, "checkpoint_every": WF_EVERY}}},
        "train": {"finetune_modes": ["keep"], "scratch": False},
    }))
    r = wd / "results" / EXP
    goal, state, log = f"results/{EXP}/train/{ARM}", r / "train-state" / ARM, r / "logs" / "train" / f"{ARM}.log"
    env = offline_env()
    shutil.rmtree(state)  # the smoke run's own checkpoints of the arm: the kill below must wait for new ones

    # 1. Run up to the train job; SIGKILL snakemake's whole process group once a checkpoint exists.
    with open(tmp_path / "first.log", "w") as fh:
        proc = subprocess.Popen(snakemake_cmd("--cores", "2", goal, "-p", configfiles=CONFIGS), cwd=wd, env=env,
                                stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 240
    try:
        while not list(state.glob("step-*/state.json")):
            assert proc.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no checkpoint within 240 s"
            time.sleep(0.01)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    gone = time.monotonic() + 10
    while _alive_in_group(proc.pid) and time.monotonic() < gone:
        time.sleep(0.1)
    assert _alive_in_group(proc.pid) == []  # nothing of that run is left (the trainer died with it)
    done = sorted(int(p.parent.name.split("-")[1]) for p in state.glob("step-*/state.json"))
    assert done and done[-1] < WF_STEPS, "the job finished before the kill; the test proves nothing"
    assert not (r / "train" / ARM / "summary.json").exists()
    first = (tmp_path / "first.log").read_text()
    train_line = next(line.strip() for line in first.splitlines() if "draftlab train " in line)

    # 2. The rerun a user does after a crash: unlock, then rerun the incomplete job.
    for args in (("--unlock",), (goal, "--rerun-incomplete")):
        snakemake(wd, "--cores", "2", *args, configfiles=CONFIGS, env=env)
    text = log.read_text()
    m = re.search(r"resuming from checkpoint \S+step-(\d+) \(step (\d+)\)", text)
    assert m, text[-3000:]
    resumed = int(m.group(2))
    assert resumed >= done[-1] and resumed % WF_EVERY == 0 and resumed < WF_STEPS
    summary = json.loads((r / "train" / ARM / "summary.json").read_text())
    assert summary["resumed_from_step"] == resumed and summary["steps"] == WF_STEPS

    # 3. The same command, uninterrupted, into another run and state folder (same thread count).
    # the printed train command, without what comes before it (shell prelude) and the log redirection
    cmd = shlex.split(train_line[train_line.index("draftlab train "):].rsplit(" > ", 1)[0])
    assert cmd[0] == "draftlab" and "--state-dir" in cmd and cmd[cmd.index("--resume") + 1] == "auto"
    cmd[cmd.index("--out") + 1], cmd[cmd.index("--state-dir") + 1] = "ref/run", "ref/state"
    threads = {k: "2" for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
    ref = cli_process(*cmd[1:], cwd=wd, env={**env, **threads}, timeout=300)
    assert ref.returncode == 0, ref.stderr[-3000:]
    a = load_file(str(wd / "ref" / "run" / "drafter" / "model.safetensors"))
    b = load_file(str(r / "train" / ARM / "drafter" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), "resumed drafter differs"
    assert _rows(wd / "ref" / "run" / "metrics.csv") == _rows(r / "train" / ARM / "metrics.csv")
