"""Streaming on the builtin server (issue 40), over real HTTP on 127.0.0.1: SGLang 0.5.23's event
formats, tokens out per verify step, the same ids and counts as a whole answer (speculative and plain,
at concurrency 1 and 8), bounded memory for a reader that falls behind, and a 400 for every option
the server does not honour, on every route."""

from __future__ import annotations

import threading
import time
import tracemalloc

import pytest
from httpcall import call
from test_server import folders  # noqa: F401 - the same tiny target and drafter (a fixture)

from draftlab import http_client
from draftlab.engine.core import Engine
from draftlab.serving import streaming
from draftlab.serving.server import load_state, make_server

# the final meta_info fields a stream must agree on with the whole answer (all but ids and times)
SAME = ("prompt_tokens", "completion_tokens", "finish_reason", "spec_verify_ct", "spec_accept_length",
        "spec_accept_rate", "spec_num_correct_drafts", "spec_num_proposed_drafts", "spec_correct_drafts_histogram")


@pytest.fixture(scope="module")
def started(folders):
    target, drafter = folders
    out = {}
    for name, state in (("plain", load_state(target, None)), ("spec", load_state(target, drafter, num_steps=3))):
        httpd = make_server(state, "127.0.0.1", 0)
        threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        out[name] = (httpd, f"http://127.0.0.1:{httpd.server_address[1]}")
    yield out
    for httpd, _ in out.values():
        httpd.shutdown()
        httpd.server_close()


def stream(url: str, payload: dict) -> tuple[str, list]:
    """(content type, the parsed events) of one streamed answer; the raw ``[DONE]`` must close it."""
    with http_client.request(url, payload, 120) as resp:
        kind = resp.content_type
        raw = resp.read().decode()
    chunks = [c for c in raw.split("\n\n") if c]
    assert chunks[-1] == "data: [DONE]" and all(c.startswith("data: ") for c in chunks), raw[-300:]
    import json

    return kind, [json.loads(c[len("data: "):]) for c in chunks[:-1]]


def _requests() -> list[dict]:
    return [{"input_ids": list(range(3, 5 + 3 * i)), "sampling_params": {
        "max_new_tokens": [24, 3, 17, 1, 24, 9, 20, 12][i], "ignore_eos": True}} for i in range(8)]


@pytest.mark.parametrize("name", ["plain", "spec"])
@pytest.mark.parametrize("concurrency", [1, 8])
def test_generate_stream_equals_the_whole_answer(started, name, concurrency):
    httpd, url = started[name]
    reqs = _requests()
    whole = [call(url + "/generate", r)[1] for r in reqs]
    got: list = [None] * len(reqs)

    def send(i):
        got[i] = stream(url + "/generate", {**reqs[i], "stream": True})

    if concurrency == 1:
        for i in range(len(reqs)):
            send(i)
    else:
        threads = [threading.Thread(target=send, args=(i,)) for i in range(len(reqs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    for w, (kind, events) in zip(whole, got):
        assert kind.startswith("text/event-stream")
        last = events[-1]
        assert last["output_ids"] == w["output_ids"] and last["text"] == w["text"]
        assert {k: last["meta_info"].get(k) for k in SAME} == {k: w["meta_info"].get(k) for k in SAME}
        # cumulative, as SGLang sends them: each event extends the last; only the last has a finish_reason
        for a, b in zip(events, events[1:]):
            assert b["output_ids"][: len(a["output_ids"])] == a["output_ids"]
            assert b["meta_info"]["completion_tokens"] == len(b["output_ids"]) > len(a["output_ids"])
        assert all(e["meta_info"]["finish_reason"] is None for e in events[:-1])
        assert all("spec_verify_ct" not in e["meta_info"] for e in events[:-1])  # SGLang: on the last only
        assert len({e["meta_info"]["id"] for e in events}) == 1
        # tokens leave as steps accept them: at most one event per step (a reader that falls behind gets
        # several steps' tokens at once; the scheduler publishes after whole steps only)
        steps = w["meta_info"].get("spec_verify_ct", w["meta_info"]["completion_tokens"] - 1)
        assert len(events) <= steps + 1
    if concurrency == 8:
        assert httpd.state.scheduler.peak_rows >= 2


def test_streams_tokens_while_decoding_not_after(started):
    """The first event arrives long before the last: TTFT below the end-to-end latency."""
    _, url = started["plain"]
    start = time.perf_counter()
    stamps = []
    with http_client.request(url + "/generate", {"input_ids": [3, 4, 5], "stream": True,
                                                 "sampling_params": {"max_new_tokens": 200, "ignore_eos": True}},
                             120) as resp:
        for _ in resp.events():
            stamps.append(time.perf_counter() - start)
    assert len(stamps) > 20 and stamps[0] < 0.5 * stamps[-1]


def test_openai_streams_completions_and_chat(started):
    _, url = started["spec"]
    base = {"model": "my-name", "prompt": "The quick brown", "max_tokens": 9, "temperature": 0, "ignore_eos": True}
    whole = call(url + "/v1/completions", base)[1]
    assert whole["model"] == "my-name" and whole["choices"][0]["matched_stop"] is None
    _, chunks = stream(url + "/v1/completions", {**base, "stream": True, "stream_options": {"include_usage": True}})
    content, usage = chunks[:-1], chunks[-1]
    assert all(c["object"] == "text_completion" and c["model"] == "my-name" for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in content) == whole["choices"][0]["text"]
    assert [c["choices"][0]["finish_reason"] for c in content] == [None] * (len(content) - 1) + ["length"]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 9 == whole["usage"]["completion_tokens"]
    _, plain_chunks = stream(url + "/v1/completions", {**base, "stream": True})
    assert all(c["choices"] for c in plain_chunks)  # no usage chunk unless asked


@pytest.mark.slow  # the session's smoke demo pair (conftest smoke_demo)
def test_chat_stream_on_a_real_chat_template(smoke_demo):
    demo = smoke_demo["result"]
    state = load_state(demo["target_v1"], demo["drafter_v1"], num_steps=3)
    httpd = make_server(state, "127.0.0.1", 0)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        body = {"model": "m", "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 12,
                "temperature": 0, "ignore_eos": True}
        whole = call(url + "/v1/chat/completions", body)[1]
        _, chunks = stream(url + "/v1/chat/completions", {**body, "stream": True,
                                                          "stream_options": {"include_usage": True}})
        assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
        assert text == whole["choices"][0]["message"]["content"]
        assert chunks[-2]["choices"][0]["finish_reason"] == "length" and chunks[-2]["choices"][0]["delta"] == {
            "reasoning_content": None}
        assert chunks[-1]["usage"] == {**whole["usage"], "reasoning_tokens": 0}
        assert all(c["object"] == "chat.completion.chunk" and c["model"] == "m" for c in chunks)
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_engine_calls_back_once_per_accepting_step(folders):
    target, drafter = folders
    engine = Engine.from_folders(target, drafter, num_steps=3)
    seen: list[list[int]] = []
    res = engine.generate([3, 4, 5, 6], 30, ignore_eos=True, on_tokens=lambda r: seen.append(list(r.output_ids)))
    assert seen[-1] == res.output_ids and len(seen[0]) == 1
    assert len(seen) == res.spec_verify_ct + 1  # the prefill's token, then one call per verify
    assert all(b[: len(a)] == a and 1 <= len(b) - len(a) <= 4 for a, b in zip(seen, seen[1:]))
    assert engine.generate([3, 4, 5, 6], 30, ignore_eos=True).output_ids == res.output_ids


def test_a_reader_that_falls_behind_costs_no_queue(started):
    """The scheduler publishes counts, never events: a stalled reader finds every new token at once,
    and the memory held for it while it stalls does not grow with the response."""
    httpd, _ = started["plain"]
    state = httpd.state
    snaps = streaming.token_stream(state, [3, 4, 5], 240, True, [], lambda: False)
    res, n, finished = next(snaps)
    # the prefill's token, or a few more where the scheduler stepped before this reader woke up (a loaded host)
    assert 1 <= n < 240 and not finished
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        deadline = time.monotonic() + 120
        while res.completion_tokens < 240 and time.monotonic() < deadline:  # decoding goes on without the reader
            time.sleep(0.05)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    rest = list(snaps)
    assert len(rest) <= 2 and rest[-1][2] and rest[-1][1] == 240  # all 239 later tokens in one or two snapshots
    assert held < 64 * 1024, held  # the token ids themselves; no per-step event kept


ROUTES = {
    "/generate": {"text": "hi", "sampling_params": {"max_new_tokens": 2}},
    "/v1/completions": {"prompt": "hi", "max_tokens": 2},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
}
REFUSED = [
    ("/generate", {"return_logprob": True}, "return_logprob"),
    ("/generate", {"top_logprobs_num": 2}, "top_logprobs_num"),
    ("/generate", {"lora_path": "x"}, "lora_path"),
    ("/generate", {"made_up": 1}, "made_up"),
    ("/generate", {"text": ["a", "b"], "stream": True}, "stream with a batch"),
    ("/v1/completions", {"logprobs": 2}, "logprobs"),
    ("/v1/completions", {"logprobs": True}, "logprobs"),
    ("/v1/completions", {"echo": True}, "echo"),
    ("/v1/completions", {"best_of": 2}, "best_of"),
    ("/v1/completions", {"suffix": "end"}, "suffix"),
    ("/v1/completions", {"top_p": 0.5}, "top_p"),
    ("/v1/completions", {"stream_options": {"include_usage": True}}, "stream_options"),
    ("/v1/completions", {"stream": True, "stream_options": {"usage_every": 2}}, "stream_options.usage_every"),
    ("/v1/completions", {"stream": True, "stream_options": {"continuous_usage_stats": "yes"}}, "continuous_usage"),
    ("/v1/completions", {"min_tokens": -1}, "min_tokens"),
    ("/v1/chat/completions", {"return_spec_tokens_details": 1}, "return_spec_tokens_details"),
    ("/v1/completions", {"prompt": ["a", "b"], "stream": True}, "stream with a batch"),
    ("/v1/chat/completions", {"logprobs": True}, "logprobs"),
    ("/v1/chat/completions", {"top_logprobs": 3}, "top_logprobs"),
    ("/v1/chat/completions", {"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ("/v1/chat/completions", {"response_format": {"type": "json_object"}}, "response_format"),
    ("/v1/chat/completions", {"presence_penalty": 0.5}, "presence_penalty"),
    ("/v1/chat/completions", {"stream": "yes"}, "stream"),
]


@pytest.mark.parametrize("route, extra, needle", REFUSED)
def test_every_option_not_honoured_is_a_400_naming_it(started, route, extra, needle):
    status, body = call(started["spec"][1] + route, {**ROUTES[route], **extra})
    assert status == 400, body
    assert needle in body["error"]["message"]


def test_no_op_values_and_what_clients_send_by_default_are_taken(started):
    url = started["spec"][1]
    # SGLang's bench_serving sends these on /generate and /v1/completions
    assert call(url + "/generate", {**ROUTES["/generate"], "stream": False, "lora_path": None, "return_logprob": False,
                                    "return_routed_experts": False, "logprob_start_len": -1})[0] == 200
    assert call(url + "/v1/completions", {**ROUTES["/v1/completions"], "best_of": 1, "echo": False, "logprobs": None,
                                          "seed": 3, "user": "u"})[0] == 200


def test_model_routes_answer_as_sglang(started, folders):
    url = started["spec"][1]
    target = str(folders[0])
    status, info = call(url + "/model_info")
    assert status == 200 and info["model_path"] == target and info["is_generation"] is True
    status, card = call(url + "/v1/models/" + target.lstrip("/"))
    assert status == 404 and "does not exist" in card["error"]["message"]
    status, card = call(url + "/v1/models/" + target)
    assert status == 200 and card["id"] == target and card["max_model_len"] > 0
    assert call(url + "/ready")[0] == 200
    info = call(url + "/server_info")[1]
    assert info["max_running_requests"] == 8 and info["served_model_name"] == target


def test_a_shutdown_mid_stream_ends_it_with_an_error_event(folders):
    """After the first event the status line is gone: a failure is SGLang's error event, then [DONE]."""
    state = load_state(folders[0], None)
    httpd = make_server(state, "127.0.0.1", 0)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}/generate"
        events = []
        with http_client.request(url, {"input_ids": [3, 4, 5], "stream": True,
                                       "sampling_params": {"max_new_tokens": 240, "ignore_eos": True}}, 60) as resp:
            assert resp.status == 200
            for event in resp.events():
                events.append(event)
                state.stopping.set()  # SIGTERM's flag: every generation ends at its next step
        assert events[-1]["error"]["code"] == 503 and "shutting down" in events[-1]["error"]["message"]
        assert len(events[-2]["output_ids"]) < 240
    finally:
        httpd.shutdown()
        httpd.server_close()
