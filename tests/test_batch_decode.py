"""Batched decoding (issue 17): every row's greedy output and counters equal serving it alone.

Both decoders: ``BatchDecoder`` (dynamic cache, slot masks; one row alone runs unmasked) and the
static-slot ``StaticDecoder`` (issue 26; eager on the CPU, the same function its CUDA graphs capture).

Float64 tiny Llama targets and EAGLE-3 drafters (the trained-ish and random ones of test_engine),
prompts of different lengths, per-request ``max_new_tokens`` and stop ids, requests joining the
batch while others decode, and rows leaving as they finish.
"""

from __future__ import annotations

import functools
import time

import pytest
import torch

from draftlab.errors import DraftlabError
from draftlab.engine.batch_decode import BatchDecoder
from draftlab.engine.core import Engine
from draftlab.engine.static_decode import StaticDecoder, graph_buckets, solo_generate, width_buckets
from test_engine import VOCAB, world  # noqa: F401 (the module fixture)

FIELDS = ("output_ids", "finish_reason", "spec_verify_ct", "accept_histogram", "accept_by_position",
          "draft_tokens", "prompt_tokens", "draft_calls", "verify_calls")


def _requests(n: int, seed: int, stop_every: int = 0):
    """``n`` requests: prompts of 2..16 tokens, max_new 1..24, a stop id for every ``stop_every``-th."""
    g = torch.Generator().manual_seed(seed)
    reqs = []
    for i in range(n):
        prompt = torch.randint(1, VOCAB, (2 + (i * 5) % 15,), generator=g).tolist()
        max_new = [24, 1, 7, 19, 2, 13, 24, 5][i % 8]
        reqs.append((prompt, max_new, i))
    return reqs


def _alone(eng: Engine, reqs, stops_of) -> list:
    generate = functools.partial(solo_generate, eng) if eng.tree else eng.generate  # a tree: a one-row decoder
    return [generate(p, n, stop_token_ids=stops_of(i)) for p, n, i in reqs]


def _batched(eng: Engine, reqs, stops_of, join_every: int = 0, compact: bool = False, static: bool = False) -> list:
    """Decode ``reqs`` together; with ``join_every`` = j, one request joins every j steps."""
    dec = StaticDecoder(eng, max_rows=16) if static else BatchDecoder(eng)
    results: dict[int, object] = {}
    waiting = list(reqs)
    while waiting or len(dec):
        for _ in range(len(waiting) if not join_every else 1):
            if waiting:
                p, n, i = waiting.pop(0)
                row = dec.add(p, eng.check_request(p, n), set(stops_of(i)) | eng.eos_token_ids, tag=i)
                if row.done:
                    results[i] = row.res
        for _ in range(max(1, join_every)):
            for row in dec.step():
                results[row.tag] = row.res
            if compact and len(dec) and not static:
                dec.compact(force=True)
    return [results[i] for _, _, i in reqs]


def _decode_filling(dec, reqs, rows: int) -> list:
    """Decode ``reqs`` keeping up to ``rows`` in the batch (the next joins as soon as a row leaves)."""
    results, waiting = {}, list(reqs)
    while waiting or len(dec):
        while waiting and len(dec) < rows:
            p, n, i = waiting.pop(0)
            row = dec.add(p, n, set(), tag=i)
            if row.done:
                results[i] = row.res
        for row in dec.step():
            results[row.tag] = row.res
    return [results[i] for _, _, i in reqs]


def _same(alone, batched):
    for a, b in zip(alone, batched):
        for f in FIELDS:
            assert getattr(a, f) == getattr(b, f), (f, getattr(a, f), getattr(b, f))
    return True


@pytest.mark.parametrize("drafter, k", [(None, 0), ("trained", 1), ("trained", 3), ("trained", 5), ("random", 3)])
@pytest.mark.parametrize("mode", ["together", "joining", "compacting", "static-together", "static-joining"])
def test_batched_rows_equal_each_request_alone(world, drafter, k, mode):  # noqa: F811
    eng = Engine(world["v1"], world[drafter] if drafter else None, num_steps=max(k, 1), eos_token_ids=())
    reqs = _requests(8, seed=11) + [(p, 20, 8 + j) for j, p in enumerate(world["train_prompts"][:3])]
    # a stop id some rows meet early: one of the target's own greedy tokens for that prompt
    first = {i: eng.generate(p, 6).output_ids for p, _, i in reqs}
    stops_of = lambda i: [first[i][3]] if i % 3 == 0 else []  # noqa: E731
    alone = _alone(eng, reqs, stops_of)
    assert any(r.finish_reason == "stop" for r in alone) and any(r.finish_reason == "length" for r in alone)
    batched = _batched(eng, reqs, stops_of, join_every=0 if mode.endswith("together") else 2,
                       compact=mode == "compacting", static=mode.startswith("static"))
    assert _same(alone, batched)
    if drafter == "trained" and k > 1:
        assert sum(sum(r.accept_histogram[1:]) for r in batched) > 0  # acceptance really happened in the batch


def test_eos_of_the_engine_applies_per_row(world):  # noqa: F811
    p = world["train_prompts"][0]
    ref = Engine(world["v1"], None, eos_token_ids=()).generate(p, 12).output_ids
    eng = Engine(world["v1"], world["trained"], num_steps=3, eos_token_ids=[ref[4]])
    reqs = [(p, 12, 0), (world["train_prompts"][1], 12, 1)]
    alone = _alone(eng, reqs, lambda i: [])
    assert alone[0].output_ids == ref[: ref.index(ref[4]) + 1] and alone[0].finish_reason == "stop"
    assert _same(alone, _batched(eng, reqs, lambda i: []))


def test_rows_leave_and_the_cache_shrinks(world):  # noqa: F811
    eng = Engine(world["v1"], world["random"], num_steps=3, eos_token_ids=())
    dec = BatchDecoder(eng)
    dec.add([1, 2, 3], 3, set())
    dec.add(list(range(1, 30)), 40, set())
    steps = 0
    while len(dec) == 2:
        dec.step()
        steps += 1
    assert len(dec) == 1 and dec.mask.shape[0] == 1 and dec.pending.shape == (1, 1)
    for _ in range(6):
        dec.step()
    # one row left: squeezed to its own slots and decoded unmasked, rejected drafts cropped
    assert dec.mask is None and dec.dmask is None
    assert dec.cache.get_seq_length() == dec.dcache.length == dec.rows[0].length


@pytest.mark.parametrize("drafter", [None, "trained"])
def test_one_row_pays_nothing_for_batching(world, drafter, monkeypatch):  # noqa: F811
    """Alone, a row runs the one-request engine's forwards (no mask, no position ids); a second row
    joining and leaving switches masking on and off, and every output equals ``Engine.generate``."""
    eng = Engine(world["v1"], world[drafter] if drafter else None, num_steps=3, eos_token_ids=())
    p0, p1 = world["train_prompts"][0], world["train_prompts"][1]
    alone = [eng.generate(p0, 30), eng.generate(p1, 6)]
    seen = []
    forward = type(world["v1"]).forward
    monkeypatch.setattr(type(world["v1"]), "forward", lambda self, *a, **kw: seen.append(
        ("attention_mask" in kw, "position_ids" in kw)) or forward(self, *a, **kw))
    dec = BatchDecoder(eng)
    r0 = dec.add(p0, 30, set())
    dec.step()
    assert dec.mask is None and seen[-1] == (False, False)  # prefill and the step: the engine's calls
    r1 = dec.add(p1, 6, set())
    dec.step()
    assert dec.mask is not None and seen[-1] == (True, True)
    while not r1.done:
        dec.step()
    dec.step()
    assert dec.mask is None and seen[-1] == (False, False)
    while not r0.done:
        dec.step()
    assert _same(alone, [r0.res, r1.res])


def test_static_decoder_moves_rows_down_and_refuses_other_models(world):  # noqa: F811
    eng = Engine(world["v1"], world["trained"], num_steps=3, eos_token_ids=())
    reqs = _requests(5, seed=5)
    alone = _alone(eng, reqs, lambda i: [])
    dec = StaticDecoder(eng, max_rows=3)
    assert dec.info() == {"static_cache": True, "cuda_graph": False, "cuda_graph_bs": [], "cuda_graph_widths": [],
                          "cuda_graph_reason": "not on CUDA", "fused_layers": True, "fused_layers_reason": None}
    # a row finishing in the middle frees a slot the last row moves into
    assert _same(alone, _decode_filling(dec, reqs, 3))
    eng.target.config.model_type = "gpt2"
    try:
        with pytest.raises(ValueError, match="model_type 'gpt2'"):
            StaticDecoder(eng, max_rows=2)
    finally:
        eng.target.config.model_type = "llama"


@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
def test_scheduler_queues_beyond_max_batch_size_and_drops_cancelled(world, static):  # noqa: F811
    from draftlab.engine.core import GenerationStopped
    from draftlab.engine.scheduler import Scheduler

    eng = Engine(world["v1"], world["trained"], num_steps=3, eos_token_ids=())
    if static:  # what enable_static gives the engine on CUDA (here eager): the scheduler takes it
        eng.static_decoder = StaticDecoder(eng, max_rows=2)
    reqs = _requests(5, seed=3)
    alone = _alone(eng, reqs, lambda i: [])
    sched = Scheduler(eng, max_batch_size=2)
    with sched.lock:  # hold the engine so that all five are queued before the first step
        tickets = [sched.submit(p, n) for p, n, _ in reqs]
        endless = sched.submit([7, 8, 9], 10**6)  # capped by the 256-token context: 60+ cycles
        never = sched.submit([7, 8], 5)
        sched.cancel(never)  # cancelled while queued: never admitted
    while not endless.started:
        assert not endless.done.is_set()
        time.sleep(0.001)
    sched.cancel(endless)  # cancelled while decoding: leaves the batch at the next step
    for t in tickets:
        assert t.done.wait(60) and t.error is None
    assert _same(alone, [t.result for t in tickets])
    assert sched.peak_rows == 2  # never more rows than allowed, and really two at a time
    assert endless.done.wait(30) and isinstance(endless.error, GenerationStopped) and endless.error.tokens < 250
    assert never.done.wait(30) and isinstance(never.error, GenerationStopped) and not never.started


def test_graph_buckets_are_sglang_shaped():
    assert graph_buckets(0) == [] and graph_buckets(1) == [1] and graph_buckets(3) == [1, 2, 3]
    assert graph_buckets(8) == [1, 2, 4, 8] and graph_buckets(20) == [1, 2, 4, 8, 16, 20]


def test_width_buckets_double_up_to_the_slots():
    assert width_buckets(1029) == [128, 256, 512, 1029]
    assert width_buckets(517) == [128, 256, 517]
    assert width_buckets(100) == [100]
    assert width_buckets(256) == [128, 256]


def test_static_decoder_replays_the_narrowest_width_that_holds_its_rows(world):  # noqa: F811
    """The graph choice on CUDA, checked on the CPU: stand-in graphs (each runs the cycle eagerly at its
    batch bucket and attention width, as its capture would) record what ``_run`` replays. Each cycle takes
    the narrowest width holding every slot its rows write, rows cross from one width to the next as they
    grow, and tokens and counters still equal each request served alone."""
    eng = Engine(world["v1"], world["trained"], num_steps=3, eos_token_ids=())
    dec = StaticDecoder(eng, max_rows=4)
    dec.buckets, dec.widths = [1, 2, 4], [16, 32, 64, dec.slots]  # narrow, so that short requests cross them
    replayed = []

    class StandIn:
        def __init__(self, b: int, w: int):
            self.b, self.w = b, w

        def replay(self):
            replayed.append((self.w, max(r.length for r in dec.rows) + dec.k + 1))
            dec._set_width(self.w)
            dec._cycle(self.b)

    dec.graphs = {(b, w): StandIn(b, w) for b in dec.buckets for w in dec.widths}
    g = torch.Generator().manual_seed(11)
    reqs = [(torch.randint(1, VOCAB, (n,), generator=g).tolist(), m, i)
            for i, (n, m) in enumerate([(5, 24), (3, 3), (9, 20), (40, 24), (12, 17)])]
    alone = _alone(eng, reqs, lambda i: [])
    assert _same(alone, _decode_filling(dec, reqs, 3))  # short rows first; the long one joins as one leaves
    widths = [16, 32, 64, dec.slots]
    assert {16, 32, 64} <= {w for w, _ in replayed}
    for w, need in replayed:  # the narrowest that holds the rows
        assert need <= w and all(v < need for v in widths if v < w), (w, need)


TREES = [(3, 2, 5), (3, 4, 10), (2, 4, 6), (1, 3, 4), (5, 3, 16)]  # (num_steps, topk, num_draft_tokens)


@pytest.mark.parametrize("drafter", ["trained", "random"])
@pytest.mark.parametrize("steps, topk, tokens", TREES)
def test_draft_trees_are_lossless_alone_and_batched(world, drafter, steps, topk, tokens):  # noqa: F811
    """SGLang's EAGLE tree (topk > 1) in the static decoder: every request's tokens are plain greedy decoding's,
    alone (``Engine.generate``) and decoded together with requests joining, with the same counters both ways."""
    plain = Engine(world["v1"], None, eos_token_ids=())
    eng = Engine(world["v1"], world[drafter], num_steps=steps, topk=topk, num_draft_tokens=tokens, eos_token_ids=())
    reqs = _requests(8, seed=11) + [(p, 20, 8 + j) for j, p in enumerate(world["train_prompts"][:3])]
    first = {i: plain.generate(p, 6).output_ids for p, _, i in reqs}
    stops_of = lambda i: [first[i][3]] if i % 3 == 0 else []  # noqa: E731
    ref = _alone(plain, reqs, stops_of)
    alone = _alone(eng, reqs, stops_of)
    for r, a in zip(ref, alone):
        assert (a.output_ids, a.finish_reason) == (r.output_ids, r.finish_reason)
        assert sum(a.accept_histogram) == a.spec_verify_ct and len(a.accept_histogram) == steps + 1
    assert _same(alone, _batched(eng, reqs, stops_of, join_every=2, static=True))
    if drafter == "trained" and steps > 1:
        assert sum(sum(r.accept_histogram[2:]) for r in alone) > 0  # paths deeper than one draft were accepted


def test_a_tree_accepts_more_than_its_chain(world):  # noqa: F811
    """The tree holds the chain's best guesses and more: on the trained drafter's own prompts, 3 steps x topk 4
    with 10 tokens verified accept more tokens a verify than the 3-step chain, with the same output."""
    prompts = world["train_prompts"][:6]
    lengths, outputs = {}, {}
    for topk, tokens in ((1, 4), (4, 10)):
        eng = Engine(world["v1"], world["trained"], num_steps=3, topk=topk, num_draft_tokens=tokens, eos_token_ids=())
        res = _alone(eng, [(p, 24, i) for i, p in enumerate(prompts)], lambda i: [])
        outputs[topk] = [r.output_ids for r in res]
        lengths[topk] = sum(r.completion_tokens for r in res) / sum(r.spec_verify_ct for r in res)
    assert outputs[4] == outputs[1]
    assert lengths[4] > lengths[1], lengths


def test_tree_settings_the_decoder_cannot_hold_are_refused(world):  # noqa: F811
    tree = Engine(world["v1"], world["trained"], num_steps=2, topk=2, num_draft_tokens=4)
    with pytest.raises(DraftlabError, match="Engine.generate drafts chains; a tree \\(topk 2\\) decodes through"):
        tree.generate([5, 6, 7], 4)
    with pytest.raises(DraftlabError, match="--num-draft-tokens: a tree of 2 steps x topk 2 verifies 2..7 tokens, got 9"):
        Engine(world["v1"], world["trained"], num_steps=2, topk=2, num_draft_tokens=9)
    with pytest.raises(DraftlabError, match="a chain \\(topk 1\\) verifies num_steps \\+ 1 = 3 tokens, got 5"):
        Engine(world["v1"], world["trained"], num_steps=2, topk=1, num_draft_tokens=5)
    with pytest.raises(DraftlabError, match="--topk 10000: over the drafter's vocabulary"):
        Engine(world["v1"], world["trained"], num_steps=1, topk=10_000, num_draft_tokens=3)


@torch.inference_mode()
def _reference_tree(eng: Engine, prompt: list[int], steps: int, topk: int, tokens: int) -> set[tuple[int, ...]]:
    """SGLang's tree for the first cycle after ``prompt``, built one path at a time: each beam's drafter
    steps rerun from the prefix's cache (the engine's own drafter, a cache per path), children scored by
    their path's summed log-probability, the best ``topk`` kept as beams, the best ``tokens - 1`` of every
    child drafted returned as token paths from the root."""
    from draftlab.models.eagle3 import DrafterCache

    _, out, pending = eng.prefill_target(prompt, hidden=True)
    dcache, d_logits, d_hidden = eng.prefill_drafter(prompt, out, pending)
    n = len(prompt)

    def children(path: tuple[int, ...], score: float) -> list[tuple[tuple[int, ...], float]]:
        logits, hidden, cache = d_logits, d_hidden, DrafterCache(k=dcache.k, v=dcache.v)
        for j, tok in enumerate(path):
            logits, hidden = eng.drafter(torch.tensor([[tok]]), hidden, torch.tensor([[n + j]]), cache)
            logits, hidden = logits[:, -1], hidden[:, -1:]
        lp, ids = torch.log_softmax(logits[0].float(), -1).topk(topk)
        return [(path + (int(eng._hot[i]),), score + float(v)) for v, i in zip(lp, ids)]

    beams = children((), 0.0)
    drafted = list(beams)
    for _ in range(steps - 1):
        kids = [c for path, score in beams for c in children(path, score)]
        drafted += kids
        beams = sorted(kids, key=lambda c: -c[1])[:topk]
    return {path for path, _ in sorted(drafted, key=lambda c: -c[1])[: tokens - 1]}


@pytest.mark.parametrize("steps, topk, tokens", [(3, 2, 5), (3, 4, 10), (4, 3, 12)])
def test_the_drafted_tree_is_sglangs_tree(world, steps, topk, tokens):  # noqa: F811
    """The batched tree drafting (beams in slots of their own, ancestor masks, beams re-gathered each step)
    drafts exactly the tree built path by path: the same token paths, whatever row each prompt sits in."""
    eng = Engine(world["v1"], world["trained"], num_steps=steps, topk=topk, num_draft_tokens=tokens, eos_token_ids=())
    prompts = world["train_prompts"][:3] + [_requests(1, seed=5)[0][0]]  # different lengths
    dec = StaticDecoder(eng, max_rows=4)
    for p in prompts:
        dec.add(p, 20, set())
    dec.step()
    nodes, parents = dec.tree_nodes.tolist(), dec.tree_parents.tolist()
    for row, p in enumerate(prompts):
        paths = set()
        for i in range(1, tokens):
            path, j = [], i
            while j:
                path.append(nodes[row][j])
                j = parents[row][j]
            paths.add(tuple(reversed(path)))
        assert paths == _reference_tree(eng, p, steps, topk, tokens), row
