"""The benchmark's requests: one call per API (SGLang/builtin ``/generate``, vLLM ``/v1/completions``)
through :mod:`draftlab.http_client`, each answer's counts parsed, and vLLM's ``/metrics`` counters."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import time
from dataclasses import dataclass
from typing import Any

from draftlab import http_client
from draftlab.benchmark.bench_checks import Plausibility
from draftlab.benchmark.bench_prompts import Prompt
from draftlab.errors import DraftlabError

# SGLang reports accepted/proposed draft counts under one of these pairs: 0.5.23's first (the builtin
# server's too), then the older versions' names, still read for a real old server (FIELD-NOTES).
ACCEPT_COUNT_KEYS = (
    ("spec_num_correct_drafts", "spec_num_proposed_drafts"),
    ("spec_accepted_drafts", "spec_proposed_drafts"),
    ("spec_accept_token_num", "spec_draft_token_num"),
)
# draftlab's builtin server only: its own split of a request's time (SGLang reports neither)
DRAFT_TIME, VERIFY_TIME = "draftlab_draft_time", "draftlab_verify_time"

VLLM_COUNTERS = {
    "drafts": "vllm:spec_decode_num_drafts",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens",
    "accepted_tokens": "vllm:spec_decode_num_accepted_tokens",
}
VLLM_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
# SGLang's request counters (``--enable-metrics``; the builtin server always): verify calls and the
# tokens they made, summed over label sets (streamed and not)
SGLANG_COUNTERS = {
    "verify_calls": "sglang:spec_verify_calls",
    "generation_tokens": "sglang:generation_tokens",
    "requests": "sglang:num_requests",
}


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
    None when absent or malformed.
    """
    if isinstance(histogram, list) and len(histogram) == 1 and isinstance(histogram[0], list):
        histogram = histogram[0]  # a batch-shaped answer to one prompt
    if not isinstance(histogram, list) or len(histogram) < 2:
        return None
    counts = [_int_or_none(x) for x in histogram]
    if any(c is None or c < 0 for c in counts):
        return None
    return [sum(counts[i:]) for i in range(1, len(counts))]


def accept_by_position(meta: dict) -> tuple[str | None, list | None]:
    """(the field it came from, accepts per draft position) of a ``meta_info``, or (None, None)."""
    by_pos = meta.get("spec_accept_by_position")  # the builtin server's older field (now the histogram)
    if isinstance(by_pos, list):
        return "spec_accept_by_position", by_pos
    counts = at_least_counts(meta.get("spec_correct_drafts_histogram"))  # SGLang 0.5.23 and the builtin server
    return ("spec_correct_drafts_histogram", counts) if counts is not None else (None, None)


def parse_sglang_meta(meta: dict) -> dict[str, Any]:
    """Raw counts from an SGLang/builtin ``meta_info`` (one code path for both), tolerating older SGLang names."""
    accepted = proposed = None
    keys = accept_count_keys(meta)
    if keys:
        accepted, proposed = _int_or_none(meta.get(keys[0])), _int_or_none(meta.get(keys[1]))
    draft_t, verify_t = _float_or_none(meta.get(DRAFT_TIME)), _float_or_none(meta.get(VERIFY_TIME))
    e2e = _float_or_none(meta.get("e2e_latency"))
    first = _float_or_none(meta.get("first_token_latency"))  # SGLang with --enable-metrics
    if draft_t is not None and verify_t is not None:
        decode, source = draft_t + verify_t, "draft_time+verify_time"  # the builtin server's split
    elif e2e is not None and first is not None and e2e >= first:
        decode, source = e2e - first, "e2e_latency-first_token_latency"
    elif e2e is not None:
        decode, source = e2e, "e2e_latency"
    else:
        decode, source = None, None
    by_pos = accept_by_position(meta)[1]
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


def output_digest(answer: Any) -> str | None:
    """SHA-256 of an answer's output (its token ids when the server returns them, else its text): a swapped
    drafter's answers must equal plain decoding's at temperature 0 (benchmark.serve_launch checks it)."""
    ids = answer.get("output_ids")
    if isinstance(ids, list):
        return hashlib.sha256(json.dumps(ids).encode()).hexdigest()
    text = answer.get("text")
    return hashlib.sha256(text.encode()).hexdigest() if isinstance(text, str) else None


class Gaps:
    """Time to first token and inter-token latencies of one stream, as SGLang's ``bench_serving`` counts them.

    ``/generate`` events are cumulative: an event that brings n new tokens after a gap g adds n
    latencies of g / n (``async_request_sglang_generate``); an OpenAI chunk with text adds one
    latency, the gap since the previous one (``async_request_openai_completions``).
    """

    def __init__(self, start: float):
        self.start, self.last, self.seen = start, start, 0
        self.ttft: float | None = None
        self.gaps: list[float] = []

    def tokens_at(self, now: float, tokens: int) -> None:
        if self.ttft is None:
            self.ttft = now - self.start
        elif tokens > self.seen:
            new = tokens - self.seen
            self.gaps.extend([(now - self.last) / new] * new)
        else:
            return
        self.last, self.seen = now, tokens

    def chunk_at(self, now: float) -> None:
        if self.ttft is None:
            self.ttft = now - self.start
        else:
            self.gaps.append(now - self.last)
        self.last = now


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

    def _exchange(self, url: str, payload: dict[str, Any], stream: bool, read_events, read_answer) -> "_Exchange":
        """Send one request and read its answer with the client's clock around it: both APIs share this
        shape (a stream only where the server answers with one); each reads its own events and answer."""
        start = time.perf_counter()
        itl = Gaps(start)
        with http_client.request(url, payload, self.timeout) as resp:
            streamed = stream and "text/event-stream" in resp.content_type
            answer = read_events(resp.events(), url, itl) if streamed else read_answer(resp, url)
        latency = time.perf_counter() - start
        return _Exchange(answer, streamed, latency, itl.ttft if streamed else None, itl.gaps if streamed else None)

    def _sglang(self, prompt: Prompt, stream: bool) -> dict[str, Any]:
        """One greedy ``/generate`` request: the server's own counts and timings, and the client's clock."""
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
        ex = self._exchange(url, payload, stream, self._sglang_events, _sglang_answer)
        final, returned = ex.answer
        final, row = self._sglang_row(final, url, ex, returned)
        # the whole answer's digest (serve_launch compares it with plain decoding's); a stream may end on an
        # increment, so a streamed answer has none
        row.update(**ex.clock(), output_sha256=None if ex.streamed else output_digest(final))
        return row

    def _sglang_events(self, events, url: str, itl: Gaps) -> tuple[Any, bool]:
        """A ``/generate`` stream read to its last event, each refused above ``max_new_tokens`` before it is
        timed: (the last event, whether any output came back)."""
        final: Any = {}
        returned = False  # whether any output (ids or text) came back
        last = 0  # the cumulative count so far: SGLang's events never take tokens back
        for n, event in enumerate(events):
            meta = http_client.JsonReader(event, url, f"event {n}").get("meta_info", "object", default={})
            tokens = max(0, _int_or_none(meta.get("completion_tokens")) or 0)
            if tokens > self.max_new_tokens:  # before it sizes anything (a lying count is refused)
                raise DraftlabError(f"{url}: event {n}: meta_info.completion_tokens {tokens} is above "
                                    f"max_new_tokens {self.max_new_tokens}, which this benchmark asked for")
            if tokens < last:
                raise DraftlabError(f"{url}: event {n}: meta_info.completion_tokens went down from {last} to "
                                    f"{tokens}; a stream's count is cumulative: refusing to record it")
            if tokens >= 1 and not returned and not (event.get("output_ids") or event.get("text")):
                # the first token's time is the TTFT: an event that claims tokens it did not return would set it
                raise DraftlabError(f"{url}: event {n}: meta_info.completion_tokens {tokens} but the event returns "
                                    "no token (output_ids and text empty): refusing its time as the first token's")
            last = tokens
            if tokens >= 1 or event.get("text"):
                itl.tokens_at(time.perf_counter(), tokens)
            returned = returned or bool(event.get("output_ids")) or bool(event.get("text"))
            final = event
        return final, returned

    def _sglang_row(self, final: Any, url: str, ex: "_Exchange", returned: bool) -> tuple[dict, dict[str, Any]]:
        """The counts of a ``/generate`` answer's ``meta_info``, checked for plausibility where asked:
        (the answer, its row); refused with one error where it is not an SGLang-style answer."""
        if isinstance(final, list):  # a batch answer to a single prompt
            final = final[0] if final else {}
        if not isinstance(final, dict) or "meta_info" not in final:
            raise DraftlabError(f"{url}: response has no 'meta_info' (is this an SGLang-style server? try --api vllm)")
        meta = final["meta_info"]
        if not isinstance(meta, dict):
            raise DraftlabError(f"{url}: key 'meta_info': expected an object, got {type(meta).__name__}")
        if self.checks is not None:
            self.checks.check_sglang_meta(meta, url, accept_count_keys(meta), ex.latency)
        row = parse_sglang_meta(meta)
        if row["completion_tokens"] is None:
            raise DraftlabError(f"{url}: key 'meta_info.completion_tokens' missing from the response")
        if self.checks is not None:  # on the parsed counts: the same for every field naming
            self.checks.check_parsed(row, url, accept_by_position(meta)[0])
            ids = final.get("output_ids")
            ids = ids if isinstance(ids, list) and not ex.streamed else None  # a stream may end on an increment
            self.checks.check_output(row["completion_tokens"], url, ids=ids,
                                     returned=returned or bool(final.get("output_ids")) or bool(final.get("text")))
        return final, row

    def _vllm(self, prompt: Prompt, stream: bool) -> dict[str, Any]:
        """One greedy ``/v1/completions`` request: its usage counts, timed by the client alone (the
        speculative counts come from ``/metrics``, around the whole run)."""
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
        ex = self._exchange(url, payload, stream, _vllm_events, _vllm_answer)
        usage, choices = ex.answer
        if self.checks is not None:
            self.checks.check_usage(usage, url)
            if not ex.streamed and not choices and (_int_or_none(usage.get("completion_tokens")) or 0) > 0:
                raise DraftlabError(f"{url}: usage.completion_tokens is {usage.get('completion_tokens')} but the "
                                    "answer holds no choices; refusing to record tokens the server did not return")
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
            "decode_time_s": ex.latency,
            "decode_time_source": "client_latency",
            **ex.clock(),
        }


@dataclass(frozen=True)
class _Exchange:
    """One request's answer as its API's reader returned it, and the client's clock around it."""

    answer: Any
    streamed: bool
    latency: float
    ttft: float | None
    itl: list[float] | None

    def clock(self) -> dict[str, Any]:
        """The row's client-side timing columns, the same for both APIs."""
        return {"latency_s": self.latency, "ttft_s": self.ttft, "itl_s": self.itl, "streamed": self.streamed}


def _sglang_answer(resp, url: str) -> tuple[Any, bool]:
    """A whole ``/generate`` answer, as parsed (checked by ``_sglang_row``); no stream returned anything."""
    return resp.json(), False


def _vllm_events(events, url: str, itl: Gaps) -> tuple[dict, list]:
    """A ``/v1/completions`` stream: each chunk with text timed; (the last usage sent, the last choices)."""
    usage: dict = {}
    choices: list = []
    for n, event in enumerate(events):
        ev = http_client.JsonReader(event, url, f"event {n}")
        choices = ev.get("choices", "list", default=[])
        if choices and ev.field("choices", "list").item(0).get("text", "str"):
            itl.chunk_at(time.perf_counter())
        usage = ev.get("usage", "object") or usage
    return usage, choices


def _vllm_answer(resp, url: str) -> tuple[dict, list]:
    """A whole ``/v1/completions`` answer: (its usage, its choices)."""
    answer = http_client.JsonReader(resp.json(dict), url)
    return answer.get("usage", "object", default={}), answer.get("choices", "list", default=[])


# --- vLLM /metrics --------------------------------------------------------------------------------

_PROM_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_POSITION = re.compile(r'position="(\d+)"')


def parse_vllm_spec_metrics(text: str, counters: dict[str, str] = VLLM_COUNTERS) -> dict[str, Any]:
    """Sum the speculative ``counters`` (vLLM's by default) of a Prometheus exposition over all label sets.

    Counters appear with the ``_total`` suffix the exposition format adds; the bare name is accepted
    too. Missing counters are absent from the result (speculation off, or another server).
    """
    wanted = {}
    for key, name in counters.items():
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


def _sglang_metrics(url: str, timeout: float) -> dict[str, Any] | None:
    """SGLang's request counters from ``/metrics``; None where it is off (SGLang without ``--enable-metrics``)."""
    try:
        with http_client.request(f"{url}/metrics", None, timeout) as resp:
            text = resp.read().decode("utf-8", "replace")
    except (http_client.RequestTimeout, http_client.BadResponse):
        raise
    except DraftlabError:
        return None
    return parse_vllm_spec_metrics(text, SGLANG_COUNTERS)


def _sglang_delta(before: dict | None, after: dict | None) -> dict[str, Any] | None:
    """The counters' growth over the run and SGLang's server-wide accept length over it: the tokens of
    verify steps (each request's prefill token excluded) per verify, as ``avg_spec_accept_length``."""
    if before is None or after is None or not all(k in before and k in after for k in SGLANG_COUNTERS):
        return None
    delta: dict[str, Any] = {k: int(round(after[k] - before[k])) for k in SGLANG_COUNTERS}
    verifies = delta["verify_calls"]
    delta["accept_length"] = (delta["generation_tokens"] - delta["requests"]) / verifies if verifies > 0 else None
    return delta


def _metrics_delta(before: dict, after: dict) -> dict[str, Any] | None:
    if not all(k in before and k in after for k in VLLM_COUNTERS):
        return None
    delta: dict[str, Any] = {k: int(round(after[k] - before[k])) for k in VLLM_COUNTERS}
    a, b = after.get("accepted_per_pos") or [], before.get("accepted_per_pos") or []
    b = b + [0.0] * (len(a) - len(b))
    delta["accepted_per_pos"] = [int(round(x - y)) for x, y in zip(a, b)]
    return delta
