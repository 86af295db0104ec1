"""SGLang 0.5.23's options and resets on the builtin server, over real HTTP on 127.0.0.1, as the wheel
shapes them (``entrypoints/openai/protocol.py``, ``serving_chat.py``, ``serving_completions.py``,
``observability/metrics_collector.py``): ``stream_options.continuous_usage_stats``, ``min_tokens``
(``min_new_tokens`` on ``/generate``), ``return_spec_tokens_details``, ``/flush_cache`` resetting the
speculative averages, ``/server_info``'s dtype, and ``/metrics`` in Prometheus text under SGLang's names.
"""

from __future__ import annotations

import contextlib
import json
import threading

import pytest
from httpcall import call
from prometheus_client.parser import text_string_to_metric_families
from test_server import folders  # noqa: F401 - the same tiny target and drafter (a fixture)
from test_streaming import stream

from draftlab.benchmark.bench import run_benchmark
from draftlab.serving.server import load_state, make_server

# SpecTokensDetails' fields, in the wheel's order
SPEC_DETAILS = ["spec_accept_rate", "spec_accept_length", "spec_cap_length", "spec_block_accept_length",
                "spec_num_correct_drafts", "spec_num_proposed_drafts", "spec_verify_ct",
                "spec_correct_drafts_histogram", "spec_cap_lens_histogram"]
PROMPT = [3, 4, 5, 6]


@contextlib.contextmanager
def serving(folders, speculative: bool):
    target, drafter = folders
    state = load_state(target, drafter if speculative else None, num_steps=3)
    httpd = make_server(state, "127.0.0.1", 0)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        yield state, f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture(scope="module")
def servers(folders):
    with serving(folders, True) as spec, serving(folders, False) as plain:
        yield {"spec": spec[1], "plain": plain[1]}


def _metrics(url: str) -> dict[str, list]:
    status, text = call(url + "/metrics")
    assert status == 200
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def _value(samples, name: str, **labels) -> float:
    return sum(s.value for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


# -- continuous_usage_stats -------------------------------------------------------------------------


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_continuous_usage_stats_puts_the_usage_so_far_on_every_content_chunk(servers, route):
    body = {"max_tokens": 10, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    body.update({"prompt": PROMPT} if route == "/v1/completions" else
                {"messages": [{"role": "user", "content": "the quick brown fox"}]})
    _, chunks = stream(servers["spec"] + route, body)
    *content, last = chunks
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 10
    key = "text" if route == "/v1/completions" else "delta"
    carrying = [c for c in content if c["choices"] and (key == "text" or c["choices"][0]["delta"].get("content"))]
    assert len(carrying) >= 3 and all(c["usage"] for c in carrying)
    done = [c["usage"]["completion_tokens"] for c in carrying]
    assert done == sorted(done) and done[-1] == 10 and done[0] >= 1
    assert all(c["usage"]["total_tokens"] == c["usage"]["prompt_tokens"] + c["usage"]["completion_tokens"]
               for c in carrying)
    # without it, as before: no usage on the content chunks
    body["stream_options"] = {"include_usage": True}
    _, plain = stream(servers["spec"] + route, body)
    assert all(not c.get("usage") for c in plain[:-1]) and plain[-1]["usage"]["completion_tokens"] == 10


# -- min_tokens ---------------------------------------------------------------------------------------


def _ids(url: str, route: str, extra: dict, streamed: bool = False) -> list[int]:
    if route == "/generate":
        sampling = {"max_new_tokens": 16, **extra}
        body = {"input_ids": PROMPT, "sampling_params": sampling}
        if streamed:
            return stream(url + route, {**body, "stream": True})[1][-1]["output_ids"]
        status, got = call(url + route, body)
        assert status == 200, got
        return got["output_ids"]
    extra = {("min_tokens" if k == "min_new_tokens" else k): v for k, v in extra.items()}
    status, got = call(url + route, {"prompt": PROMPT, "max_tokens": 16, **extra})
    assert status == 200, got
    return got["choices"][0]["token_ids"]


@pytest.mark.parametrize("name", ["spec", "plain"])
def test_min_tokens_holds_every_stop_id_back_until_that_many_tokens(servers, name):
    url = servers[name]
    free = _ids(url, "/generate", {"ignore_eos": True})
    stop = free[1]  # the answer's second token, made a stop id: the answer ends there
    first = free.index(stop)
    assert _ids(url, "/generate", {"ignore_eos": True, "stop_token_ids": [stop]}) == free[: first + 1]
    for route in ("/generate", "/v1/completions"):
        held = _ids(url, route, {"ignore_eos": True, "stop_token_ids": [stop], "min_new_tokens": 6})
        assert held[:first] == free[:first]  # the same greedy answer up to where the stop id was
        assert stop not in held[:6] and len(held) >= 6  # SGLang: no stop id is chosen before 6 tokens
        assert held[6:].count(stop) <= 1 and (stop not in held[6:] or held[-1] == stop)
    streamed = _ids(url, "/generate", {"ignore_eos": True, "stop_token_ids": [stop], "min_new_tokens": 6}, True)
    assert streamed == held
    # the speculative server's answer is the plain one's (greedy, stop ids held back in the verify too)
    other = servers["plain" if name == "spec" else "spec"]
    assert _ids(other, "/generate", {"ignore_eos": True, "stop_token_ids": [stop], "min_new_tokens": 6}) == held


def test_min_tokens_on_the_chat_route_and_its_bounds(servers):
    url = servers["spec"]
    chat = {"messages": [{"role": "user", "content": "the quick brown fox"}], "max_tokens": 12, "ignore_eos": True}
    status, free = call(url + "/v1/chat/completions", chat)
    assert status == 200 and free["usage"]["completion_tokens"] == 12
    status, got = call(url + "/v1/chat/completions", {**chat, "min_tokens": 12})
    assert status == 200 and got["usage"]["completion_tokens"] == 12
    for value in (-1, 1.5, True, "3"):
        status, err = call(url + "/v1/completions", {"prompt": PROMPT, "max_tokens": 4, "min_tokens": value})
        assert status == 400 and "min_tokens" in err["message"], value


# -- return_spec_tokens_details -----------------------------------------------------------------------


def test_spec_tokens_details_as_sglang_answers_them(servers):
    url = servers["spec"]
    status, gen = call(url + "/generate", {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 12,
                                                                                    "ignore_eos": True}})
    meta = gen["meta_info"]
    status, whole = call(url + "/v1/completions", {"prompt": PROMPT, "max_tokens": 12, "ignore_eos": True,
                                                   "return_spec_tokens_details": True})
    details = whole["sglext"]["spec_tokens_details"]
    assert list(details) == SPEC_DETAILS
    assert {k: details[k] for k in SPEC_DETAILS if k in meta} == {k: meta[k] for k in SPEC_DETAILS if k in meta}
    assert details["spec_cap_length"] == 0.0 and details["spec_cap_lens_histogram"] == []
    # streamed chat: a chunk of its own, choices [], after the finish chunk and before the usage chunk
    _, chunks = stream(url + "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "the quick brown fox"}], "max_tokens": 8, "ignore_eos": True,
        "stream": True, "stream_options": {"include_usage": True}, "return_spec_tokens_details": True})
    assert chunks[-3]["choices"][0]["finish_reason"] == "length"
    assert chunks[-2]["choices"] == [] and list(chunks[-2]["sglext"]["spec_tokens_details"]) == SPEC_DETAILS
    assert chunks[-1]["usage"]["completion_tokens"] == 8
    # not asked for, or no drafter: no sglext at all (SGLang leaves it out)
    assert "sglext" not in call(url + "/v1/completions", {"prompt": PROMPT, "max_tokens": 4})[1]
    status, plain = call(servers["plain"] + "/v1/completions", {"prompt": PROMPT, "max_tokens": 4,
                                                                "return_spec_tokens_details": True})
    assert status == 200 and "sglext" not in plain


# -- /server_info, /flush_cache, /metrics ----------------------------------------------------------------


def test_server_info_names_the_dtype(servers):
    assert call(servers["plain"] + "/server_info")[1]["dtype"] == "float32"


def test_flush_cache_starts_the_speculative_averages_again(folders):
    with serving(folders, True) as (state, url):
        for n in (16, 9):
            call(url + "/generate", {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": n, "ignore_eos": True}})
        before = call(url + "/server_info")[1]["internal_states"][0]
        assert before["avg_spec_accept_length"] >= 1.0
        status, text = call(url + "/flush_cache")
        assert status == 200 and text.startswith("Cache flushed.")
        assert "avg_spec_accept_length" not in call(url + "/server_info")[1]["internal_states"][0]
        gauges = _metrics(url)
        assert _value(gauges["sglang:spec_accept_length"], "sglang:spec_accept_length") == 0
        status, gen = call(url + "/generate", {"input_ids": [7, 8, 9], "sampling_params": {"max_new_tokens": 12,
                                                                                          "ignore_eos": True}})
        meta = gen["meta_info"]
        after = call(url + "/server_info")[1]["internal_states"][0]["avg_spec_accept_length"]
        # SGLang's server-wide rule, now over this one request: (accepted drafts + one bonus per verify) / verifies
        assert after == pytest.approx((meta["spec_num_correct_drafts"] + meta["spec_verify_ct"]) / meta["spec_verify_ct"])
        assert _value(_metrics(url)["sglang:spec_accept_length"], "sglang:spec_accept_length") == pytest.approx(after)

        # while a request runs, SGLang refuses to flush (400) and nothing changes
        decoder, gate = state.scheduler._decoder, threading.Event()
        step = decoder.step
        decoder.step = lambda: (gate.wait(60), step())[1]
        worker = threading.Thread(target=call, args=(url + "/generate", {"input_ids": PROMPT, "sampling_params": {
            "max_new_tokens": 6, "ignore_eos": True}}))
        worker.start()
        try:
            for _ in range(6000):  # until the request holds a row (a minute at most)
                if state.scheduler.counts() != (0, 0):
                    break
                worker.join(0.01)
            status, text = call(url + "/flush_cache")
        finally:
            gate.set()
            worker.join(60)
            decoder.step = step
        assert status == 400 and "pending requests" in text and "#running-req: 1" in text
        assert "avg_spec_accept_length" in call(url + "/server_info")[1]["internal_states"][0]


SCHEDULER_LABELS = {"model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"}


def test_metrics_count_what_was_served_under_sglangs_names(folders):
    with serving(folders, True) as (state, url):
        answers = []
        for n in (5, 12, 1):
            status, gen = call(url + "/generate", {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": n,
                                                                                            "ignore_eos": True}})
            answers.append(gen["meta_info"])
        _, chunks = stream(url + "/v1/completions", {"prompt": PROMPT, "max_tokens": 7, "ignore_eos": True,
                                                     "stream": True})
        families = _metrics(url)
        info = call(url + "/server_info")[1]
    model = state.model_path
    tokens = sum(m["completion_tokens"] for m in answers)
    gen = families["sglang:generation_tokens"]
    assert _value(gen, "sglang:generation_tokens_total", is_streaming="false") == tokens
    assert _value(gen, "sglang:generation_tokens_total", is_streaming="true") == 7
    assert _value(families["sglang:prompt_tokens"], "sglang:prompt_tokens_total") == len(PROMPT) * 4
    assert _value(families["sglang:num_requests"], "sglang:num_requests_total", model_name=model,
                  engine_type="unified") == 4
    verifies = _value(families["sglang:spec_verify_calls"], "sglang:spec_verify_calls_total")
    assert verifies >= sum(m.get("spec_verify_ct", 0) for m in answers) and verifies > 0
    # one time to first token and one end-to-end latency per request; a token interval per token after the first
    assert _value(families["sglang:time_to_first_token_seconds"], "sglang:time_to_first_token_seconds_count") == 4
    assert _value(families["sglang:e2e_request_latency_seconds"], "sglang:e2e_request_latency_seconds_count") == 4
    assert _value(families["sglang:inter_token_latency_seconds"],
                  "sglang:inter_token_latency_seconds_count") == tokens + 7 - 4
    assert _value(families["sglang:generation_tokens_histogram"],
                  "sglang:generation_tokens_histogram_count") == 4
    gauges = {name: families[name][0] for name in ("sglang:num_running_reqs", "sglang:num_queue_reqs",
                                                   "sglang:spec_accept_length", "sglang:spec_accept_rate",
                                                   "sglang:spec_num_steps", "sglang:spec_num_draft_tokens")}
    assert all(set(s.labels) == SCHEDULER_LABELS and s.labels["model_name"] == model for s in gauges.values())
    assert gauges["sglang:num_running_reqs"].value == 0 == gauges["sglang:num_queue_reqs"].value
    assert (gauges["sglang:spec_num_steps"].value, gauges["sglang:spec_num_draft_tokens"].value) == (3, 4)
    assert gauges["sglang:spec_accept_length"].value == pytest.approx(
        info["internal_states"][0]["avg_spec_accept_length"])
    assert 0 <= gauges["sglang:spec_accept_rate"].value <= 1
    assert set(families["sglang:time_to_first_token_seconds"][0].labels) == {"model_name", "engine_type",
                                                                             "is_streaming", "le"}


def test_bench_reads_the_servers_own_counters_as_it_reads_sglangs(folders, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": str(i), "conversations": [{"from": "human", "value": text}]}) + "\n"
                               for i, text in enumerate(["the quick brown fox", "def add(a, b):", "jumps over"])))
    with serving(folders, True) as (_, url):
        res = run_benchmark(url, prompts, max_new_tokens=9, repeats=2, warmup=1, concurrency=2, ignore_eos=True,
                            progress=False, measure_ttft=False)
        info = call(url + "/server_info")[1]["internal_states"][0]
    rows = [r for r in res.rows if r["phase"] == "measure"]
    delta = res.summary["sglang_metrics_delta"]  # the timed passes only: not the warm-up
    assert delta["requests"] == len(rows) == 6
    assert delta["generation_tokens"] == sum(r["completion_tokens"] for r in rows) == 54
    assert delta["verify_calls"] == sum(r["verify_ct"] for r in rows)
    assert delta["accept_length"] == pytest.approx((54 - 6) / delta["verify_calls"])
    assert info["avg_spec_accept_length"] >= 1.0


@pytest.mark.parametrize("speculative", [True, False], ids=["spec", "plain"])
def test_min_new_in_the_dynamic_cache_decoder_is_the_servers_answer(folders, servers, speculative):
    """The dynamic-cache decoder (a static path refused, or its CUDA graphs off) holds stop ids back as the
    server's default decoder does: the same ids."""
    from draftlab.engine.batch_decode import BatchDecoder
    from draftlab.engine.core import Engine

    target, drafter = folders
    engine = Engine.from_folders(target, drafter if speculative else None, num_steps=3)

    def run(min_new: int, stops: set[int]) -> list[int]:
        decoder = BatchDecoder(engine)
        row = decoder.add(PROMPT, 16, stops, min_new=min_new)
        while not row.done:
            decoder.step()
        return row.res.output_ids

    free = run(0, set())
    stop = free[1]
    held = run(6, {stop})
    assert stop not in held[:6] and held[:free.index(stop)] == free[:free.index(stop)]
    url = servers["spec" if speculative else "plain"]
    assert _ids(url, "/generate", {"ignore_eos": True, "stop_token_ids": [stop], "min_new_tokens": 6}) == held
