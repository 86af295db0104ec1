"""Greedy decoding of several requests at once, plain or EAGLE-3, each row exact as if alone.

Why: the builtin server decodes the requests in flight together (``scheduler``), so one target
forward serves up to ``max_batch_size`` requests. Layout ("slot-masked" caches):

- every row's KV entries live in one batched cache ``[B, heads, S, hd]`` (the target's transformers
  ``DynamicCache`` and the drafter's ``DrafterCache``), with a ``[B, S]`` bool mask of the slots the
  row may attend to. Rows are left-padded to the longest; RoPE positions are passed per row
  (``position_ids``), so a slot's index never matters, only the mask;
- a request joins by being prefilled alone (the same code as ``Engine.generate``) and having its
  caches left-padded into the batch; a finished row leaves (``index_select`` on the batch);
- a speculative cycle drafts and verifies the same number of tokens for every row (the largest
  any row may use); a row's rejected drafts are not cropped (other rows accepted more) but masked
  out for good, and only the first ``k_eff`` drafts of a row count (``engine.accept_cycle``), so
  counters and outputs equal the one-request engine's;
- masked slots are squeezed out (``compact``) once they make up a large part of the cache;
- one row alone pays nothing for batching: its caches are squeezed to its own slots, ``mask`` is
  ``None``, and each step runs the one-request engine's forwards (no attention mask, no position
  ids; rejected drafts cropped, not masked) until a second row joins.

Masked keys get exactly zero attention weight, so each row computes what it would alone, up to
floating-point reduction order (``tests/test_batch_decode.py`` checks token equality in float64).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from draftlab.engine.core import Engine, GenerationResult, accept_cycle, crop_cache, hold_stops


@dataclass(eq=False)
class Row:
    """One request in the batch: its limits, result so far and committed length (positions)."""

    prompt: list[int]
    max_new: int
    stops: set[int]
    res: GenerationResult
    length: int = 0  # tokens in the target cache (real positions, padding excluded)
    t_start: float = 0.0
    tag: Any = None  # the caller's handle (the scheduler's ticket)
    done: bool = False
    min_new: int = 0  # no stop id before this many tokens (SGLang's min_new_tokens)


def _pad_left(t: Tensor, n: int) -> Tensor:
    """Prepend ``n`` zero slots along dim 2 ([B, heads, S, hd])."""
    if n == 0:
        return t
    pad = torch.zeros(*t.shape[:2], n, t.shape[3], dtype=t.dtype, device=t.device)
    return torch.cat([pad, t], dim=2)


def _merge(a: Tensor | None, b: Tensor) -> Tensor:
    """Batch ``b``'s rows after ``a``'s, both left-padded to the longer slot count."""
    if a is None:
        return b
    s = max(a.shape[2], b.shape[2])
    return torch.cat([_pad_left(a, s - a.shape[2]), _pad_left(b, s - b.shape[2])], dim=0)


def _merge_mask(a: Tensor | None, n: int, device) -> Tensor:
    b = torch.ones(1, n, dtype=torch.bool, device=device)
    if a is None:
        return b
    s = max(a.shape[1], n)
    pad = lambda m: torch.cat([torch.zeros(m.shape[0], s - m.shape[1], dtype=torch.bool, device=device), m], 1)
    return torch.cat([pad(a), pad(b)], dim=0)


def prefill_row(eng: Engine, prompt: list[int], max_new: int, stops: set[int], tag: Any = None, min_new: int = 0):
    """Prefill one request alone (the engine's code): ``(row, target cache, pending [1, 1], drafter state)``.

    ``row.done`` when its first token already finished it; otherwise, with a drafter, the drafter's
    prefill ``(cache, first logits, hidden)`` comes too (else None).
    """
    k = eng.num_steps if eng.speculative else 0
    t0 = eng._tick()
    hold = stops | eng.eos_token_ids if min_new > 0 else ()  # SGLang holds EOS back even under ignore_eos
    cache, out, pending = eng.prefill_target(prompt, hidden=eng.speculative, hold=hold)
    tok = int(pending.item())
    res = GenerationResult(output_ids=[tok], prompt_tokens=len(prompt), finish_reason="length", num_steps=k,
                           accept_histogram=[0] * (k + 1) if k else [], accept_by_position=[0] * k if k else [])
    row = Row(prompt, max_new, stops, res, length=len(prompt), t_start=t0, tag=tag, min_new=min_new)
    drafted = None
    if tok in stops or max_new <= 1:
        res.finish_reason = "stop" if tok in stops else "length"
        row.done = True
    elif eng.speculative:
        drafted = eng.prefill_drafter(prompt, out, pending)
    del out
    t1 = eng._tick()
    res.prefill_time = t1 - t0
    if row.done:
        res.e2e_time = t1 - t0
    return row, cache, pending, drafted


class BatchDecoder:
    """The rows being decoded together and their caches; ``add`` a prefilled request, ``step`` all."""

    holds_stops = True  # honours min_new (the static decoder's CUDA graphs cannot)
    single_fast_path = True  # False: a row alone is masked like a batch (the first batching path; benchmarks compare)

    def __init__(self, engine: Engine):
        self.engine = engine
        self.rows: list[Row] = []
        self.cache = None  # target DynamicCache, batched
        self.mask: Tensor | None = None  # [B, S] target slots each row attends to (None: one row, no masking)
        self.pending: Tensor | None = None  # [B, 1] next token per row, not yet in the cache
        self.dcache = None  # DrafterCache, batched
        self.dmask: Tensor | None = None  # [B, Sd]
        self.d_logits: Tensor | None = None  # [B, M] the drafter's logits for the first draft
        self.d_hidden: Tensor | None = None  # [B, 1, H]

    def __len__(self) -> int:
        return len(self.rows)

    # -- joining ----------------------------------------------------------------------------------
    @torch.inference_mode()
    def add(self, prompt: list[int], max_new: int, stops: set[int], tag: Any = None, min_new: int = 0) -> Row:
        """Prefill one request alone; it joins the batch unless its first token already finished it."""
        row, cache, pending, drafted = prefill_row(self.engine, prompt, max_new, stops, tag, min_new)
        if row.done:
            return row
        self._join(cache, pending)
        if drafted is not None:
            self._join_drafter(*drafted)
        self.rows.append(row)
        return row

    def _join(self, cache, pending: Tensor) -> None:
        if self.cache is None:
            self.cache = cache
        else:
            if self.mask is None:  # the single row gets its (all-valid) masks back
                self.mask = torch.ones(1, self.cache.get_seq_length(), dtype=torch.bool, device=pending.device)
                if self.dcache is not None:
                    self.dmask = torch.ones(1, self.dcache.length, dtype=torch.bool, device=pending.device)
            for mine, theirs in zip(self.cache.layers, cache.layers):
                mine.keys, mine.values = _merge(mine.keys, theirs.keys), _merge(mine.values, theirs.values)
        if self.mask is not None or len(self.rows) or not self.single_fast_path:
            self.mask = _merge_mask(self.mask, cache.get_seq_length(), pending.device)
        self.pending = pending if self.pending is None else torch.cat([self.pending, pending], dim=0)

    def _join_drafter(self, dcache, d_logits: Tensor, d_hidden: Tensor) -> None:
        if self.dcache is None:
            self.dcache = dcache
        else:
            self.dcache.k, self.dcache.v = _merge(self.dcache.k, dcache.k), _merge(self.dcache.v, dcache.v)
        if self.mask is not None:
            self.dmask = _merge_mask(self.dmask, dcache.length, d_logits.device)
        self.d_logits = d_logits if self.d_logits is None else torch.cat([self.d_logits, d_logits], dim=0)
        self.d_hidden = d_hidden if self.d_hidden is None else torch.cat([self.d_hidden, d_hidden], dim=0)

    # -- leaving ----------------------------------------------------------------------------------
    def remove(self, rows: list[Row]) -> None:
        """Drop rows (finished or cancelled) from the batch."""
        gone = {id(r) for r in rows}
        keep = [i for i, r in enumerate(self.rows) if id(r) not in gone]
        if len(keep) == len(self.rows):
            return
        self.rows = [self.rows[i] for i in keep]
        if not keep:
            self.cache = self.mask = self.pending = None
            self.dcache = self.dmask = self.d_logits = self.d_hidden = None
            return
        idx = torch.tensor(keep, device=self.pending.device)
        self.cache.batch_select_indices(idx)
        self.mask, self.pending = self.mask[idx], self.pending[idx]
        if self.dcache is not None:
            self.dcache.k, self.dcache.v = self.dcache.k[idx], self.dcache.v[idx]
            self.dmask, self.d_logits, self.d_hidden = self.dmask[idx], self.d_logits[idx], self.d_hidden[idx]
        self.compact()

    def compact(self, force: bool = False) -> None:
        """Squeeze masked slots out of both caches when they are a third of them (or ``force``)."""
        if self.mask is None:
            return
        self.mask = self._squeeze(self.mask, [(l.keys, l.values, l) for l in self.cache.layers], force)
        if self.dcache is not None and self.dcache.k is not None:
            self.dmask = self._squeeze(self.dmask, [(self.dcache.k, self.dcache.v, None)], force)

    def _squeeze(self, mask: Tensor, tensors: list, force: bool) -> Tensor:
        counts = mask.sum(1)
        width = int(counts.max())
        s = mask.shape[1]
        if s == width or (not force and s - width < max(16, s // 3)):
            return mask
        # stable order of each row's valid slots, left-padded: slot j of the new row is idx[j]
        order = torch.argsort((~mask).to(torch.int8) * 2 - 1, dim=1, stable=True)  # valid first, in order
        pos = torch.arange(width, device=mask.device)
        shift = (width - counts)[:, None]
        src = torch.where(pos[None] >= shift, (pos[None] - shift).clamp(min=0), 0)
        idx = torch.gather(order, 1, src)  # [B, width]
        new_mask = pos[None] >= shift
        for k, v, layer in tensors:
            g = idx[:, None, :, None].expand(k.shape[0], k.shape[1], width, k.shape[3])
            k2, v2 = torch.gather(k, 2, g), torch.gather(v, 2, g)
            if layer is None:
                self.dcache.k, self.dcache.v = k2, v2
            else:
                layer.keys, layer.values = k2, v2
        return new_mask

    # -- decoding ---------------------------------------------------------------------------------
    def _target(self, ids: Tensor, positions: Tensor, hidden: bool):
        eng = self.engine
        mask = torch.cat([self.mask, torch.ones_like(ids, dtype=torch.bool)], dim=1)
        kw = {eng._cache_kw: self.cache, "use_cache": True, "output_hidden_states": hidden}
        return eng.target(input_ids=ids, attention_mask=mask, position_ids=positions, **kw)

    def _lengths(self) -> Tensor:
        return torch.tensor([r.length for r in self.rows], device=self.pending.device)

    def _to_single(self) -> None:
        """One row left: squeeze its caches to its own slots and stop masking."""
        self.compact(force=True)
        self.mask = self.dmask = None

    @torch.inference_mode()
    def step(self) -> list[Row]:
        """One decode step (plain) or one draft + verify cycle (speculative) for every row.

        Returns the rows that finished (already removed from the batch).
        """
        if not self.rows:
            return []
        if len(self.rows) == 1 and self.mask is not None and self.single_fast_path:
            self._to_single()
        done = self._spec_step() if self.engine.speculative else self._plain_step()
        t = self.engine._tick()
        for r in done:
            r.done = True
            r.res.e2e_time = t - r.t_start
        self.remove(done)
        if self.rows:
            self.compact()
        return done

    def _plain_step(self) -> list[Row]:
        eng = self.engine
        t0 = eng._tick()
        if self.mask is None:  # one row: the one-request engine's step
            out = eng._target(self.pending, self.cache, hidden=False)
        else:
            out = self._target(self.pending, self._lengths()[:, None], hidden=False)
        nxt = self._held(out.logits[:, -1:])[:, -1].argmax(-1, keepdim=True)  # [B, 1]
        if self.mask is not None:
            self.mask = torch.cat([self.mask, torch.ones_like(nxt, dtype=torch.bool)], dim=1)
        self.pending = nxt
        toks = nxt[:, 0].tolist()
        dt = eng._tick() - t0
        done = []
        for r, tok in zip(self.rows, toks):
            r.res.output_ids.append(tok)
            r.res.verify_calls += 1
            r.res.verify_time += dt
            r.length += 1
            if tok in r.stops or len(r.res.output_ids) >= r.max_new:
                r.res.finish_reason = "stop" if tok in r.stops else "length"
                done.append(r)
        return done

    def _held(self, logits: Tensor) -> Tensor:
        """``logits`` [B, T, V] with the stop ids held back where a row is still below its ``min_new``."""
        if any(r.min_new > len(r.res.output_ids) for r in self.rows):
            hold_stops(logits, [(len(r.res.output_ids), r.min_new, r.stops | self.engine.eos_token_ids)
                                for r in self.rows])
        return logits

    def _spec_step(self) -> list[Row]:
        """One speculative cycle for every row: draft, verify in one target forward, accept each row's
        prefix, then let the drafter read the accepted positions for the next cycle's first draft."""
        eng, rows, dev = self.engine, self.rows, self.pending.device
        single = self.mask is None  # one row: no masks, rejected drafts cropped (as ``Engine.generate``)
        k_eff = [min(eng.num_steps, r.max_new - len(r.res.output_ids) - 1) for r in rows]
        kb = max(k_eff)
        lengths = self._lengths()
        t0 = eng._tick()
        d_start = self.dcache.length
        drafts = self._draft(k_eff, kb, lengths, single)
        t1 = eng._tick()
        verify_in = torch.cat([self.pending, *drafts], dim=1)  # [B, kb+1]
        span = torch.arange(kb + 1, device=dev)
        out = self._verify(verify_in, lengths, span, single)
        greedy = self._held(out.logits).argmax(-1)  # [B, kb+1]
        accepted, done, m_t, keep = self._accept(greedy, verify_in, k_eff, span, single)
        t2 = eng._tick()
        for r in rows:
            r.res.verify_time += t2 - t1
            r.res.draft_time += t1 - t0
        self._forget_drafts(d_start, single)
        self.pending = greedy.gather(1, m_t[:, None])
        live = [i for i, r in enumerate(rows) if r not in done]
        self.remove(done)
        if live:
            idx = torch.tensor(live, device=dev)
            aux = eng._aux(out)[idx]
            del out  # the target's hidden states go before the drafter's forward
            self._read_accepted(rows, live, idx, greedy, aux, lengths[:, None] + span, accepted, m_t, keep, single, t2)
        return done

    def _draft(self, k_eff: list[int], kb: int, lengths: Tensor, single: bool) -> list[Tensor]:
        """``kb`` greedy drafts per row ([B, 1] target ids each), chained through the drafter's cache;
        a row's ``draft_calls`` counts only the forwards among its own first ``k_eff`` drafts."""
        eng, drafter, rows = self.engine, self.engine.drafter, self.rows
        drafts = []
        d_logits, d_hidden = self.d_logits, self.d_hidden
        for j in range(kb):
            d_tok = eng._hot[d_logits.argmax(-1, keepdim=True)]  # [B, 1] target ids
            drafts.append(d_tok)
            if j + 1 < kb:
                if not single:
                    self.dmask = torch.cat([self.dmask, torch.ones_like(d_tok, dtype=torch.bool)], dim=1)
                d_logits, d_hidden = drafter(d_tok, d_hidden, (lengths + j)[:, None], self.dcache, key_mask=self.dmask)
                d_logits = d_logits[:, -1]
                for r, ke in zip(rows, k_eff):
                    r.res.draft_calls += j + 1 < ke
        return drafts

    def _verify(self, verify_in: Tensor, lengths: Tensor, span: Tensor, single: bool):
        """The target's forward over each row's pending token and drafts, with the hidden states the
        drafter reads next."""
        if single:
            return self.engine._target(verify_in, self.cache, hidden=True)
        return self._target(verify_in, lengths[:, None] + span, hidden=True)

    def _accept(self, greedy: Tensor, verify_in: Tensor, k_eff: list[int], span: Tensor,
                single: bool) -> tuple[list[int], list[Row], Tensor, Tensor]:
        """Accept each row's drafts up to the first the target disagrees with (``accept_cycle``: counters
        and outputs as the one-request engine's), and keep only those slots in the target cache.

        Returns the accepted counts, the rows that finished, the counts as a tensor and the kept slots.
        """
        rows = self.rows
        g_rows, v_rows = greedy.tolist(), verify_in[:, 1:].tolist()
        accepted, done = [], []
        for r, g, v, ke in zip(rows, g_rows, v_rows, k_eff):
            m, stopped = accept_cycle(r.res, v, g, ke, r.stops, r.max_new)
            accepted.append(m)
            if stopped or len(r.res.output_ids) >= r.max_new:
                r.res.finish_reason = "stop" if stopped else "length"
                done.append(r)
        m_t = torch.tensor(accepted, device=greedy.device)
        keep = span[None] <= m_t[:, None]  # [B, kb+1]: the accepted drafts and the bonus token's slot
        if single:
            crop_cache(self.cache, rows[0].length + accepted[0] + 1)
        else:
            self.mask = torch.cat([self.mask, keep], dim=1)
        return accepted, done, m_t, keep

    def _forget_drafts(self, d_start: int, single: bool) -> None:
        """The drafter forgets this cycle's chain (its own guesses): cropped alone, masked in a batch."""
        if single:
            self.dcache.crop(d_start)
        else:
            self.dmask[:, d_start:] = False

    def _read_accepted(self, rows: list[Row], live: list[int], idx: Tensor, greedy: Tensor, aux: Tensor,
                       pos: Tensor, accepted: list[int], m_t: Tensor, keep: Tensor, single: bool, t2: float) -> None:
        """The drafter reads the live rows' accepted positions with the target's real features, which
        gives the logits and hidden state of the next cycle's first draft; ``rows`` is the batch as it
        was before the finished rows left, ``live`` indexes it."""
        drafter, dev = self.engine.drafter, greedy.device
        if single:  # extend over the accepted positions only
            n = accepted[0] + 1
            lg, hid = drafter(greedy[:, :n], aux[:, :n], pos[:, :n], self.dcache)
            self.d_logits, self.d_hidden = lg[:, -1], hid[:, -1:]
        else:
            m_live, keep = m_t[idx], keep[idx]
            self.dmask = torch.cat([self.dmask, keep], dim=1)
            lg, hid = drafter(greedy[idx], aux, pos[idx], self.dcache, key_mask=self.dmask)
            ar = torch.arange(len(live), device=dev)
            self.d_logits, self.d_hidden = lg[ar, m_live], hid[ar, m_live][:, None]
        for i in live:
            rows[i].res.draft_calls += 1
            rows[i].length += accepted[i] + 1
        t3 = self.engine._tick()
        for i in live:
            rows[i].res.draft_time += t3 - t2
