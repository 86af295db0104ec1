"""The builtin EAGLE-3 speculative decoding engine (greedy, chain drafting, batch size 1).

One cycle, with ``L`` tokens in the target's KV cache and the next token ``x`` already chosen:

1. draft   k tokens d_1..d_k with the drafter (its first logits came from the previous cycle's
           extend step; k-1 more single-token steps feed back the drafter's own ``hidden_out``);
2. verify  one target forward over ``[x, d_1..d_k]`` (k+1 tokens) gives greedy choices g_0..g_k;
3. accept  the longest prefix with d_i == g_{i-1} (m tokens) plus the bonus token g_m, so each
           cycle emits m+1 tokens, all of them target argmaxes: output == target-only greedy;
4. roll back the target cache to L+m+1 and the drafter cache to L, then *extend* the drafter over
           the accepted positions with the target's real aux hidden states (token t+1 paired with
           the features at t), which also yields the first draft logits of the next cycle.

Plain decoding (no drafter) runs through the same prefill and cache code, so the two are a fair
comparison. ``generate`` decodes one request (batch size 1); the server decodes the requests in
flight together through ``batch_decode``, which reuses this prefill and acceptance code.
"""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import torch
from torch import Tensor

from draftlab.errors import DraftlabError
from draftlab.formats import aux_layers
from draftlab.models.target import aux_layer_ids_for, load_target
from draftlab.engine.draft_shape import draft_tokens_problem
from draftlab.models.eagle3 import DrafterCache, Eagle3Drafter

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "float64": torch.float64, "fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass
class GenerationResult:
    """One request's output and counters (SGLang semantics: accept length counts the bonus token)."""

    output_ids: list[int]
    prompt_tokens: int
    finish_reason: str  # "stop" (EOS / stop id) or "length"
    spec_verify_ct: int = 0  # target verify forwards (0 for plain decoding)
    num_steps: int = 0  # k, draft tokens per cycle (0 for plain decoding)
    accept_histogram: list[int] = field(default_factory=list)  # [j] = verifies that accepted j drafts
    accept_by_position: list[int] = field(default_factory=list)  # [i] = times draft i+1 was accepted
    draft_time: float = 0.0  # seconds in drafter forwards after prefill
    verify_time: float = 0.0  # seconds in target forwards after prefill (decode steps when plain)
    prefill_time: float = 0.0  # target prefill (+ drafter prefill extend)
    draft_calls: int = 0
    verify_calls: int = 0
    draft_tokens: int = 0  # draft tokens proposed (k per cycle, fewer when max_new_tokens is near)
    e2e_time: float = 0.0

    @property
    def completion_tokens(self) -> int:
        return len(self.output_ids)

    @property
    def spec_accept_length(self) -> float | None:
        return self.completion_tokens / self.spec_verify_ct if self.spec_verify_ct else None


class GenerationStopped(Exception):
    """``should_stop`` said so between two decode steps (client gone, server shutting down)."""

    def __init__(self, tokens: int):
        super().__init__(f"generation stopped after {tokens} tokens")
        self.tokens = tokens


def _never() -> bool:
    return False


def _ignore(res: "GenerationResult") -> None:
    pass


def context_length_of(config) -> int | None:
    """The target's context window in tokens (None when its config does not say)."""
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        value = getattr(config, key, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def resolve_dtype(name: str | torch.dtype | None) -> torch.dtype | None:
    if name is None or isinstance(name, torch.dtype):
        return name
    if name not in DTYPES:
        raise DraftlabError(f"--dtype: expected one of {', '.join(DTYPES)}, got {name!r}")
    return DTYPES[name]


def _cache_kwarg(model) -> str:
    """transformers 5.x renamed ``past_key_values`` to ``cache``; use whichever the model takes."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def crop_cache(cache, length: int) -> None:
    """Roll a transformers cache back to its first ``length`` positions (negative crop: remove n)."""
    n = cache.get_seq_length() - length
    if n < 0:
        raise ValueError(f"cannot crop a cache of length {cache.get_seq_length()} to {length}")
    if n:
        cache.crop(-n)


def eos_ids_of(model) -> set[int]:
    ids: set[int] = set()
    for src in (getattr(model, "generation_config", None), model.config):
        eos = getattr(src, "eos_token_id", None) if src is not None else None
        if eos is None:
            continue
        ids.update([eos] if isinstance(eos, int) else list(eos))
    return ids


class Engine:
    """Greedy decoding of one transformers causal LM, with an optional EAGLE-3 drafter."""

    # Timer for the per-request times; benchmarks on a shared CPU swap in time.thread_time.
    clock = staticmethod(time.perf_counter)

    def __init__(self, target, drafter=None, *, num_steps: int = 3, topk: int = 1, num_draft_tokens: int | None = None,
                 aux_layer_ids: Sequence[int] | None = None, eos_token_ids: Iterable[int] | None = None):
        self.target = target
        self.drafter = drafter
        self.num_steps = int(num_steps)
        self.topk = int(topk)
        self.num_draft_tokens = self.num_steps + 1 if num_draft_tokens is None else int(num_draft_tokens)
        if drafter is not None:
            _check_speculative(self.num_steps, self.topk, self.num_draft_tokens)
        self.device = next(target.parameters()).device
        self.eos_token_ids = set(eos_ids_of(target) if eos_token_ids is None else eos_token_ids)
        self._cache_kw = _cache_kwarg(target)
        self.aux_layer_ids: list[int] = []
        if drafter is not None:
            tcfg = target.config.to_dict()
            self.aux_layer_ids = aux_layers.check_output_ids(aux_layer_ids, tcfg) if aux_layer_ids is not None \
                else aux_layer_ids_for(drafter.config, tcfg)
            _check_vocab(drafter, int(target.get_output_embeddings().weight.shape[0]))
            t_hidden = int(getattr(target.config, "hidden_size"))
            want = drafter.fc.in_features
            if want != 3 * t_hidden:
                raise DraftlabError(
                    f"drafter config: target_hidden_size implies fc input {want}, but the target's hidden_size is "
                    f"{t_hidden} (expected fc input {3 * t_hidden}): this drafter was built for another target"
                )
            drafter.load_target_embeddings(target.get_input_embeddings().weight.detach())
            drafter.to(device=self.device, dtype=next(target.parameters()).dtype)
            drafter.eval()
            # draft id -> target id in one gather: hot[i] = i + d2t[i] (SGLang's hot_token_id)
            self._hot = drafter.d2t + torch.arange(drafter.d2t.numel(), device=drafter.d2t.device)
            _check_hot_ids(self._hot, int(target.get_output_embeddings().weight.shape[0]))
            if self.topk > self._hot.numel():  # a tree's first step takes the drafter's topk best tokens
                raise DraftlabError(f"--topk {self.topk}: over the drafter's vocabulary ({self._hot.numel()} tokens)")
        self.trace: list[dict[str, Any]] | None = None  # set to [] to record every cycle (tests, debugging)
        self.static_decoder = None  # the server's static-cache decoder on CUDA (engine.static_decode)
        self._sync = self.device.type == "cuda"

    @classmethod
    def from_folders(cls, target_dir: str | Path, drafter_dir: str | Path | None = None, *, num_steps: int = 3,
                     topk: int = 1, num_draft_tokens: int | None = None, device: str = "cpu",
                     dtype: str | torch.dtype | None = None, trust_remote_code: bool = False) -> "Engine":
        """Load a transformers target folder and (optionally) an EAGLE-3 drafter folder."""
        dt = resolve_dtype(dtype)
        target = load_target(target_dir, dtype=dt, device=device, trust_remote_code=trust_remote_code)
        drafter = None
        if drafter_dir is not None:
            drafter = Eagle3Drafter.from_pretrained(drafter_dir, dtype=next(target.parameters()).dtype, device=device)
            _check_vocab(drafter, int(target.get_output_embeddings().weight.shape[0]), f"{drafter_dir}/config.json",
                         f"target {target_dir}")
        return cls(target, drafter, num_steps=num_steps, topk=topk, num_draft_tokens=num_draft_tokens)

    @property
    def speculative(self) -> bool:
        return self.drafter is not None

    @property
    def tree(self) -> bool:
        """Drafts a tree (topk > 1): only the static-slot decoder decodes one (``static_decode``)."""
        return self.drafter is not None and self.topk > 1

    @property
    def context_length(self) -> int | None:
        return context_length_of(self.target.config)

    def check_request(self, input_ids: Sequence[int], max_new_tokens: int) -> int:
        """Refuse a request the model cannot serve; return ``max_new_tokens`` capped so prompt + new <= context.

        Runs before a request waits for the engine, so a prompt beyond the context is refused at once
        (SGLang's wording), and no request can grow the KV cache past the window.
        """
        if len(input_ids) == 0:
            raise DraftlabError("request: the prompt is empty (expected at least one token)")
        if max_new_tokens < 1:
            raise DraftlabError(f"request: max_new_tokens must be >= 1, got {max_new_tokens}")
        ctx = self.context_length
        if ctx is not None and len(input_ids) >= ctx:
            raise DraftlabError(f"The input ({len(input_ids)} tokens) is longer than the model's context length "
                                f"({ctx} tokens).")
        vocab = int(self.target.config.vocab_size)
        bad = [t for t in input_ids if not 0 <= int(t) < vocab]
        if bad:
            raise DraftlabError(f"request: input_ids {bad[:5]} are outside the target vocabulary 0..{vocab - 1}")
        return max_new_tokens if ctx is None else min(max_new_tokens, ctx - len(input_ids))

    def limits(self, input_ids: Sequence[int], max_new_tokens: int, ignore_eos: bool = False,
               stop_token_ids: Iterable[int] = ()) -> tuple[int, set[int]]:
        """A request's token budget (``check_request``) and stop ids (EOS unless ``ignore_eos``)."""
        budget = self.check_request(input_ids, max_new_tokens)
        return budget, set(stop_token_ids) | (set() if ignore_eos else self.eos_token_ids)

    # -- forwards ---------------------------------------------------------------------------------
    def _target(self, ids: Tensor, cache, hidden: bool, last_only: bool = False):
        kw = {self._cache_kw: cache, "use_cache": True, "output_hidden_states": hidden}
        if last_only:
            kw["logits_to_keep"] = 1
        return self.target(input_ids=ids, **kw)

    def _aux(self, out, upto: int | None = None) -> Tensor:
        hs = out.hidden_states
        parts = [hs[i + 1] if upto is None else hs[i + 1][:, :upto] for i in self.aux_layer_ids]
        return torch.cat(parts, dim=-1)

    def _tick(self) -> float:
        if self._sync:
            torch.cuda.synchronize(self.device)
        return self.clock()

    # -- public -----------------------------------------------------------------------------------
    @torch.inference_mode()
    def generate(self, input_ids: Sequence[int], max_new_tokens: int, *, ignore_eos: bool = False,
                 stop_token_ids: Iterable[int] = (),
                 should_stop: Callable[[], bool] | None = None,
                 on_tokens: Callable[[GenerationResult], None] | None = None) -> GenerationResult:
        """Greedy-decode up to ``max_new_tokens`` after ``input_ids`` (capped by the context window).

        Stops at EOS unless ``ignore_eos``. ``should_stop`` is polled before every decode step or
        speculative cycle; when it returns True, :class:`GenerationStopped` is raised. ``on_tokens``
        (streaming) is called with the result so far each time tokens are accepted: once after the
        prefill's token, then after every decode step or verify; it must not modify the result.
        """
        if self.tree:
            raise DraftlabError(f"Engine.generate drafts chains; a tree (topk {self.topk}) decodes through the "
                                "static-slot decoder: draftlab.engine.static_decode.solo_generate(engine, ...)")
        budget, stops = self.limits(input_ids, max_new_tokens, ignore_eos, stop_token_ids)
        run = self._plain if self.drafter is None else self._speculative
        return run(list(map(int, input_ids)), budget, stops, should_stop or _never, on_tokens or _ignore)

    def _new_cache(self):
        from transformers import DynamicCache  # deferred: transformers (seconds), only for the dynamic-cache path

        return DynamicCache(config=self.target.config)

    def prefill_target(self, prompt: list[int], hidden: bool, hold: Iterable[int] = ()):
        """Prefill one prompt: (its cache, the forward's output, the first token [1, 1]); the first
        token is none of ``hold`` (a request's stop ids under ``min_new_tokens``)."""
        cache = self._new_cache()
        ids = torch.tensor([prompt], device=self.device)
        out = self._target(ids, cache, hidden=hidden, last_only=True)
        logits = hold_stops(out.logits[:, -1:], [(0, 1, set(hold))])
        return cache, out, logits[:, -1].argmax(-1, keepdim=True)

    def prefill_drafter(self, prompt: list[int], out, pending: Tensor):
        """The drafter's prefill extend (features at t with token t+1): (cache, first logits, hidden)."""
        dcache = DrafterCache()
        ids = torch.tensor([prompt], device=self.device)
        d_in = torch.cat([ids[:, 1:], pending], dim=1)
        pos = torch.arange(len(prompt), device=self.device).unsqueeze(0)
        d_logits, d_hidden = self.drafter(d_in, self._aux(out), pos, dcache)
        return dcache, d_logits[:, -1], d_hidden[:, -1:]

    def _plain(self, prompt: list[int], max_new: int, stops: set[int], should_stop, on_tokens) -> GenerationResult:
        t_start = self._tick()
        cache, _, nxt = self.prefill_target(prompt, hidden=False)  # nxt: [1, 1]
        tok = int(nxt.item())
        res = GenerationResult(output_ids=[tok], prompt_tokens=len(prompt), finish_reason="length")
        t = self._tick()
        res.prefill_time = t - t_start
        finished = tok in stops
        on_tokens(res)
        while not finished and len(res.output_ids) < max_new:
            if should_stop():
                raise GenerationStopped(len(res.output_ids))
            out = self._target(nxt, cache, hidden=False)
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            tok = int(nxt.item())
            res.output_ids.append(tok)
            res.verify_calls += 1
            finished = tok in stops
            on_tokens(res)
        t_end = self._tick()
        res.verify_time = t_end - t
        res.e2e_time = t_end - t_start
        res.finish_reason = "stop" if finished else "length"
        return res

    def _speculative(self, prompt: list[int], max_new: int, stops: set[int], should_stop,
                     on_tokens) -> GenerationResult:
        """Greedy EAGLE decoding of one request: prefill both models, then cycles of drafting a chain,
        verifying it in one target forward and extending the drafter over the accepted tokens."""
        t_start = self._tick()
        res, cache, pending, (dcache, d_logits, d_hidden) = self._speculative_prefill(prompt, max_new, stops)
        finished = res.output_ids[0] in stops
        L = len(prompt)  # positions in both caches
        t = self._tick()
        res.prefill_time = t - t_start
        on_tokens(res)
        while not finished and len(res.output_ids) < max_new:
            if should_stop():
                raise GenerationStopped(len(res.output_ids))
            k_eff = min(self.num_steps, max_new - len(res.output_ids) - 1)
            t0 = self._tick()
            drafts = self._draft_chain(res, d_logits, d_hidden, dcache, L, k_eff)
            t1 = self._tick()
            out, greedy, m, finished = self._verify_chain(res, cache, pending, drafts, L, k_eff, stops, max_new)
            t2 = self._tick()
            res.verify_time += t2 - t1
            res.draft_time += t1 - t0
            on_tokens(res)
            if finished or len(res.output_ids) >= max_new:
                break
            d_logits, d_hidden = self._extend_drafter(res, out, greedy, m, L, dcache)
            del out
            L += m + 1
            pending = greedy[m : m + 1].unsqueeze(0)
            res.draft_time += self._tick() - t2
        res.finish_reason = "stop" if finished else "length"
        res.e2e_time = self._tick() - t_start
        return res

    def _speculative_prefill(self, prompt: list[int], max_new: int, stops: set[int]):
        """Prefill the target (its next token is the result's first) and, unless that token already ends
        the request, the drafter: the result, the target cache, the pending token and the drafter's state."""
        k = self.num_steps
        # pending: [1, 1], the next token, not yet in the cache
        cache, out, pending = self.prefill_target(prompt, hidden=True)
        tok = int(pending.item())
        res = GenerationResult(output_ids=[tok], prompt_tokens=len(prompt), finish_reason="length", num_steps=k,
                               accept_histogram=[0] * (k + 1), accept_by_position=[0] * k)
        drafter_state = (None, None, None)
        if tok not in stops and max_new > 1:
            drafter_state = self.prefill_drafter(prompt, out, pending)
        return res, cache, pending, drafter_state

    def _draft_chain(self, res: GenerationResult, d_logits: Tensor, d_hidden: Tensor, dcache, L: int,
                     k_eff: int) -> list[Tensor]:
        """Draft a chain of ``k_eff`` tokens (target ids, ``[1, 1]`` each) from the drafter's state at ``L``."""
        drafts = []
        for j in range(k_eff):
            d_tok = self._hot[d_logits.argmax(-1, keepdim=True)]  # [1, 1] target id
            drafts.append(d_tok)
            if j + 1 < k_eff:
                pos = torch.full((1, 1), L + j, device=self.device, dtype=torch.long)
                d_logits, d_hidden = self.drafter(d_tok, d_hidden, pos, dcache)
                d_logits = d_logits[:, -1]
                res.draft_calls += 1
        return drafts

    def _verify_chain(self, res: GenerationResult, cache, pending: Tensor, drafts: list[Tensor], L: int,
                      k_eff: int, stops: set[int], max_new: int):
        """Verify the pending token and the drafts in one target forward, accept the longest agreeing
        prefix into ``res`` and crop the target cache past it: (forward output, greedy tokens, accepted, stopped)."""
        verify_in = torch.cat([pending, *drafts], dim=1)  # [1, k_eff+1]
        out = self._target(verify_in, cache, hidden=True)
        greedy = out.logits[0].argmax(-1)  # [k_eff+1]
        v = verify_in[0, 1:].tolist()
        m, finished = accept_cycle(res, v, greedy.tolist(), k_eff, stops, max_new)
        if self.trace is not None:
            self.trace.append({"length": L, "drafts": v, "accepted": m})
        crop_cache(cache, L + m + 1)
        return out, greedy, m, finished

    def _extend_drafter(self, res: GenerationResult, out, greedy: Tensor, m: int, L: int, dcache):
        """Roll the drafter back to ``L`` and extend it over the accepted positions ``L..L+m`` (the target's
        hidden states of the verify): its logits and hidden state for the next cycle's first draft."""
        dcache.crop(L)
        pos = torch.arange(L, L + m + 1, device=self.device).unsqueeze(0)
        d_logits, d_hidden = self.drafter(greedy[: m + 1].unsqueeze(0), self._aux(out, m + 1), pos, dcache)
        res.draft_calls += 1
        return d_logits[:, -1], d_hidden[:, -1:]


def hold_stops(logits: Tensor, rows: Sequence[tuple[int, int, set[int]]]) -> Tensor:
    """SGLang's ``min_new_tokens``: no stop id is chosen before a request has that many tokens (its
    stop ids and the model's EOS ids, even under ``ignore_eos``, as SGLang's min-new-tokens penalizer).
    ``logits`` [B, T, V] (in place): position ``j`` of row ``b`` gives its token number ``have + j``;
    ``rows[b] = (have, min_new, stop ids)``. The stop ids' logits are -inf below ``min_new``."""
    for b, (have, min_new, stops) in enumerate(rows):
        upto = min(min_new - have, logits.shape[1])
        ids = [t for t in stops if 0 <= t < logits.shape[-1]]
        if upto > 0 and ids:
            logits[b, :upto, ids] = float("-inf")
    return logits


def accept_cycle(res: GenerationResult, drafts: list[int], greedy: list[int], k_eff: int, stops: set[int],
                 max_new: int) -> tuple[int, bool]:
    """Count one verify in ``res`` and append its tokens; return (drafts accepted, stopped at a stop id).

    Only the first ``k_eff`` drafts count (a batched verify may carry more for other rows); the
    tokens appended are the target's greedy choices, cut at a stop id or at ``max_new``.
    """
    m = 0
    while m < k_eff and drafts[m] == greedy[m]:
        m += 1
    res.spec_verify_ct += 1
    res.verify_calls += 1
    res.draft_tokens += k_eff
    res.accept_histogram[m] += 1
    for i in range(m):
        res.accept_by_position[i] += 1
    for tok in greedy[: m + 1]:
        res.output_ids.append(tok)
        if tok in stops:
            return m, True
        if len(res.output_ids) >= max_new:
            break
    return m, False


def _check_speculative(num_steps: int, topk: int, num_draft_tokens: int) -> None:
    """SGLang's three speculative numbers, as the builtin engine can draft them."""
    if num_steps < 1:
        raise DraftlabError(f"--num-steps: expected an integer >= 1 with a drafter, got {num_steps}")
    if topk < 1:
        raise DraftlabError(f"--topk: expected an integer >= 1, got {topk}")
    problem = draft_tokens_problem(num_steps, topk, num_draft_tokens)
    if problem:
        raise DraftlabError(f"--num-draft-tokens: {problem}")


def _check_vocab(drafter, vocab: int, where: str = "drafter config.json", target: str = "the target") -> None:
    """Refuse at load a drafter whose vocabulary is larger than the target's: its embedding and its
    draft ids reach past the target's (served, an IndexError on some request)."""
    d_vocab = int(drafter.config.get("vocab_size") or 0)
    d_draft = int(drafter.d2t.numel())
    if d_vocab > vocab or d_draft > vocab:
        raise DraftlabError(f"{where}: vocab_size {d_vocab} (draft_vocab_size {d_draft}) is larger than the "
                            f"vocabulary of {target} ({vocab} tokens): the drafter belongs to another target")


def _check_hot_ids(hot: torch.Tensor, vocab: int) -> None:
    """Refuse at load a drafter whose ``d2t`` maps a draft id outside the target vocabulary: served,
    its first proposal of that id would index past the target's logits (a 500 on some request)."""
    bad = ((hot < 0) | (hot >= vocab)).nonzero().flatten()
    if bad.numel():
        i = int(bad[0])
        raise DraftlabError(f"drafter d2t: {bad.numel()} draft ids map outside the target vocabulary [0, {vocab}) "
                            f"(first: draft id {i} -> target id {int(hot[i])}); the drafter belongs to another target")
