"""The builtin server's shared state: the engine, its scheduler and counters, and the HTTP failures.

Every handler thread of :mod:`draftlab.serving.server` holds the one :class:`ServerState`; requests
run through its scheduler (continuous batching), and a request that must fail raises one of the
:class:`HTTPFailure` kinds here, which the handler answers in SGLang's error shape.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from draftlab import __version__
from draftlab.errors import DraftlabError
from draftlab.engine.core import Engine, GenerationResult
from draftlab.engine.scheduler import DEFAULT_MAX_BATCH_SIZE, Scheduler, Ticket
from draftlab.engine.static_decode import enable_static
from draftlab.serving.metrics import ServerMetrics
from draftlab.serving.sglang_meta import WEIGHT_VERSION

MAX_PROMPTS = 256  # prompts in one /generate or /v1/completions request (--max-prompts-per-request)
MIN_BODY = 1024 * 1024  # body limit: this, or BODY_BYTES_PER_TOKEN per context token if larger
BODY_BYTES_PER_TOKEN = 64  # generous: a token is at most a few UTF-8 characters, or ~8 bytes as an id in JSON
HEALTH_TIMEOUT_S = 20.0  # SGLang's /health_generate waits as long for its probe request
READ_TIMEOUT_S = 30.0
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
        self.weight_version = WEIGHT_VERSION  # SGLang's --weight-version; a drafter swap may name a new one
        self.stopping = threading.Event()  # set on SIGTERM: every wait and generation ends
        self._active = 0  # requests being handled, so a shutdown can let their answers go out
        self._idle = threading.Condition()
        self.lock = threading.Lock()  # held by the scheduler around every engine step
        # on CUDA: static KV cache + CUDA graphs up to cuda_graph_max_bs; reported by server_info
        self.decoding = {**enable_static(engine, max_batch_size, cuda_graph_max_bs), "cuda_graph_max_bs":
                         max_batch_size if cuda_graph_max_bs is None else cuda_graph_max_bs}
        self.scheduler = Scheduler(engine, max_batch_size, lock=self.lock)
        self._stats = threading.Lock()
        self.started = time.time()
        self.verify_total = 0  # verify forwards since the start or the last /flush_cache
        self.accepted_total = 0  # accepted draft tokens since then
        self.proposed_total = 0  # proposed draft tokens since then (SGLang's rule: verifies x (draft tokens - 1))
        self.requests = 0
        self.last_gen_throughput = 0.0
        self.metrics = ServerMetrics(model_path, self._gauges())

    # -- requests ---------------------------------------------------------------------------------
    def run(self, ids: list[int], max_new_tokens: int, ignore_eos: bool, stop_ids: list[int],
            record: bool = True, client_gone: Callable[[], bool] | None = None,
            wait_s: float | None = None, min_new_tokens: int = 0) -> GenerationResult:
        """Generate for one request (see ``run_many``)."""
        return self.run_many([ids], max_new_tokens, ignore_eos, stop_ids, record, client_gone, wait_s,
                             min_new_tokens)[0]

    def run_many(self, prompts: list[list[int]], max_new_tokens: int, ignore_eos: bool, stop_ids: list[int],
                 record: bool = True, client_gone: Callable[[], bool] | None = None,
                 wait_s: float | None = None, min_new_tokens: int = 0) -> list[GenerationResult]:
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
                                                         stop_token_ids=stop_ids, group=group,
                                                         min_new_tokens=min_new_tokens))
                except DraftlabError as exc:
                    raise BadRequest(str(exc)) from None
            results = [self._wait(t, client_gone or (lambda: False), wait_s, time.monotonic()) for t in tickets]
        finally:
            for t in tickets:
                if not t.done.is_set():
                    self.scheduler.cancel(t)
        if record:
            self.record(results, tickets)
        return results

    def record(self, results: list[GenerationResult], tickets: list[Ticket], streaming: bool = False) -> None:
        """Count finished requests (and their ``tickets``' timings) into the server-wide figures
        (``/server_info``, ``/metrics``)."""
        with self._stats:
            for res, ticket in zip(results, tickets):
                self.requests += 1
                self.verify_total += res.spec_verify_ct
                self.accepted_total += sum(res.accept_by_position)
                self.proposed_total += res.spec_verify_ct * max(self.engine.num_draft_tokens - 1, 0)
                decode = res.e2e_time - res.prefill_time
                if decode > 0 and res.completion_tokens > 1:
                    self.last_gen_throughput = (res.completion_tokens - 1) / decode
                self.metrics.observe(res.prompt_tokens, res.completion_tokens, res.spec_verify_ct, ticket.marks,
                                     streaming)

    def flush_cache(self) -> tuple[int, bytes]:
        """SGLang's ``/flush_cache``: when no request runs or waits, the speculative averages start
        again (``/server_info``, ``sglang:spec_accept_*``), so a benchmark's figure is its own run's;
        otherwise a 400, as SGLang answers, and nothing changes."""
        running, queued = self.scheduler.counts()
        if running or queued:
            return 400, (f"Cache not flushed because there are pending requests. #queue-req: {queued}, "
                         f"#running-req: {running}\n").encode()
        with self._stats:
            self.verify_total = self.accepted_total = self.proposed_total = 0
        return 200, (b"Cache flushed.\nPlease check backend logs for more details. (When there are running or "
                     b"waiting requests, the operation will not be performed.)\n")

    def avg_spec_accept_length(self) -> float | None:
        """SGLang's cumulative figure since the start or the last flush: (accepted drafts + one bonus per
        verify) / verifies; None before the first verify or without a drafter."""
        with self._stats:
            if not (self.engine.speculative and self.verify_total):
                return None
            return (self.accepted_total + self.verify_total) / self.verify_total

    def _gauges(self) -> dict[str, Any]:
        """SGLang's scheduler gauges, read at each scrape of ``/metrics``."""
        eng = self.engine

        def rate() -> float:
            with self._stats:
                return self.accepted_total / self.proposed_total if self.proposed_total else 0.0

        return {"num_running_reqs": lambda: self.scheduler.counts()[0],
                "num_queue_reqs": lambda: self.scheduler.counts()[1],
                "gen_throughput": lambda: self.last_gen_throughput,
                "spec_accept_length": lambda: self.avg_spec_accept_length() or 0.0,
                "spec_accept_rate": rate,
                "spec_num_steps": lambda: eng.num_steps if eng.speculative else 0,
                "spec_num_draft_tokens": lambda: eng.num_draft_tokens if eng.speculative else 0}

    def dtype_name(self) -> str:
        """The dtype the target runs in (``float32``), as ``--dtype`` names it: the one asked for or the
        weights' own."""
        if self.dtype and self.dtype != "auto":
            return self.dtype
        param = next(self.engine.target.parameters(), None)
        return str(param.dtype).removeprefix("torch.") if param is not None else "auto"

    def _wait(self, t: Ticket, gone: Callable[[], bool], wait_s: float | None, start: float) -> GenerationResult:
        while not t.done.wait(_POLL_S):
            self.check_alive(t, gone)
            if wait_s is not None and time.monotonic() - start >= wait_s:
                raise Unavailable(f"the engine has been busy for more than {wait_s:g}s")
        return self.outcome(t)

    def check_alive(self, t: Ticket, gone: Callable[[], bool]) -> None:
        """Raise when the server is stopping or the client of ticket ``t`` has gone."""
        if self.stopping.is_set():
            raise Unavailable("the server is shutting down" + (
                f" (generation stopped after {t.tokens} tokens)" if t.started else ""))
        if gone():
            raise ClientGone(f"client disconnected; generation stopped after {t.tokens} tokens" if t.started
                             else "client disconnected while waiting for the engine")

    @staticmethod
    def outcome(t: Ticket) -> GenerationResult:
        """A finished ticket's result, or its error as the HTTP failure it is."""
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
        avg = self.avg_spec_accept_length()
        if avg is not None:
            state["avg_spec_accept_length"] = avg
        return {
            "model_path": self.model_path,
            "tokenizer_path": self.model_path if self.tokenizer is not None else None,
            "served_model_name": self.model_path,
            "context_length": eng.context_length,
            "speculative_algorithm": "EAGLE3" if eng.speculative else None,
            "speculative_draft_model_path": self.drafter_path,
            "speculative_num_steps": eng.num_steps if eng.speculative else None,
            "speculative_eagle_topk": eng.topk if eng.speculative else None,
            "speculative_num_draft_tokens": eng.num_draft_tokens if eng.speculative else None,
            "device": self.device,
            "dtype": self.dtype_name(),
            "tp_size": 1,
            "dp_size": 1,
            # what SGLang clients read besides the speculative settings (bench_serving, router, openai shims)
            "max_running_requests": self.scheduler.max_batch_size,
            "max_req_input_len": (eng.context_length - 1) if eng.context_length else None,
            "skip_tokenizer_init": self.tokenizer is None,
            "weight_version": self.weight_version,
            "startup_time": self.started,
            "frontend": "python",
            "max_batch_size": self.scheduler.max_batch_size,
            **self.decoding,
            "backend": "draftlab-builtin",
            "version": f"draftlab {__version__}",
            "internal_states": [state],
        }
