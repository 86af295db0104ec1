"""Benchmark client: send a prompt set to a running server, measure speed and accept length.

One client for every server draftlab launches: the builtin server and SGLang through
``POST /generate`` (per-request ``meta_info`` counts), vLLM through ``POST /v1/completions`` plus the
deltas of its Prometheus ``/metrics`` speculative counters. Only the standard library is used for
HTTP (``draftlab.http_client``: one deadline per request, capped reads, shape-checked JSON)
and concurrency (a thread pool), so importing this module is cheap.

Counting follows SGLang: accept length = sum(completion_tokens) / sum(spec_verify_ct), bonus token
included; vLLM: 1 + accepted / drafts. Ratios are always computed from raw counts, never averaged
from per-request ratios. docs/benchmark.md defines every summary field.
"""

from __future__ import annotations

import collections
import csv
import hashlib
import json
import math
import re
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from draftlab.benchmark.bench_checks import Plausibility, check_same_server
from draftlab.benchmark.bench_client import _Client, _metrics_delta, _sglang_delta, _sglang_metrics, _vllm_metrics
from draftlab.benchmark.bench_prompts import (Prompt, default_prompts_path, file_sha256,  # noqa: F401 - the bench API
                                              load_prompt_files, load_prompts, resolve_prompts_path,
                                              stratified_sample)
from draftlab.benchmark.bench_summary import (PERCENTILES, VERIFY_CYCLE_SOURCES, _is_unverified,  # noqa: F401 - the bench API
                                              is_verify_cycle, summarize)
from draftlab.csvcells import cell
from draftlab.errors import DraftlabError
from draftlab.fsutil import atomic_path, write_json
from draftlab.http_client import HTTPStatusError
from draftlab.serving.server_info import server_info, served_model  # noqa: F401 - also this module's API

APIS = ("sglang", "vllm")

CSV_COLUMNS = (
    "phase",
    "repeat",
    "prompt_id",
    "category",
    "prompt_tokens",
    "completion_tokens",
    "latency_s",
    "server_latency_s",
    "verify_ct",
    "accepted_drafts",
    "proposed_drafts",
    "decode_time_s",
    "decode_time_source",
    "cycle_ms",
    "ttft_s",
)

GUARD_HINT = (
    "refusing to record this as a drafter result — check --speculative-algorithm EAGLE3 and the "
    "drafter path"
)


# --- results --------------------------------------------------------------------------------------


@dataclass
class BenchResult:
    """What one benchmark run measured: per-request rows, the summary, and how it was run."""

    summary: dict[str, Any]
    rows: list[dict[str, Any]]
    config: dict[str, Any]
    prompt_set: dict[str, Any]
    server: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "summary": self.summary,
            "rows": self.rows,
            "config": self.config,
            "prompt_set": self.prompt_set,
            "server": self.server,
        }


def write_results(result: BenchResult, out_json: str | Path, out_csv: str | Path | None = None) -> None:
    """Write the result as JSON (everything) and CSV (one line per request, formula-looking text quoted:
    :mod:`draftlab.csvcells`), each atomically."""
    write_json(out_json, result.to_dict())
    if out_csv is not None:
        with atomic_path(out_csv) as tmp:
            with open(tmp, "w", newline="", encoding="utf-8") as fh:
                writer = csv.DictWriter(fh, fieldnames=CSV_COLUMNS, extrasaction="ignore")
                writer.writeheader()
                for row in result.rows:
                    writer.writerow({k: ("" if row.get(k) is None else cell(row.get(k))) for k in CSV_COLUMNS})


def _guard_sglang(rows: list[dict], where: str, need_evidence: bool = True) -> None:
    missing = [r for r in rows if _is_unverified(r)]
    no_evidence = need_evidence and not any((r["completion_tokens"] or 0) > 1 for r in rows)
    if missing or no_evidence:
        n = len(missing) or len(rows)
        raise DraftlabError(
            f"speculation is not active: the server reported no speculative verification "
            f"(spec_verify_ct missing or 0) for {n} requests ({where}); {GUARD_HINT}"
        )


def _guard_vllm(delta: dict | None, n: int) -> None:
    if delta is None or delta["drafts"] <= 0:
        raise DraftlabError(
            f"speculation is not active: the server reported no speculative verification "
            f"(vllm:spec_decode_num_drafts_total missing or unchanged) for {n} requests; {GUARD_HINT}"
        )


def run_benchmark(
    url: str,
    prompts: str | Path | Sequence[Prompt] | Sequence[str | Path],
    *,
    api: str = "sglang",
    max_new_tokens: int = 64,  # the model's bench.clients default (a test keeps them equal)
    repeats: int = 3,
    warmup: int = 1,
    concurrency: int = 1,
    require_speculation: bool = False,
    model: str | None = None,
    progress: bool = True,
    measure_ttft: bool = True,
    ignore_eos: bool = False,
    limit: int | None = None,
    ttft_limit: int | None = None,
    request_timeout_s: float = 600.0,
    on_row: Callable[[dict[str, Any]], None] | None = None,
    num_steps: int | None = None,
    num_draft_tokens: int | None = None,
    category: str | None = None,
    sample_seed: int = 0,
    expect_server: dict[str, Any] | None = None,
) -> BenchResult:
    """Benchmark the server at ``url`` with a prompt set and return rows plus a summary.

    Phases: ``warmup`` unrecorded requests (prompts taken in order, cycling); ``repeats`` passes over
    all prompts with ``concurrency`` requests in flight, each pass timed end to end for output tok/s;
    then, with ``measure_ttft``, one streaming request per prompt (``ttft_limit``: per prompt of a stratified
    sample of that many, drawn as ``limit`` draws), sequentially, for time to first token and inter-token
    latency (null when the server does not stream). With ``require_speculation`` a run whose server
    shows no speculative verification raises :class:`DraftlabError` (checked after the warm-up and
    after every pass, so a silent fallback fails early) and nothing is returned to be written.
    ``num_steps``/``num_draft_tokens``: the speculative settings the server was launched with (the
    plan's), bounding what its answers can say where the server does not report them itself.
    ``limit`` takes a stratified sample (:func:`stratified_sample`, seeded with ``sample_seed``), not the
    first N; ``max_new_tokens`` has no default here: the caller says it (the experiment's client setting,
    or ``draftlab bench --max-new-tokens``). ``category`` labels the prompts of a file that has no ``category`` field (the workflow
    passes the client's name). ``expect_server``: the ``/server_info`` values the launch asked for
    (model, drafter, speculative setting); the server must name them before and after the run.
    """
    config = dict(url=url, api=api, model=model, max_new_tokens=max_new_tokens, repeats=repeats, warmup=warmup,
                  concurrency=concurrency, require_speculation=require_speculation, ignore_eos=ignore_eos, temperature=0.0,
                  measure_ttft=measure_ttft, limit=limit, ttft_limit=ttft_limit, category=category, sample_seed=sample_seed)
    config["url"] = _checked_args(config, num_steps, num_draft_tokens, request_timeout_s)
    prompt_list, prompt_set = _prompt_set(prompts, category, limit, sample_seed)
    client, settings = _connect(config, request_timeout_s, num_steps, num_draft_tokens)
    config["model"] = client.model
    rows, walls, delta = _measure(client, prompt_list, prompt_set["path"], config, progress, on_row)
    return _result(client, rows, walls, delta, config, prompt_set, settings, expect_server)


def _checked_args(config: dict[str, Any], num_steps: int | None, num_draft_tokens: int | None,
                  request_timeout_s: float) -> str:
    """Refuse a bad argument in one line naming its flag; returns the URL without a trailing slash."""
    api, limit = config["api"], config["limit"]
    if api not in APIS:
        raise DraftlabError(f"--api: expected one of {', '.join(APIS)}, got {api!r}")
    for name, value, low in (
        ("--max-new-tokens", config["max_new_tokens"], 1),
        ("--repeats", config["repeats"], 1),
        ("--warmup", config["warmup"], 0),
        ("--concurrency", config["concurrency"], 1),
        ("--sample-seed", config["sample_seed"], 0),
    ):
        if isinstance(value, bool) or int(value) != value or value < low:
            raise DraftlabError(f"{name}: expected an integer >= {low}, got {value!r}")
    for name, value, low in (("--num-steps", num_steps, 1), ("num_draft_tokens", num_draft_tokens, 1),
                             ("--limit", limit, 1), ("--ttft-limit", config["ttft_limit"], 1)):  # None: not set
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
            raise DraftlabError(f"{name}: expected an integer >= {low}, got {value!r}")
    if not (isinstance(request_timeout_s, (int, float)) and math.isfinite(request_timeout_s) and request_timeout_s > 0):
        raise DraftlabError(f"--timeout: expected a number of seconds > 0, got {request_timeout_s!r}")
    url = config["url"].rstrip("/")
    if not re.match(r"^https?://", url):
        raise DraftlabError(f"--url: expected http://HOST:PORT, got {url!r}")
    return url


def _connect(config: dict[str, Any], timeout: float, num_steps: int | None,
             num_draft_tokens: int | None) -> tuple[_Client, dict[str, Any]]:
    """The client for the server, and the speculative settings the server says it runs before any request.

    Those settings bound what its answers can say (bench_checks) and are compared with what it says after
    the run. vLLM is asked which model it serves when the caller does not name one.
    """
    url, api, model = config["url"], config["api"], config["model"]
    if api == "vllm" and model is None:
        model = served_model(url, timeout)
    settings = server_info(url, min(timeout, 30.0)) if api == "sglang" else {}
    checks = Plausibility.from_server_info(config["max_new_tokens"], settings, num_steps, num_draft_tokens)
    client = _Client(url, api, config["max_new_tokens"], config["ignore_eos"], timeout, model, checks)
    return client, settings


def _measure(client: _Client, prompt_list: list[Prompt], source: str | None, config: dict[str, Any], progress: bool,
             on_row: Callable[[dict[str, Any]], None] | None) -> tuple[list[dict[str, Any]], list[float], dict | None]:
    """Send the requests of every phase: the warm-up, the timed passes, then the TTFT requests.

    The speculation guard runs between phases so that a silent fallback fails early. Returns the sorted
    rows, each pass's wall time and the growth of the server's counters over the passes: vLLM's
    speculative ones, or SGLang's request counters where it exports ``/metrics``.
    """
    url, api, n = config["url"], config["api"], len(prompt_list)
    guard_sglang = config["require_speculation"] and api == "sglang"
    streamed = stratified_sample(prompt_list, config["ttft_limit"], config["sample_seed"]) \
        if config["measure_ttft"] else []
    total = config["warmup"] + config["repeats"] * n + len(streamed)
    run = _Run(client, total, progress, on_row, source)
    try:
        run.warmup(prompt_list, config["warmup"], guard=guard_sglang)
        before = _vllm_metrics(url, client.timeout) if api == "vllm" else _sglang_metrics(url, client.timeout)
        walls = run.passes(prompt_list, config["repeats"], config["concurrency"], guard=guard_sglang)
        delta = None
        if api == "sglang":  # the timed passes' growth of SGLang's counters, where it exports them
            delta = _sglang_delta(before, _sglang_metrics(url, client.timeout) if before is not None else None)
        elif api == "vllm":
            delta = _metrics_delta(before or {}, _vllm_metrics(url, client.timeout))
            client.checks.check_vllm_delta(delta, f"{url}/metrics")
            if config["require_speculation"]:
                _guard_vllm(delta, config["repeats"] * n)
        for p in streamed:
            run.record(run.one(p, "ttft", None, stream=True))
    finally:
        run.bar.close()
    return run.sorted_rows(prompt_list), walls, delta


def _result(client: _Client, rows: list[dict[str, Any]], walls: list[float], delta: dict | None,
            config: dict[str, Any], prompt_set: dict[str, Any], settings: dict[str, Any],
            expect_server: dict[str, Any] | None) -> BenchResult:
    """Summarize the rows, after checking that the server still names what it ran before the run and what
    the launch asked for; a run whose server changed under it is refused, not recorded."""
    url, api = config["url"], config["api"]
    summary = summarize(rows, walls, api=api, vllm_delta=delta if api == "vllm" else None)
    if api == "vllm":
        summary["vllm_metrics_delta"] = delta
    elif delta is not None:
        summary["sglang_metrics_delta"] = delta  # SGLang's /metrics over the timed passes
    server = server_info(url, min(client.timeout, 30.0)) if api == "sglang" else {}
    where = f"{url}{server.get('endpoint') or settings.get('endpoint') or '/server_info'}"
    check_same_server(settings, server, where, expect_server)
    client.checks.check_server_info(server, where)
    summary["warnings"] = _warnings(summary, server)
    return BenchResult(summary=summary, rows=rows, config=config, prompt_set=prompt_set, server=server)


def _prompt_set(prompts: str | Path | Sequence[Prompt] | Sequence[str | Path], category: str | None, limit: int | None,
                sample_seed: int) -> tuple[list[Prompt], dict[str, Any]]:
    """The prompts to send (a stratified sample when ``limit``) and the record of where they came from."""
    if isinstance(prompts, (str, Path)):
        prompt_path = resolve_prompts_path(prompts)
        prompt_list = load_prompts(prompt_path, category)
        prompt_set = {"path": str(prompt_path), "sha256": file_sha256(prompt_path)}
    elif prompts and all(isinstance(p, (str, Path)) for p in prompts):
        prompt_list, prompt_set = load_prompt_files(prompts, category)
    else:
        prompt_list = list(prompts)
        blob = "\n".join(json.dumps([p.id, p.category, p.text]) for p in prompt_list).encode()
        prompt_set = {"path": None, "sha256": hashlib.sha256(blob).hexdigest()}
    available = len(prompt_list)
    prompt_list = stratified_sample(prompt_list, limit, sample_seed)
    if not prompt_list:
        raise DraftlabError("prompts: expected at least one prompt")
    prompt_set["count"] = len(prompt_list)
    prompt_set["available"] = available
    prompt_set["categories"] = dict(collections.Counter(p.category for p in prompt_list))
    prompt_set["sample"] = "all" if len(prompt_list) == available else f"stratified, seed {sample_seed}"
    return prompt_list, prompt_set


class _Run:
    """The requests of one run and their rows: the warm-up, the timed passes, the TTFT requests."""

    def __init__(self, client: _Client, total: int, progress: bool,
                 on_row: Callable[[dict[str, Any]], None] | None, source: str | None = None):
        from tqdm import tqdm  # noqa: PLC0415  # deferred: tqdm (~100 ms), only when a run starts

        self.client = client
        self.source = source or "the prompt set"
        self.on_row = on_row
        self.bar = tqdm(total=total, desc="bench", unit="req", file=sys.stderr, disable=not progress)
        self.lock = threading.Lock()
        self.rows: list[dict[str, Any]] = []

    def record(self, row: dict[str, Any]) -> None:
        with self.lock:
            self.rows.append(row)
            self.bar.update(1)
        if self.on_row is not None:
            self.on_row(row)

    def one(self, prompt: Prompt, phase: str, repeat: int | None, stream: bool = False) -> dict[str, Any]:
        try:
            raw = self.client.generate(prompt, stream=stream)
        except HTTPStatusError as exc:  # a 4xx refuses this prompt (too long for the context...): say which
            if not 400 <= exc.status < 500:
                raise
            raise DraftlabError(f"{self.source}: prompt {prompt.id!r} ({len(prompt.text)} characters) refused by "
                                f"the server: {exc}") from None
        verify = raw.get("verify_ct")
        row = {
            "phase": phase,
            "repeat": repeat,
            "prompt_id": prompt.id,
            "category": prompt.category,
            **{k: raw.get(k) for k in CSV_COLUMNS if k in raw},
        }
        for key in ("accept_by_position", "itl_s"):  # JSON only; the CSV keeps scalar columns
            if raw.get(key) is not None:
                row[key] = raw[key]
        if raw.get("output_sha256"):  # JSON only: what serve-launch compares with plain decoding's answers
            row["output_sha256"] = raw["output_sha256"]
        row["cycle_ms"] = (
            1000.0 * raw["decode_time_s"] / verify if verify and raw.get("decode_time_s") is not None else None
        )
        row.setdefault("ttft_s", None)
        return row

    def warmup(self, prompt_list: list[Prompt], warmup: int, guard: bool) -> None:
        """``warmup`` unrecorded requests, prompts in order, cycling."""
        warm_rows = []
        for i in range(warmup):
            warm_rows.append(self.one(prompt_list[i % len(prompt_list)], "warmup", None))
            self.bar.update(1)
        if guard and warm_rows:
            _guard_sglang(warm_rows, "warm-up", need_evidence=False)

    def passes(self, prompt_list: list[Prompt], repeats: int, concurrency: int, guard: bool) -> list[float]:
        """``repeats`` timed passes over all prompts, ``concurrency`` in flight; each pass's wall time."""
        walls: list[float] = []
        failed = threading.Event()  # set by the worker that failed, before a free worker takes the next prompt

        def send(p: Prompt, rep: int) -> dict[str, Any] | None:
            if failed.is_set():
                return None
            try:
                return self.one(p, "measure", rep)
            except BaseException:
                failed.set()
                raise

        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            for rep in range(repeats):
                start = time.perf_counter()
                futures = [pool.submit(send, p, rep) for p in prompt_list]
                done = []
                try:
                    for fut in futures:
                        row = fut.result()
                        self.record(row)
                        done.append(row)
                except BaseException:
                    failed.set()  # do not keep sending after a failure: at most the requests in flight finish
                    for fut in futures:
                        fut.cancel()
                    raise
                walls.append(time.perf_counter() - start)
                if guard:
                    _guard_sglang(done, f"repeat {rep}")
        return walls

    def sorted_rows(self, prompt_list: list[Prompt]) -> list[dict[str, Any]]:
        order = {"measure": 0, "ttft": 1}
        position = {p.id: i for i, p in enumerate(prompt_list)}
        return sorted(self.rows, key=lambda r: (order[r["phase"]], r["repeat"] or 0, position[r["prompt_id"]]))


NEAR_ONE_ACCEPT_LENGTH = 1.05


def _warnings(summary: dict[str, Any], server: dict[str, Any]) -> list[str]:
    """Signs of a silently broken drafter that the guard cannot see (speculation runs, but uselessly)."""
    out = []
    length = summary.get("accept_length")
    if length is not None and length < NEAR_ONE_ACCEPT_LENGTH:
        out.append(
            f"accept length {length:.3f}: almost every draft token is rejected — an EAGLE-3 drafter served "
            f"with --speculative-algorithm EAGLE, a missing/wrong d2t, or aux layer ids off by one?"
        )
    algo = server.get("speculative_algorithm")
    if algo is not None and str(algo).upper() == "EAGLE":
        out.append("the server runs --speculative-algorithm EAGLE; an EAGLE-3 drafter needs EAGLE3")
    return out


def _cycle_label(summary: dict[str, Any]) -> str:
    if summary.get("cycle_ms") is None or is_verify_cycle(summary.get("cycle_time_source")):
        return "cycle"
    return f"end-to-end time per verify step (from {summary.get('cycle_time_source')}: prefill and queueing included)"


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else 1000.0 * seconds


def human_summary(result: BenchResult) -> str:
    """A few lines for a person at a terminal."""
    s = result.summary

    def f(v: Any, fmt: str = "{:.2f}") -> str:
        return "n/a" if v is None else fmt.format(v)

    ci = s.get("output_tps_ci95")
    lines = [
        f"requests: {s['requests']} ({s['repeats']} repeats), completion tokens: {s['total_completion_tokens']}",
        f"output tok/s: median {f(s['output_tps_median'])}"
        + (f" (95% CI {ci[0]:.2f}..{ci[1]:.2f})" if ci else ""),
        f"accept length: {f(s['accept_length'])}  {_cycle_label(s)}: {f(s['cycle_ms'])} ms",
        "streamed: TTFT p50/p90/p99 " + "/".join(f(s.get(f"ttft_s_p{q}"), "{:.3f}") for q in PERCENTILES)
        + " s, ITL p50/p90/p99 " + "/".join(f(_ms(s.get(f"itl_s_p{q}")), "{:.1f}") for q in PERCENTILES) + " ms",
        f"speculation active: {s['speculation_active']}",
    ]
    lines += [f"warning: {w}" for w in s.get("warnings", [])]
    return "\n".join(lines)
