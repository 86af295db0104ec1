"""Issue 16 items 5 and 8: no output without signal, no memory sized by unchecked input.

A drafter trained on no loss tokens, a mapping built from no tokens, a mapping whose d2t and t2d
disagree: each used to produce a complete-looking artifact. A 10 MB training line was tokenized whole;
a config ``vocab_size`` of 2e9 sized a dense t2d. Each is now refused (or bounded) with one line.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from factories import tiny_drafter_config, write_drafter, write_target_config
from helpers import cli, one_error_line
from safetensors.torch import save_file
from tiny_models import tiny_tokenizer

from draftlab.training.tokenize import tokenize_record
from draftlab.static.d2t import VocabMapping, save_mapping

V = 256  # factories' tiny target vocabulary


def tokens_file(path: Path, masks_on: bool) -> Path:
    rows = [{"input_ids": [(7 * i + j) % V for j in range(12)], "loss_mask": [int(masks_on and j > 5) for j in range(12)]}
            for i in range(24)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_train_refuses_data_without_loss_tokens_before_training(tmp_path):
    target = write_target_config(tmp_path / "target")
    out = tmp_path / "run"
    proc = cli("train", "--target", target, "--tokens", tokens_file(tmp_path / "t.jsonl", False), "--out", out,
               "--max-steps", "2", "--draft-vocab-size", "32", "--device", "cpu")
    one_error_line(proc, "t.jsonl", "'loss_mask'", "no sample has a loss token")
    assert not (out / "drafter").exists() and not (out / "summary.json").exists()


def test_train_refuses_conversations_without_an_assistant_turn(tmp_path):
    target = tmp_path / "target"
    tiny_tokenizer(target)
    write_target_config(target, vocab_size=320)
    data = tmp_path / "users.jsonl"
    data.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"the quick brown fox {i}"}]}) + "\n"
                            for i in range(12)))
    proc = cli("train", "--target", target, "--data", data, "--out", tmp_path / "run", "--max-steps", "1",
               "--draft-vocab-size", "16", "--device", "cpu")
    one_error_line(proc, "users.jsonl", "no assistant turn")


def test_d2t_build_refuses_no_tokens_and_writes_nothing(tmp_path):
    out = tmp_path / "m.safetensors"
    proc = cli("d2t", "build", "--tokens", tokens_file(tmp_path / "t.jsonl", False), "--target-vocab-size", V,
               "--draft-vocab-size", 32, "--out", out)
    one_error_line(proc, "t.jsonl", "no loss-masked tokens")
    assert not out.exists()
    assert cli("d2t", "build", "--tokens", tokens_file(tmp_path / "t2.jsonl", True), "--target-vocab-size", V,
               "--draft-vocab-size", 32, "--out", out).returncode == 0


def _mapping_file(path: Path, case: str) -> Path:
    ids = torch.arange(0, 64, 2)
    d2t = ids - torch.arange(32)
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[ids] = True
    if case == "t2d-disagrees":
        t2d[1] = True
    elif case == "duplicate-ids":
        d2t[1] -= 2  # draft ids 0 and 1 both -> target id 0
    elif case == "d2t-2d":
        d2t = d2t.reshape(4, 8)
    elif case == "d2t-float":
        d2t = d2t.float()
    elif case == "t2d-float":
        t2d = t2d.float() * 0.5
    elif case == "d2t-empty":
        d2t = d2t[:0]
    save_file({"d2t": d2t.contiguous(), "t2d": t2d.contiguous()}, str(path))
    return path


BAD_MAPPINGS = {
    "t2d-disagrees": ("'t2d'", "disagrees with d2t"),
    "duplicate-ids": ("'d2t'", "appear more than once"),
    "d2t-2d": ("'d2t'", "expected one dimension"),
    "d2t-float": ("'d2t'", "expected integer offsets"),
    "t2d-float": ("'t2d'", "expected a boolean mask"),
    "d2t-empty": ("'d2t'", "empty"),
}


@pytest.mark.parametrize("case", list(BAD_MAPPINGS))
def test_every_mapping_reader_validates_what_it_loads(tmp_path, case):
    bad = _mapping_file(tmp_path / f"{case}.safetensors", case)
    good = tmp_path / "good.safetensors"
    ids = torch.arange(0, 64, 2)
    save_mapping(good, VocabMapping.from_target_ids(ids, V))
    key, phrase = BAD_MAPPINGS[case]
    one_error_line(cli("d2t", "diff", good, bad), str(bad), key, phrase)
    one_error_line(cli("d2t", "coverage", "--drafter", bad, "--tokens", tokens_file(tmp_path / "t.jsonl", True)),
                   str(bad), key, phrase)
    target = write_target_config(tmp_path / "target")
    proc = cli("train", "--target", target, "--tokens", tmp_path / "t.jsonl", "--vocab-mapping", bad,
               "--out", tmp_path / "run", "--max-steps", "1", "--device", "cpu")
    one_error_line(proc, str(bad), key, phrase)
    assert not (tmp_path / "run" / "drafter").exists()


def test_huge_config_vocab_size_is_refused_not_allocated(tmp_path):
    """vocab_size 2e9 with no t2d: a 2 GB dense t2d per drafter (4.1 GB in d2t diff) before; now one line."""
    cfg = tiny_drafter_config(vocab_size=2_000_000_000)
    a = write_drafter(tmp_path / "a", cfg=tiny_drafter_config())
    b = tmp_path / "b"
    write_drafter(b, cfg=tiny_drafter_config())
    from safetensors.torch import load_file

    tensors = load_file(str(b / "model.safetensors"))
    del tensors["t2d"]
    save_file(tensors, str(b / "model.safetensors"))
    (b / "config.json").write_text(json.dumps(cfg))
    code = ("import resource, sys\nfrom draftlab.cli import main\nrc = main(sys.argv[1:])\n"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, rc)\n")
    proc = subprocess.run([sys.executable, "-c", code, "d2t", "diff", str(a), str(b)], capture_output=True, text=True,
                          timeout=300)
    rss_kb, rc = map(int, proc.stdout.split()[-2:])
    assert rc == 2 and "key 'vocab_size'" in proc.stderr and "1..16777216" in proc.stderr, proc.stderr
    assert rss_kb < 1_000_000  # well under the 2 GB a dense t2d of 2e9 ids needs


class CountingTokenizer:
    """A real tokenizer that records how many characters each call was given."""

    def __init__(self, tok):
        self.tok, self.seen = tok, []
        self.chat_template = tok.chat_template

    def __call__(self, text, **kw):
        self.seen.append(len(text))
        return self.tok(text, **kw)

    def apply_chat_template(self, *a, **kw):
        return self.tok.apply_chat_template(*a, **kw)


@pytest.mark.parametrize("kind", ["text", "messages"])
def test_a_10mb_line_is_cut_by_characters_before_tokenizing(tmp_path, kind):
    tok = tiny_tokenizer(tmp_path / "tok")
    words = "the quick brown fox jumps over the lazy dog def return print range "
    big = (words * (10_000_000 // len(words) + 1))[:10_000_000]
    record = {"text": big} if kind == "text" else {
        "messages": [{"role": "user", "content": "hello"}, {"role": "assistant", "content": big}]}
    counting = CountingTokenizer(tok)
    out = tokenize_record(counting, record, max_length=512)
    assert max(counting.seen) <= 512 * 64, counting.seen  # not the 10 MB
    assert len(out["input_ids"]) == 512 and len(out["loss_mask"]) == 512
    # the same tokens as tokenizing a generous prefix whole (the cut does not change what is kept)
    small = {"text": big[:200_000]} if kind == "text" else {
        "messages": [{"role": "user", "content": "hello"}, {"role": "assistant", "content": big[:200_000]}]}
    ref = tokenize_record(tok, small, max_length=None)
    assert out["input_ids"] == ref["input_ids"][:512] and out["loss_mask"] == ref["loss_mask"][:512]
    # short records are unchanged (tokenized whole, end-of-turn marker included)
    short = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "the fox"}]}
    assert tokenize_record(tok, short, max_length=512) == tokenize_record(tok, short, max_length=None)
