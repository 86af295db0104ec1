"""Token-exact training data: the ids the target emitted are kept with each answer (a real builtin server on
127.0.0.1), the training rendering holds them, and `draftlab token-check` says how often, stopping a run below
its floor in one line with the first mismatch decoded."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from helpers import cli, one_error_line
from tiny_models import WORDS, tiny_target

from draftlab.datagen.answerers import Prompt, Sampling, chat_request
from draftlab.datagen.generate_data import _identity, generate
from draftlab.models.target import load_tokenizer
from draftlab.serving.launch import ServerSpec, running_server
from draftlab.training import token_check
from draftlab.training.tokenize import tokenize_record


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    return tiny_target(tmp_path_factory.mktemp("tok-check") / "target")


def _builtin(target: Path) -> ServerSpec:
    return ServerSpec.from_dict({"backend": "builtin", "target": str(target), "device": "cpu", "port": 0,
                                 "max_batch_size": 4, "health_interval_s": 0.1, "health_deadline_s": 120.0})


@pytest.fixture(scope="module")
def generated(target, tmp_path_factory) -> Path:
    """Conversations a real builtin server answered (one to three user turns each, every turn answered)."""
    rng = random.Random(11)
    rows = [{"messages": [m for _ in range(1 + i % 3) for m in (
        {"role": "user", "content": " ".join(rng.choices(WORDS, k=5))},
        {"role": "assistant", "content": "the data's own answer"})]} for i in range(9)]
    folder = tmp_path_factory.mktemp("tok-check-data")
    (folder / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with running_server(_builtin(target), folder / "server.log", progress=lambda m: None) as srv:
        generate(target, folder / "prompts.jsonl", folder / "gen.jsonl", url=srv.url, concurrency=4,
                 max_new_tokens=16, progress=False)
    return folder / "gen.jsonl"


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_the_request_asks_for_the_emitted_ids_and_every_answer_keeps_them(generated):
    body = chat_request("m", Prompt(0, ({"role": "user", "content": "hi"},), "d"), Sampling(max_new_tokens=4))
    assert body["return_token_ids"] is True and body["stream"] is False  # SGLang returns them unstreamed only
    turns = [m for r in _rows(generated) for m in r["messages"] if m["role"] == "assistant"]
    assert len(turns) == sum(1 + i % 3 for i in range(9))
    assert all(isinstance(m.get("token_ids"), list) and 0 < len(m["token_ids"]) <= 17 for m in turns)


def test_tokenize_trains_on_the_emitted_ids_and_the_check_passes_at_100(generated, target, tmp_path):
    tok = load_tokenizer(str(target))
    for row in _rows(generated):
        rec = tokenize_record(tok, {"messages": row["messages"]})
        runs = token_check.loss_runs(rec["loss_mask"])
        emitted = [m["token_ids"] for m in row["messages"] if m["role"] == "assistant"]
        assert len(runs) == len(emitted)
        for (a, b), ids in zip(runs, emitted):
            assert rec["input_ids"][a:a + len(ids)] == ids
    out = tmp_path / "check.json"
    proc = cli("token-check", "--target", str(target), "--data", str(generated), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    r = json.loads(out.read_text())
    assert r["turns"] == r["exact"] == sum(1 + i % 3 for i in range(9)) and r["match_rate"] == 1.0
    assert r["first_mismatch"] is None and "token check (tokenize): 18/18 assistant turns" in proc.stdout
    # a stated sample: that many conversations, seeded
    sampled = json.loads(cli("token-check", "--target", str(target), "--data", str(generated), "--sample", "4",
                             "--json").stdout)
    assert sampled["conversations"] == 4 and sampled["sampled"] and sampled["match_rate"] == 1.0


def test_a_rendering_that_does_not_hold_the_emitted_ids_stops_the_run_with_the_first_mismatch(generated, target,
                                                                                                tmp_path):
    rows = _rows(generated)
    turn = next(m for m in rows[4]["messages"] if m["role"] == "assistant")
    turn["content"] = "another rendering " + turn["content"]  # the text no longer is what the target emitted
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc = cli("token-check", "--target", str(target), "--data", str(bad), "--out", str(tmp_path / "c.json"))
    line = one_error_line(proc, str(bad), "floor data.min_token_match 1", "first mismatch: line 5, assistant turn 1, "
                          "token 0: emitted", "rendered 'another")
    assert proc.returncode == 2 and "17/18 assistant turns" in line
    r = json.loads((tmp_path / "c.json").read_text())
    assert r["exact"] == 17 and r["first_mismatch"]["line"] == 5
    assert cli("token-check", "--target", str(target), "--data", str(bad), "--min-match", "0.9").returncode == 0


def test_data_without_emitted_ids_is_refused_unless_the_floor_is_zero(generated, target, tmp_path):
    rows = _rows(generated)
    for r in rows:
        for m in r["messages"]:
            m.pop("token_ids", None)
    old = tmp_path / "old.jsonl"
    old.write_text("".join(json.dumps(r) + "\n" for r in rows))
    one_error_line(cli("token-check", "--target", str(target), "--data", str(old)), str(old),
                   "no assistant turn carries the ids the target emitted", "data.min_token_match: 0")
    assert cli("token-check", "--target", str(target), "--data", str(old), "--min-match", "0").returncode == 0


def test_a_special_token_the_target_emitted_inside_its_answer_is_trained_on_though_the_text_lost_it(target):
    """A server decodes answers without special tokens: the demo target emitted `<|endoftext|><|im_start|>` mid
    answer (the smoke loop's first token check: 9/10). Training on the emitted ids keeps them; the text tokenized
    again (SpecForge's capture) cannot, and the check says so."""
    tok = load_tokenizer(str(target))
    end = tok.convert_tokens_to_ids("<|end|>")
    emitted = tok.encode("the cat", add_special_tokens=False) + [tok.convert_tokens_to_ids("<|user|>")] \
        + tok.encode(" sat", add_special_tokens=False) + [end]
    content = tok.decode(emitted, skip_special_tokens=True)
    assert "<|user|>" not in content
    messages = [{"role": "user", "content": "where"}, {"role": "assistant", "content": content, "token_ids": emitted}]
    rec = tokenize_record(tok, {"messages": messages})
    (a, b), = token_check.loss_runs(rec["loss_mask"])
    assert rec["input_ids"][a:a + len(emitted)] == emitted and rec["input_ids"][a + len(emitted) - 1] == end
    assert rec["input_ids"][a:b].count(end) == 1  # the template's end-of-turn is the emitted one, not written twice
    assert [r["exact"] for r in token_check.check_conversation(tok, messages)] == [True]
    text = token_check.check_conversation(tok, messages, "text")
    assert [r["exact"] for r in text] == [False] and "<|user|>" in text[0]["emitted_text"]


@pytest.mark.parametrize("rendering", token_check.RENDERINGS)
def test_thinking_the_training_rendering_drops_is_a_mismatch(target, rendering):
    """SGLang's reasoning parser keeps K2.5's thinking apart (reasoning_content) while the emitted ids hold it;
    SpecForge 0.2.0's parser (role, content, tool_calls) and draftlab's tokenize (role, content) never render it,
    so the drafter would not train on it: the check says so."""
    tok = load_tokenizer(str(target))
    emitted = tok.encode("the fox jumps over", add_special_tokens=False) + tok.encode(" the dog", add_special_tokens=False) \
        + [tok.convert_tokens_to_ids("<|end|>")]
    messages = [{"role": "user", "content": "what"},
                {"role": "assistant", "content": tok.decode(tok.encode(" the dog", add_special_tokens=False)).strip(),
                 "reasoning_content": "the fox jumps over", "token_ids": emitted}]
    res, = token_check.check_conversation(tok, messages, rendering)
    assert not res["exact"] and res["emitted_text"].startswith("the fox jumps")


def test_the_text_as_emitted_is_asked_for_in_sglangs_field_and_the_builtin_server_answers_the_same(generated, target,
                                                                                                   tmp_path):
    """data.separate_reasoning false: the request says so in SGLang's own field (a server with a reasoning parser
    then returns the thinking inside the text, as emitted); the builtin server has no parser, so its answers are
    the same, and the run's identity and stats record the setting."""
    prompt = Prompt(0, ({"role": "user", "content": "hi"},), "d")
    assert "separate_reasoning" not in chat_request("m", prompt, Sampling(max_new_tokens=4))
    assert chat_request("m", prompt, Sampling(4, separate_reasoning=False))["separate_reasoning"] is False
    with running_server(_builtin(target), tmp_path / "server.log", progress=lambda m: None) as srv:
        stats = generate(target, generated.parent / "prompts.jsonl", tmp_path / "gen.jsonl", url=srv.url,
                         concurrency=4, max_new_tokens=16, progress=False, limit=3, separate_reasoning=False)
    assert stats["separate_reasoning"] is False and stats["failed"] == 0
    # a resumed run never mixes answers of the two settings; runs from before the setting keep their identity
    def identity(sampling):
        return _identity(target, None, srv.url, sampling, False, "all")

    assert "separate_reasoning" not in identity(Sampling(16))
    assert identity(Sampling(16, separate_reasoning=False))["separate_reasoning"] is False
    assert _rows(tmp_path / "gen.jsonl") == _rows(generated)[:3]
    cmd = cli("generate-data", "--help").stdout
    assert "--no-separate-reasoning" in cmd
