"""Refuse numbers from a server that no correct server can produce, before anything is recorded.

Why: a benchmark result is a claim about a drafter. A server that reports 12 tokens from one
verify pass with 3 draft steps, a negative count, or more tokens than were asked for is broken (or
not the server we think), and its figures must not become a record. Each check raises a one-line
``DraftlabError`` naming the field, the value and the bound.

Bounds, with SGLang's semantics (``spec_verify_ct`` counts target verify passes; the first token
of a request comes from the prefill, not from a verify):

- every count >= 0, every time a finite number >= 0;
- times nest: the builtin server's ``draftlab_prefill_time + draftlab_draft_time + draftlab_verify_time`` and
  ``first_token_latency`` within ``e2e_latency`` (the
  request as the server timed it), and that within the request as the client timed it (plus
  ``TIME_SLACK_S``): no part of a request lasts longer than the request;
- ``spec_verify_ct <= completion_tokens``: every verify pass emits at least one token, so the
  accept length is at least 1;
- ``completion_tokens <= max_new_tokens`` (the client's own request);
- a verify pass emits at most ``T = min(num_steps + 1, num_draft_tokens)`` tokens: a chain of
  ``num_steps`` drafts plus the bonus token, and a tree of depth ``num_steps`` accepts one path of
  at most that length, never more than the ``num_draft_tokens`` it verifies. So
  ``completion_tokens <= spec_verify_ct * T + 1`` and the server's cumulative
  ``avg_spec_accept_length <= T``;
- accepted drafts <= proposed drafts, and <= ``spec_verify_ct * T`` (T rather than ``num_steps``:
  SGLang versions differ on whether the bonus token is counted); per-position accept counts <=
  ``spec_verify_ct``, at most ``num_steps`` positions.

Bounds that need no setting, from the answer's own counts (a bench without ``/server_info`` and
without a plan still has these): a server that claims tokens returns them (``output_ids`` or
``text``; as many ids as ``completion_tokens``); per-position acceptance never rises with depth (a
draft at depth i+1 is accepted only after the one at depth i); and every token after the first comes
from a verify pass, as one of its accepted drafts or its bonus token, so ``completion_tokens <=
accepted drafts + spec_verify_ct + 1`` whatever the settings (the accept length is computed from
these counts, never taken from a server's own ratio).

The server benchmarked is the one planned and stays it: ``/server_info`` before the run, after it
and the plan's settings must name one model and one speculative setting (:func:`check_same_server`).

``num_steps`` and ``num_draft_tokens`` come from the server (``/server_info``) or, when it does not
say (no such endpoint, a server that hides them), from the plan that launched it: without either a
server could report 64 tokens from one verify and have it recorded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from draftlab.errors import DraftlabError

COUNT_KEYS = ("prompt_tokens", "completion_tokens", "spec_verify_ct")
TIME_KEYS = ("e2e_latency", "draftlab_draft_time", "draftlab_verify_time", "draftlab_prefill_time",
             "first_token_latency")
SPLIT_KEYS = ("draftlab_prefill_time", "draftlab_draft_time", "draftlab_verify_time")
TIME_SLACK_S = 0.001  # clock granularity: the server times a request inside the client's own timing of it (50 ms let a 10 ms decode pass for a 1 ms request)


def _setting(info: dict[str, Any], key: str, low: int) -> int | None:
    value = info.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        return None
    return value


def _count(where: str, key: str, value: Any, required: bool = False) -> int | None:
    """A reported count as an int (None when absent, unless ``required``); negative or fractional
    counts are refused."""
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            isinstance(value, float) and not value.is_integer()) or value < 0:
        raise DraftlabError(f"{where}: {key} is {value!r}; expected an integer >= 0")
    return int(value)


@dataclass
class Plausibility:
    """The bounds of one benchmark run: its ``max_new_tokens`` and the server's speculative settings."""

    max_new_tokens: int
    num_steps: int | None = None
    num_draft_tokens: int | None = None

    @classmethod
    def from_server_info(cls, max_new_tokens: int, info: dict[str, Any], num_steps: int | None = None,
                         num_draft_tokens: int | None = None) -> "Plausibility":
        """The server's settings; ``num_steps``/``num_draft_tokens`` (the launch plan's) where it is silent."""
        steps = _setting(info, "speculative_num_steps", 0)
        tokens = _setting(info, "speculative_num_draft_tokens", 1)
        return cls(max_new_tokens, num_steps if steps is None else steps,
                   num_draft_tokens if tokens is None else tokens)

    @property
    def per_verify(self) -> int | None:
        """T: the most tokens one verify pass can emit (None when the server did not say)."""
        bounds = [b for b in (None if self.num_steps is None else self.num_steps + 1, self.num_draft_tokens)
                  if b is not None]
        return min(bounds) if bounds else None

    def _settings_text(self) -> str:
        parts = [f"{k} {v}" for k, v in (("speculative_num_steps", self.num_steps),
                                          ("speculative_num_draft_tokens", self.num_draft_tokens)) if v is not None]
        return ", ".join(parts)

    def check_sglang_meta(self, meta: dict[str, Any], where: str, accept_keys: tuple[str, str] | None,
                          latency_s: float | None = None) -> None:
        """One ``/generate`` answer's ``meta_info``; ``accept_keys`` is the (accepted, proposed) pair it uses;
        ``latency_s`` the request's time as the client measured it."""
        counts = {k: _count(where, f"meta_info.{k}", meta.get(k)) for k in COUNT_KEYS}
        self._check_times(meta, where, latency_s)
        completion, verify = counts["completion_tokens"], counts["spec_verify_ct"]
        if completion is not None:
            self._check_completion(completion, where, "meta_info.completion_tokens")
        if completion is not None and verify is not None and verify > completion:
            raise DraftlabError(
                f"{where}: meta_info.spec_verify_ct {verify} is above completion_tokens {completion}: every "
                f"verify pass emits at least one token (accept length {completion / verify:.3f} < 1); refusing "
                f"to record it")
        t = self.per_verify
        if completion is not None and verify and t is not None and completion > verify * t + 1:
            raise DraftlabError(
                f"{where}: meta_info.completion_tokens {completion} is impossible with spec_verify_ct {verify}: "
                f"at most {verify * t + 1} ({t} tokens per verify with {self._settings_text()}, plus the "
                f"prefill token); refusing to record it")
        if accept_keys:
            acc_key, prop_key = accept_keys
            accepted = _count(where, f"meta_info.{acc_key}", meta.get(acc_key))
            proposed = _count(where, f"meta_info.{prop_key}", meta.get(prop_key))
            if accepted is not None and proposed is not None and accepted > proposed:
                raise DraftlabError(f"{where}: meta_info.{acc_key} {accepted} is above meta_info.{prop_key} "
                                    f"{proposed}: more drafts accepted than proposed")
            # T, not K: a server that counts the bonus token among the accepted ones stays within it
            if accepted is not None and verify is not None and t is not None and accepted > verify * t:
                raise DraftlabError(f"{where}: meta_info.{acc_key} {accepted} is above spec_verify_ct {verify} x "
                                    f"{t} tokens per verify ({self._settings_text()}) = {verify * t}")
        self._check_histogram(meta, where, verify)
        self._check_by_position(meta, where, verify)

    def _check_by_position(self, meta: dict[str, Any], where: str, verify: int | None) -> None:
        """``spec_accept_by_position`` (the builtin server's older field; still read): each count <=
        ``spec_verify_ct``, at most ``num_steps`` positions."""
        by_pos = meta.get("spec_accept_by_position")
        if not isinstance(by_pos, list):
            return
        for i, value in enumerate(by_pos):
            n = _count(where, f"meta_info.spec_accept_by_position[{i}]", value, required=True)
            if verify is not None and n is not None and n > verify:
                raise DraftlabError(f"{where}: meta_info.spec_accept_by_position[{i}] {n} is above "
                                    f"spec_verify_ct {verify}")
        if self.num_steps is not None and len(by_pos) > self.num_steps:
            raise DraftlabError(f"{where}: meta_info.spec_accept_by_position has {len(by_pos)} positions; "
                                f"speculative_num_steps is {self.num_steps}")

    def _check_histogram(self, meta: dict[str, Any], where: str, verify: int | None) -> None:
        """SGLang's ``spec_correct_drafts_histogram``: entry j counts the verifies that accepted exactly j
        drafts, so its entries sum to ``spec_verify_ct`` and it has at most ``num_steps + 1`` entries."""
        hist = meta.get("spec_correct_drafts_histogram")
        if isinstance(hist, list) and len(hist) == 1 and isinstance(hist[0], list):
            hist = hist[0]  # a batch-shaped answer to one prompt
        if not isinstance(hist, list):
            return
        counts = [_count(where, f"meta_info.spec_correct_drafts_histogram[{i}]", v, required=True)
                  for i, v in enumerate(hist)]
        if verify is not None and sum(counts) != verify:
            raise DraftlabError(f"{where}: meta_info.spec_correct_drafts_histogram sums to {sum(counts)} verifies; "
                                f"spec_verify_ct is {verify}")
        if self.num_steps is not None and len(counts) > self.num_steps + 1:
            raise DraftlabError(f"{where}: meta_info.spec_correct_drafts_histogram has {len(counts)} entries "
                                f"(0..{len(counts) - 1} drafts accepted); speculative_num_steps is {self.num_steps}")

    @staticmethod
    def _check_times(meta: dict[str, Any], where: str, latency_s: float | None) -> None:
        times = {}
        for key in TIME_KEYS:
            value = meta.get(key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise DraftlabError(f"{where}: meta_info.{key} is {value!r}; expected a number of seconds")
            if value < 0:
                raise DraftlabError(f"{where}: meta_info.{key} is {value!r}; a duration cannot be negative")
            times[key] = float(value)
        parts = [(k, times[k]) for k in SPLIT_KEYS if k in times]
        inner = [(" + ".join(k for k, _ in parts), sum(v for _, v in parts))] if parts else []
        if "first_token_latency" in times:
            inner.append(("first_token_latency", times["first_token_latency"]))
        outer = [("e2e_latency", times["e2e_latency"])] if "e2e_latency" in times else []
        if latency_s is not None:
            outer.append(("the request's own time (client)", latency_s))
        for name, value in inner + outer[:1]:
            for bound_name, bound in outer:
                if name != bound_name and value > bound + TIME_SLACK_S:
                    raise DraftlabError(f"{where}: meta_info.{name} {value:.6g} s is longer than {bound_name} "
                                        f"{bound:.6g} s; a part of a request cannot outlast it")

    def check_usage(self, usage: dict[str, Any], where: str) -> None:
        """An OpenAI ``usage`` object (vLLM)."""
        _count(where, "usage.prompt_tokens", usage.get("prompt_tokens"))
        completion = _count(where, "usage.completion_tokens", usage.get("completion_tokens"))
        if completion is not None:
            self._check_completion(completion, where, "usage.completion_tokens", "max_tokens")

    def _check_completion(self, completion: int, where: str, field: str, asked: str = "max_new_tokens") -> None:
        if completion > self.max_new_tokens:
            raise DraftlabError(f"{where}: {field} {completion} is above {asked} {self.max_new_tokens}, "
                                f"which this benchmark asked for")

    def check_server_info(self, info: dict[str, Any], where: str) -> None:
        """SGLang's cumulative ``avg_spec_accept_length`` from ``/get_server_info``."""
        value = info.get("avg_spec_accept_length")
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            return
        t = self.per_verify
        if value < 0 or (t is not None and value > t):
            raise DraftlabError(f"{where}: internal_states[0].avg_spec_accept_length {value} is outside [0, {t}] "
                                f"(at most {t} tokens per verify with {self._settings_text()})")

    def check_output(self, completion: int, where: str, *, returned: bool, ids: list | None = None) -> None:
        """Tokens claimed in ``meta_info`` are tokens returned: ``returned`` says whether any output (ids or
        text) came back; ``ids``, a whole answer's ``output_ids`` (not a stream's last increment), must
        hold as many tokens as claimed."""
        if completion > 0 and not returned:
            raise DraftlabError(f"{where}: meta_info.completion_tokens is {completion} but the answer holds no "
                                "output (output_ids and text empty or missing); refusing to record tokens the "
                                "server did not return")
        if ids is not None and len(ids) != completion:
            raise DraftlabError(f"{where}: meta_info.completion_tokens is {completion} but output_ids holds "
                                f"{len(ids)} tokens; refusing to record counts the answer contradicts")

    def check_parsed(self, row: dict[str, Any], where: str, by_pos_field: str | None) -> None:
        """The counts the client parsed from one answer (whatever its field names), against each other."""
        completion, verify = row.get("completion_tokens"), row.get("verify_ct")
        by_pos = row.get("accept_by_position")
        if by_pos:
            for i in range(1, len(by_pos)):
                if by_pos[i] > by_pos[i - 1]:
                    raise DraftlabError(
                        f"{where}: meta_info.{by_pos_field}: acceptance rises with depth ({by_pos[i - 1]} at "
                        f"position {i - 1}, {by_pos[i]} at position {i}); a draft is accepted only after the one "
                        "before it, so the counts cannot rise; refusing to record it")
        # the larger of the two counts a server may give: a server whose two counts disagree is refused only
        # where neither explains its tokens
        claims = [c for c in (sum(by_pos) if by_pos else None, row.get("accepted_drafts")) if c is not None]
        accepted = max(claims) if claims else None
        if completion is not None and verify and accepted is not None and completion > accepted + verify + 1:
            raise DraftlabError(
                f"{where}: meta_info.completion_tokens {completion} is impossible with spec_verify_ct {verify} "
                f"and {accepted} accepted drafts: at most {accepted + verify + 1} (one bonus token per verify "
                "plus the prefill token), whatever the settings; refusing to record it")

    def check_vllm_delta(self, delta: dict[str, Any] | None, where: str) -> None:
        """The change of vLLM's speculative counters over the measured passes."""
        if delta is None:
            return
        for key in ("drafts", "draft_tokens", "accepted_tokens"):
            if delta[key] < 0:
                raise DraftlabError(f"{where}: counter {key} went down by {-delta[key]} during the benchmark "
                                    f"(a restarted server?); refusing to record it")
        if delta["accepted_tokens"] > delta["draft_tokens"]:
            raise DraftlabError(f"{where}: accepted_tokens grew by {delta['accepted_tokens']}, more than "
                                f"draft_tokens ({delta['draft_tokens']})")
        per_pos = delta.get("accepted_per_pos") or []
        for i, value in enumerate(per_pos):
            if value < 0 or value > delta["drafts"]:
                raise DraftlabError(f"{where}: accepted_tokens_per_pos[{i}] grew by {value}; expected 0.."
                                    f"{delta['drafts']} (the number of drafts)")
            if i and value > per_pos[i - 1]:
                raise DraftlabError(f"{where}: accepted_tokens_per_pos: acceptance rises with depth ({per_pos[i - 1]} "
                                    f"at position {i - 1}, {value} at position {i}); refusing to record it")
        k = self.num_steps
        if k is not None and delta["drafts"] > 0:  # vLLM has no /server_info: the plan's K bounds it
            if delta["accepted_tokens"] > delta["drafts"] * k:
                raise DraftlabError(
                    f"{where}: accepted_tokens grew by {delta['accepted_tokens']} over {delta['drafts']} drafts: "
                    f"accept length {1 + delta['accepted_tokens'] / delta['drafts']:.3f}, above {k + 1} "
                    f"(num_speculative_tokens {k} + the bonus token); refusing to record it")
            if len(per_pos) > k:
                raise DraftlabError(f"{where}: accepted_tokens_per_pos has {len(per_pos)} positions; "
                                    f"num_speculative_tokens is {k}")


# What names the server and its speculative setting in ``/server_info`` (the counters and the
# cumulative accept length move during a run; these may not).
IDENTITY_KEYS = ("model_path", "speculative_algorithm", "speculative_draft_model_path", "speculative_num_steps",
                 "speculative_eagle_topk", "speculative_num_draft_tokens", "version")


def check_same_server(before: dict[str, Any], after: dict[str, Any], where: str,
                      plan: dict[str, Any] | None = None) -> None:
    """The server described before the run is the one described after it, and the one ``plan`` launched.

    Why: a server restarted with another model or another drafter setting mid-run (or a wrong one on the
    planned port) would have its numbers recorded under the plan's name. ``plan``: the ``IDENTITY_KEYS``
    values the launch asked for; a key the server does not report is not compared."""
    if before and not after:
        raise DraftlabError(f"{where}: described itself before the run and no longer after it (another server "
                            "answers now?); refusing to record the run")
    for key in IDENTITY_KEYS:
        if key in before and key in after and before[key] != after[key]:
            raise DraftlabError(f"{where}: {key} was {before[key]!r} before the run and is {after[key]!r} after "
                                "it: the server changed under the benchmark; refusing to record it")
    for key, want in (plan or {}).items():
        for when, info in (("before", before), ("after", after)):
            if key in info and info[key] != want:
                raise DraftlabError(f"{where}: {key} is {info[key]!r} ({when} the run) but the plan launched "
                                    f"{want!r}: not the planned server; refusing to record it")
