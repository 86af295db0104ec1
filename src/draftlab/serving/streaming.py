"""Streaming answers as SGLang 0.5.23 streams them: server-sent events, one per verify step.

Why: clients measure what users feel (time to first token, inter-token latency) from a stream;
a server that answers a stream with one body makes every TTFT equal the end-to-end latency.

- :func:`token_stream` submits one prompt to the scheduler and yields the result each time a step
  (the prefill, a decode step, a verify) has accepted tokens. It keeps no queue: a reader that falls
  behind gets all new tokens at once at its next wake, so memory stays bounded by the response itself.
- the three builders turn that into SGLang's wire formats (``entrypoints/http_server.py``,
  ``openai/serving_completions.py``, ``openai/serving_chat.py`` in the wheel):
  ``/generate`` events carry the cumulative ``text``, ``output_ids`` and ``meta_info`` (speculative
  fields on the last); OpenAI chunks carry the new text, ``finish_reason`` on the last content chunk
  (completions) or a chunk of its own (chat), then a ``usage`` chunk under
  ``stream_options.include_usage``. Every stream ends ``data: [DONE]``.
- :func:`send_sse` writes the events with chunked transfer encoding; a failure before the first
  event is an ordinary HTTP error, one after it an SGLang error event followed by ``[DONE]``.
"""

from __future__ import annotations

import json
import time
import traceback
from typing import Any, Callable, Iterator, NamedTuple

from draftlab.engine.core import GenerationResult
from draftlab.errors import DraftlabError
from draftlab.serving.server_state import BadRequest, ClientGone, HTTPFailure, ServerState
from draftlab.serving.sglang_meta import meta_info, spec_tokens_details

POLL_S = 0.25  # how often a stream waiting for tokens checks for a gone client or a shutdown
DONE = b"data: [DONE]\n\n"

Snapshot = tuple[GenerationResult, int, bool]  # (result so far, tokens final in it, finished)


class Extras(NamedTuple):
    """What an OpenAI stream adds to its chunks: ``stream_options`` and ``return_spec_tokens_details``."""

    include_usage: bool = False  # a usage chunk after the last
    continuous_usage: bool = False  # the usage so far on every content chunk
    spec_details: bool = False  # an ``sglext.spec_tokens_details`` chunk before the usage chunk


class Stream:
    """An answer to send as server-sent events (``events``: the encoded ``data:`` lines)."""

    def __init__(self, events: Iterator[bytes]):
        self.events = events


def token_stream(state: ServerState, ids: list[int], max_new: int, ignore_eos: bool, stop_ids: list[int],
                 client_gone: Callable[[], bool], min_new: int = 0) -> Iterator[Snapshot]:
    """Yield ``(result, n, finished)`` each time tokens are accepted; the last has ``finished``.

    Only ``result.output_ids[:n]`` is final until ``finished`` (the scheduler is still appending).
    A gone client or a shutdown ends the generation at its next step (``ClientGone`` /
    ``Unavailable``); closing the generator cancels it.
    """
    try:
        ticket = state.scheduler.submit(ids, max_new, ignore_eos=ignore_eos, stop_token_ids=stop_ids,
                                        min_new_tokens=min_new)
    except DraftlabError as exc:
        raise BadRequest(str(exc)) from None
    seen = 0
    try:
        while not ticket.done.is_set():
            n = ticket.wait_tokens(seen, POLL_S)
            if ticket.done.is_set():
                break
            state.check_alive(ticket, client_gone)
            if n > seen:
                seen = n
                yield ticket.partial, n, False
        res = state.outcome(ticket)
        state.record([res], [ticket], streaming=True)
        yield res, res.completion_tokens, True
    finally:
        if not ticket.done.is_set():
            state.scheduler.cancel(ticket)


def _event(payload: Any) -> bytes:
    return b"data: " + json.dumps(payload, ensure_ascii=False).encode() + b"\n\n"


def text_upto(state: ServerState, res: GenerationResult, n: int, finished: bool) -> str:
    """The text of the first ``n`` tokens; before the end without a trailing partial character
    (a multi-byte character split over two steps decodes as U+FFFD until its last byte comes)."""
    text = state.decode(res.output_ids[:n])
    return text if finished else text.rstrip("\ufffd")


def generate_events(state: ServerState, snapshots: Iterator[Snapshot], rid: str, t_arrival: float) -> Iterator[bytes]:
    """``/generate`` with ``stream: true``: SGLang's cumulative events."""
    for res, n, finished in snapshots:
        meta = meta_info(res, rid, num_draft_tokens=state.engine.num_draft_tokens,
                         weight_version=state.weight_version, finished=finished,
                         completion_tokens=n, e2e_latency=time.perf_counter() - t_arrival if finished else None)
        yield _event({"text": text_upto(state, res, n, finished), "output_ids": res.output_ids[:n], "meta_info": meta})
    yield DONE


def _usage(res: GenerationResult, n: int | None = None) -> dict[str, int]:
    """OpenAI's usage of ``res`` (of its first ``n`` tokens: a stream's usage so far)."""
    done = res.completion_tokens if n is None else n
    return {"prompt_tokens": res.prompt_tokens, "total_tokens": res.prompt_tokens + done,
            "completion_tokens": done, "reasoning_tokens": 0}


def _tail(state: ServerState, res: GenerationResult | None, head: dict[str, Any], extras: Extras) -> Iterator[bytes]:
    """After the last content chunk, as SGLang sends them: the ``sglext`` chunk (spec details, speculative
    servers only), the ``usage`` chunk (``include_usage``), then ``[DONE]``."""
    if res is not None and extras.spec_details:
        details = spec_tokens_details(res, state.engine.num_draft_tokens)
        if details is not None:
            yield _event({**head, "choices": [], "usage": None, "sglext": {"spec_tokens_details": details}})
    if res is not None and extras.include_usage:
        yield _event({**head, "choices": [], "usage": _usage(res)})
    yield DONE


def completion_events(state: ServerState, snapshots: Iterator[Snapshot], rid: str, model: str,
                      extras: Extras) -> Iterator[bytes]:
    """``/v1/completions`` with ``stream: true``: text deltas, ``finish_reason`` on the last."""
    head = {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model}
    sent, res = 0, None
    for res, n, finished in snapshots:
        text = text_upto(state, res, n, finished)
        reason = res.finish_reason if finished else None
        matched = res.output_ids[-1] if finished and reason == "stop" else None
        yield _event({**head, "choices": [{"index": 0, "text": text[sent:], "logprobs": None, "finish_reason": reason,
                                           "matched_stop": matched}],
                      "usage": _usage(res, n) if extras.continuous_usage else None})
        sent = len(text)
    yield from _tail(state, res, head, extras)


def chat_events(state: ServerState, snapshots: Iterator[Snapshot], rid: str, model: str,
                extras: Extras) -> Iterator[bytes]:
    """``/v1/chat/completions`` with ``stream: true``: a role chunk, content deltas, a finish chunk."""
    head = {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model}
    sent, res = 0, None

    def chunk(delta: dict[str, Any], reason: str | None = None, matched: int | None = None,
              usage: dict[str, int] | None = None) -> bytes:
        body = {**head, "choices": [{"index": 0, "delta": {"reasoning_content": None, **delta}, "logprobs": None,
                                     "finish_reason": reason, "matched_stop": matched}]}
        return _event({**body, "usage": usage} if usage else body)

    first = True
    for res, n, finished in snapshots:
        if first:
            yield chunk({"role": "assistant", "content": ""})
            first = False
        text = text_upto(state, res, n, finished)
        if len(text) > sent:
            yield chunk({"content": text[sent:]}, usage=_usage(res, n) if extras.continuous_usage else None)
            sent = len(text)
    if res is not None:
        reason = res.finish_reason
        yield chunk({}, reason, res.output_ids[-1] if reason == "stop" else None)
    yield from _tail(state, res, head, extras)


def _fail(handler, message: str, status: int) -> None:
    """SGLang's error event, then ``[DONE]``: how a stream already under way says it failed."""
    handler.write_chunk(_event({"error": {"message": message, "type": "invalid_request_error" if status < 500
                                          else "server_error", "code": status}}))
    handler.write_chunk(DONE)


def send_sse(handler, stream: Stream) -> None:
    """Write ``stream`` on ``handler``'s connection (chunked transfer encoding).

    The first event is produced before the status line, so a request refused or failed before its
    first token gets its ordinary HTTP error; a failure after it ends the stream with SGLang's error
    event and ``[DONE]``.
    """
    events = stream.events
    try:
        first = next(events)
    except StopIteration:
        first = DONE
    handler.begin_stream()
    try:
        handler.write_chunk(first)
        for event in events:
            handler.write_chunk(event)
    except HTTPFailure as exc:  # the server is stopping, or the engine failed, mid-stream
        _fail(handler, str(exc), exc.status)
    except (ClientGone, OSError):
        raise  # nobody to tell (the handler closes the connection)
    except Exception as exc:  # a bug: the stream ends with an error event, not a second status line inside it
        traceback.print_exc()
        _fail(handler, f"internal error: {type(exc).__name__}: {exc}", 500)
    finally:
        events.close()
    handler.write_chunk(b"")
