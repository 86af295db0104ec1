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
import os
import re
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from draftlab import http_client
from draftlab.serving.server_info import server_info, served_model  # noqa: F401 - also this module's API
from draftlab.benchmark.bench_checks import Plausibility
from draftlab.errors import DraftlabError
from draftlab.fsutil import atomic_path, write_json

APIS = ("sglang", "vllm")

# Newer SGLang versions report accepted/proposed draft counts under one of these pairs.
ACCEPT_COUNT_KEYS = (
    ("spec_accept_token_num", "spec_draft_token_num"),
    ("spec_accepted_drafts", "spec_proposed_drafts"),
    ("spec_num_correct_drafts", "spec_num_proposed_drafts"),
)

VLLM_COUNTERS = {
    "drafts": "vllm:spec_decode_num_drafts",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens",
    "accepted_tokens": "vllm:spec_decode_num_accepted_tokens",
}
VLLM_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"

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

# Decode-time sources that time verify cycles only (prefill and queueing excluded): draftlab's
# builtin engine reports draft/verify time; SGLang 0.5.23 reports neither, only ``e2e_latency``
# (arrival to finish) and, with --enable-metrics, ``first_token_latency`` (arrival to first token).
VERIFY_CYCLE_SOURCES = ("draft_time+verify_time", "e2e_latency-first_token_latency")


def is_verify_cycle(source: str | None) -> bool:
    """True when a ``cycle_time_source`` times verify cycles alone, not prefill and queueing too."""
    return source in VERIFY_CYCLE_SOURCES


GUARD_HINT = (
    "refusing to record this as a drafter result — check --speculative-algorithm EAGLE3 and the "
    "drafter path"
)


# --- prompt sets ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Prompt:
    id: str
    category: str
    text: str


def default_prompts_path() -> Path:
    """The prompt set shipped with draftlab (chat, code, math, reasoning, long and short prompts)."""
    return Path(__file__).resolve().parents[1] / "data" / "prompts.jsonl"


def resolve_prompts_path(path: str | Path) -> Path:
    """``"default"`` means the shipped set; anything else is a path."""
    return default_prompts_path() if str(path) == "default" else Path(path)


def file_sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


MAX_PROMPT_ID_CHARS = 200


def load_prompts(path: str | Path, category: str | None = None) -> list[Prompt]:
    """Read a prompt set in any format :mod:`draftlab.formats.prompt_file` reads (the shipped JSONL, MT-Bench,
    HumanEval ``.jsonl.gz``, GSM8K, ShareGPT, OpenAI messages, plain lines).

    Each prompt sends its **first user turn** as the request text (MT-Bench's later turns are about
    the model's own earlier answer, which a fixed prompt set does not have; data generation replays
    them). Its id is the record's own (``id``, ``question_id``, ``task_id``), else its position in the
    file (``"0"``, ``"1"``, ...); its category is the record's ``category``, else ``category`` (the
    client's name in the workflow), else ``"misc"``."""
    from draftlab.formats.prompt_file import first_user_turn, iter_prompts

    path = resolve_prompts_path(path)
    if not os.path.lexists(path):
        raise DraftlabError(f"{path}: prompt file not found (use --prompts default for the shipped set)")
    prompts: list[Prompt] = []
    seen: set[str] = set()
    for p in iter_prompts(path):
        where = f"{path}:{p.line}"
        pid = p.source_id if p.source_id is not None else p.id
        if (not isinstance(pid, (str, int)) or isinstance(pid, bool) or str(pid) == ""
                or len(str(pid)) > MAX_PROMPT_ID_CHARS):
            raise DraftlabError(f"{where}: key 'id': expected a non-empty string or integer of at most "
                                f"{MAX_PROMPT_ID_CHARS} characters, got {pid!r:.80}")
        pid = str(pid)
        if pid in seen:
            raise DraftlabError(f"{where}: key 'id': duplicate prompt id {pid!r}")
        seen.add(pid)
        text = first_user_turn(p)
        if not text:
            roles = ", ".join(m["role"] for m in p.messages)
            raise DraftlabError(f"{where}: expected a non-empty user turn to send, got turns: {roles}")
        prompts.append(Prompt(pid, p.category or category or "misc", text))
    return prompts


def stratified_sample(prompts: Sequence[Prompt], limit: int | None, seed: int = 0) -> list[Prompt]:
    """``limit`` prompts drawn across categories in proportion to their sizes, in file order.

    Every category gets one prompt first when ``limit`` reaches the number of categories; the rest go,
    one at a time, to the category furthest below its proportional share ``limit * n_c / n`` (ties: the
    category that comes first in the file), never beyond its size. With fewer slots than categories the
    largest categories get them. Which prompts of a category are drawn is a seeded shuffle of that
    category alone (``random.Random(f"{seed}/{category}")``), so the sample is the same on every run and
    host and one category's size never changes another's draw. ``limit`` None or >= the set: all."""
    import random

    if limit is None or limit >= len(prompts):
        return list(prompts)
    groups: dict[str, list[int]] = {}
    for i, p in enumerate(prompts):
        groups.setdefault(p.category, []).append(i)
    total = len(prompts)
    take = {c: (1 if limit >= len(groups) else 0) for c in groups}
    for _ in range(limit - sum(take.values())):
        open_ = [c for c in groups if take[c] < len(groups[c])]
        c = max(open_, key=lambda c: limit * len(groups[c]) / total - take[c])  # max keeps the first of ties
        take[c] += 1
    chosen: list[int] = []
    for c, members in groups.items():
        chosen += random.Random(f"{seed}/{c}").sample(members, take[c])
    return [prompts[i] for i in sorted(chosen)]


# --- statistics -----------------------------------------------------------------------------------

# Two-sided 95% Student-t quantiles t(0.975, df) for df = 1..30; beyond, a Cornish-Fisher expansion.
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)


def t_quantile_975(df: int) -> float:
    """t(0.975, df): a table for df <= 30, the Cornish-Fisher series (error < 1e-3) above."""
    if df < 1:
        raise ValueError("df must be >= 1")
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959964
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def mean_ci95(values: Sequence[float], floor: float | None = None) -> tuple[float, float] | None:
    """95% Student-t interval of the mean: mean +- t(0.975, n-1) * s / sqrt(n); None for n < 2.

    ``floor`` clamps the lower end (0 for throughput, which cannot be negative).
    """
    n = len(values)
    if n < 2:
        return None
    m = statistics.fmean(values)
    half = t_quantile_975(n - 1) * statistics.stdev(values) / math.sqrt(n)
    low = m - half if floor is None else max(floor, m - half)
    return (low, m + half)


# --- one request per API ---------------------------------------------------------------------------


def _int_or_none(value: Any) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _float_or_none(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def accept_count_keys(meta: dict) -> tuple[str, str] | None:
    """The (accepted, proposed) draft-count pair this ``meta_info`` uses, if any."""
    return next(((a, p) for a, p in ACCEPT_COUNT_KEYS if a in meta or p in meta), None)


def at_least_counts(histogram: Any) -> list[int] | None:
    """SGLang 0.5.23's ``spec_correct_drafts_histogram`` as accepts per draft position.

    Entry j of the histogram counts the verify cycles with exactly j correct drafts (SGLang's
    ``io_struct``: "histogram[3] = 10 means 10 steps with 3 accepted tokens"); in a chain, draft i was
    accepted in every cycle with at least i correct, so position i counts sum_{j>=i} histogram[j]
    (the builtin server's ``spec_accept_by_position``). None when absent or malformed.
    """
    if isinstance(histogram, list) and len(histogram) == 1 and isinstance(histogram[0], list):
        histogram = histogram[0]  # a batch-shaped answer to one prompt
    if not isinstance(histogram, list) or len(histogram) < 2:
        return None
    counts = [_int_or_none(x) for x in histogram]
    if any(c is None or c < 0 for c in counts):
        return None
    return [sum(counts[i:]) for i in range(1, len(counts))]


def parse_sglang_meta(meta: dict) -> dict[str, Any]:
    """Raw counts from an SGLang/builtin ``meta_info``, tolerating every known field naming."""
    accepted = proposed = None
    keys = accept_count_keys(meta)
    if keys:
        accepted, proposed = _int_or_none(meta.get(keys[0])), _int_or_none(meta.get(keys[1]))
    draft_t, verify_t = _float_or_none(meta.get("draft_time")), _float_or_none(meta.get("verify_time"))
    e2e = _float_or_none(meta.get("e2e_latency"))
    first = _float_or_none(meta.get("first_token_latency"))  # SGLang with --enable-metrics
    if draft_t is not None and verify_t is not None:
        decode, source = draft_t + verify_t, "draft_time+verify_time"
    elif e2e is not None and first is not None and e2e >= first:
        decode, source = e2e - first, "e2e_latency-first_token_latency"
    elif e2e is not None:
        decode, source = e2e, "e2e_latency"
    else:
        decode, source = None, None
    by_pos = meta.get("spec_accept_by_position")  # draftlab's builtin server: accepts per draft position
    if not isinstance(by_pos, list):
        by_pos = at_least_counts(meta.get("spec_correct_drafts_histogram"))  # SGLang 0.5.23
    return {
        "prompt_tokens": _int_or_none(meta.get("prompt_tokens")),
        "completion_tokens": _int_or_none(meta.get("completion_tokens")),
        "verify_ct": _int_or_none(meta.get("spec_verify_ct")),
        "accept_by_position": [int(x) for x in by_pos] if isinstance(by_pos, list) else None,
        "accepted_drafts": accepted,
        "proposed_drafts": proposed,
        "server_latency_s": e2e,
        "decode_time_s": decode,
        "decode_time_source": source,
    }


@dataclass
class _Client:
    """Sends one prompt to one server API and returns a row of raw measurements."""

    url: str
    api: str
    max_new_tokens: int
    ignore_eos: bool
    timeout: float
    model: str | None = None
    checks: Plausibility | None = None

    def generate(self, prompt: Prompt, stream: bool = False) -> dict[str, Any]:
        send = self._sglang if self.api == "sglang" else self._vllm
        return send(prompt, stream)

    def _sglang(self, prompt: Prompt, stream: bool) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "text": prompt.text,
            "sampling_params": {
                "max_new_tokens": self.max_new_tokens,
                "temperature": 0.0,
                "ignore_eos": self.ignore_eos,
            },
        }
        if stream:
            payload["stream"] = True
        url = f"{self.url}/generate"
        start = time.perf_counter()
        ttft = None
        with http_client.request(url, payload, self.timeout) as resp:
            streamed = stream and "text/event-stream" in resp.content_type
            if streamed:
                final: Any = {}
                for n, event in enumerate(resp.events()):
                    meta = http_client.JsonReader(event, url, f"event {n}").get("meta_info", "object", default={})
                    if ttft is None and ((_int_or_none(meta.get("completion_tokens")) or 0) >= 1 or event.get("text")):
                        ttft = time.perf_counter() - start
                    final = event
            else:
                final = resp.json()
        latency = time.perf_counter() - start
        if isinstance(final, list):  # a batch answer to a single prompt
            final = final[0] if final else {}
        if not isinstance(final, dict) or "meta_info" not in final:
            raise DraftlabError(f"{url}: response has no 'meta_info' (is this an SGLang-style server? try --api vllm)")
        meta = final["meta_info"]
        if not isinstance(meta, dict):
            raise DraftlabError(f"{url}: key 'meta_info': expected an object, got {type(meta).__name__}")
        if self.checks is not None:
            self.checks.check_sglang_meta(meta, url, accept_count_keys(meta), latency)
        row = parse_sglang_meta(meta)
        if row["completion_tokens"] is None:
            raise DraftlabError(f"{url}: key 'meta_info.completion_tokens' missing from the response")
        row.update(latency_s=latency, ttft_s=ttft, streamed=streamed)
        return row

    def _vllm(self, prompt: Prompt, stream: bool) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "model": self.model,
            "prompt": prompt.text,
            "max_tokens": self.max_new_tokens,
            "temperature": 0.0,
        }
        if self.ignore_eos:
            payload["ignore_eos"] = True
        if stream:
            payload["stream"] = True
            payload["stream_options"] = {"include_usage": True}
        url = f"{self.url}/v1/completions"
        start = time.perf_counter()
        ttft = None
        usage: dict = {}
        with http_client.request(url, payload, self.timeout) as resp:
            streamed = stream and "text/event-stream" in resp.content_type
            if streamed:
                for n, event in enumerate(resp.events()):
                    ev = http_client.JsonReader(event, url, f"event {n}")
                    choices = ev.get("choices", "list", default=[])
                    if ttft is None and choices and ev.field("choices", "list").item(0).get("text", "str"):
                        ttft = time.perf_counter() - start
                    usage = ev.get("usage", "object") or usage
            else:
                usage = http_client.JsonReader(resp.json(dict), url).get("usage", "object", default={})
        latency = time.perf_counter() - start
        if self.checks is not None:
            self.checks.check_usage(usage, url)
        completion = _int_or_none(usage.get("completion_tokens"))
        if completion is None:
            raise DraftlabError(f"{url}: key 'usage.completion_tokens' missing from the response")
        return {
            "prompt_tokens": _int_or_none(usage.get("prompt_tokens")),
            "completion_tokens": completion,
            "verify_ct": None,
            "accepted_drafts": None,
            "proposed_drafts": None,
            "server_latency_s": None,
            "decode_time_s": latency,
            "decode_time_source": "client_latency",
            "latency_s": latency,
            "ttft_s": ttft,
            "streamed": streamed,
        }


# --- vLLM /metrics --------------------------------------------------------------------------------

_PROM_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_POSITION = re.compile(r'position="(\d+)"')


def parse_vllm_spec_metrics(text: str) -> dict[str, Any]:
    """Sum the speculative counters of a Prometheus exposition over all label sets (engines).

    Counters appear with the ``_total`` suffix the exposition format adds; the bare name is accepted
    too. Missing counters are absent from the result (speculation off, or not vLLM).
    """
    wanted = {}
    for key, name in VLLM_COUNTERS.items():
        wanted[name] = key
        wanted[name + "_total"] = key
    out: dict[str, Any] = {}
    per_pos: dict[int, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _PROM_LINE.match(line)
        if not m:
            continue
        name, labels, raw = m.group(1), m.group(2) or "", m.group(3)
        try:
            value = float(raw)
        except ValueError:
            continue
        if name in wanted:
            out[wanted[name]] = out.get(wanted[name], 0.0) + value
        elif name in (VLLM_PER_POS, VLLM_PER_POS + "_total"):
            pos = _POSITION.search(labels)
            if pos:
                per_pos[int(pos.group(1))] = per_pos.get(int(pos.group(1)), 0.0) + value
    if per_pos:
        out["accepted_per_pos"] = [per_pos.get(i, 0.0) for i in range(max(per_pos) + 1)]
    return out


def _vllm_metrics(url: str, timeout: float) -> dict[str, Any]:
    with http_client.request(f"{url}/metrics", None, timeout) as resp:
        return parse_vllm_spec_metrics(resp.read().decode("utf-8", "replace"))


def _metrics_delta(before: dict, after: dict) -> dict[str, Any] | None:
    if not all(k in before and k in after for k in VLLM_COUNTERS):
        return None
    delta: dict[str, Any] = {k: int(round(after[k] - before[k])) for k in VLLM_COUNTERS}
    a, b = after.get("accepted_per_pos") or [], before.get("accepted_per_pos") or []
    b = b + [0.0] * (len(a) - len(b))
    delta["accepted_per_pos"] = [int(round(x - y)) for x, y in zip(a, b)]
    return delta


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
    """Write the result as JSON (everything) and CSV (one line per request), each atomically."""
    write_json(out_json, result.to_dict())
    if out_csv is not None:
        with atomic_path(out_csv) as tmp:
            with open(tmp, "w", newline="", encoding="utf-8") as fh:
                writer = csv.DictWriter(fh, fieldnames=CSV_COLUMNS, extrasaction="ignore")
                writer.writeheader()
                for row in result.rows:
                    writer.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in CSV_COLUMNS})


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _is_unverified(row: dict) -> bool:
    # A request that produced at most one token finishes in prefill: no verify cycle is expected.
    return (row["completion_tokens"] or 0) > 1 and not (row.get("verify_ct") or 0) > 0


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


def summarize(
    rows: list[dict[str, Any]],
    repeat_walls: list[float],
    *,
    api: str,
    vllm_delta: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Turn measured rows (phase "measure"), per-repeat wall times and TTFT rows into the summary."""
    measured = [r for r in rows if r["phase"] == "measure"]
    ttft_rows = [r for r in rows if r["phase"] == "ttft" and r.get("ttft_s") is not None]
    completion = sum(r["completion_tokens"] or 0 for r in measured)
    per_repeat = []
    for rep, wall in enumerate(repeat_walls):
        tokens = sum(r["completion_tokens"] or 0 for r in measured if r["repeat"] == rep)
        per_repeat.append(tokens / wall if wall > 0 else 0.0)
    ci = mean_ci95(per_repeat, floor=0.0)

    accept_length = cycle_ms = accept_rate = None
    verify_total: int | None = None
    accept_source = cycle_source = None
    accepted_per_pos = None
    if api == "sglang":
        spec_rows = [r for r in measured if (r.get("verify_ct") or 0) > 0]
        if spec_rows:
            verify_total = sum(r["verify_ct"] for r in spec_rows)
            accept_length = sum(r["completion_tokens"] for r in spec_rows) / verify_total
            accept_source = "sum(completion_tokens)/sum(spec_verify_ct)"
            timed = [r for r in spec_rows if r.get("decode_time_s") is not None]
            if timed:
                cycle_ms = 1000.0 * sum(r["decode_time_s"] for r in timed) / sum(r["verify_ct"] for r in timed)
                sources = sorted({r["decode_time_source"] for r in timed})
                cycle_source = sources[0] if len(sources) == 1 else "mixed:" + "+".join(sources)
            with_pos = [r["accept_by_position"] for r in spec_rows if r.get("accept_by_position") is not None]
            if len(with_pos) == len(spec_rows):
                width = max(len(x) for x in with_pos)
                sums = [sum(x[i] for x in with_pos if i < len(x)) for i in range(width)]
                accepted_per_pos = [a / verify_total for a in sums]
            counted = [r for r in spec_rows if r.get("accepted_drafts") is not None and r.get("proposed_drafts")]
            if counted:
                accept_rate = sum(r["accepted_drafts"] for r in counted) / sum(r["proposed_drafts"] for r in counted)
    elif vllm_delta is not None and vllm_delta["drafts"] > 0:
        verify_total = vllm_delta["drafts"]
        accept_length = 1.0 + vllm_delta["accepted_tokens"] / verify_total
        accept_source = "1+delta(accepted_tokens)/delta(drafts) from /metrics"
        if vllm_delta["draft_tokens"] > 0:
            accept_rate = vllm_delta["accepted_tokens"] / vllm_delta["draft_tokens"]
        accepted_per_pos = [a / verify_total for a in vllm_delta["accepted_per_pos"]]
        cycle_ms = 1000.0 * sum(r["latency_s"] for r in measured) / verify_total
        cycle_source = "client_latency"

    decode_rows = [r for r in measured if r.get("decode_time_s") is not None]
    decode_tokens = sum(r["completion_tokens"] or 0 for r in decode_rows)
    return {
        "requests": len(measured),
        "repeats": len(repeat_walls),
        "total_prompt_tokens": sum(r["prompt_tokens"] or 0 for r in measured),
        "total_completion_tokens": completion,
        "total_verify_ct": verify_total,
        "output_tps_median": _median(per_repeat),
        "output_tps_mean": statistics.fmean(per_repeat) if per_repeat else None,
        "output_tps_ci95": list(ci) if ci else None,
        "output_tps_ci_method": "student-t 95% interval of the mean over repeats, lower end clamped at 0 (null for 1 repeat)",
        "output_tps_per_repeat": per_repeat,
        "repeat_wall_s": repeat_walls,
        "speculation_active": accept_length is not None,
        "accept_length": accept_length,
        "accept_length_source": accept_source,
        "accept_rate": accept_rate,
        "accepted_per_position_rate": accepted_per_pos,
        "cycle_ms": cycle_ms,
        "cycle_time_source": cycle_source,
        "cycle_ms_is_verify_cycle": None if cycle_ms is None else is_verify_cycle(cycle_source),
        "ms_per_output_token": (
            1000.0 * sum(r["decode_time_s"] for r in decode_rows) / decode_tokens if decode_tokens else None
        ),
        "latency_s_median": _median([r["latency_s"] for r in measured]),
        "ttft_s_median": _median([r["ttft_s"] for r in ttft_rows]),
        "ttft_s_mean": statistics.fmean([r["ttft_s"] for r in ttft_rows]) if ttft_rows else None,
        "ttft_requests": len(ttft_rows),
    }


def run_benchmark(
    url: str,
    prompts: str | Path | Sequence[Prompt],
    *,
    api: str = "sglang",
    max_new_tokens: int = 128,
    repeats: int = 3,
    warmup: int = 1,
    concurrency: int = 1,
    require_speculation: bool = False,
    model: str | None = None,
    progress: bool = True,
    measure_ttft: bool = True,
    ignore_eos: bool = False,
    limit: int | None = None,
    request_timeout_s: float = 600.0,
    on_row: Callable[[dict[str, Any]], None] | None = None,
    num_steps: int | None = None,
    num_draft_tokens: int | None = None,
    category: str | None = None,
    sample_seed: int = 0,
) -> BenchResult:
    """Benchmark the server at ``url`` with a prompt set and return rows plus a summary.

    Phases: ``warmup`` unrecorded requests (prompts taken in order, cycling); ``repeats`` passes over
    all prompts with ``concurrency`` requests in flight, each pass timed end to end for output tok/s;
    then, with ``measure_ttft``, one streaming request per prompt, sequentially, for time to first
    token (null when the server does not stream). With ``require_speculation`` a run whose server
    shows no speculative verification raises :class:`DraftlabError` (checked after the warm-up and
    after every pass, so a silent fallback fails early) and nothing is returned to be written.
    ``num_steps``/``num_draft_tokens``: the speculative settings the server was launched with (the
    plan's), bounding what its answers can say where the server does not report them itself.
    ``limit`` takes a stratified sample (:func:`stratified_sample`, seeded with ``sample_seed``), not the
    first N; ``category`` labels the prompts of a file that has no ``category`` field (the workflow
    passes the client's name).
    """
    if api not in APIS:
        raise DraftlabError(f"--api: expected one of {', '.join(APIS)}, got {api!r}")
    for name, value, low in (
        ("--max-new-tokens", max_new_tokens, 1),
        ("--repeats", repeats, 1),
        ("--warmup", warmup, 0),
        ("--concurrency", concurrency, 1),
        ("--sample-seed", sample_seed, 0),
    ):
        if isinstance(value, bool) or int(value) != value or value < low:
            raise DraftlabError(f"{name}: expected an integer >= {low}, got {value!r}")
    for name, value, low in (("--num-steps", num_steps, 1), ("num_draft_tokens", num_draft_tokens, 1)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
            raise DraftlabError(f"{name}: expected an integer >= {low}, got {value!r}")
    if not (isinstance(request_timeout_s, (int, float)) and math.isfinite(request_timeout_s) and request_timeout_s > 0):
        raise DraftlabError(f"--timeout: expected a number of seconds > 0, got {request_timeout_s!r}")
    if limit is not None and limit < 1:
        raise DraftlabError(f"--limit: expected an integer >= 1, got {limit!r}")
    url = url.rstrip("/")
    if not re.match(r"^https?://", url):
        raise DraftlabError(f"--url: expected http://HOST:PORT, got {url!r}")

    if isinstance(prompts, (str, Path)):
        prompt_path = resolve_prompts_path(prompts)
        prompt_list = load_prompts(prompt_path, category)
        prompt_set = {"path": str(prompt_path), "sha256": file_sha256(prompt_path)}
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

    if api == "vllm" and model is None:
        model = served_model(url, request_timeout_s)
    # the server's speculative settings bound what its answers can say (bench_checks)
    settings = server_info(url, min(request_timeout_s, 30.0)) if api == "sglang" else {}
    checks = Plausibility.from_server_info(max_new_tokens, settings, num_steps, num_draft_tokens)
    client = _Client(url, api, max_new_tokens, ignore_eos, request_timeout_s, model, checks)

    from tqdm import tqdm  # noqa: PLC0415 - only when a run actually starts

    total = warmup + repeats * len(prompt_list) + (len(prompt_list) if measure_ttft else 0)
    bar = tqdm(total=total, desc="bench", unit="req", file=sys.stderr, disable=not progress)
    lock = threading.Lock()
    rows: list[dict[str, Any]] = []

    def record(row: dict[str, Any]) -> None:
        with lock:
            rows.append(row)
            bar.update(1)
        if on_row is not None:
            on_row(row)

    def one(prompt: Prompt, phase: str, repeat: int | None, stream: bool = False) -> dict[str, Any]:
        raw = client.generate(prompt, stream=stream)
        verify = raw.get("verify_ct")
        row = {
            "phase": phase,
            "repeat": repeat,
            "prompt_id": prompt.id,
            "category": prompt.category,
            **{k: raw.get(k) for k in CSV_COLUMNS if k in raw},
        }
        if raw.get("accept_by_position") is not None:  # JSON only; the CSV keeps scalar columns
            row["accept_by_position"] = raw["accept_by_position"]
        row["cycle_ms"] = (
            1000.0 * raw["decode_time_s"] / verify if verify and raw.get("decode_time_s") is not None else None
        )
        row.setdefault("ttft_s", None)
        return row

    try:
        warm_rows = []
        for i in range(warmup):
            warm_rows.append(one(prompt_list[i % len(prompt_list)], "warmup", None))
            bar.update(1)
        if require_speculation and api == "sglang" and warm_rows:
            _guard_sglang(warm_rows, "warm-up", need_evidence=False)

        before = _vllm_metrics(url, request_timeout_s) if api == "vllm" else None
        walls: list[float] = []
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            for rep in range(repeats):
                start = time.perf_counter()
                futures = [pool.submit(one, p, "measure", rep) for p in prompt_list]
                done = []
                try:
                    for fut in futures:
                        row = fut.result()
                        record(row)
                        done.append(row)
                except BaseException:
                    for fut in futures:  # do not keep sending after a failure
                        fut.cancel()
                    raise
                walls.append(time.perf_counter() - start)
                if require_speculation and api == "sglang":
                    _guard_sglang(done, f"repeat {rep}")
        delta = None
        if api == "vllm":
            delta = _metrics_delta(before or {}, _vllm_metrics(url, request_timeout_s))
            checks.check_vllm_delta(delta, f"{url}/metrics")
            if require_speculation:
                _guard_vllm(delta, repeats * len(prompt_list))

        if measure_ttft:
            for p in prompt_list:
                record(one(p, "ttft", None, stream=True))
    finally:
        bar.close()

    order = {"measure": 0, "ttft": 1}
    position = {p.id: i for i, p in enumerate(prompt_list)}
    rows.sort(key=lambda r: (order[r["phase"]], r["repeat"] or 0, position[r["prompt_id"]]))
    summary = summarize(rows, walls, api=api, vllm_delta=delta)
    if api == "vllm":
        summary["vllm_metrics_delta"] = delta
    config = {
        "url": url,
        "api": api,
        "model": model,
        "max_new_tokens": max_new_tokens,
        "repeats": repeats,
        "warmup": warmup,
        "concurrency": concurrency,
        "require_speculation": require_speculation,
        "ignore_eos": ignore_eos,
        "temperature": 0.0,
        "measure_ttft": measure_ttft,
        "limit": limit,
        "category": category,
        "sample_seed": sample_seed,
    }
    server = server_info(url, min(request_timeout_s, 30.0)) if api == "sglang" else {}
    checks.check_server_info(server, f"{url}{server.get('endpoint', '')}")
    summary["warnings"] = _warnings(summary, server)
    return BenchResult(summary=summary, rows=rows, config=config, prompt_set=prompt_set, server=server)


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
        f"accept length: {f(s['accept_length'])}  {_cycle_label(s)}: {f(s['cycle_ms'])} ms  "
        f"TTFT median: {f(s['ttft_s_median'], '{:.3f}')} s",
        f"speculation active: {s['speculation_active']}",
    ]
    lines += [f"warning: {w}" for w in s.get("warnings", [])]
    return "\n".join(lines)
