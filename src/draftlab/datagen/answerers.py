"""Two ways to have the target answer prompts: in this process (transformers) or through a server.

- :class:`TransformersAnswerer` loads the target with transformers and decodes greedy prompts in
  left-padded batches (sampled ones one at a time, each under ``seed + prompt id``). It cannot load a
  1T-parameter model; it is the fallback for small targets and machines without a server.
- :class:`ServerAnswerer` sends each prompt to ``/v1/chat/completions`` of running servers (SGLang,
  vLLM or draftlab's builtin one: the server applies the chat template; several servers of one model
  share the prompts), with ``concurrency`` requests in flight per server. A request that fails is retried with backoff (client errors other than 408/429
  are not: they fail the same way again), then reported as a :class:`Failure`; the run goes on. When
  the server itself is gone (``alive()`` false, or every request in a row cannot reach it) the run
  stops with an error: answering nothing is not a result.

Both yield :class:`Answer` or :class:`Failure` per prompt; the server yields them in completion order.
With ``turns="all"`` a multi-turn conversation is answered turn by turn (``prompt_file.turn_segments``):
each user turn goes to the target with its own earlier answers in the context, so every assistant
turn the drafter trains on is the target's (the loss covers them all); ``"last"`` answers only the
final turn after the data's own earlier answers.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Sequence

from draftlab.errors import DraftlabError
from draftlab.formats.prompt_file import Prompt, turn_segments
from draftlab.formats.data import chat_prompt_ids
from draftlab.formats.target_config import text_config
from draftlab.http_client import BadResponse, HTTPStatusError, JsonReader, json_call
from draftlab.serving.server_info import served_model

TURN_MODES = ("all", "last")


@dataclass
class Answer:
    prompt: Prompt
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str | None
    reasoning: str | None = None   # a reasoning parser's separate reasoning_content (SGLang), if any
    truncated_prompt: bool = False  # the transformers path cut the prompt to fit the context
    context: list[dict[str, Any]] | None = None  # what the final answer follows, when turns were regenerated
    turns: int = 1                  # answers the target wrote for this prompt (its tokens are summed above)
    token_ids: list[int] | None = None  # the ids the target emitted for this turn, where the server returned them

    @property
    def message(self) -> dict[str, Any]:
        """This answer as an assistant turn; ``token_ids``: what the target emitted (the token check compares the
        rendering of the stored text with them)."""
        turn: dict[str, Any] = {"role": "assistant", "content": self.text}
        if self.reasoning:
            turn["reasoning_content"] = self.reasoning
        if self.token_ids is not None:
            turn["token_ids"] = list(self.token_ids)
        return turn

    def messages(self) -> list[dict[str, Any]]:
        """The whole conversation: the prompt (or the regenerated context) and this answer."""
        before = self.context if self.context is not None else self.prompt.as_messages()
        return [dict(m) for m in before] + [self.message]


def _joined(prompt: Prompt, answers: list[Answer], context: list[dict[str, Any]]) -> Answer:
    """One Answer for a conversation answered turn by turn: the last turn's text, every turn's tokens."""
    last = answers[-1]
    return Answer(prompt, last.text, sum(a.prompt_tokens for a in answers), sum(a.completion_tokens for a in answers),
                  last.finish_reason, last.reasoning, any(a.truncated_prompt for a in answers), context, len(answers),
                  last.token_ids)


def check_turns(turns: str) -> str:
    if turns not in TURN_MODES:
        raise DraftlabError(f"--turns: expected one of {', '.join(TURN_MODES)}, got {turns!r}")
    return turns


def _segments(prompt: Prompt, turns: str) -> list[list[dict[str, str]]]:
    """What the target is asked, in order: every user turn (``all``), or the whole prompt once (``last``)."""
    return turn_segments(prompt.messages) if turns == "all" else [prompt.as_messages()]


def request_messages(messages) -> list[dict[str, str]]:
    """The messages as sent to a chat template or server: role and content only (an earlier answer's
    ``reasoning_content`` stays in the stored row, not in the request)."""
    return [{"role": m["role"], "content": m["content"]} for m in messages]


@dataclass
class Failure:
    prompt: Prompt
    error: str
    attempts: int


@dataclass(frozen=True)
class Sampling:
    """What decides an answer besides the prompt: greedy when ``temperature`` is 0."""

    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    template_kwargs: tuple[tuple[str, Any], ...] = ()
    # SGLang's separate_reasoning: False asks a server with a reasoning parser for the text as emitted
    separate_reasoning: bool = True

    @property
    def sampled(self) -> bool:
        return self.temperature > 0

    def describe(self) -> str:
        if not self.sampled:
            return "greedy"
        return f"sampled (temperature {self.temperature}, top_p {self.top_p}, seed {self.seed} + prompt id)"


# --- in process ------------------------------------------------------------------------------------


class TransformersAnswerer:
    """The target loaded here; greedy prompts in left-padded batches of ``batch_size``."""

    def __init__(self, target: str, sampling: Sampling, *, device: str | None = None, batch_size: int = 1,
                 trust_remote_code: bool = False, turns: str = "all"):
        from draftlab.models.target import load_target, load_tokenizer, read_config  # deferred: loads torch
        from draftlab.models.devices import resolve_device  # deferred: loads torch

        if batch_size < 1:
            raise DraftlabError(f"--batch-size: expected a positive integer, got {batch_size}")
        self.sampling, self.turns = sampling, check_turns(turns)
        self.context = int(text_config(read_config(target)).get("max_position_embeddings") or 0) or None
        self.tokenizer = load_tokenizer(target, trust_remote_code=trust_remote_code)
        where = resolve_device(device, what="generate: --device") if device is not None else None
        self.model = load_target(target, device=where, trust_remote_code=trust_remote_code)
        self.device = next(self.model.parameters()).device
        self.eos = _eos_ids(self.model, self.tokenizer)
        tok = self.tokenizer
        self.pad = tok.pad_token_id if tok.pad_token_id is not None else (self.eos[0] if self.eos else 0)
        # Sampled prompts one at a time, so that prompt i is always sampled under seed + i.
        self.batch_size = 1 if sampling.sampled else int(batch_size)

    def describe(self) -> dict[str, Any]:
        return {"engine": "transformers", "device": str(self.device), "batch_size": self.batch_size}

    def _job(self, messages: list[dict[str, Any]]) -> tuple[list[int], int, bool]:
        """Prompt ids and token budget; a prompt too long for the context keeps its end (the header)."""
        ids = chat_prompt_ids(self.tokenizer, request_messages(messages), dict(self.sampling.template_kwargs))
        budget, cut = self.sampling.max_new_tokens, False
        if self.context is not None and len(ids) + budget > self.context:
            keep = max(1, self.context - budget)
            if keep < len(ids):
                ids, cut = ids[-keep:], True
            budget = min(budget, self.context - len(ids))
        return ids, budget, cut

    def answer(self, prompts: Iterable[Prompt]) -> Iterator[Answer | Failure]:
        batch: list[Prompt] = []
        for prompt in prompts:
            batch.append(prompt)
            if len(batch) == self.batch_size:
                yield from self._batch(batch)
                batch = []
        if batch:
            yield from self._batch(batch)

    def _batch(self, prompts: list[Prompt]) -> Iterator[Answer]:
        # round r answers the r-th question of every conversation that has one (one round with "last")
        plans = [_segments(p, self.turns) for p in prompts]
        history: list[list[dict[str, Any]]] = [[] for _ in prompts]
        answers: list[list[Answer]] = [[] for _ in prompts]
        for r in range(max(len(plan) for plan in plans)):
            idx = [i for i, plan in enumerate(plans) if r < len(plan)]
            for i in idx:
                history[i] += plans[i][r]
            for i, a in zip(idx, self._generate([(prompts[i], history[i]) for i in idx])):
                answers[i].append(a)
                if r + 1 < len(plans[i]):
                    history[i].append(a.message)
        for p, h, a in zip(prompts, history, answers):
            yield _joined(p, a, h)

    def _generate(self, items: list[tuple[Prompt, list[dict[str, Any]]]]) -> list[Answer]:
        """One answer per (prompt, messages), decoded together (left-padded)."""
        import torch  # deferred: torch (seconds), only the transformers engine needs it

        jobs = [self._job(messages) for _, messages in items]
        width = max(len(ids) for ids, _, _ in jobs)
        x = torch.tensor([[self.pad] * (width - len(ids)) + ids for ids, _, _ in jobs], device=self.device)
        att = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids, _, _ in jobs], device=self.device)
        s = self.sampling
        kwargs: dict[str, Any] = dict(max_new_tokens=min(b for _, b, _ in jobs), eos_token_id=self.eos or None,
                                      pad_token_id=self.pad, attention_mask=att)
        if s.sampled:
            torch.manual_seed(s.seed + items[0][0].id)
            kwargs.update(do_sample=True, temperature=float(s.temperature), top_p=s.top_p, top_k=0)
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        with torch.no_grad():
            seqs = self.model.generate(x, **kwargs)[:, width:].tolist()
        out = []
        for (prompt, _), (ids, budget, cut), seq in zip(items, jobs, seqs):
            new, stopped = _until_eos(seq, self.eos)
            emitted = seq[:len(new) + 1] if stopped else new  # the end-of-turn id the target emitted too
            out.append(Answer(prompt, self.tokenizer.decode(new, skip_special_tokens=True), len(ids), len(new),
                              "stop" if stopped else "length", truncated_prompt=cut, token_ids=emitted))
        return out


def _until_eos(seq: list[int], eos: list[int]) -> tuple[list[int], bool]:
    """The tokens before the first end-of-turn id (a batched row carries padding after it)."""
    for j, tok in enumerate(seq):
        if tok in eos:
            return seq[:j], True
    return seq, False


def _eos_ids(model, tokenizer) -> list[int]:
    """End-of-turn ids: the generation config's, the model config's and the tokenizer's."""
    ids: list[int] = []
    for source in (getattr(model, "generation_config", None), model.config):
        value = getattr(source, "eos_token_id", None)
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if v is not None and v not in ids:
                ids.append(int(v))
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(int(tokenizer.eos_token_id))
    return ids


# --- through a server --------------------------------------------------------------------------------


RETRY_STATUSES = (408, 429)
BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0)


class ServerGone(DraftlabError):
    """The server stopped answering altogether: the run stops (resumable) instead of failing every prompt."""


class ServerAnswerer:
    """Prompts to ``/v1/chat/completions`` of one or more servers of the same model: ``concurrency``
    requests in flight per server (as SpecForge's regeneration counts it), each sent to the server with
    the fewest in flight; a request is retried ``retries`` times, on another server after a connection
    error when there is one."""

    def __init__(self, urls: str | Sequence[str], sampling: Sampling, *, concurrency: int = 8, retries: int = 3,
                 request_timeout_s: float = 1800.0, alive: Callable[[], bool] | None = None,
                 backoff_s: tuple[float, ...] | None = None, turns: str = "all"):
        if concurrency < 1:
            raise DraftlabError(f"--concurrency: expected a positive integer, got {concurrency}")
        if retries < 0:
            raise DraftlabError(f"--retries: expected an integer >= 0, got {retries}")
        self.urls = [u.rstrip("/") for u in ([urls] if isinstance(urls, str) else urls)]
        if not self.urls:
            raise DraftlabError("--url: expected at least one server address")
        self.sampling, self.turns = sampling, check_turns(turns)
        self.retries = int(retries)
        self.concurrency = int(concurrency) * len(self.urls)
        self.timeout = float(request_timeout_s)
        self.alive = alive or (lambda: True)
        self.backoff_s = backoff_s or BACKOFF_S
        self.models = {u: served_model(u, min(self.timeout, 60.0)) for u in self.urls}
        self._in_flight = dict.fromkeys(self.urls, 0)
        self._lock = threading.Lock()
        self._unreachable_in_a_row = 0

    def describe(self) -> dict[str, Any]:
        return {"engine": "server", "url": self.urls[0], "urls": self.urls, "model": self.models[self.urls[0]],
                "concurrency": self.concurrency, "retries": self.retries}

    def _take(self, avoid: str | None) -> str:
        """The server with the fewest requests in flight (not ``avoid``, when there is another)."""
        with self._lock:
            choices = [u for u in self.urls if u != avoid] or self.urls
            url = min(choices, key=lambda u: self._in_flight[u])
            self._in_flight[url] += 1
            return url

    def _release(self, url: str) -> None:
        with self._lock:
            self._in_flight[url] -= 1

    def _one(self, prompt: Prompt) -> Answer | Failure:
        """The prompt's answer; turn by turn with ``turns="all"`` (a turn that fails fails the prompt)."""
        history: list[dict[str, Any]] = []
        answers: list[Answer] = []
        segments = _segments(prompt, self.turns)
        for r, segment in enumerate(segments):
            history += segment
            res = self._ask(prompt, history)
            if isinstance(res, Failure):
                res.error = f"turn {r + 1} of {len(segments)}: {res.error}" if len(segments) > 1 else res.error
                return res
            answers.append(res)
            if r + 1 < len(segments):
                history.append(res.message)
        return _joined(prompt, answers, history)

    def _ask(self, prompt: Prompt, messages: list[dict[str, Any]]) -> Answer | Failure:
        """One request, retried; a Failure once the retries are spent."""
        attempts, last, avoid = 0, "", None
        while attempts <= self.retries:
            attempts += 1
            url = self._take(avoid)
            try:
                reply = json_call(f"{url}/v1/chat/completions",
                                  chat_request(self.models[url], prompt, self.sampling, messages), self.timeout, dict)
                return _answer(prompt, reply, f"{url}/v1/chat/completions", self.sampling.max_new_tokens)
            except HTTPStatusError as exc:
                last = str(exc)
                if 400 <= exc.status < 500 and exc.status not in RETRY_STATUSES:
                    break  # the same request fails the same way: no point retrying
            except DraftlabError as exc:
                last = str(exc)
                avoid = url if "cannot reach the server" in last else None
            finally:
                self._release(url)
            if not self.alive():
                break
            if attempts <= self.retries:
                time.sleep(self.backoff_s[min(attempts - 1, len(self.backoff_s) - 1)])
        return Failure(prompt, " ".join(last.split())[:500], attempts)

    def answer(self, prompts: Iterable[Prompt]) -> Iterator[Answer | Failure]:
        """Answers in completion order; at most ``concurrency`` prompts are held at once (streamed input)."""
        it = iter(prompts)
        pending: set[Future] = set()
        with ThreadPoolExecutor(self.concurrency, thread_name_prefix="generate") as pool:
            try:
                for prompt in it:
                    pending.add(pool.submit(self._one, prompt))
                    if len(pending) >= self.concurrency:
                        done, pending = wait(pending, return_when=FIRST_COMPLETED)
                        yield from self._results(done)
                while pending:
                    done, pending = wait(pending, return_when=FIRST_COMPLETED)
                    yield from self._results(done)
            finally:
                for f in pending:
                    f.cancel()

    def _results(self, done: set[Future]) -> Iterator[Answer | Failure]:
        for f in done:
            res = f.result()
            if isinstance(res, Failure) and "cannot reach the server" in res.error:
                self._unreachable_in_a_row += 1
            else:
                self._unreachable_in_a_row = 0
            if not self.alive() or self._unreachable_in_a_row >= max(3, self.concurrency):
                why = res.error if isinstance(res, Failure) else "it exited"
                raise ServerGone(f"{', '.join(self.urls)}: the server stopped answering ({why}); "
                                 "the answers so far are kept and a rerun resumes after them")
            yield res


def chat_request(model: str, prompt: Prompt, sampling: Sampling,
                 messages: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The OpenAI chat request for one prompt, or for one turn of it (``messages``: the conversation so
    far); the contract tests check it with SGLang's own ``ChatCompletionRequest``. Greedy is temperature
    0; sampled prompts carry ``seed + prompt id``."""
    body: dict[str, Any] = {"model": model, "messages": request_messages(messages or prompt.messages),
                            "max_completion_tokens": sampling.max_new_tokens, "temperature": sampling.temperature,
                            "stream": False,
                            # the ids the target emitted (SGLang 0.5.23: choices[].response_token_ids), kept with
                            # the answer so the token check can compare the training rendering with them
                            "return_token_ids": True}
    if sampling.sampled:
        body.update(top_p=sampling.top_p, seed=sampling.seed + prompt.id)
    if sampling.template_kwargs:
        body["chat_template_kwargs"] = dict(sampling.template_kwargs)
    if not sampling.separate_reasoning:
        body["separate_reasoning"] = False
    return body


def _emitted_ids(value: Any, where: str) -> list[int] | None:
    """``response_token_ids`` as a list of token ids, None where the server returned none."""
    if value is None:
        return None
    if not isinstance(value, list) or not all(type(t) is int and t >= 0 for t in value):
        raise BadResponse(f"{where}: choices[0].response_token_ids: expected a list of token ids")
    return value


def _answer(prompt: Prompt, reply: Any, where: str, max_new_tokens: int | None = None) -> Answer:
    """An OpenAI chat completion as an Answer; a malformed one (wrong shape, or token counts no server
    can report: negative, or more completion tokens than the request's budget) fails this prompt."""
    doc = JsonReader(reply, where)
    choice = doc.field("choices", "list").item(0)
    message = choice.field("message")
    usage = doc.field("usage", required=False) or JsonReader({}, where, "usage")
    counts = {k: usage.get(k, "int", default=0) for k in ("prompt_tokens", "completion_tokens")}
    answer = Answer(prompt, message.get("content", "str", default=""), counts["prompt_tokens"],
                    counts["completion_tokens"], choice.get("finish_reason", "str"),
                    message.get("reasoning_content", "str"), token_ids=_emitted_ids((choice.value or {}).get("response_token_ids"), where))
    for key, value in counts.items():
        if value < 0:
            raise BadResponse(f"{where}: usage.{key} is {value}; a token count cannot be negative")
    if max_new_tokens is not None and answer.completion_tokens > max_new_tokens:
        raise BadResponse(f"{where}: usage.completion_tokens {answer.completion_tokens} is above the "
                          f"max_completion_tokens {max_new_tokens} this request asked for; refusing to record it")
    return answer
