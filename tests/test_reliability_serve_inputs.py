"""Issue 36, family 7, the builtin server and the target loader: a lone surrogate in a request is a 400
naming the field (not a 500 and a traceback per request); a drafter whose vocabulary is larger than the
target's, and a target saved only as a pickle, are refused at load in one line."""

from __future__ import annotations

import json

import pytest
import torch
from factories import drafter_tensors, tiny_drafter_config, write_drafter
from helpers import DRAFTLAB, cli_process, one_error_line
from safetensors.torch import load_file
from test_reliability_server_limits import Served, call, folders  # noqa: F401 - folders: the module fixture
from tiny_models import tiny_target


@pytest.fixture(scope="module")
def server(folders, tmp_path_factory):  # noqa: F811
    srv = Served(folders, tmp_path_factory.mktemp("log") / "serve.log")
    yield srv
    srv.stop()


LONE = "\\ud800"  # as JSON spells it: the escape, not a character
BODIES = {  # (path, raw JSON body, the field the 400 must name)
    "generate text": ("/generate", '{"text": "hi %s", "sampling_params": {"max_new_tokens": 2}}' % LONE, "text"),
    "generate text list": ("/generate", '{"text": ["ok", "%s"]}' % LONE, "text[1]"),
    "completions prompt": ("/v1/completions", '{"model": "m", "prompt": "%s", "max_tokens": 2}' % LONE, "prompt"),
    "chat content": ("/v1/chat/completions",
                     '{"model": "m", "messages": [{"role": "user", "content": "a%sb"}]}' % LONE, "messages[0].content"),
    "a key": ("/generate", '{"text": "hi", "sampling_params": {"%s": 1}}' % LONE, "sampling_params"),
    "stop string": ("/v1/completions", '{"model": "m", "prompt": "hi", "stop": ["%s"]}' % LONE, "stop[0]"),
}


@pytest.mark.parametrize("name", list(BODIES))
def test_a_lone_surrogate_is_a_400_naming_the_field(server, name):
    path, raw, field = BODIES[name]
    status, body = call(server.url + path, raw=raw.encode(), headers={"Content-Type": "application/json"})
    assert status == 400, (status, body)
    message = body["error"]["message"]
    assert message.startswith(field) and "surrogate" in message, message
    ok, answer = call(server.url + "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 2}})
    assert ok == 200 and answer["meta_info"]["completion_tokens"] == 2
    assert "Traceback" not in server.log.read_text()


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("pair")
    target = tiny_target(root / "target")
    return root, target, json.loads((target / "config.json").read_text())


def test_a_drafter_whose_vocabulary_is_larger_than_the_targets_is_refused_at_load(pair):
    root, target, tcfg = pair
    # its own embeddings (hidden 48 != the target's 32), 640 tokens; its draft ids all inside the target's
    cfg = tiny_drafter_config(target=tcfg, hidden_size=48, num_attention_heads=4, num_key_value_heads=2,
                              vocab_size=2 * tcfg["vocab_size"])
    tensors = drafter_tensors(cfg, seed=1)
    tensors["d2t"] = torch.zeros_like(tensors["d2t"])
    drafter = write_drafter(root / "big-vocab", cfg, tensors)
    proc = cli_process("serve", "--target", target, "--drafter", drafter, "--threads", "1", timeout=120)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    for needle in (f"{drafter}/config.json", "vocab_size 640", str(target), "320 tokens"):
        assert needle in last, (needle, last)


@pytest.fixture(scope="module")
def pickled_target(pair):
    """The tiny target saved as ``pytorch_model.bin`` only, as ``torch.save`` of its state dict does."""
    root, target, _ = pair
    folder = root / "pickled"
    folder.mkdir()
    for f in target.iterdir():
        if f.name != "model.safetensors":
            (folder / f.name).write_bytes(f.read_bytes())
    torch.save(load_file(str(target / "model.safetensors")), folder / "pytorch_model.bin")
    return folder


@pytest.mark.parametrize("argv", [["serve", "--threads", "1"],
                                  ["generate-data", "--prompts", "{prompts}", "--out", "{out}", "--max-new-tokens", "2"]],
                         ids=["serve", "generate-data"])
def test_a_target_saved_only_as_a_pickle_is_one_line(pickled_target, tmp_path, argv):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hi"}\n')
    args = [a.format(prompts=prompts, out=tmp_path / "out.jsonl") for a in argv]
    proc = cli_process(args[0], "--target", pickled_target, *args[1:], timeout=120)
    said = [line for line in proc.stderr.splitlines() if not line.startswith("draftlab-serve: loading")]
    proc.stderr = "\n".join(said)  # serve says what it loads first
    one_error_line(proc, str(pickled_target), "pytorch_model.bin", "safetensors only")
    assert not (tmp_path / "out.jsonl").exists()


def test_a_bench_prompt_longer_than_the_context_names_the_prompt_and_the_file(server, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "short-1", "prompt": "hello there"}) + "\n"
                       + json.dumps({"id": "huge-7", "prompt": "word " * 3000}) + "\n")
    proc = cli_process("bench", "--url", server.url, "--prompts", prompts, "--out", tmp_path / "b.json",
                       "--repeats", "1", "--warmup", "0", "--max-new-tokens", "2", "--no-progress", "--no-ttft")
    one_error_line(proc, str(prompts), "prompt 'huge-7'", "context length")
    assert not (tmp_path / "b.json").exists()
