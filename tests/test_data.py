"""Training data: formats read, loss masks on the assistant tokens, the tokens.jsonl format."""

from __future__ import annotations

import json

import pytest
from tiny_models import tiny_target, tiny_tokenizer

from draftlab.cli import main
from draftlab.formats.data import read_records, read_tokens, write_tokens
from draftlab.training.tokenize import tokenize_record
from draftlab.errors import DraftlabError

CONV = {"messages": [{"role": "user", "content": "what is a drafter?"},
                     {"role": "assistant", "content": "a small model."},
                     {"role": "user", "content": "ok"},
                     {"role": "assistant", "content": "yes"}]}


def _split(tok, rec):
    out = tokenize_record(tok, rec)
    assert len(out["input_ids"]) == len(out["loss_mask"])
    on = tok.decode([i for i, m in zip(out["input_ids"], out["loss_mask"]) if m])
    off = tok.decode([i for i, m in zip(out["input_ids"], out["loss_mask"]) if not m])
    return on, off


def test_chat_template_masks_assistant_turns_with_end_marker(tmp_path):
    tok = tiny_tokenizer(tmp_path)
    on, off = _split(tok, CONV)
    assert on == "a small model.<|end|>yes<|end|>"
    assert off == "<|user|>what is a drafter?<|end|><|assistant|><|user|>ok<|end|><|assistant|>"


def test_without_template_uses_role_colon_format(tmp_path):
    tok = tiny_tokenizer(tmp_path, chat_template=False)
    on, off = _split(tok, CONV)
    assert on.strip() == "a small model.\nyes"
    assert "user: what is a drafter?" in off and "a small" not in off


def test_plain_text_is_all_loss(tmp_path):
    tok = tiny_tokenizer(tmp_path)
    out = tokenize_record(tok, {"text": "def add(a, b): return a + b"}, max_length=5)
    assert len(out["input_ids"]) == 5 and out["loss_mask"] == [1] * 5


def test_read_formats_and_errors(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text("\n".join([
        json.dumps(CONV),
        json.dumps({"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}),
        json.dumps({"text": "plain"}),
        "",
    ]))
    recs = list(read_records(p))
    assert recs[1]["messages"][1] == {"role": "assistant", "content": "yo"}
    assert recs[2] == {"text": "plain"}
    (tmp_path / "t.txt").write_text("line one\n\nline two\n")
    assert [r["text"] for r in read_records(tmp_path / "t.txt")] == ["line one", "line two"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(CONV) + "\n" + json.dumps({"prompt": "x"}) + "\n")
    with pytest.raises(DraftlabError, match=r"bad.jsonl:2: .*'messages'"):
        list(read_records(bad))


def test_tokens_file_roundtrip_and_validation(tmp_path):
    samples = [{"input_ids": [1, 2, 3], "loss_mask": [0, 1, 1]}, {"input_ids": [4, 5], "loss_mask": [1, 1]}]
    write_tokens(tmp_path / "tok.jsonl", samples)
    assert read_tokens(tmp_path / "tok.jsonl") == samples
    (tmp_path / "bad.jsonl").write_text(json.dumps({"input_ids": [1, 2], "loss_mask": [1]}) + "\n")
    with pytest.raises(DraftlabError, match="bad.jsonl:1: 'loss_mask'"):
        read_tokens(tmp_path / "bad.jsonl")
    with pytest.raises(DraftlabError, match="outside the target vocabulary"):
        read_tokens(tmp_path / "tok.jsonl", vocab_size=4)


def test_cli_tokenize(tmp_path, capsys):
    target = tiny_target(tmp_path / "t")
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps(CONV) + "\n" + json.dumps({"text": "hello world"}) + "\n")
    assert main(["tokenize", "--target", str(target), "--data", str(data), "--out", str(tmp_path / "tok.jsonl"),
                 "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["samples"] == 2 and r["chat_template"] is True
    rows = read_tokens(tmp_path / "tok.jsonl")
    assert sum(rows[1]["loss_mask"]) == len(rows[1]["input_ids"])
    assert 0 < sum(rows[0]["loss_mask"]) < len(rows[0]["input_ids"])
