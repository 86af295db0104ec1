"""One client cannot starve the builtin server (issue 24, family 2): a real server on 127.0.0.1.

A tiny transformers target (plain decoding, one row per step: ``max_batch_size`` 1, the case where
one request holds the engine longest). One ``/generate`` with many prompts must take turns with the
other requests: ``/health_generate`` and a second small request are answered while it still runs.
Per-request limits (prompts per request) and client-supplied chat templates are refused with 4xx.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch
from httpcall import call
from tiny_models import tiny_target

from draftlab.serving.server import load_state, make_server

BIG = 60  # prompts in the greedy request
MAX_PROMPTS = 64


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    torch.set_num_threads(1)
    target = tiny_target(tmp_path_factory.mktemp("fair") / "target", max_position_embeddings=512)
    state = load_state(target, None, max_batch_size=1, health_timeout_s=120.0, max_prompts=MAX_PROMPTS)
    httpd = make_server(state, "127.0.0.1", 0)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield state, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_a_request_with_many_prompts_takes_turns_with_the_others(served):
    state, url = served
    big = {"input_ids": [[5 + i % 50, 6, 7] for i in range(BIG)],
           "sampling_params": {"max_new_tokens": 16, "ignore_eos": True}}
    result: dict = {}
    worker = threading.Thread(target=lambda: result.update(big=call(url + "/generate", big, timeout=600)))
    steps_before = state.scheduler.peak_rows
    worker.start()
    for _ in range(6000):  # until the big request's first prompt is being decoded
        if state.scheduler.peak_rows > steps_before or not worker.is_alive():
            break
        time.sleep(0.01)
    assert worker.is_alive(), result
    # the probe and a second client each wait for one free row, not for the other request's 60 prompts
    assert call(url + "/health_generate", timeout=300)[0] == 200
    assert worker.is_alive(), "/health_generate was answered only after the whole big request"
    status, small = call(url + "/generate", {"input_ids": [9, 10, 11], "sampling_params": {"max_new_tokens": 4,
                                                                                           "ignore_eos": True}},
                         timeout=300)
    assert status == 200 and small["meta_info"]["completion_tokens"] == 4
    assert worker.is_alive(), "the small request was served only after the whole big request"
    worker.join(600)
    status, answers = result["big"]
    assert status == 200 and len(answers) == BIG and all(a["meta_info"]["completion_tokens"] == 16 for a in answers)


def test_too_many_prompts_in_one_request_is_refused(served):
    _, url = served
    for path, key in (("/generate", "input_ids"), ("/v1/completions", "prompt")):
        # each route's own budget key (issue 40: a key a route does not honour is a 400 of its own)
        budget = {"max_tokens": 1} if path == "/v1/completions" else {"sampling_params": {"max_new_tokens": 1}}
        body = {key: [[5, 6]] * (MAX_PROMPTS + 1), **budget}
        status, answer = call(url + path, body)
        assert status == 413, answer
        assert f"{MAX_PROMPTS + 1} prompts" in answer["message"] and f"at most {MAX_PROMPTS}" in answer["message"]
    status, _ = call(url + "/generate", {"input_ids": [[5, 6]] * MAX_PROMPTS, "sampling_params": {"max_new_tokens": 1}})
    assert status == 200


CHAT = {"messages": [{"role": "user", "content": "hello"}], "max_completion_tokens": 2}


@pytest.mark.parametrize("kwargs, needle", [
    ({"chat_template": "{% for i in range(10**9) %}{{ i }}{% endfor %}"}, "chat_template_kwargs.chat_template"),
    ({"chat_template": "PWNED {{ messages }}"}, "chat_template_kwargs.chat_template"),
    ({"tokenize": False}, "chat_template_kwargs.tokenize"),
    ({"tools": [{"type": "function"}]}, "chat_template_kwargs.tools"),
    ({"bos_token": "<x>"}, "chat_template_kwargs.bos_token"),
    ({"enable_thinking": {"nested": [1, 2]}}, "chat_template_kwargs.enable_thinking"),
    ({"note": "x" * 5000}, "5000 characters"),
    ({"a b": 1}, "not a template variable name"),
    ("thinking", "chat_template_kwargs: expected an object"),
])
def test_client_supplied_templates_are_refused(served, kwargs, needle):
    _, url = served
    status, answer = call(url + "/v1/chat/completions", {**CHAT, "chat_template_kwargs": kwargs}, timeout=60)
    assert status == 400, answer
    assert needle in answer["message"]


def test_template_variables_for_the_models_own_template_are_served(served):
    _, url = served
    plain = call(url + "/v1/chat/completions", CHAT)
    with_var = call(url + "/v1/chat/completions", {**CHAT, "chat_template_kwargs": {"enable_thinking": False}})
    assert plain[0] == with_var[0] == 200
    assert with_var[1]["usage"]["prompt_tokens"] == plain[1]["usage"]["prompt_tokens"]  # the model's template


@pytest.mark.parametrize("length", ["²", "¹", "-1", "1e3", "+5"])
def test_a_non_ascii_or_signed_content_length_is_a_400(served, length):
    _, url = served
    status, answer = call(url + "/generate", raw=b"{}", headers={"Content-Length": length})
    assert status == 400 and "Content-Length" in answer["message"], answer
