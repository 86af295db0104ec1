"""A trainer SIGKILLed mid-run resumes from its last checkpoint and ends where an unkilled run ends.

``draftlab train`` runs as a real subprocess on a tiny real target; the test waits for its first
checkpoint, SIGKILLs the whole process group (no handler, no cleanup runs), and reruns the same
command with ``--resume``. Weights, per-step metrics (timing columns aside) and validation must
equal those of an uninterrupted run of the same command.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers import DRAFTLAB
from safetensors.torch import load_file

STEPS, EVERY = 30, 5


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    from tiny_models import tiny_chat_data, tiny_target

    from draftlab.training.tokenize import tokenize_file

    root = tmp_path_factory.mktemp("train")
    target = tiny_target(root / "target")
    chat = tiny_chat_data(root / "data.jsonl", n=24)
    tokenize_file(target, chat, root / "tokens.jsonl", max_length=48)
    return target, root / "tokens.jsonl"


def _cmd(target: Path, tokens: Path, out: Path, *extra: str) -> list[str]:
    return [*DRAFTLAB, "train", "--target", str(target), "--tokens", str(tokens),
            "--out", str(out), "--draft-vocab-size", "64", "--ttt-length", "2", "--max-steps", str(STEPS),
            "--lr", "3e-3", "--checkpoint-every", str(EVERY), "--val-samples", "2", "--seed", "0", *extra]


ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # same arithmetic in every run


def _rows(path: Path) -> list[dict]:
    with open(path) as f:
        return [{k: v for k, v in r.items() if k != "tokens_per_s"} for r in csv.DictReader(f)]


@pytest.mark.slow  # four trainer processes: ~30-40 s on 2 shared cores
def test_sigkilled_trainer_resumes_from_last_checkpoint_and_matches_uninterrupted(data, tmp_path):
    target, tokens = data
    full = subprocess.run(_cmd(target, tokens, tmp_path / "full"), env=ENV, capture_output=True, text=True)
    assert full.returncode == 0, full.stderr

    run = tmp_path / "killed"
    proc = subprocess.Popen(_cmd(target, tokens, run), env=ENV, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    first = run / "checkpoints" / f"step-{EVERY:08d}" / "state.json"
    deadline = time.monotonic() + 120
    while not first.exists():
        assert proc.poll() is None, "the trainer ended before its first checkpoint"
        assert time.monotonic() < deadline
        time.sleep(0.005)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    assert proc.returncode == -signal.SIGKILL
    # Killed mid-run: no final drafter, nothing that looks like a finished run.
    assert not (run / "drafter").exists() and not (run / "summary.json").exists()
    done = sorted(p.name for p in (run / "checkpoints").glob("step-*"))
    assert done and all(int(n.split("-")[1]) % EVERY == 0 for n in done)
    last = int(done[-1].split("-")[1])
    assert last < STEPS

    # Without --resume the old checkpoints are not silently overwritten.
    again = subprocess.run(_cmd(target, tokens, run), env=ENV, capture_output=True, text=True)
    assert again.returncode == 2 and "--resume" in again.stderr

    resumed = subprocess.run(_cmd(target, tokens, run, "--resume", "--json"), env=ENV, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    summary = json.loads(resumed.stdout)
    assert summary["steps"] == STEPS

    a = load_file(str(tmp_path / "full" / "drafter" / "model.safetensors"))
    b = load_file(str(run / "drafter" / "model.safetensors"))
    assert a.keys() == b.keys()
    assert all(bool((a[k] == b[k]).all()) for k in a), "resumed weights differ from the uninterrupted run"
    ra, rb = _rows(tmp_path / "full" / "metrics.csv"), _rows(run / "metrics.csv")
    assert [r["step"] for r in rb] == [str(i) for i in range(1, STEPS + 1)]  # no step twice, none missing
    assert ra == rb
    assert json.loads((tmp_path / "full" / "validation.json").read_text()) == \
        json.loads((run / "validation.json").read_text())
