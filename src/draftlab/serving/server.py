"""The builtin HTTP server: draftlab's engine behind the subset of SGLang's protocol the benchmark uses.

Why it exists: the embedded default (CPU, CI) must run the same benchmark client as production
SGLang, so this server answers ``/health``, ``/health_generate``, ``/generate`` (``meta_info`` with
``completion_tokens``, ``spec_verify_ct``, ...), ``/get_server_info`` (``internal_states[0].
avg_spec_accept_length``), ``/v1/models`` and ``/v1/completions`` in the same shapes. Standard
library only (``http.server``). The requests in flight are decoded together, up to
``max_batch_size`` rows per forward (``scheduler``, continuous batching), each one's output the
same as if it ran alone; greedy decoding only (temperature 0).

No request can wedge it: prompts beyond the context are refused and ``max_new_tokens`` is capped by
the context; a generation stops between two decode steps when its client disconnects or the server
is shutting down; ``/health_generate`` answers 503 when the engine stays busy; bodies are size
limited and every request must arrive within ``read_timeout_s`` (docs/RELIABILITY.md). No client
can starve the others: a request carries at most ``max_prompts`` prompts, and the prompts of
different requests take turns for the batch's rows (``scheduler``). No client code runs here:
``chat_template_kwargs`` are variables for the model's own chat template, never a template.
"""

from __future__ import annotations

import inspect
import io
import json
import os
import re
import select
import signal
import sys
import threading
import time
import uuid
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable

from draftlab import __version__
from draftlab.deadline_io import DeadlineReader, peer_closed
from draftlab.serving.engine import Engine, GenerationResult, meta_info
from draftlab.errors import DraftlabError
from draftlab.serving.scheduler import DEFAULT_MAX_BATCH_SIZE, Scheduler, Ticket

LOOPBACK = ("127.0.0.1", "localhost", "::1")
LISTEN_LINE = "draftlab-serve listening on http://{host}:{port}"
MAX_PROMPTS = 256  # prompts in one /generate or /v1/completions request (--max-prompts-per-request)
MIN_BODY = 1024 * 1024  # body limit: this, or BODY_BYTES_PER_TOKEN per context token if larger
BODY_BYTES_PER_TOKEN = 64  # generous: a token is at most a few UTF-8 characters, or ~8 bytes as an id in JSON
HEALTH_TIMEOUT_S = 20.0  # SGLang's /health_generate waits as long for its probe request
READ_TIMEOUT_S = 30.0
STOP_GRACE_S = 3.0
_POLL_S = 0.25


class HTTPFailure(Exception):
    """Answered with ``status`` and this message in SGLang's error JSON; ``close`` drops the connection."""

    status = 500

    def __init__(self, message: str, status: int | None = None, close: bool = False):
        super().__init__(message)
        self.status = status or self.status
        self.close = close


class BadRequest(HTTPFailure):
    """A client error: answered with HTTP 400 (or the given 4xx) and this message."""

    status = 400


class Unavailable(HTTPFailure):
    """The server cannot take the request now (engine busy past a bound, shutting down): HTTP 503."""

    status = 503


class ClientGone(Exception):
    """The client disconnected while its request waited or ran; nobody is left to answer."""


class ServerState:
    """The engine, its tokenizer and the server-wide counters, shared by all handler threads."""

    def __init__(self, engine: Engine, *, model_path: str, drafter_path: str | None = None, tokenizer=None,
                 device: str = "cpu", dtype: str | None = None, health_timeout_s: float = HEALTH_TIMEOUT_S,
                 read_timeout_s: float = READ_TIMEOUT_S, max_body_bytes: int | None = None,
                 max_batch_size: int = DEFAULT_MAX_BATCH_SIZE, max_prompts: int = MAX_PROMPTS,
                 cuda_graph_max_bs: int | None = None):
        from draftlab.serving.static_decode import enable_static

        self.engine = engine
        self.tokenizer = tokenizer
        self.model_path = model_path
        self.drafter_path = drafter_path
        self.device = device
        self.dtype = dtype
        self.health_timeout_s = float(health_timeout_s)
        self.read_timeout_s = float(read_timeout_s)
        ctx = engine.context_length or 0
        self.max_body_bytes = int(max_body_bytes or max(MIN_BODY, BODY_BYTES_PER_TOKEN * ctx))
        self.max_prompts = int(max_prompts)
        self.stopping = threading.Event()  # set on SIGTERM: every wait and generation ends
        self._active = 0  # requests being handled, so a shutdown can let their answers go out
        self._idle = threading.Condition()
        self.lock = threading.Lock()  # held by the scheduler around every engine step
        # on CUDA: static KV cache + CUDA graphs up to cuda_graph_max_bs (issue 26); reported by server_info
        self.decoding = {**enable_static(engine, max_batch_size, cuda_graph_max_bs), "cuda_graph_max_bs":
                         max_batch_size if cuda_graph_max_bs is None else cuda_graph_max_bs}
        self.scheduler = Scheduler(engine, max_batch_size, lock=self.lock)
        self._stats = threading.Lock()
        self.started = time.time()
        self.verify_total = 0  # verify forwards over all requests
        self.accepted_total = 0  # accepted draft tokens over all requests
        self.requests = 0
        self.last_gen_throughput = 0.0

    # -- requests ---------------------------------------------------------------------------------
    def run(self, ids: list[int], max_new_tokens: int, ignore_eos: bool, stop_ids: list[int],
            record: bool = True, client_gone: Callable[[], bool] | None = None,
            wait_s: float | None = None) -> GenerationResult:
        """Generate for one request (see ``run_many``)."""
        return self.run_many([ids], max_new_tokens, ignore_eos, stop_ids, record, client_gone, wait_s)[0]

    def run_many(self, prompts: list[list[int]], max_new_tokens: int, ignore_eos: bool, stop_ids: list[int],
                 record: bool = True, client_gone: Callable[[], bool] | None = None,
                 wait_s: float | None = None) -> list[GenerationResult]:
        """Generate for each prompt, all of them decoded in the batch with the other requests in flight.

        Checked before anything is queued (context, vocabulary); while waiting and between decode
        steps, a disconnected client (``client_gone``) or a shutdown ends the request. ``wait_s``
        bounds the whole wait for the results (``Unavailable`` after it).
        """
        tickets: list[Ticket] = []
        group = object()  # this request's prompts take turns with other requests' (scheduler)
        try:
            for ids in prompts:
                try:
                    tickets.append(self.scheduler.submit(ids, max_new_tokens, ignore_eos=ignore_eos,
                                                         stop_token_ids=stop_ids, group=group))
                except DraftlabError as exc:
                    raise BadRequest(str(exc)) from None
            results = [self._wait(t, client_gone or (lambda: False), wait_s, time.monotonic()) for t in tickets]
        finally:
            for t in tickets:
                if not t.done.is_set():
                    self.scheduler.cancel(t)
        if record:
            with self._stats:
                for res in results:
                    self.requests += 1
                    self.verify_total += res.spec_verify_ct
                    self.accepted_total += sum(res.accept_by_position)
                    decode = res.e2e_time - res.prefill_time
                    if decode > 0 and res.completion_tokens > 1:
                        self.last_gen_throughput = (res.completion_tokens - 1) / decode
        return results

    def _wait(self, t: Ticket, gone: Callable[[], bool], wait_s: float | None, start: float) -> GenerationResult:
        while not t.done.wait(_POLL_S):
            if self.stopping.is_set():
                raise Unavailable("the server is shutting down" + (
                    f" (generation stopped after {t.tokens} tokens)" if t.started else ""))
            if gone():
                raise ClientGone(f"client disconnected; generation stopped after {t.tokens} tokens" if t.started
                                 else "client disconnected while waiting for the engine")
            if wait_s is not None and time.monotonic() - start >= wait_s:
                raise Unavailable(f"the engine has been busy for more than {wait_s:g}s")
        if isinstance(t.error, DraftlabError):
            raise BadRequest(str(t.error))
        if t.error is not None:
            raise t.error
        return t.result

    def begin_request(self) -> None:
        with self._idle:
            self._active += 1

    def end_request(self) -> None:
        with self._idle:
            self._active -= 1
            self._idle.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no request is being handled; False if some still are after ``timeout`` seconds."""
        with self._idle:
            return self._idle.wait_for(lambda: self._active == 0, timeout)

    def encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            raise BadRequest(f"the target {self.model_path} has no tokenizer; send 'input_ids' instead of text")
        return list(self.tokenizer.encode(text))

    def decode(self, ids: list[int]) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def server_info(self) -> dict[str, Any]:
        eng = self.engine
        state: dict[str, Any] = {"last_gen_throughput": self.last_gen_throughput, "num_requests": self.requests}
        if eng.speculative and self.verify_total:
            # SGLang's cumulative figure: (accepted drafts + one bonus per verify) / verifies
            state["avg_spec_accept_length"] = (self.accepted_total + self.verify_total) / self.verify_total
        return {
            "model_path": self.model_path,
            "tokenizer_path": self.model_path if self.tokenizer is not None else None,
            "served_model_name": self.model_path,
            "context_length": eng.context_length,
            "speculative_algorithm": "EAGLE3" if eng.speculative else None,
            "speculative_draft_model_path": self.drafter_path,
            "speculative_num_steps": eng.num_steps if eng.speculative else None,
            "speculative_eagle_topk": 1 if eng.speculative else None,
            "speculative_num_draft_tokens": eng.num_steps + 1 if eng.speculative else None,
            "device": self.device,
            "dtype": self.dtype,
            "tp_size": 1,
            "max_batch_size": self.scheduler.max_batch_size,
            **self.decoding,
            "backend": "draftlab-builtin",
            "version": f"draftlab {__version__}",
            "internal_states": [state],
        }


# -- request parsing --------------------------------------------------------------------------------

# SGLang's SamplingParams keywords (an unknown one is refused, as SGLang's constructor refuses it), with
# the value at which each one does nothing; any other value of these needs sampling the builtin lacks.
SAMPLING_NO_OP = {"top_p": 1.0, "min_p": 0.0, "frequency_penalty": 0.0, "presence_penalty": 0.0,
                  "repetition_penalty": 1.0, "min_new_tokens": 0, "json_schema": None, "regex": None,
                  "ebnf": None, "structural_tag": None, "logit_bias": None}
SAMPLING_HANDLED = {"max_new_tokens", "temperature", "top_k", "n", "stop", "stop_token_ids", "ignore_eos"}
SAMPLING_HARMLESS = {"skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim", "stream_interval",
                     "custom_params", "sampling_seed", "seed"}


def _int(value: Any, key: str, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise BadRequest(f"{key}: expected an integer >= {minimum}, got {value!r}")
    return value


def _bool(value: Any, key: str) -> bool:
    if not isinstance(value, bool):
        raise BadRequest(f"{key}: expected true or false, got {value!r}")
    return value


def _known_sampling_keys(params: dict[str, Any], where: str) -> None:
    for key, value in params.items():
        if key in SAMPLING_HANDLED or key in SAMPLING_HARMLESS:
            continue
        if key not in SAMPLING_NO_OP:
            raise BadRequest(f"{where}{key}: unknown sampling parameter")
        if value is not None and value != SAMPLING_NO_OP[key]:
            raise BadRequest(f"{where}{key} is {value!r}: the builtin server decodes greedily only; "
                             f"leave it out or send {SAMPLING_NO_OP[key]!r}")


def _greedy_params(params: dict[str, Any], where: str) -> None:
    """Reject anything but greedy decoding clearly (SGLang treats top_k 1 as greedy too)."""
    temp = params.get("temperature")
    top_k = params.get("top_k")
    if temp is not None:
        if isinstance(temp, bool) or not isinstance(temp, (int, float)):
            raise BadRequest(f"{where}temperature: expected a number, got {temp!r}")
        if temp != 0 and top_k != 1:
            raise BadRequest(
                f"{where}temperature is {temp}: the builtin server decodes greedily only; send temperature 0"
            )
    n = params.get("n")
    if n not in (None, 1):
        raise BadRequest(f"{where}n is {n!r}: the builtin server returns one completion per prompt")
    stop = params.get("stop")
    if stop not in (None, "", []):
        raise BadRequest(f"{where}stop strings are not supported by the builtin server; use stop_token_ids")


def _stop_ids(params: dict[str, Any], where: str) -> list[int]:
    ids = params.get("stop_token_ids") or []
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise BadRequest(f"{where}stop_token_ids: expected a list of integers, got {ids!r}")
    return ids


def _prompts(state: ServerState, text: Any, input_ids: Any, where: str) -> tuple[list[list[int]], bool]:
    """Token id lists for a single or batched prompt, and whether the request was a batch."""
    if (text is None) == (input_ids is None):
        raise BadRequest(f"{where}: send exactly one of 'text' or 'input_ids'")
    if text is not None:
        if isinstance(text, str):
            return [state.encode(text)], False
        if isinstance(text, list) and text and all(isinstance(t, str) for t in text):
            return [state.encode(t) for t in text], True
        raise BadRequest(f"{where}: 'text' must be a string or a non-empty list of strings")
    if isinstance(input_ids, list) and input_ids and all(_is_id(t) for t in input_ids):
        return [list(input_ids)], False
    if (isinstance(input_ids, list) and input_ids
            and all(isinstance(x, list) and x and all(_is_id(t) for t in x) for x in input_ids)):
        return [list(x) for x in input_ids], True
    raise BadRequest(f"{where}: 'input_ids' must be a non-empty list of token ids (or a list of such lists)")


def _is_id(t: Any) -> bool:
    return isinstance(t, int) and not isinstance(t, bool)


def _check_all(state: ServerState, prompts: list[list[int]], max_new: int, where: str = "request") -> None:
    """Refuse a batch before any of it runs when it is too large or one prompt cannot be served."""
    if len(prompts) > state.max_prompts:
        raise BadRequest(f"{where}: {len(prompts)} prompts in one request; this server takes at most "
                         f"{state.max_prompts} (--max-prompts-per-request): send them in several requests", 413)
    for ids in prompts:
        try:
            state.engine.check_request(ids, max_new)
        except DraftlabError as exc:
            raise BadRequest(str(exc)) from None


def handle_generate(state: ServerState, body: dict[str, Any], t_arrival: float,
                    client_gone: Callable[[], bool] | None = None) -> Any:
    """``POST /generate`` (SGLang shape)."""
    params = body.get("sampling_params")
    params = {} if params is None else params
    if not isinstance(params, dict):
        raise BadRequest("sampling_params: expected an object")
    _known_sampling_keys(params, "sampling_params.")
    _greedy_params(params, "sampling_params.")
    max_new = params.get("max_new_tokens")
    max_new = _int(128 if max_new is None else max_new, "sampling_params.max_new_tokens", 1)
    ignore_eos = _bool(params.get("ignore_eos", False), "sampling_params.ignore_eos")
    stop_ids = _stop_ids(params, "sampling_params.")
    prompts, batched = _prompts(state, body.get("text"), body.get("input_ids"), "/generate")
    _check_all(state, prompts, max_new, "/generate")
    outs = []
    for res in state.run_many(prompts, max_new, ignore_eos, stop_ids, client_gone=client_gone):
        meta = meta_info(res, e2e_latency=time.perf_counter() - t_arrival)
        meta["id"] = uuid.uuid4().hex
        outs.append({"text": state.decode(res.output_ids), "output_ids": res.output_ids, "meta_info": meta})
    return outs if batched else outs[0]


def handle_completions(state: ServerState, body: dict[str, Any],
                       client_gone: Callable[[], bool] | None = None) -> dict[str, Any]:
    """``POST /v1/completions`` (OpenAI shape with ``usage``)."""
    _greedy_params(body, "")
    max_new = body.get("max_tokens")
    max_new = _int(16 if max_new is None else max_new, "max_tokens", 1)
    ignore_eos = _bool(body.get("ignore_eos", False), "ignore_eos")
    prompt = body.get("prompt")
    if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and isinstance(prompt[0], str)):
        prompts, _ = _prompts(state, prompt, None, "/v1/completions: prompt")
    else:
        prompts, _ = _prompts(state, None, prompt, "/v1/completions: prompt")
    stop_ids = _stop_ids(body, "")
    _check_all(state, prompts, max_new, "/v1/completions")
    choices, prompt_tokens, completion_tokens = [], 0, 0
    for i, res in enumerate(state.run_many(prompts, max_new, ignore_eos, stop_ids, client_gone=client_gone)):
        prompt_tokens += res.prompt_tokens
        completion_tokens += res.completion_tokens
        choices.append({"index": i, "text": state.decode(res.output_ids), "logprobs": None,
                        "finish_reason": res.finish_reason, "token_ids": res.output_ids})
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": state.model_path,
        "choices": choices,
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    }


def _chat_messages(body: dict[str, Any]) -> list[dict[str, str]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages: expected a non-empty list of {role, content} objects")
    out = []
    for i, m in enumerate(messages):
        role = m.get("role") if isinstance(m, dict) else None
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list):  # OpenAI content parts: text only
            if not all(isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
                       for part in content):
                raise BadRequest(f"messages[{i}].content: the builtin server takes text parts only")
            content = "".join(part["text"] for part in content)
        if not isinstance(role, str) or not isinstance(content, str):
            raise BadRequest(f"messages[{i}]: expected 'role' and 'content' strings")
        out.append({"role": role, "content": content})
    return out


TEMPLATE_KWARG_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
TEMPLATE_KWARG_CHARS = 1024
# apply_chat_template's own parameters: a client must not pick the template (``chat_template`` is
# Jinja that would run here), its tools, or how it tokenizes; special tokens are the model's
RESERVED_TEMPLATE_KWARGS = frozenset((
    "chat_template", "tools", "documents", "conversation", "messages", "add_generation_prompt",
    "continue_final_message", "tokenize", "padding", "truncation", "max_length", "return_tensors", "return_dict",
    "return_assistant_tokens_mask", "tokenizer_kwargs", "processor_kwargs", "kwargs", "raise_exception",
    "strftime_now", "bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token",
    "additional_special_tokens"))


def _template_kwargs(tokenizer, kwargs: Any) -> dict[str, Any]:
    """``chat_template_kwargs`` as variables for the model's own template, and nothing else.

    Keys are identifiers that are none of ``apply_chat_template``'s own parameters (``chat_template``
    above all: a client-supplied Jinja template would be rendered on this server, and a nested loop
    pins a core after the client has gone) and no special-token name; values are scalars (strings
    up to 1,024 characters). Anything else is a 400.
    """
    if kwargs is None:
        return {}
    if not isinstance(kwargs, dict):
        raise BadRequest("chat_template_kwargs: expected an object")
    try:
        own = set(inspect.signature(tokenizer.apply_chat_template).parameters)
    except (TypeError, ValueError):
        own = set()
    for key, value in kwargs.items():
        if key in RESERVED_TEMPLATE_KWARGS or key in own:
            raise BadRequest(f"chat_template_kwargs.{key}: refused; the server renders the model's own chat "
                             f"template only (template variables such as enable_thinking are allowed)")
        if not TEMPLATE_KWARG_KEY.fullmatch(key):
            raise BadRequest(f"chat_template_kwargs: key {key[:80]!r} is not a template variable name")
        if value is not None and not isinstance(value, (bool, int, float, str)):
            raise BadRequest(f"chat_template_kwargs.{key}: expected a string, number, true/false or null, "
                             f"got {type(value).__name__}")
        if isinstance(value, str) and len(value) > TEMPLATE_KWARG_CHARS:
            raise BadRequest(f"chat_template_kwargs.{key}: a string of {len(value)} characters; at most "
                             f"{TEMPLATE_KWARG_CHARS}")
    return dict(kwargs)


def handle_chat_completions(state: ServerState, body: dict[str, Any],
                            client_gone: Callable[[], bool] | None = None) -> dict[str, Any]:
    """``POST /v1/chat/completions`` (OpenAI shape, as SGLang answers it): the target's chat template
    (``chat_template_kwargs`` passed to it) renders the messages, the reply is the assistant's turn."""
    from draftlab.formats.data import chat_prompt_ids

    _greedy_params(body, "")
    if body.get("stream"):
        raise BadRequest("stream: the builtin server answers whole responses only; send stream false")
    if state.tokenizer is None:
        raise BadRequest(f"the target {state.model_path} has no tokenizer to apply a chat template with")
    max_new = body.get("max_completion_tokens", body.get("max_tokens"))
    # OpenAI's default is "up to the context"; the engine caps any budget at the context.
    max_new = _int(state.engine.context_length or 128 if max_new is None else max_new, "max_completion_tokens", 1)
    ignore_eos = _bool(body.get("ignore_eos", False), "ignore_eos")
    kwargs = _template_kwargs(state.tokenizer, body.get("chat_template_kwargs"))
    messages = _chat_messages(body)
    try:
        ids = chat_prompt_ids(state.tokenizer, messages, kwargs)
    except Exception as exc:  # a template that refuses the conversation (roles, kwargs) is the client's input
        raise BadRequest(f"messages: the chat template cannot render them ({type(exc).__name__}: {exc})") from None
    stop_ids = _stop_ids(body, "")
    _check_all(state, [ids], 1)  # the prompt itself must fit; the answer budget is capped by the engine
    res = state.run(ids, max_new, ignore_eos, stop_ids, client_gone=client_gone)
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": state.model_path,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": state.decode(res.output_ids)},
                     "logprobs": None, "finish_reason": res.finish_reason, "matched_stop": None}],
        "usage": {"prompt_tokens": res.prompt_tokens, "completion_tokens": res.completion_tokens,
                  "total_tokens": res.prompt_tokens + res.completion_tokens},
    }


# -- HTTP -------------------------------------------------------------------------------------------


class Handler(BaseHTTPRequestHandler):
    server_version = f"draftlab/{__version__}"
    protocol_version = "HTTP/1.1"

    @property
    def state(self) -> ServerState:
        return self.server.state  # type: ignore[attr-defined]

    def setup(self) -> None:
        super().setup()
        # every read of a request (request line, headers, body) shares one deadline: slowloris-proof
        self._reader = DeadlineReader(self.connection)
        self.rfile = io.BufferedReader(self._reader)

    def handle_one_request(self) -> None:
        # the deadline covers the wait for the next request on a kept-alive connection too
        self._reader.deadline = time.monotonic() + self.state.read_timeout_s
        super().handle_one_request()

    def client_gone(self) -> bool:
        """Whether the client has hung up (polled between decode steps)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
        except (OSError, ValueError):
            return True
        return bool(readable) and peer_closed(self.connection)

    def log_message(self, fmt: str, *args: Any) -> None:
        sys.stderr.write(f"[draftlab-serve] {self.address_string()} {fmt % args}\n")

    def _send(self, status: int, payload: Any) -> None:
        body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        self._reader.deadline = None
        self.connection.settimeout(self.state.read_timeout_s)  # a client that never reads is dropped too
        self.send_response(status)
        self.send_header("Content-Type", "application/json" if not isinstance(payload, bytes) else "text/plain")
        self.send_header("Content-Length", str(len(body)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, message: str) -> None:
        # SGLang's error shape ({"object": "error", "message", "type", "code"}) plus an OpenAI-style "error" object
        phrase = HTTPStatus(status).phrase.replace(" ", "")
        self._send(status, {"error": {"message": message, "type": phrase, "code": status},
                            "object": "error", "message": message, "type": phrase, "param": None, "code": status})

    def _body(self) -> dict[str, Any]:
        if self.headers.get("Transfer-Encoding"):
            raise BadRequest("chunked request bodies are not supported; send Content-Length", 411, close=True)
        raw_length = (self.headers.get("Content-Length") or "0").strip()
        if not (raw_length.isascii() and raw_length.isdigit()):  # "²".isdigit() is True, int("²") fails
            raise BadRequest(f"Content-Length: expected a non-negative integer, got {raw_length!r}", close=True)
        length = int(raw_length)
        if length > self.state.max_body_bytes:
            raise BadRequest(f"request body of {length} bytes is larger than the limit of "
                             f"{self.state.max_body_bytes} bytes", 413, close=True)
        try:
            raw = self.rfile.read(length) if length else b""
        except TimeoutError:
            raise BadRequest(f"request body not received within {self.state.read_timeout_s:g}s", 408,
                             close=True) from None
        if len(raw) < length:
            raise ClientGone("client closed the connection before sending the whole body")
        try:
            body = json.loads(raw or b"{}")
        except (ValueError, RecursionError) as exc:
            raise BadRequest(f"request body is not valid JSON ({str(exc)[:200]})") from None
        if not isinstance(body, dict):
            raise BadRequest("request body: expected a JSON object")
        return body

    def do_GET(self) -> None:  # noqa: N802 (http.server naming)
        self._route("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._route("POST")

    def _route(self, method: str) -> None:
        self.state.begin_request()
        try:
            self._dispatch(method)
        finally:
            self.state.end_request()

    def _dispatch(self, method: str) -> None:
        t0 = time.perf_counter()
        path = self.path.split("?", 1)[0].rstrip("/") or "/"
        try:
            if path == "/health":
                self._send(200, b"")
            elif path == "/health_generate":
                ids = [0] if self.state.tokenizer is None else (self.state.encode("hi") or [0])
                self.state.run(ids, 1, True, [], record=False, client_gone=self.client_gone,
                               wait_s=self.state.health_timeout_s)
                self._send(200, b"")
            elif path in ("/get_server_info", "/server_info"):
                self._send(200, self.state.server_info())
            elif path == "/get_model_info":
                self._send(200, {"model_path": self.state.model_path, "is_generation": True})
            elif path == "/v1/models":
                self._send(200, {"object": "list", "data": [{
                    "id": self.state.model_path, "object": "model", "created": int(self.state.started),
                    "owned_by": "draftlab", "root": self.state.model_path}]})
            elif path == "/flush_cache":
                self._send(200, b"Cache flushed.")
            elif path == "/generate" and method == "POST":
                self._send(200, handle_generate(self.state, self._body(), t0, self.client_gone))
            elif path == "/v1/completions" and method == "POST":
                self._send(200, handle_completions(self.state, self._body(), self.client_gone))
            elif path == "/v1/chat/completions" and method == "POST":
                self._send(200, handle_chat_completions(self.state, self._body(), self.client_gone))
            elif path in ("/generate", "/v1/completions", "/v1/chat/completions"):
                self._error(405, f"{path}: use POST")
            else:
                self._error(404, f"{path}: no such endpoint")
        except HTTPFailure as exc:
            self.close_connection = self.close_connection or exc.close
            self._error(exc.status, str(exc))
        except ClientGone as exc:
            self.log_message("%s", exc)
            self.close_connection = True
        except (BrokenPipeError, ConnectionResetError, TimeoutError) as exc:
            self.log_message("connection lost while answering: %s", exc)
            self.close_connection = True
        except Exception as exc:  # a bug: answer 500 and keep serving, with the traceback in the log
            import traceback

            traceback.print_exc()
            self._error(500, f"internal error: {type(exc).__name__}: {exc}")


class DraftlabHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # socketserver's default listen backlog is 5: a client opening 64 connections at once (generate-data,
    # a benchmark at high concurrency) had the rest of its SYNs dropped and retried a second later, and
    # the batch ran a fifth full. The kernel caps this at net.core.somaxconn.
    request_queue_size = 1024

    def handle_error(self, request, client_address) -> None:
        """A client that hung up while http.server itself answered it (a 400 for a broken request
        line, say) is one log line, not a traceback; anything else keeps socketserver's traceback."""
        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError, TimeoutError)):
            sys.stderr.write(f"[draftlab-serve] {client_address[0]} connection lost: {sys.exc_info()[1]}\n")
            return
        super().handle_error(request, client_address)

    def __init__(self, address: tuple[str, int], state: ServerState):
        import socket

        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.state = state
        super().__init__(address, Handler)


def make_server(state: ServerState, host: str = "127.0.0.1", port: int = 0) -> DraftlabHTTPServer:
    """Bind (port 0 = a free port, see ``server.server_address``) without starting to serve."""
    try:
        return DraftlabHTTPServer((host, port), state)
    except OSError as exc:
        raise DraftlabError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def load_state(target: str | Path, drafter: str | Path | None = None, *, num_steps: int = 3, device: str = "cpu",
               dtype: str | None = None, trust_remote_code: bool = False, **limits: Any) -> ServerState:
    """Load models and tokenizer (if the target folder has one) into a ready ``ServerState``.

    ``limits``: ``health_timeout_s``, ``read_timeout_s``, ``max_body_bytes``, ``max_batch_size``, ``max_prompts``,
    ``cuda_graph_max_bs``
    (see ``ServerState``).
    """
    from draftlab.models.target import load_tokenizer

    engine = Engine.from_folders(target, drafter, num_steps=num_steps, device=device, dtype=dtype,
                                 trust_remote_code=trust_remote_code)
    tokenizer = None
    tdir = Path(target)
    if any((tdir / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        tokenizer = load_tokenizer(tdir, trust_remote_code=trust_remote_code)
    return ServerState(engine, model_path=str(target), drafter_path=str(drafter) if drafter else None,
                       tokenizer=tokenizer, device=device, dtype=dtype, **limits)


def serve(state: ServerState, host: str = "127.0.0.1", port: int = 0) -> int:
    """Serve until SIGTERM/SIGINT; prints the machine-readable listening line first.

    A signal stops every generation at its next decode step and every wait for the engine (their
    clients get 503); if requests are still being handled ``STOP_GRACE_S`` after the listener has
    closed, the process exits anyway.
    """
    if host not in LOOPBACK:
        print(f"WARNING: draftlab serve is binding {host}, reachable from other machines; it has no "
              f"authentication. Use --host 127.0.0.1 unless you mean it.", file=sys.stderr, flush=True)
    httpd = make_server(state, host, port)
    bound_port = httpd.server_address[1]

    def stop(signum, frame):
        print(f"draftlab-serve: signal {signum}, shutting down", file=sys.stderr, flush=True)
        state.stopping.set()
        threading.Thread(target=httpd.shutdown, daemon=True).start()

    old = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    print(LISTEN_LINE.format(host=host, port=bound_port), flush=True)
    try:
        httpd.serve_forever(poll_interval=0.2)
    finally:
        httpd.server_close()
        for s, h in old.items():
            signal.signal(s, h)
    if not state.wait_idle(STOP_GRACE_S):  # in-flight requests end at their next step and answer 503
        print(f"draftlab-serve: requests still running {STOP_GRACE_S:g}s after the signal; exiting anyway",
              file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(0)
    print("draftlab-serve: stopped", file=sys.stderr, flush=True)
    return 0
