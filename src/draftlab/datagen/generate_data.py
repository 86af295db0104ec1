"""``draftlab generate-data``: the target answers a prompt set and the conversations become fine-tune data.

Why: a drafter learns to predict *its target's* next token, so the best fine-tune data is the target's
own output on prompts like the ones it will serve (SpecForge's data regeneration does the same through
SGLang servers). Output is JSONL, one conversation per prompt, sorted by prompt id::

    {"messages": [..the prompt.., {"role": "assistant", "content": <generated>}], "id": <the record's own id>}

A multi-turn prompt is answered turn by turn by default (``turns="all"``, as SpecForge regenerates):
every assistant turn of the row is the target's, each written with the target's earlier answers in
its context; ``turns="last"`` keeps the data's own earlier answers and regenerates the last turn only.

Two engines (:mod:`draftlab.datagen.answerers`): a server (``server=`` a launch spec, started and
always torn down like a benchmark server, or ``url=`` one already running) with ``concurrency``
requests in flight and the chat template applied by the server; or transformers in this process.

At production scale a run takes days, so it is resumable and exact (:mod:`draftlab.datagen.answer_shards`):
answers go to shards keyed by prompt id as they arrive; a killed run (SIGKILL, a lost node) started
again answers only what is missing; a prompt that keeps failing is retried, then listed in the stats
instead of stopping the run. The final file is written atomically once every prompt is answered (or
failed), and its content depends neither on the order answers arrived in nor on where a run stopped:
greedy answers, or sampling seeded per prompt (``seed + prompt id``).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from draftlab.errors import DraftlabError, require_int
from draftlab.settings.model import schema_default
from draftlab.fsutil import write_json
from draftlab.datagen.answer_shards import AnswerShards
from draftlab.datagen.answerers import (Answer, Failure, Sampling, ServerAnswerer, TransformersAnswerer,
                                        check_turns)
from draftlab.formats.prompt_file import Prompt, iter_prompts, read_prompts  # noqa: F401 - read_prompts re-exported
from draftlab.serving.launch import ServerSpec, running_server, server_fingerprint
from draftlab.serving.server_info import served_model, server_info

LIST_LIMIT = 1000  # failures/skips listed by id in the stats (all are counted)


def generate(
    target: str | os.PathLike,
    prompts: str | os.PathLike,
    out: str | os.PathLike,
    *,
    max_new_tokens: int | None = None,
    temperature: float | None = None,
    top_p: float = 1.0,
    seed: int | None = None,
    limit: int | None = None,
    device: str | None = None,
    trust_remote_code: bool = False,
    batch_size: int | None = None,
    server: Any = None,
    server_log: str | os.PathLike | None = None,
    url: str | Sequence[str] | None = None,
    concurrency: int | None = None,
    retries: int | None = None,
    request_timeout_s: float = 1800.0,
    max_prompt_chars: int | None = None,
    max_failed_fraction: float | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
    turns: str | None = None,
    separate_reasoning: bool | None = None,
    state_dir: str | os.PathLike | None = None,
    stats: str | os.PathLike | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Answer every prompt of ``prompts`` (the first ``limit``) and write the conversations to ``out``.

    Engine: ``server`` (a ``ServerSpec`` or a mapping of one: launched, used, torn down) or ``url`` (a running
    server), else transformers in this process (``device``, ``batch_size``). ``temperature`` None or 0
    is greedy. State lives in ``state_dir`` (default ``<out>.parts``) until the final file is written;
    ``stats`` (a JSON file) records counts, throughput, failures and the server. Returns the stats.
    A setting left None takes the experiment schema's default (``data.*``, ``train.seed``), as the
    command line and the pipeline do.
    """
    sampling, turns, knobs = _settings(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                                       seed=seed, batch_size=batch_size, concurrency=concurrency, retries=retries,
                                       max_failed_fraction=max_failed_fraction, turns=turns,
                                       template_kwargs=template_kwargs, separate_reasoning=separate_reasoning)
    batch_size, concurrency, retries, max_failed_fraction = knobs
    engine = _choose_engine(target, sampling, turns, server, url, server_log=server_log, device=device,
                            batch_size=batch_size, trust_remote_code=trust_remote_code, concurrency=concurrency,
                            retries=retries, request_timeout_s=request_timeout_s)
    return _run(engine, prompts, Path(out), state_dir, limit=limit, max_prompt_chars=max_prompt_chars,
                max_failed_fraction=max_failed_fraction, stats=stats, progress=progress)


def _run(engine: _Engine, prompts: str | os.PathLike, out: Path, state_dir: str | os.PathLike | None, *,
         limit: int | None, max_prompt_chars: int | None, max_failed_fraction: float,
         stats: str | os.PathLike | None, progress: bool) -> dict[str, Any]:
    """Answer the prompts the state folder lacks, merge every stored answer into ``out``, then remove the
    state; returns the stats (also written to ``stats``).

    The answers stay in the state folder when too many prompts failed (one error) so that a rerun asks
    only for the rest; the engine is started only when something is left to answer.
    """
    state = Path(state_dir) if state_dir else out.with_name(out.name + ".parts")
    t0 = time.perf_counter()
    plan = _Plan.read(prompts, limit, max_prompt_chars)
    identity = _identity(engine.target, engine.spec, _what_urls_serve(engine.urls) if engine.urls else None,
                         engine.sampling, engine.trust_remote_code, engine.turns)
    with AnswerShards(state, identity, say=_say) as shards, ExitStack() as stack:
        todo = sum(1 for pid, digest in plan.wanted if not shards.answered(pid, digest))
        resumed = len(plan.wanted) - todo
        if resumed:
            _say(f"generate-data: resuming: {resumed} of {len(plan.wanted)} answers are already stored in {state}")
        described: dict[str, Any] = {}
        server_record: dict[str, Any] | None = None
        failures: list[Failure] = []
        run = _RunCounts()
        if todo:
            answerer, described, server_record = _answerer(stack, engine)
            _answer_all(answerer, plan, shards, run, failures, _Meter(todo, progress), stack)
        seconds = time.perf_counter() - t0
        result = _stats(out, plan, engine.sampling, engine.turns, described, server_record, state, resumed, run,
                        failures, seconds, shards)
        _refuse_too_many_failures(failures, len(plan.wanted), max_failed_fraction, engine.retries, result, stats,
                                  shards, state)
        counts = shards.merge(out, plan.wanted)
        result.update(answers=counts["rows"], prompt_tokens=counts["prompt_tokens"],
                      generated_tokens=counts["completion_tokens"], empty=counts["empty"])
    _remove_state(state)
    result["state_dir"] = None
    if stats:
        write_json(stats, result)
    return result


def _settings(*, max_new_tokens, temperature, top_p, seed, batch_size, concurrency, retries, max_failed_fraction,
              turns, template_kwargs, separate_reasoning) -> tuple[Sampling, str, tuple[int, int, int, float]]:
    """The run's settings, a None taking the schema's default; a bad one is refused naming its flag."""
    def default(value, key):
        return schema_default(key) if value is None else value

    max_new_tokens = default(max_new_tokens, "data.max_new_tokens")
    seed, batch_size = default(seed, "train.seed"), default(batch_size, "data.batch_size")
    concurrency, retries = default(concurrency, "data.concurrency"), default(retries, "data.retries")
    max_failed_fraction = default(max_failed_fraction, "data.max_failed_fraction")
    turns = check_turns(default(turns, "data.turns"))
    require_int("--max-new-tokens", max_new_tokens)
    require_int("--batch-size", batch_size)
    require_int("--concurrency", concurrency)
    require_int("--retries", retries, 0)
    if temperature is not None and not 0 <= temperature < math.inf:
        raise DraftlabError(f"--temperature: expected a finite value >= 0, got {temperature}")
    if not 0 < top_p <= 1:
        raise DraftlabError(f"--top-p: expected a value in (0, 1], got {top_p}")
    if not 0 <= max_failed_fraction <= 1:
        raise DraftlabError(f"--max-failed-fraction: expected a fraction in [0, 1], got {max_failed_fraction}")
    sampling = Sampling(max_new_tokens, float(temperature or 0.0), float(top_p), int(seed),
                        tuple(sorted((template_kwargs or {}).items())),
                        bool(default(separate_reasoning, "data.separate_reasoning")))
    return sampling, turns, (batch_size, concurrency, retries, max_failed_fraction)


def _answer_all(answerer, plan: _Plan, shards: AnswerShards, run: _RunCounts, failures: list[Failure],
                meter: _Meter, stack: ExitStack) -> None:
    """Store every answer as it comes (a kill loses none); the engine goes down before the merge."""
    run.started = time.perf_counter()
    try:
        for res in answerer.answer(plan.pending(shards)):
            if isinstance(res, Failure):
                failures.append(res)
            else:
                shards.append(res.prompt.id, res.prompt.digest, _row(res), res.prompt_tokens,
                              res.completion_tokens, res.finish_reason)
                run.add(res)
            meter.update(run.tokens, len(failures))
    finally:
        run.seconds = time.perf_counter() - run.started
        meter.close()
        stack.close()  # the server goes down before the merge: it is not needed any more


def _refuse_too_many_failures(failures: list[Failure], wanted: int, max_failed_fraction: float, retries: int,
                              result: dict[str, Any], stats: str | os.PathLike | None, shards: AnswerShards,
                              state: Path) -> None:
    """More failed prompts than ``--max-failed-fraction`` allows: stats written, one error, answers kept."""
    failed = len(failures)
    if failed <= max_failed_fraction * wanted:
        return
    if stats:
        write_json(stats, result)
    first = min(failures, key=lambda f: f.prompt.id)
    raise DraftlabError(
        f"generate-data: {failed} of {wanted} prompts failed (retried up to {retries} times), "
        f"more than --max-failed-fraction {max_failed_fraction:g} allows (first: prompt {first.prompt.id}: "
        f"{first.error[:200]}); {len(shards.index)} answers are kept in {state} and a rerun "
        "asks only for the rest" + (f"; see {stats}" if stats else ""))


# --- the prompt plan ---------------------------------------------------------------------------------


class _Plan:
    """Which prompts this run answers: the first ``limit`` of the file, minus those too long to send."""

    def __init__(self, path: str | os.PathLike, limit: int | None, max_chars: int | None):
        self.path, self.limit, self.max_chars = path, limit, max_chars
        self.wanted: list[tuple[int, str]] = []
        self.skipped: list[dict[str, int]] = []
        self.skipped_count = 0
        self.total = 0

    @classmethod
    def read(cls, path: str | os.PathLike, limit: int | None, max_chars: int | None) -> "_Plan":
        if limit is not None and limit < 1:
            raise DraftlabError(f"--limit: expected a positive integer, got {limit}")
        if max_chars is not None and max_chars < 1:
            raise DraftlabError(f"--max-prompt-chars: expected a positive integer, got {max_chars}")
        plan = cls(path, limit, max_chars)
        for p in plan._prompts():
            plan.total += 1
            if max_chars is not None and p.chars > max_chars:
                plan.skipped_count += 1
                if len(plan.skipped) < LIST_LIMIT:
                    plan.skipped.append({"id": p.id, "chars": p.chars})
                continue
            plan.wanted.append((p.id, p.digest))
        return plan

    def _prompts(self) -> Iterator[Prompt]:
        for p in iter_prompts(self.path):
            if self.limit is not None and p.id >= self.limit:
                return
            yield p

    def pending(self, shards: AnswerShards) -> Iterator[Prompt]:
        """The prompts still to answer, read again from the file (a million prompts are never held)."""
        want = {pid for pid, _ in self.wanted}
        for p in self._prompts():
            if p.id in want and not shards.answered(p.id, p.digest):
                yield p


# --- the engine ---------------------------------------------------------------------------------------


def _server_spec(server, sampling: Sampling):
    """The description to launch (a ``ServerSpec``, or a mapping of one read here), checked for generating."""
    spec = server if isinstance(server, ServerSpec) else ServerSpec.from_dict(dict(server), source="generate-data server")
    if spec.drafter is not None:
        raise DraftlabError("generate-data server: key 'drafter': data is generated by the target alone; "
                            "serve it without a drafter")
    if spec.backend == "builtin" and sampling.sampled:
        raise DraftlabError("generate-data: --temperature > 0 with the builtin server, which decodes greedily "
                            "only; use temperature 0, the transformers engine or an SGLang server")
    return spec


@dataclass(frozen=True)
class _Engine:
    """What answers the prompts: a server to launch (``spec``), running servers (``urls``), else
    transformers in this process; with the settings each of them takes."""

    target: str | os.PathLike
    sampling: Sampling
    turns: str
    spec: ServerSpec | None
    urls: list[str]
    server_log: str | os.PathLike | None
    device: str | None
    batch_size: int
    trust_remote_code: bool
    concurrency: int
    retries: int
    request_timeout_s: float


def _choose_engine(target, sampling: Sampling, turns: str, server, url, **settings) -> _Engine:
    """The engine the arguments ask for: a server to launch or running ones, never both."""
    if server is not None and url is not None:
        raise DraftlabError("generate-data: give a server to launch or the --url of a running one, not both")
    spec = _server_spec(server, sampling) if server is not None else None
    urls = [url] if isinstance(url, str) else list(url or [])
    return _Engine(target, sampling, turns, spec, urls, **settings)


def _answerer(stack: ExitStack, engine: _Engine):
    """The engine (and, for a launched server, the server itself, torn down by ``stack``)."""
    spec, urls, sampling, turns = engine.spec, engine.urls, engine.sampling, engine.turns
    if spec is None and not urls:
        a = TransformersAnswerer(str(engine.target), sampling, device=engine.device, batch_size=engine.batch_size,
                                 trust_remote_code=engine.trust_remote_code, turns=turns)
        return a, a.describe(), None
    alive = None
    record: dict[str, Any]
    if spec is not None:
        log = engine.server_log or "generate-data-server.log"
        _say(f"generate-data: launching {' '.join(spec.argv())}")
        srv = stack.enter_context(running_server(spec, log))
        urls = [srv.url]
        alive = srv.alive
        record = {"backend": spec.backend, "fingerprint": server_fingerprint(spec), "argv": spec.argv(),
                  "url": srv.url, "pid": srv.pid, "log": str(log)}
    else:
        record = {"backend": "external", "url": urls[0], "urls": urls}

    info = server_info(urls[0], 30.0)
    if info:
        record["info"] = info
    a = ServerAnswerer(urls, sampling, concurrency=engine.concurrency, retries=engine.retries,
                       request_timeout_s=engine.request_timeout_s, alive=alive, turns=turns)
    return a, a.describe(), record


def _what_urls_serve(urls: list[str]) -> str:
    """The model the running servers serve, as they name it (the same model at another address is the
    same engine); servers of different models cannot share one run."""
    models = {u: str(server_info(u, 30.0).get("model_path") or served_model(u, 30.0)) for u in urls}
    if len(set(models.values())) > 1:
        raise DraftlabError("--url: the servers serve different models ("
                            + ", ".join(f"{u}: {m}" for u, m in models.items()) + "); one run answers with one model")
    return next(iter(models.values()))


def target_fingerprint(target: str | os.PathLike) -> str:
    """A short hash of what the target folder holds (config, tokenizer, weights: sizes and sampled
    bytes, never times): another model behind the same path is another run's answers."""
    from draftlab.training.resume import path_fingerprint  # deferred: loads numpy, torch

    def timeless(fp: Any) -> Any:
        return {k: timeless(v) for k, v in fp.items() if k != "mtime_ns"} if isinstance(fp, dict) else fp

    blob = json.dumps(timeless(path_fingerprint(target)), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def _identity(target, spec, served: str | None, sampling: Sampling, trust_remote_code: bool,
              turns: str) -> dict[str, Any]:
    """What makes two runs' answers interchangeable: the target and engine, and the sampling settings."""
    if spec is not None:
        engine = f"server {server_fingerprint(spec)}"
    elif served is not None:
        engine = f"running server of {served}"
    else:
        engine = "transformers"
    return {"target": os.path.normpath(str(target)), "target_fingerprint": target_fingerprint(target), "engine": engine, "max_new_tokens": sampling.max_new_tokens,
            "temperature": sampling.temperature, "top_p": sampling.top_p if sampling.sampled else None,
            "seed": sampling.seed if sampling.sampled else None, "template_kwargs": dict(sampling.template_kwargs),
            "trust_remote_code": bool(trust_remote_code), "turns": turns,
            # only where set: the answers of runs before this setting existed stay interchangeable
            **({} if sampling.separate_reasoning else {"separate_reasoning": False})}


# --- rows, counts, stats ------------------------------------------------------------------------------


def _row(res: Answer) -> dict[str, Any]:
    row: dict[str, Any] = {"messages": res.messages()}
    if res.prompt.source_id is not None:
        row["id"] = res.prompt.source_id
    return row


class _RunCounts:
    """What this attempt answered (the resumed answers were counted by the attempt that wrote them)."""

    def __init__(self) -> None:
        self.answers = self.tokens = self.prompt_tokens = self.truncated = self.turns = 0
        self.started, self.seconds = 0.0, 0.0  # the answering itself: after the model or server is up

    def add(self, res: Answer) -> None:
        self.answers += 1
        self.tokens += res.completion_tokens
        self.prompt_tokens += res.prompt_tokens
        self.truncated += res.truncated_prompt
        self.turns += res.turns


def _stats(out: Path, plan: _Plan, sampling: Sampling, turns: str, engine: dict, server: dict | None, state: Path,
           resumed: int, run: _RunCounts, failures: list[Failure], seconds: float,
           shards: AnswerShards) -> dict[str, Any]:
    return {
        "out": str(out),
        "prompts": len(plan.wanted),
        "prompts_in_file": plan.total if plan.limit is None else None,
        "limit": plan.limit,
        "answers": None,  # filled once the final file is written
        "resumed_answers": resumed,
        "answered_now": run.answers,
        "failed": len(failures),
        "failures": [{"id": f.prompt.id, "source_id": f.prompt.source_id, "attempts": f.attempts, "error": f.error}
                     for f in sorted(failures, key=lambda f: f.prompt.id)[:LIST_LIMIT]],
        "skipped_long": plan.skipped_count,
        "skipped": plan.skipped,
        "max_prompt_chars": plan.max_chars,
        "truncated_prompts": run.truncated,
        "generated_tokens": None,
        "prompt_tokens": None,
        "empty": None,
        "mode": sampling.describe(),
        "separate_reasoning": sampling.separate_reasoning,
        "turns": turns,
        "answered_turns": run.turns,
        "max_new_tokens": sampling.max_new_tokens,
        "seconds": round(seconds, 3),
        "answering_seconds": round(run.seconds, 3),
        "prompts_per_s": round(run.answers / run.seconds, 3) if run.seconds > 0 else None,
        "tokens_per_s": round(run.tokens / run.seconds, 1) if run.seconds > 0 else None,
        "engine": engine.get("engine", "none (every answer was stored)"),
        "device": engine.get("device"),
        "batch_size": engine.get("batch_size"),
        "concurrency": engine.get("concurrency"),
        "server": server,
        "state_dir": str(state),
        "torn_lines": shards.torn_lines,
        "duplicate_lines": shards.duplicates,
    }


def _remove_state(state: Path) -> None:
    """Remove the state folder's own files once the final file is written (nothing else in it)."""
    for p in list(state.glob("shard-*.jsonl")) + [state / "run.json", state / ".lock"]:
        p.unlink(missing_ok=True)
    try:
        state.rmdir()
    except OSError:
        _say(f"generate-data: {state} holds files draftlab did not write; left in place")


# --- progress -----------------------------------------------------------------------------------------


class _Meter:
    """A progress bar with prompts/s and tokens/s on a terminal; a line every 30 s in a log file."""

    LINE_EVERY_S = 30.0

    def __init__(self, total: int, enabled: bool):
        self.total, self.done, self.t0 = total, 0, time.perf_counter()
        self.tty = enabled and sys.stderr.isatty()
        self.enabled = enabled
        self.bar = None
        self.last_line = self.t0
        if self.tty:
            from tqdm import tqdm  # deferred: tqdm (~100 ms), only on a terminal

            self.bar = tqdm(total=total, desc="generate", unit="prompt", file=sys.stderr, dynamic_ncols=True)

    def update(self, tokens: int, failed: int) -> None:
        self.done += 1
        now = time.perf_counter()
        rate = tokens / max(now - self.t0, 1e-9)
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix_str(f"{rate:,.0f} tok/s, {failed} failed", refresh=False)
        elif self.enabled and (now - self.last_line >= self.LINE_EVERY_S or self.done == self.total):
            self.last_line = now
            _say(f"generate-data: {self.done}/{self.total} prompts, {self.done / (now - self.t0):.2f} prompts/s, "
                 f"{rate:,.0f} tok/s, {failed} failed")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
