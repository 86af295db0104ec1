"""Issue 36, family 7: a full disk and a refused permission are one ``error:`` line, not a crash.

A full disk is real: a 32 KiB tmpfs mounted for the test. A permission is real too: the tests run as
root, which passes every permission bit, so the command runs as root without the two capabilities
that do that (``setpriv --bounding-set -dac_override,-dac_read_search``): then the mode bits of the
folder decide, as for any user.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import DRAFTLAB, cli, one_error_line
from test_train import setup  # noqa: F401 - the module fixture pair builds on

AS_A_USER = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"]


def _can(cmd: list[str]) -> bool:
    try:
        return subprocess.run(cmd, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                                reason="mounts a tmpfs and drops root's capabilities: needs root and setpriv")


@pytest.fixture(scope="module")
def pair(setup):
    """(target, chat data, tokens): test_train's tiny real Llama target and its tokenized data."""
    root, target, tokens = setup
    return target, root / "data.jsonl", tokens


@pytest.fixture
def full_disk(tmp_path):
    """A 32 KiB tmpfs: room for a marker and a config, not for a drafter or a mapping."""
    mnt = tmp_path / "full"
    mnt.mkdir()
    if not _can(["mount", "-t", "tmpfs", "-o", "size=32k", "tmpfs", str(mnt)]):
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def _train(pair, out, *extra):
    target, _, tokens = pair
    return cli("train", "--target", target, "--tokens", tokens, "--out", out, "--draft-vocab-size", "64",
               "--ttt-length", "2", "--val-samples", "2", "--max-steps", "3", *extra)


def _no_space(proc, *needles):
    line = one_error_line(_last_line_only(proc), *needles, "No space left on device")
    assert "internal error" not in proc.stderr
    return line


def _last_line_only(proc):
    """``train`` draws the target's loading bar on stderr first; the verdict is its last line."""
    last = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ""
    return subprocess.CompletedProcess(proc.args, proc.returncode, proc.stdout, last)


def test_disk_full_while_writing_a_checkpoint_is_one_line(pair, tmp_path, full_disk):
    proc = _train(pair, tmp_path / "run", "--state-dir", full_disk / "state", "--checkpoint-every", "2")
    _no_space(proc, str(full_disk / "state"))
    assert not list((full_disk / "state").glob("step-*")) and not (tmp_path / "run" / "drafter").exists()


def test_disk_full_while_writing_the_final_drafter_is_one_line(pair, tmp_path, full_disk):
    proc = _train(pair, full_disk / "run", "--state-dir", tmp_path / "state", "--checkpoint-every", "0")
    _no_space(proc, str(full_disk / "run" / "drafter"))
    assert not (full_disk / "run" / "drafter").exists() and not (full_disk / "run" / "summary.json").exists()


def test_disk_full_while_writing_the_d2t_mapping_is_one_line(tmp_path, full_disk):
    tokens = tmp_path / "tokens.jsonl"
    ids = list(range(0, 200_000, 7))
    tokens.write_text(json.dumps({"input_ids": ids, "loss_mask": [1] * len(ids)}) + "\n")
    out = full_disk / "mapping.safetensors"
    proc = cli("d2t", "build", "--tokens", tokens, "--target-vocab-size", "200000", "--draft-vocab-size", "20000",
               "--out", out)
    _no_space(proc, str(out))
    assert list(full_disk.iterdir()) == []


# --- permissions -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def locked(pair, tmp_path_factory):
    """A folder holding every kind of input (a target, a drafter, prompts, tokens, a config) that no user
    may enter (mode 000), and a read-only output folder (mode 555)."""
    target, data, tokens = pair
    root = tmp_path_factory.mktemp("perm")
    root.chmod(0o755)
    box = root / "locked"
    box.mkdir()
    shutil.copytree(target, box / "target")
    shutil.copytree(target, box / "drafter")
    shutil.copy(data, box / "data.jsonl")
    shutil.copy(tokens, box / "tokens.jsonl")
    (box / "prompts.jsonl").write_text('{"prompt": "hi"}\n')
    (box / "config.yaml").write_text("experiment: x\n")
    readonly = root / "readonly"
    readonly.mkdir()
    box.chmod(0o000)
    readonly.chmod(0o555)
    if not _can([*AS_A_USER, "true"]):
        pytest.skip("setpriv cannot drop the capabilities here")
    yield root
    box.chmod(0o755)
    readonly.chmod(0o755)


def _as_a_user(cwd: Path, *args) -> subprocess.CompletedProcess:
    return subprocess.run([*AS_A_USER, *DRAFTLAB, *map(str, args)], capture_output=True, text=True, cwd=cwd,
                          timeout=120)


INPUTS = {  # a command reading an input inside the locked folder: (argv, the path named)
    "inspect": (["inspect", "locked/target"], "locked/target"),
    "compare": (["compare", "locked/target", "{target}"], "locked/target"),
    "doctor": (["doctor", "--drafter", "locked/drafter", "--target", "{target}"], "locked/drafter"),
    "tokenize": (["tokenize", "--target", "{target}", "--data", "locked/data.jsonl", "--out", "t.jsonl"],
                 "locked/data.jsonl"),
    "train": (["train", "--target", "locked/target", "--tokens", "{tokens}", "--out", "run"], "locked/target"),
    "eval-drafter": (["eval-drafter", "--drafter", "locked/drafter", "--target", "{target}", "--tokens", "{tokens}"],
                     "locked/drafter"),
    "generate-data": (["generate-data", "--target", "{target}", "--prompts", "locked/prompts.jsonl", "--out",
                       "g.jsonl"], "locked/prompts.jsonl"),
    "bench": (["bench", "--url", "http://127.0.0.1:9", "--prompts", "locked/prompts.jsonl", "--out", "b.json"],
              "locked/prompts.jsonl"),
    "check-config": (["check-config", "locked/config.yaml"], "locked/config.yaml"),
    "d2t coverage": (["d2t", "coverage", "--drafter", "locked/drafter", "--tokens", "{tokens}"], "locked/drafter"),
}

OUTPUTS = {  # a command writing into the read-only folder
    "tokenize": ["tokenize", "--target", "{target}", "--data", "{data}", "--out", "readonly/t.jsonl"],
    "d2t build": ["d2t", "build", "--tokens", "{tokens}", "--target-vocab-size", "320", "--draft-vocab-size", "32",
                  "--out", "readonly/m.safetensors"],
    "train": ["train", "--target", "{target}", "--tokens", "{tokens}", "--out", "readonly/run",
              "--draft-vocab-size", "64", "--max-steps", "1"],
    "inspect": ["inspect", "{target}", "--summary", "readonly/summary.md"],
}


def _fill(argv, pair):
    target, data, tokens = pair
    return [a.format(target=target, data=data, tokens=tokens) for a in argv]


@pytest.mark.parametrize("name", list(INPUTS))
def test_an_input_folder_the_user_cannot_enter_is_one_line(pair, locked, name):
    argv, named = INPUTS[name]
    proc = _as_a_user(locked, *_fill(argv, pair))
    line = one_error_line(_last_line_only(proc), named, "Permission denied")
    assert "internal error" not in proc.stderr and "not found" not in line
    made = sorted(p.name for p in locked.iterdir() if not p.name.endswith(".lock"))  # train's lock may stay
    assert made == ["locked", "readonly"], made


@pytest.mark.parametrize("name", list(OUTPUTS))
def test_an_output_folder_that_takes_no_new_file_is_one_line(pair, locked, name):
    proc = _as_a_user(locked, *_fill(OUTPUTS[name], pair))
    one_error_line(_last_line_only(proc), "readonly/", "Permission denied")
    assert "internal error" not in proc.stderr
    assert list((locked / "readonly").iterdir()) == []


def test_generate_data_after_a_full_disk_mid_shard_says_so_and_resumes_cleanly(pair, tmp_path, full_disk):
    """The state folder fills up while answers are stored: one line naming the shard; the rerun (with room
    again) cuts the torn last line off, answers what is missing, and the output is complete."""
    from draftlab.datagen.answer_shards import stored_ids

    target, _, _ = pair
    N = 30  # noqa: N806 - ~2 KB a stored answer: the 32 KiB disk fills after about a dozen
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"story {i} " + "word " * 400}) + "\n" for i in range(N)))
    state, out = full_disk / "state", tmp_path / "gen.jsonl"
    argv = ("generate-data", "--target", target, "--prompts", prompts, "--out", out, "--state-dir", state,
            "--max-new-tokens", "2", "--batch-size", "2", "--no-progress")
    proc = cli(*argv)
    line = one_error_line(_last_line_only(proc), str(state / "shard-00000.jsonl"), "No space left on device",
                          "answers stored are kept")
    assert not out.exists()
    shard = (state / "shard-00000.jsonl").read_bytes()
    assert shard and not shard.endswith(b"\n"), "the test wants a torn last line"
    kept = stored_ids(state)
    assert 0 < len(kept) < N, line
    subprocess.run(["mount", "-o", "remount,size=4m", str(full_disk)], check=True)
    proc = cli(*argv)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(out.read_text().splitlines()) == N
    assert "shard-00000.jsonl: dropped its torn last line" in proc.stderr
    assert f"{len(kept)} of {N} answers are already stored" in proc.stderr
