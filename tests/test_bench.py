"""The benchmark client against real HTTP servers on 127.0.0.1.

``ScriptedServer`` is a small stdlib server that speaks exactly the documented protocol fields of
SGLang (``/generate`` meta_info, SSE streaming, ``/get_server_info``) or vLLM (``/v1/completions``,
``/v1/models``, Prometheus ``/metrics``) with numbers the test chooses, so every summary value can be
checked against an independent computation.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

import pytest
from httpcall import send_json

from draftlab.benchmark.bench import CSV_COLUMNS, run_benchmark, write_results
from draftlab.benchmark.bench_client import ACCEPT_COUNT_KEYS, parse_vllm_spec_metrics
from draftlab.benchmark.bench_prompts import Prompt, default_prompts_path, load_prompts
from draftlab.benchmark.bench_summary import mean_ci95, t_quantile_975
from draftlab.cli import main
from draftlab.errors import DraftlabError

PROMPTS = [Prompt(f"p{i}", "chat" if i % 2 else "code", "word " * (3 + i)) for i in range(4)]


def completion_for(text: str, max_new: int) -> int:
    return min(max_new, 5 + len(text) % 7)


class ScriptedServer:
    """A real threaded HTTP server with scripted speculative counts per request."""

    def __init__(
        self,
        api: str = "sglang",
        *,
        verify: Callable[[int], int | None] = lambda c: math.ceil(c / 2.5),
        accept_keys: tuple[str, str] | None = ("spec_accept_token_num", "spec_draft_token_num"),
        delay: float = 0.0,
        first_token_delay: float | None = None,
        streaming: bool = True,
        extra_meta: Callable[[int, int], dict] | None = None,
        spec_metrics: bool = True,
        fail_status: int | None = None,
    ):
        self.api, self.verify, self.accept_keys = api, verify, accept_keys
        self.delay, self.first_token_delay, self.streaming = delay, first_token_delay, streaming
        self.extra_meta, self.spec_metrics, self.fail_status = extra_meta, spec_metrics, fail_status
        self.requests: list[dict] = []
        self.inflight = self.max_inflight = 0
        self.arrivals: list[int] = []  # requests in flight as each one arrived, itself included
        self.counters = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "pos": [0, 0, 0]}
        self.lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> "ScriptedServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    # -- protocol ---------------------------------------------------------------------------------
    def counts(self, text: str, max_new: int) -> dict[str, Any]:
        c = completion_for(text, max_new)
        v = self.verify(c)
        meta: dict[str, Any] = {"prompt_tokens": len(text.split()), "completion_tokens": c}
        if v is not None:
            meta["spec_verify_ct"] = v
            meta["spec_accept_length"] = 99.0  # bogus on purpose: the client must use raw counts
            if self.accept_keys and v:
                meta[self.accept_keys[0]] = c - v
                meta[self.accept_keys[1]] = 3 * v
        return meta

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):  # keep test output quiet
                pass

            def _json(self, obj: Any, status: int = 200) -> None:
                self._leave()
                send_json(self, status, obj)

            def _leave(self) -> None:
                """The request stops counting as in flight before its last byte is written: once the
                client has its answer it may send the next one, which must not see this one still in."""
                if getattr(self, "_counted", False):
                    self._counted = False
                    with server.lock:
                        server.inflight -= 1

            def do_GET(self):
                if server.api == "sglang" and self.path == "/get_server_info":
                    return self._json(
                        {
                            "model_path": "tiny-target",
                            "speculative_algorithm": "EAGLE3",
                            "speculative_num_steps": 3,
                            "internal_states": [{"avg_spec_accept_length": 2.4}],
                        }
                    )
                if server.api == "vllm" and self.path == "/v1/models":
                    return self._json({"object": "list", "data": [{"id": "tiny-vllm"}]})
                if server.api == "vllm" and self.path == "/metrics":
                    return self._metrics()
                self._json({"error": "not found"}, 404)

            def _metrics(self):
                lines = ["# HELP vllm:num_requests_running x", 'vllm:num_requests_running{engine="0"} 0.0']
                if server.spec_metrics:
                    c = server.counters
                    # split over two engines: the client must sum label sets
                    for eng, share in (("0", 0.5), ("1", 0.5)):
                        lab = f'engine="{eng}",model_name="tiny-vllm"'
                        lines += [
                            "# TYPE vllm:spec_decode_num_drafts counter",
                            f"vllm:spec_decode_num_drafts_total{{{lab}}} {c['drafts'] * share}",
                            f"vllm:spec_decode_num_draft_tokens_total{{{lab}}} {c['draft_tokens'] * share}",
                            f"vllm:spec_decode_num_accepted_tokens_total{{{lab}}} {c['accepted'] * share}",
                            f"vllm:spec_decode_num_drafts_created{{{lab}}} 1.7e9",
                        ]
                        for pos, val in enumerate(c["pos"]):
                            lines.append(
                                f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="{pos}"}} {val * share}'
                            )
                body = ("\n".join(lines) + "\n").encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):
                req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    server.requests.append({"path": self.path, **req})
                    server.inflight += 1
                    server.max_inflight = max(server.max_inflight, server.inflight)
                    server.arrivals.append(server.inflight)
                self._counted = True
                try:
                    if server.fail_status:
                        return self._json({"error": "boom"}, server.fail_status)
                    if server.api == "sglang" and self.path == "/generate":
                        return self._generate(req)
                    if server.api == "vllm" and self.path == "/v1/completions":
                        return self._completions(req)
                    self._json({"error": "not found"}, 404)
                finally:
                    self._leave()

            def _generate(self, req):
                start = time.perf_counter()
                max_new = req["sampling_params"]["max_new_tokens"]
                meta = server.counts(req["text"], max_new)
                if req.get("stream") and server.streaming:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.end_headers()
                    time.sleep(server.first_token_delay or 0.0)
                    first = {"text": "a", "meta_info": {"prompt_tokens": meta["prompt_tokens"], "completion_tokens": 1}}
                    self.wfile.write(f"data: {json.dumps(first)}\n\n".encode())
                    self.wfile.flush()
                    time.sleep(server.delay)
                    meta["e2e_latency"] = time.perf_counter() - start
                    self._leave()
                    self.wfile.write(f"data: {json.dumps({'text': 'abc', 'meta_info': meta})}\n\n".encode())
                    self.wfile.write(b"data: [DONE]\n\n")
                    return
                time.sleep(server.delay)
                meta["e2e_latency"] = time.perf_counter() - start
                if server.extra_meta:
                    meta.update(server.extra_meta(meta["completion_tokens"], meta.get("spec_verify_ct") or 0))
                self._json({"text": "abc", "meta_info": meta})

            def _completions(self, req):
                assert req["model"] == "tiny-vllm"
                time.sleep(server.delay)
                c = completion_for(req["prompt"], req["max_tokens"])
                v = server.verify(c)
                if server.spec_metrics and v:
                    with server.lock:
                        k = server.counters
                        k["drafts"] += v
                        k["draft_tokens"] += 3 * v
                        k["accepted"] += c - v
                        left = c - v
                        for pos in range(3):
                            take = min(left, v)
                            k["pos"][pos] += take
                            left -= take
                usage = {"prompt_tokens": len(req["prompt"].split()), "completion_tokens": c, "total_tokens": 0}
                if req.get("stream") and server.streaming:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.end_headers()
                    time.sleep(server.first_token_delay or 0.0)
                    chunk = {"choices": [{"index": 0, "text": "x"}]}
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self._leave()
                    self.wfile.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
                    self.wfile.write(b"data: [DONE]\n\n")
                    return
                self._json({"choices": [{"index": 0, "text": "xyz"}], "usage": usage})

        return Handler


def measured(result):
    return [r for r in result.rows if r["phase"] == "measure"]


# --- SGLang / builtin protocol ----------------------------------------------------------------------


def test_sglang_accept_length_and_cycle_from_raw_counts():
    with ScriptedServer(delay=0.01) as srv:
        res = run_benchmark(srv.url, PROMPTS, max_new_tokens=32, repeats=2, warmup=2, progress=False)
    rows = measured(res)
    assert len(rows) == 2 * len(PROMPTS)
    # warm-up requests are sent but not recorded; the TTFT pass sends one streaming request per prompt
    gen = [r for r in srv.requests if r["path"] == "/generate"]
    assert len(gen) == 2 + 2 * len(PROMPTS) + len(PROMPTS)
    assert sum(1 for r in gen if r.get("stream")) == len(PROMPTS)
    comp = [completion_for(p.text, 32) for p in PROMPTS] * 2
    ver = [math.ceil(c / 2.5) for c in comp]
    s = res.summary
    assert s["total_completion_tokens"] == sum(comp)
    assert s["total_verify_ct"] == sum(ver)
    assert s["accept_length"] == pytest.approx(sum(comp) / sum(ver))
    assert s["accept_length"] != pytest.approx(99.0)
    assert s["accept_rate"] == pytest.approx(sum(c - v for c, v in zip(comp, ver)) / sum(3 * v for v in ver))
    e2e = sum(r["server_latency_s"] for r in rows)
    assert s["cycle_ms"] == pytest.approx(1000 * e2e / sum(ver))
    assert s["cycle_time_source"] == "e2e_latency"
    assert s["cycle_ms_is_verify_cycle"] is False  # prefill and queueing are in e2e_latency
    assert s["speculation_active"] is True
    assert [r["prompt_id"] for r in rows] == [p.id for p in PROMPTS] * 2
    assert res.server["speculative_algorithm"] == "EAGLE3"
    assert res.server["avg_spec_accept_length"] == 2.4
    assert s["warnings"] == []


def test_accept_length_near_one_is_flagged():
    # speculation runs, but nothing is accepted: one token per verify cycle
    with ScriptedServer(verify=lambda c: c) as srv:
        res = run_benchmark(srv.url, PROMPTS, max_new_tokens=128, repeats=1, warmup=0, progress=False, measure_ttft=False,
                            require_speculation=True)
    assert res.summary["accept_length"] < 1.05
    assert "--speculative-algorithm EAGLE" in res.summary["warnings"][0]


@pytest.mark.parametrize("keys", ACCEPT_COUNT_KEYS)
def test_every_sglang_naming_of_draft_counts(keys):
    with ScriptedServer(accept_keys=keys) as srv:
        res = run_benchmark(srv.url, PROMPTS, max_new_tokens=128, repeats=1, warmup=0, progress=False, measure_ttft=False)
    rows = measured(res)
    assert all(r["accepted_drafts"] == r["completion_tokens"] - r["verify_ct"] for r in rows)
    assert all(r["proposed_drafts"] == 3 * r["verify_ct"] for r in rows)
    acc = sum(r["accepted_drafts"] for r in rows) / sum(r["proposed_drafts"] for r in rows)
    assert res.summary["accept_rate"] == pytest.approx(acc)


def test_draft_plus_verify_time_is_preferred_for_cycle_time():
    # draftlab's builtin server: 5 ms per cycle (its draftlab_ times), and acceptance per draft position from
    # SGLang's histogram (every verify accepted at least one draft, half of them two)
    extra = lambda c, v: {"draftlab_draft_time": 0.001 * v, "draftlab_verify_time": 0.004 * v,
                          "spec_correct_drafts_histogram": [0, v - v // 2, v // 2]}
    with ScriptedServer(extra_meta=extra, delay=0.05) as srv:  # longer than its 5 ms x verifies
        res = run_benchmark(srv.url, PROMPTS, max_new_tokens=128, repeats=1, warmup=0, progress=False, measure_ttft=False)
    assert res.summary["cycle_ms"] == pytest.approx(5.0)
    assert res.summary["cycle_time_source"] == "draft_time+verify_time"
    assert all(r["cycle_ms"] == pytest.approx(5.0) for r in measured(res))
    ver = [r["verify_ct"] for r in measured(res)]
    assert res.summary["accepted_per_position_rate"] == pytest.approx([1.0, sum(v // 2 for v in ver) / sum(ver)])


def test_sglang_first_token_latency_takes_prefill_out_of_the_cycle():
    # SGLang 0.5.23 with --enable-metrics: first_token_latency (arrival -> first token) beside e2e_latency
    extra = lambda c, v: {"e2e_latency": 0.05 + 0.006 * v, "first_token_latency": 0.05}
    with ScriptedServer(extra_meta=extra, delay=0.1) as srv:  # the request lasts longer than its e2e_latency
        res = run_benchmark(srv.url, PROMPTS, max_new_tokens=128, repeats=1, warmup=0, progress=False, measure_ttft=False)
    s = res.summary
    assert s["cycle_time_source"] == "e2e_latency-first_token_latency"
    assert s["cycle_ms"] == pytest.approx(6.0) and s["cycle_ms_is_verify_cycle"] is True


def test_baseline_without_speculation_has_no_accept_length():
    with ScriptedServer(verify=lambda c: None) as srv:
        res = run_benchmark(srv.url, PROMPTS, max_new_tokens=128, repeats=2, warmup=0, progress=False, measure_ttft=False)
    s = res.summary
    assert s["speculation_active"] is False
    assert s["accept_length"] is None and s["cycle_ms"] is None and s["total_verify_ct"] is None
    assert s["ms_per_output_token"] == pytest.approx(
        1000 * sum(r["server_latency_s"] for r in measured(res)) / s["total_completion_tokens"]
    )
    assert s["output_tps_median"] > 0


# --- speculation-active guard ----------------------------------------------------------------------


@pytest.mark.parametrize("verify", [lambda c: None, lambda c: 0], ids=["missing", "zero"])
def test_guard_refuses_and_writes_nothing(tmp_path, capsys, verify):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"id": p.id, "text": p.text}) + "\n" for p in PROMPTS))
    out = tmp_path / "res" / "bench.json"
    with ScriptedServer(verify=verify) as srv:
        code = main(
            ["bench", "--url", srv.url, "--prompts", str(prompts), "--warmup", "0", "--repeats", "2",
             "--require-speculation", "--out", str(out), "--no-progress"]
        )
    err = capsys.readouterr().err
    assert code == 2
    assert "speculation is not active" in err and f"for {len(PROMPTS)} requests" in err
    assert "--speculative-algorithm EAGLE3" in err
    assert not out.exists() and not out.with_suffix(".csv").exists()
    # it stopped after the first pass instead of finishing the run
    assert len(srv.requests) == len(PROMPTS)


def test_guard_fails_right_after_warmup():
    with ScriptedServer(verify=lambda c: None) as srv:
        with pytest.raises(DraftlabError, match=r"for 1 requests \(warm-up\)"):
            run_benchmark(srv.url, PROMPTS, max_new_tokens=128, warmup=1, require_speculation=True, progress=False)
    assert len(srv.requests) == 1


def test_guard_passes_with_speculation_and_ignores_single_token_requests():
    verify = lambda c: 0 if c <= 1 else math.ceil(c / 3)
    one_token = [Prompt("tiny", "short", "x")]
    with ScriptedServer(verify=verify) as srv:
        res = run_benchmark(
            srv.url, PROMPTS + one_token, max_new_tokens=1 + 0, repeats=1, warmup=0,
            require_speculation=False, progress=False, measure_ttft=False,
        )
        assert res.summary["accept_length"] is None  # every request stopped after one token
        with pytest.raises(DraftlabError, match="speculation is not active"):
            run_benchmark(srv.url, one_token, max_new_tokens=1, repeats=1, warmup=0,
                          require_speculation=True, progress=False)
        res = run_benchmark(srv.url, PROMPTS, max_new_tokens=16, repeats=1, warmup=0,
                            require_speculation=True, progress=False, measure_ttft=False)
    assert res.summary["speculation_active"]


# --- time to first token, concurrency, statistics ---------------------------------------------------


def test_ttft_from_streaming_and_null_without_it():
    with ScriptedServer(delay=0.15, first_token_delay=0.05) as srv:
        res = run_benchmark(srv.url, PROMPTS[:2], max_new_tokens=128, repeats=1, warmup=0, progress=False)
    ttft = [r for r in res.rows if r["phase"] == "ttft"]
    assert len(ttft) == 2 and res.summary["ttft_requests"] == 2
    for r in ttft:
        # the server sleeps 0.15 s between the first chunk and the last: TTFT is read at the first,
        # so it ends at least that long before the request does, however slow the host is
        assert r["ttft_s"] >= 0.05 and r["latency_s"] - r["ttft_s"] >= 0.1
        assert r["latency_s"] >= 0.2
        assert r["verify_ct"] > 0  # the final SSE event carries meta_info
    assert 0.05 <= res.summary["ttft_s_median"] <= min(r["latency_s"] for r in ttft) - 0.1
    assert all(r["ttft_s"] is None for r in measured(res))

    with ScriptedServer(streaming=False) as srv:  # answers with plain JSON even when asked to stream
        res = run_benchmark(srv.url, PROMPTS[:2], max_new_tokens=128, repeats=1, warmup=0, progress=False)
    assert res.summary["ttft_s_median"] is None and res.summary["ttft_requests"] == 0


def test_ttft_limit_streams_a_stratified_sample_and_times_every_prompt():
    """``ttft_limit`` (bench.clients[].ttft_limit, ``draftlab bench --ttft-limit``) thins the streamed pass only:
    every prompt is still timed (the decision's rows), the streamed ones are the stratified sample ``limit``
    would draw (every category in it), and the summary counts what was streamed."""
    from draftlab.benchmark.bench_prompts import stratified_sample

    prompts = [Prompt(f"q{i}", ("chat", "code", "math")[i % 3], f"prompt {i} " * 3) for i in range(12)]
    with ScriptedServer() as srv:
        res = run_benchmark(srv.url, prompts, max_new_tokens=8, repeats=1, warmup=0, progress=False, ttft_limit=3)
    streamed = [r["prompt_id"] for r in res.rows if r["phase"] == "ttft"]
    assert streamed == [p.id for p in stratified_sample(prompts, 3)]
    assert {pid[1:] and prompts[int(pid[1:])].category for pid in streamed} == {"chat", "code", "math"}
    assert len(measured(res)) == 12 and res.summary["ttft_requests"] == 3 and res.config["ttft_limit"] == 3
    assert len(srv.arrivals) == 15  # 12 timed + 3 streamed, nothing else sent
    with pytest.raises(DraftlabError, match=r"^--ttft-limit: expected an integer >= 1, got 0$"):
        run_benchmark("http://127.0.0.1:9", prompts, max_new_tokens=8, ttft_limit=0, progress=False)

def test_concurrency_keeps_that_many_requests_in_flight():
    prompts = [Prompt(f"c{i}", "chat", f"prompt {i}") for i in range(8)]
    with ScriptedServer(delay=0.15) as srv:
        res = run_benchmark(srv.url, prompts, max_new_tokens=128, repeats=1, warmup=0, concurrency=4, progress=False, measure_ttft=False)
    assert srv.max_inflight == 4 and len(srv.arrivals) == 8 and res.summary["requests"] == 8
    # counted, not timed: the first four overlap, and so do the last four (never one by one)
    assert srv.arrivals[:4] == [1, 2, 3, 4] and max(srv.arrivals[4:]) >= 2, srv.arrivals
    with ScriptedServer(delay=0.02) as srv:
        run_benchmark(srv.url, prompts, max_new_tokens=128, repeats=1, warmup=0, concurrency=1, progress=False, measure_ttft=False)
    assert srv.max_inflight == 1


def test_t_interval_numbers():
    lo, hi = mean_ci95([10.0, 12.0, 14.0])
    half = 4.303 * 2.0 / math.sqrt(3)
    assert (lo, hi) == pytest.approx((12 - half, 12 + half))
    assert mean_ci95([5.0]) is None
    assert mean_ci95([5.0, 9.0]) is None  # no interval from two points (t = 12.7)
    assert t_quantile_975(30) == 2.042
    assert t_quantile_975(31) == pytest.approx(2.040, abs=2e-3)
    assert t_quantile_975(120) == pytest.approx(1.980, abs=1e-3)


def test_throughput_per_repeat_and_ci_are_consistent():
    with ScriptedServer(delay=0.01) as srv:
        res = run_benchmark(srv.url, PROMPTS, max_new_tokens=128, repeats=3, warmup=0, progress=False, measure_ttft=False)
    s = res.summary
    for rep, wall in enumerate(s["repeat_wall_s"]):
        tokens = sum(r["completion_tokens"] for r in measured(res) if r["repeat"] == rep)
        assert s["output_tps_per_repeat"][rep] == pytest.approx(tokens / wall)
    lo, hi = s["output_tps_ci95"]
    assert lo <= s["output_tps_mean"] <= hi
    assert s["output_tps_median"] == sorted(s["output_tps_per_repeat"])[1]


# --- vLLM protocol ----------------------------------------------------------------------------------


def test_vllm_accept_length_from_metrics_deltas():
    with ScriptedServer(api="vllm", verify=lambda c: math.ceil(c / 3), delay=0.005) as srv:
        res = run_benchmark(srv.url, PROMPTS, max_new_tokens=128, api="vllm", repeats=2, warmup=3, progress=False)
    comp = [completion_for(p.text, 128) for p in PROMPTS] * 2
    drafts = [math.ceil(c / 3) for c in comp]
    s = res.summary
    assert res.config["model"] == "tiny-vllm"  # taken from /v1/models
    assert s["total_verify_ct"] == sum(drafts)  # warm-up and TTFT requests excluded from the delta
    assert s["accept_length"] == pytest.approx(1 + sum(c - d for c, d in zip(comp, drafts)) / sum(drafts))
    assert s["accept_rate"] == pytest.approx(sum(c - d for c, d in zip(comp, drafts)) / (3 * sum(drafts)))
    assert sum(s["vllm_metrics_delta"]["accepted_per_pos"]) == s["vllm_metrics_delta"]["accepted_tokens"]
    assert s["accepted_per_position_rate"][0] >= s["accepted_per_position_rate"][1]
    assert s["cycle_ms"] == pytest.approx(1000 * sum(r["latency_s"] for r in measured(res)) / sum(drafts))
    assert s["ttft_requests"] == len(PROMPTS)


def test_vllm_guard_when_counters_do_not_move():
    with ScriptedServer(api="vllm", spec_metrics=False) as srv:
        with pytest.raises(DraftlabError, match=r"vllm:spec_decode_num_drafts_total missing or unchanged\) for 4 requests"):
            run_benchmark(srv.url, PROMPTS, max_new_tokens=128, api="vllm", repeats=1, warmup=0, require_speculation=True, progress=False)
        res = run_benchmark(srv.url, PROMPTS, max_new_tokens=128, api="vllm", repeats=1, warmup=0, progress=False, measure_ttft=False)
    assert res.summary["accept_length"] is None


def test_prometheus_parsing_accepts_both_counter_spellings():
    text = (
        "vllm:spec_decode_num_drafts 4\n"
        'vllm:spec_decode_num_draft_tokens_total{engine="0"} 12\n'
        'vllm:spec_decode_num_accepted_tokens_total{engine="0"} 7 1700000000\n'
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="1"} 3\n'
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="0"} 4\n'
    )
    m = parse_vllm_spec_metrics(text)
    assert m == {"drafts": 4, "draft_tokens": 12, "accepted_tokens": 7, "accepted_per_pos": [4, 3]}


# --- files, prompts, errors -------------------------------------------------------------------------


def test_cli_writes_json_and_csv(tmp_path, capsys):
    out, csv_path = tmp_path / "b.json", tmp_path / "rows.csv"
    with ScriptedServer() as srv:
        code = main(
            ["bench", "--url", srv.url + "/", "--prompts", "default", "--limit", "5", "--repeats", "2",
             "--warmup", "1", "--max-new-tokens", "16", "--concurrency", "2", "--out", str(out),
             "--csv", str(csv_path), "--no-progress", "--require-speculation"]
        )
    assert code == 0, capsys.readouterr().err
    data = json.loads(out.read_text())
    assert set(data) >= {"summary", "rows", "config", "prompt_set"}
    assert data["config"] == data["config"] | {
        "url": srv.url, "api": "sglang", "max_new_tokens": 16, "repeats": 2, "warmup": 1, "concurrency": 2,
    }
    path = default_prompts_path()
    assert data["prompt_set"] == {
        "path": str(path), "sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "count": 5, "available": 49,
        "sample": "stratified, seed 0", "categories": {"chat": 1, "code": 1, "math": 1, "short": 1, "long": 1},
    }
    assert data["config"]["limit"] == 5 and data["config"]["sample_seed"] == 0
    with open(csv_path, newline="") as fh:
        table = list(csv.DictReader(fh))
    assert tuple(table[0].keys()) == CSV_COLUMNS
    assert len(table) == len(data["rows"]) == 2 * 5 + 5
    assert [int(r["completion_tokens"]) for r in table] == [r["completion_tokens"] for r in data["rows"]]
    assert all(r["verify_ct"] for r in table)
    assert "accept length" in capsys.readouterr().out


def test_write_results_defaults_csv_next_to_json(tmp_path):
    with ScriptedServer() as srv:
        res = run_benchmark(srv.url, PROMPTS, max_new_tokens=128, repeats=1, warmup=0, progress=False, measure_ttft=False)
    write_results(res, tmp_path / "a.json", tmp_path / "a.csv")
    assert json.loads((tmp_path / "a.json").read_text())["summary"]["requests"] == len(PROMPTS)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp files left


def test_default_prompt_set_is_varied():
    prompts = load_prompts("default")
    assert len(prompts) >= 30
    assert len({p.id for p in prompts}) == len(prompts)
    cats = {p.category for p in prompts}
    assert {"chat", "code", "math", "long", "short"} <= cats
    lengths = sorted(len(p.text) for p in prompts)
    assert lengths[0] < 60 and lengths[-1] > 800


def test_bad_prompt_file_names_file_line_and_key(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"id": "a", "text": "hi"}\n{"id": "b"}\n')
    with pytest.raises(DraftlabError, match=r"p.jsonl:2: expected a key 'text' or 'prompt'"):
        load_prompts(f)
    f.write_text('{"id": "a", "text": "hi"}\nnot json\n')
    with pytest.raises(DraftlabError, match=r"p.jsonl:2: not valid JSON"):
        load_prompts(f)
    f.write_text('{"id": "a", "text": "hi"}\n{"id": "a", "text": "again"}\n')
    with pytest.raises(DraftlabError, match="duplicate prompt id 'a'"):
        load_prompts(f)
    with pytest.raises(DraftlabError, match="prompt file not found"):
        load_prompts(tmp_path / "missing.jsonl")


def test_unreachable_and_failing_servers_are_user_errors():
    with ScriptedServer() as srv:
        dead = srv.url
    with pytest.raises(DraftlabError, match="cannot reach the server"):
        run_benchmark(dead, PROMPTS, max_new_tokens=128, progress=False, request_timeout_s=5)
    with ScriptedServer(fail_status=503) as srv:
        with pytest.raises(DraftlabError, match="HTTP 503"):
            run_benchmark(srv.url, PROMPTS, max_new_tokens=128, progress=False)
    with ScriptedServer(api="vllm") as srv:  # wrong protocol for this server
        with pytest.raises(DraftlabError, match="/generate: HTTP 404"):
            run_benchmark(srv.url, PROMPTS, max_new_tokens=128, api="sglang", progress=False)


# --- draftlab's builtin server: real transformers target, real EAGLE-3 drafter ------------------------


@pytest.fixture(scope="module")
def builtin_servers(tmp_path_factory):
    """The builtin server twice on 127.0.0.1: target + drafter (K=3), and the target alone."""
    server_mod = pytest.importorskip("draftlab.serving.server", reason="builtin server not in this tree yet")
    from factories import tiny_drafter_config, write_drafter
    from tiny_models import tiny_target

    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models on a shared 2-core machine: more threads only contend
    root = tmp_path_factory.mktemp("builtin")
    target = tiny_target(root / "target")
    cfg = json.loads((target / "config.json").read_text())
    drafter = write_drafter(root / "drafter", tiny_drafter_config(target=cfg))
    servers = {}
    for name, d in (("spec", drafter), ("plain", None)):
        state = server_mod.load_state(target, d, num_steps=3)
        httpd = server_mod.make_server(state, "127.0.0.1", 0)
        threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers[name] = (f"http://127.0.0.1:{httpd.server_address[1]}", httpd)
    yield {k: v[0] for k, v in servers.items()}
    for _, httpd in servers.values():
        httpd.shutdown()
        httpd.server_close()
    torch.set_num_threads(threads)


def test_builtin_server_speculative_run(builtin_servers, tmp_path):
    out = tmp_path / "spec.json"
    code = main(["bench", "--url", builtin_servers["spec"], "--prompts", "default", "--limit", "3",
                 "--repeats", "2", "--warmup", "1", "--max-new-tokens", "10", "--require-speculation",
                 "--out", str(out), "--no-progress"])
    assert code == 0
    data = json.loads(out.read_text())
    rows = [r for r in data["rows"] if r["phase"] == "measure"]
    s = data["summary"]
    assert all(r["verify_ct"] >= 1 and 1 <= r["completion_tokens"] <= 10 for r in rows)
    assert s["accept_length"] == pytest.approx(
        sum(r["completion_tokens"] for r in rows) / sum(r["verify_ct"] for r in rows)
    )
    assert 1.0 <= s["accept_length"] <= 4.0  # K = 3: at most 3 drafts + the bonus token per cycle
    assert s["cycle_time_source"] == "draft_time+verify_time"
    assert s["cycle_ms"] == pytest.approx(
        1000 * sum(r["decode_time_s"] for r in rows) / sum(r["verify_ct"] for r in rows)
    )
    assert len(s["accepted_per_position_rate"]) == 3
    assert data["server"]["speculative_algorithm"] == "EAGLE3"
    assert data["server"]["speculative_num_steps"] == 3
    # issue 40: the builtin server streams, so the TTFT pass measures TTFT and inter-token latency
    ttft = [r for r in data["rows"] if r["phase"] == "ttft"]
    assert len(ttft) == 3 and all(0 < r["ttft_s"] < r["latency_s"] for r in ttft)
    # one latency per token after the first event (bench_serving's count: an event may bring several)
    assert 0 < sum(len(r["itl_s"]) for r in ttft) == s["itl_count"] <= sum(r["completion_tokens"] - 1 for r in ttft)
    assert 0 < s["ttft_s_p50"] <= s["ttft_s_p90"] <= s["ttft_s_p99"]
    assert 0 < s["itl_s_p50"] <= s["itl_s_p90"] <= s["itl_s_p99"]


def test_builtin_server_without_drafter_trips_the_guard(builtin_servers, tmp_path, capsys):
    out = tmp_path / "plain.json"
    args = ["bench", "--url", builtin_servers["plain"], "--prompts", "default", "--limit", "3",
            "--repeats", "1", "--warmup", "0", "--max-new-tokens", "8", "--no-ttft", "--out", str(out),
            "--no-progress"]
    assert main(args + ["--require-speculation"]) == 2
    assert "speculation is not active" in capsys.readouterr().err
    assert not out.exists()
    assert main(args) == 0  # the same run is a valid baseline without the guard
    s = json.loads(out.read_text())["summary"]
    assert s["accept_length"] is None and s["output_tps_median"] > 0 and s["ms_per_output_token"] > 0
