"""The builtin server's continuous batcher: one thread decodes every request in flight together.

Why: with one request at a time, a benchmark client at concurrency 8 measures a queue. Handler
threads ``submit`` a request and wait on its ticket; the scheduler thread admits waiting requests
(up to ``max_batch_size`` rows; each is prefilled alone and joins the batch), runs one decode step
or speculative cycle for all rows, and hands each request its result the step it finishes. A
cancelled ticket (client gone, shutdown, health probe timed out) leaves the batch at the next step.

Fair admission: the tickets of one HTTP request (a ``/generate`` with many prompts) share a
``group``, and free rows go to the waiting groups in turn (round robin), not first come first
served. One request with 3,000 prompts takes turns with every other client: a second request, or
``/health_generate``, waits for one free row, not for the 3,000.

``lock`` is held around every prefill and step: whoever holds it has the engine to itself.

Streaming: after a request's prefill and after every step, its ticket *publishes* how many of its
tokens are final (``Ticket.published``) and wakes whoever waits in ``Ticket.wait_tokens``. Nothing is
queued per token: a reader that falls behind finds all the new tokens at its next wake, so a slow
client costs no memory and never slows the batch.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from collections import OrderedDict, deque
from typing import Iterable, Sequence

import torch

from draftlab.engine.core import Engine, GenerationResult, GenerationStopped
from draftlab.errors import DraftlabError
from draftlab.engine.static_decode import make_decoder

DEFAULT_MAX_BATCH_SIZE = 8


class Ticket:
    """One submitted request: its arguments, and (once ``done``) its result or error."""

    def __init__(self, ids: list[int], max_new: int, stops: set[int], min_new: int = 0):
        self.ids, self.max_new, self.stops, self.min_new = ids, max_new, stops, min_new
        self.done = threading.Event()
        self.result: GenerationResult | None = None
        self.error: BaseException | None = None
        self.cancelled = False
        self.row = None  # set once admitted (prefilled)
        self.published = 0  # tokens of row.res.output_ids that a verify step (or the prefill) has accepted
        self._progress = threading.Condition()
        self.submitted = time.perf_counter()
        self.marks: list[tuple[float, int]] = []  # (seconds since submitted, tokens published): TTFT, ITL

    @property
    def started(self) -> bool:
        return self.row is not None

    @property
    def tokens(self) -> int:
        """Tokens generated so far (0 while waiting)."""
        return 0 if self.row is None else len(self.row.res.output_ids)

    @property
    def partial(self) -> GenerationResult | None:
        """The result so far (read it only up to ``published`` tokens), None while waiting."""
        return None if self.row is None else self.row.res

    def wait_tokens(self, seen: int, timeout: float) -> int:
        """Wait until more than ``seen`` tokens are published or the request ends (or ``timeout``);
        return the number published."""
        with self._progress:
            self._progress.wait_for(lambda: self.published > seen or self.done.is_set(), timeout)
            return self.published

    def _publish(self) -> None:
        if self.row is None:
            return
        with self._progress:
            self._mark(len(self.row.res.output_ids))
            self._progress.notify_all()

    def _mark(self, n: int) -> None:
        if n > self.published:
            self.marks.append((time.perf_counter() - self.submitted, n))
        self.published = n

    def _finish(self, result: GenerationResult | None = None, error: BaseException | None = None) -> None:
        self.result, self.error = result, error
        with self._progress:
            if result is not None:
                self._mark(len(result.output_ids))
            self.done.set()
            self._progress.notify_all()


class Scheduler:
    """Collects submitted requests and decodes them in batches of at most ``max_batch_size`` rows."""

    def __init__(self, engine: Engine, max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
                 lock: threading.Lock | None = None):
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.engine = engine
        self.max_batch_size = int(max_batch_size)
        self.lock = lock or threading.Lock()
        self._queue: OrderedDict[object, deque[Ticket]] = OrderedDict()  # group -> its waiting tickets
        self._cv = threading.Condition()
        self._decoder = make_decoder(engine)  # the static-cache decoder on CUDA, else BatchDecoder
        self._thread: threading.Thread | None = None
        self.peak_rows = 0  # the most rows one step has decoded together (tests, benchmarks)

    def submit(self, ids: Sequence[int], max_new_tokens: int, *, ignore_eos: bool = False,
               stop_token_ids: Iterable[int] = (), group: object = None, min_new_tokens: int = 0) -> Ticket:
        """Queue one prompt (checked and capped by the engine first; ``DraftlabError`` if refused).

        ``group``: the prompts of one request share it and take turns with other groups for free
        rows (None: a group of its own). ``min_new_tokens``: no stop id or EOS before this many tokens."""
        budget, stops = self.engine.limits(ids, max_new_tokens, ignore_eos, stop_token_ids)
        if min_new_tokens and not getattr(self._decoder, "holds_stops", False):
            raise DraftlabError("min_tokens (min_new_tokens) is not supported by this server's decoder (CUDA "
                                "graphs or a draft tree choose the greedy token); leave it out or send 0")
        ticket = Ticket(list(map(int, ids)), budget, stops, min_new_tokens)
        with self._cv:
            self._queue.setdefault(ticket if group is None else group, deque()).append(ticket)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="draftlab-scheduler", daemon=True)
                self._thread.start()
            self._cv.notify_all()
        return ticket

    def counts(self) -> tuple[int, int]:
        """(requests being decoded, requests waiting for a row): SGLang's running and queued requests."""
        with self._cv:
            return len(self._decoder), sum(len(q) for q in self._queue.values())

    def cancel(self, ticket: Ticket) -> None:
        """Give up on a request: it leaves the queue or the batch before the next step."""
        ticket.cancelled = True
        with self._cv:
            self._cv.notify_all()

    # -- the scheduler thread ---------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._queue or len(self._decoder))
                admit = []
                while self._queue and len(self._decoder) + len(admit) < self.max_batch_size:
                    admit.append(self._next_ticket())
            with self.lock, torch.inference_mode():
                try:
                    self._admit(admit)
                    self._drop_cancelled()
                    self.peak_rows = max(self.peak_rows, len(self._decoder))
                    stepping = [r.tag for r in self._decoder.rows]
                    for row in self._decoder.step():
                        row.tag._finish(row.res)
                    for t in stepping:
                        t._publish()
                except Exception as exc:  # a bug or an engine failure: fail the batch, keep serving

                    traceback.print_exc(file=sys.stderr)
                    for t in admit + [r.tag for r in self._decoder.rows]:
                        if not t.done.is_set():
                            t._finish(error=exc)
                    self._decoder = make_decoder(self.engine)

    def _next_ticket(self) -> Ticket:
        """The first waiting group's next ticket; that group then goes to the back of the line."""
        group, waiting = next(iter(self._queue.items()))
        ticket = waiting.popleft()
        if waiting:
            self._queue.move_to_end(group)
        else:
            del self._queue[group]
        return ticket

    def _admit(self, tickets: list[Ticket]) -> None:
        for t in tickets:
            if t.cancelled:
                t._finish(error=GenerationStopped(0))
                continue
            t.row = self._decoder.add(t.ids, t.max_new, t.stops, tag=t, **({"min_new": t.min_new} if t.min_new else {}))
            if t.row.done:
                t._finish(t.row.res)
            else:
                t._publish()  # the prefill's token: a stream's first

    def _drop_cancelled(self) -> None:
        gone = [r for r in self._decoder.rows if r.tag.cancelled]
        if gone:
            self._decoder.remove(gone)
            for r in gone:
                r.tag._finish(error=GenerationStopped(len(r.res.output_ids)))
