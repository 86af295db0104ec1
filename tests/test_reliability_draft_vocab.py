"""A draft vocabulary larger than the target's: refused in one line by serve, train and the doctor.

``draftlab serve --drafter`` with ``draft_vocab_size`` 384 over a 320-token target crashed building the drafter
(``IndexError``, exit 70, "a draftlab bug"); train from that checkpoint crashed the same way, and ``train --init
scratch --draft-vocab-size 999`` silently trained a 320-row drafter instead of the size asked for.
"""

from __future__ import annotations

import json

import pytest
import torch
from factories import drafter_tensors, tiny_drafter_config, write_drafter
from helpers import cli, cli_process, one_error_line
from tiny_models import tiny_chat_data, tiny_target

from draftlab.training.tokenize import tokenize_file


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """A tiny target (320 tokens), its tokens, and a drafter whose draft vocabulary (384) is larger."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("big-draft-vocab")
    target = tiny_target(root / "target")
    tcfg = json.loads((target / "config.json").read_text())
    tokenize_file(target, tiny_chat_data(root / "data.jsonl", n=8), root / "tokens.jsonl", max_length=32)
    vocab = tcfg["vocab_size"]
    cfg = tiny_drafter_config(target=tcfg, draft_vocab_size=vocab + 64)
    tensors = drafter_tensors(dict(cfg, draft_vocab_size=64), seed=1)
    tensors["lm_head.weight"] = torch.randn(vocab + 64, tensors["lm_head.weight"].shape[1]) * 0.02
    tensors["d2t"] = torch.zeros(vocab + 64, dtype=torch.int64)
    drafter = write_drafter(root / "big", cfg, tensors)
    return target, root / "tokens.jsonl", drafter, vocab


def test_serve_refuses_it_at_load_in_one_line(big):
    target, _, drafter, vocab = big
    proc = cli_process("serve", "--target", target, "--drafter", drafter, "--threads", "1", timeout=120)
    proc.stderr = "\n".join(ln for ln in proc.stderr.splitlines() if not ln.startswith(("draftlab-serve: loading",
                                                                                        "Loading weights")))
    one_error_line(proc, f"{drafter}/config.json", f"draft_vocab_size {vocab + 64}", f"at most {vocab}")
    assert "listening" not in proc.stdout


def test_train_from_it_refuses_in_one_line_and_writes_no_drafter(big, tmp_path):
    target, tokens, drafter, vocab = big
    proc = cli("train", "--target", target, "--tokens", tokens, "--out", tmp_path / "run", "--init", "checkpoint",
               "--checkpoint", drafter, "--max-steps", "1", "--device", "cpu")
    one_error_line(proc, f"{drafter}/config.json", f"draft_vocab_size {vocab + 64}")
    assert not (tmp_path / "run" / "drafter").exists()


def test_train_from_scratch_refuses_a_draft_vocab_size_the_target_cannot_hold(big, tmp_path):
    target, tokens, _, vocab = big
    proc = cli("train", "--target", target, "--tokens", tokens, "--out", tmp_path / "run", "--init", "scratch",
               "--draft-vocab-size", str(vocab + 1), "--max-steps", "1", "--device", "cpu")
    one_error_line(proc, "--draft-vocab-size", f"({vocab} tokens)", f"at most {vocab}")
    assert not (tmp_path / "run").exists()


def test_the_doctor_reports_it_as_an_error(big):
    target, _, drafter, vocab = big
    proc = cli("doctor", "--drafter", drafter, "--target", target)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"ERROR   vocab-size-mismatch: draft_vocab_size {vocab + 64} > target vocab_size {vocab}" in proc.stdout
