"""draftlab generate: a real (tiny) transformers target answers prompts; the output is its own greedy/sampled text."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from draftlab.training import demo_models as demo
from draftlab.cli import main
from draftlab.errors import DraftlabError
from draftlab.datagen.generate_data import generate, read_prompts


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    """A tiny random Llama with the demo's BPE tokenizer and chat template (context 64)."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("gen") / "target"
    texts = [demo.render_chat([{"role": "user", "content": f"line {i} of some text"},
                               {"role": "assistant", "content": f"answer number {i * 7} here"}]) for i in range(200)]
    demo.train_tokenizer(texts, 300, folder, model_max_length=64)
    tok = AutoTokenizer.from_pretrained(str(folder))
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(str(folder))
    return folder


def _prompts(tmp_path: Path) -> Path:
    rows = [
        {"prompt": "line 3 of some text"},
        {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "line 9"},
                      {"role": "assistant", "content": "dropped: the target writes this turn"}]},
        {"text": "answer number"},
    ]
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _manual_greedy(target: Path, messages, n: int) -> str:
    """Greedy decoding by hand (full forward per token) to check generate's output against."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(str(target))
    model = LlamaForCausalLM.from_pretrained(str(target)).eval()
    ids = list(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False))
    new = []
    with torch.no_grad():
        for _ in range(n):
            nxt = int(model(input_ids=torch.tensor([ids + new])).logits[0, -1].argmax())
            if nxt == tok.eos_token_id:
                break
            new.append(nxt)
    return tok.decode(new, skip_special_tokens=True)


def test_greedy_output_is_the_targets_own_argmax_continuation(target, tmp_path):
    out = tmp_path / "gen.jsonl"
    stats = generate(target, _prompts(tmp_path), out, max_new_tokens=12)
    rows = _rows(out)
    assert stats["prompts"] == 3 and stats["mode"] == "greedy" and len(rows) == 3
    assert [m["role"] for m in rows[1]["messages"]] == ["system", "user", "assistant"]
    assert "dropped" not in rows[1]["messages"][-1]["content"]
    for row in rows:
        prompt, answer = row["messages"][:-1], row["messages"][-1]
        assert answer["role"] == "assistant"
        assert answer["content"] == _manual_greedy(target, prompt, 12)
    assert stats["generated_tokens"] > 0


def test_sampling_is_reproducible_per_prompt(target, tmp_path):
    p = _prompts(tmp_path)
    a, b, c, first = (tmp_path / f"{n}.jsonl" for n in "abcd")
    generate(target, p, a, max_new_tokens=16, temperature=1.0, seed=5)
    generate(target, p, b, max_new_tokens=16, temperature=1.0, seed=5)
    generate(target, p, c, max_new_tokens=16, temperature=1.0, seed=6)
    generate(target, p, first, max_new_tokens=16, temperature=1.0, seed=5, limit=1)
    assert a.read_text() == b.read_text()
    assert a.read_text() != c.read_text()
    assert _rows(first)[0] == _rows(a)[0]  # prompt i is sampled under seed+i, whatever else runs
    greedy = tmp_path / "g.jsonl"
    generate(target, p, greedy, max_new_tokens=16)
    assert greedy.read_text() != a.read_text()


def test_long_prompt_is_cut_to_fit_the_context(target, tmp_path):
    p = tmp_path / "long.txt"
    p.write_text("line " * 200 + "\n")
    stats = generate(target, p, tmp_path / "o.jsonl", max_new_tokens=8)
    assert stats["truncated_prompts"] == 1
    assert len(_rows(tmp_path / "o.jsonl")) == 1


def test_cli_json_and_errors(target, tmp_path, capsys):
    p = _prompts(tmp_path)
    out = tmp_path / "cli.jsonl"
    assert main(["generate", "--target", str(target), "--prompts", str(p), "--out", str(out),
                 "--max-new-tokens", "4", "--temperature", "0.7", "--seed", "1", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["prompts"] == 3 and stats["mode"].startswith("sampled") and out.is_file()
    assert main(["generate", "--target", str(target), "--prompts", str(tmp_path / "nope.jsonl"),
                 "--out", str(out)]) == 2
    assert "prompt file not found" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["generate", "--target", str(target), "--prompts", str(p), "--out", str(out),
              "--greedy", "--temperature", "0.5"])
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "assistant", "content": "x"}]}\n')
    with pytest.raises(Exception, match="no user turn"):
        read_prompts(bad)


def test_every_turn_of_a_conversation_is_the_targets_answer_to_what_came_before(target, tmp_path):
    """turns "all" (the default): each user turn answered in order with the target's own earlier answers in
    the context, batched conversations with different numbers of turns included; "last" keeps the data's."""
    rows = [
        {"conversations": [{"from": "system", "value": "be brief"}, {"from": "human", "value": "line 4"},
                           {"from": "gpt", "value": "an old answer"}, {"from": "human", "value": "line 5 of"}]},
        {"messages": [{"role": "user", "content": "line 1"}, {"role": "user", "content": "answer number"},
                      {"role": "assistant", "content": "a trailing old answer"}]},
        {"prompt": "line 3 of some text"},
    ]
    p = tmp_path / "multi.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    stats = generate(target, p, tmp_path / "all.jsonl", max_new_tokens=8, batch_size=2)
    got = _rows(tmp_path / "all.jsonl")
    assert [m["role"] for m in got[0]["messages"]] == ["system", "user", "assistant", "user", "assistant"]
    assert [m["role"] for m in got[1]["messages"]] == ["user", "assistant", "user", "assistant"]
    assert "old answer" not in json.dumps(got)
    for row in got:
        msgs = row["messages"]
        for j, m in enumerate(msgs):
            if m["role"] == "assistant":
                assert m["content"] == _manual_greedy(target, msgs[:j], 8)
    assert stats["turns"] == "all" and stats["answered_turns"] == 5 and stats["answers"] == 3
    one_at_a_time = tmp_path / "one.jsonl"
    generate(target, p, one_at_a_time, max_new_tokens=8)
    assert _rows(one_at_a_time) == got

    last = generate(target, p, tmp_path / "last.jsonl", max_new_tokens=8, turns="last")
    kept = _rows(tmp_path / "last.jsonl")[0]["messages"]
    assert kept[2] == {"role": "assistant", "content": "an old answer"}
    assert kept[-1]["content"] == _manual_greedy(target, kept[:-1], 8) and last["answered_turns"] == 3
    with pytest.raises(DraftlabError, match="--turns: expected one of all, last"):
        generate(target, p, tmp_path / "x.jsonl", turns="first")


def test_batched_greedy_equals_one_prompt_at_a_time(target, tmp_path):
    """Left-padded batches (the GPU path, data.batch_size) write what batch 1 writes, in prompt order."""
    rows = [{"prompt": f"line {i} of some text"} for i in range(5)] + [{"text": "answer number"}]
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    one = generate(target, prompts, tmp_path / "one.jsonl", max_new_tokens=10)
    many = generate(target, prompts, tmp_path / "many.jsonl", max_new_tokens=10, batch_size=4, device="auto")
    assert many["batch_size"] == 4 and one["batch_size"] == 1 and many["device"] == "cpu"
    assert _rows(tmp_path / "many.jsonl") == _rows(tmp_path / "one.jsonl")
    assert many["generated_tokens"] == one["generated_tokens"]
    with pytest.raises(DraftlabError, match="--batch-size"):
        generate(target, prompts, tmp_path / "x.jsonl", batch_size=0)
