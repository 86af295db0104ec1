"""``/metrics``: the builtin server's counters in Prometheus text, under SGLang 0.5.23's metric names.

Why: load testers (aiperf scrapes ``/metrics`` by default and tabulates ``sglang:spec_accept_length``
and ``sglang:spec_accept_rate``), dashboards and draftlab's own bench read a server's figures the
way they read SGLang's (``observability/metrics_collector.py`` in the wheel): the same names, label
names and histogram buckets, from ``prometheus_client``. One registry per server, not the process'
global one, so two servers in one process (tests) never share a figure.

- scheduler gauges (labels ``model_name``, ``engine_type``, ``tp_rank``, ``pp_rank``,
  ``moe_ep_rank``): running and queued requests, generation throughput, and the speculative
  ``spec_accept_length`` / ``spec_accept_rate`` since the last ``/flush_cache`` (``/server_info``'s
  ``avg_spec_accept_length`` is the same figure), ``spec_num_steps``, ``spec_num_draft_tokens``;
- request counters and histograms (labels ``model_name``, ``engine_type``, plus ``is_streaming`` where
  SGLang has it): prompt and generation tokens, requests, verify calls, time to first token,
  inter-token latency, time per output token and end-to-end latency, measured on the server from a
  request's arrival at the scheduler to each step that published its tokens.
"""

from __future__ import annotations

from typing import Callable, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

CONTENT_TYPE = CONTENT_TYPE_LATEST

# SGLang's default buckets (TokenizerMetricsCollector)
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200, 1800, 2400)
ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080, 0.100,
               0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000)
TOKEN_BUCKETS = (100, 300, 500, 700, 1000, 1500, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 9000, 10000, 12500,
                 15000, 17500, 20000, 22500, 25000, 27500, 30000, 35000, 40000, 60000, 80000, 100000, 200000,
                 300000, 400000, 600000, 800000, 1000000, 1100000)
SCHEDULER_LABELS = ("model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank")
REQUEST_LABELS = ("model_name", "engine_type")


class ServerMetrics:
    """The server's Prometheus registry; ``observe`` counts one finished request, ``exposition`` renders."""

    def __init__(self, model_name: str, gauges: dict[str, Callable[[], float]]):
        """``gauges``: SGLang scheduler gauge name (without ``sglang:``) -> a function read at each scrape."""
        self.registry = CollectorRegistry(auto_describe=True)
        sched = {"model_name": model_name, "engine_type": "unified", "tp_rank": "0", "pp_rank": "0",
                 "moe_ep_rank": "0"}
        self.labels = {"model_name": model_name, "engine_type": "unified"}
        for name, read in gauges.items():
            gauge = Gauge(f"sglang:{name}", GAUGE_HELP[name], SCHEDULER_LABELS, registry=self.registry,
                          multiprocess_mode="mostrecent")
            gauge.labels(**sched).set_function(read)

        def counter(name: str, doc: str, streaming: bool = True) -> Counter:
            return Counter(f"sglang:{name}", doc, [*REQUEST_LABELS, *(("is_streaming",) if streaming else ())],
                           registry=self.registry)

        def histogram(name: str, doc: str, buckets: Sequence[float], streaming: bool = True) -> Histogram:
            return Histogram(f"sglang:{name}", doc, [*REQUEST_LABELS, *(("is_streaming",) if streaming else ())],
                             buckets=buckets, registry=self.registry)

        self.prompt_tokens = counter("prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter("generation_tokens", "Number of generation tokens processed.")
        self.requests = counter("num_requests", "Number of requests processed.")
        self.verify_calls = counter("spec_verify_calls", "Number of speculative decoding verification calls.",
                                    streaming=False)
        self.ttft = histogram("time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                              TTFT_BUCKETS)
        self.itl = histogram("inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
                             ITL_BUCKETS, streaming=False)
        self.tpot = histogram("request_time_per_output_token_seconds",
                              "Per-request TPOT in seconds: (finished_time - first_token_time) / "
                              "(completion_tokens - 1).", ITL_BUCKETS)
        self.e2e = histogram("e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds",
                             E2E_BUCKETS)
        self.prompt_hist = histogram("prompt_tokens_histogram", "Histogram of prompt token length.", TOKEN_BUCKETS,
                                     streaming=False)
        self.generation_hist = histogram("generation_tokens_histogram", "Histogram of generation token length.",
                                         TOKEN_BUCKETS, streaming=False)

    def observe(self, prompt_tokens: int, generation_tokens: int, verify_calls: int,
                marks: Sequence[tuple[float, int]], streaming: bool) -> None:
        """One finished request. ``marks``: (seconds since it reached the scheduler, tokens final then),
        one per step that published tokens; the first is its first token, the last its end."""
        both = {**self.labels, "is_streaming": "true" if streaming else "false"}
        self.prompt_tokens.labels(**both).inc(prompt_tokens)
        self.generation_tokens.labels(**both).inc(generation_tokens)
        self.requests.labels(**both).inc()
        if verify_calls:
            self.verify_calls.labels(**self.labels).inc(verify_calls)
        self.prompt_hist.labels(**self.labels).observe(prompt_tokens)
        self.generation_hist.labels(**self.labels).observe(generation_tokens)
        if not marks:
            return
        (t_first, n_first), (t_last, n_last) = marks[0], marks[-1]
        self.ttft.labels(**both).observe(t_first)
        self.e2e.labels(**both).observe(t_last)
        if n_last > 1:
            self.tpot.labels(**both).observe((t_last - t_first) / (n_last - 1))
        itl = self.itl.labels(**self.labels)
        for (t0, n0), (t1, n1) in zip(marks, marks[1:]):
            for _ in range(n1 - n0):  # SGLang: a step of n tokens is n intervals of (its time / n)
                itl.observe((t1 - t0) / (n1 - n0))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


GAUGE_HELP = {
    "num_running_reqs": "The number of running requests.",
    "num_queue_reqs": "The number of requests in the waiting queue.",
    "gen_throughput": "The generation throughput (token/s).",
    "spec_accept_length": "Mean acceptance length of speculative decoding (accepted drafts + bonus token per "
                          "forward).",
    "spec_accept_rate": "Speculative acceptance rate (`accepted drafts / proposed drafts` in batch).",
    "spec_num_steps": "Currently active speculative_num_steps.",
    "spec_num_draft_tokens": "Currently active speculative_num_draft_tokens (decouples from steps under topk>1).",
}
