"""The builtin EAGLE-3 engine: lossless greedy output, exact counters, correct cache rollback.

Models are tiny real transformers Llama targets and real EAGLE-3 drafters, in float64 so that
"identical to target-only greedy decoding" is a sharp test (no near-ties flipping an argmax).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from draftlab.engine.core import Engine, _cache_kwarg, crop_cache
from draftlab.serving.sglang_meta import meta_info
from draftlab.errors import DraftlabError
from draftlab.models.eagle3 import DrafterCache, Eagle3Drafter, init_weights
from draftlab.models.target import aux_layer_ids_for, load_target, read_config, target_features
from factories import tiny_drafter_config
from tiny_models import tiny_target

DT = torch.float64
VOCAB = 320
KS = (1, 2, 3, 5)
NEW = 20


def _prompts(n: int, seed: int, length: int = 6) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, VOCAB, (length + i % 4,), generator=g).tolist() for i in range(n)]


@torch.no_grad()
def reference_greedy(model, prompt: list[int], n: int) -> list[int]:
    """Target-only greedy decoding, recomputing the whole sequence each step (no cache at all)."""
    ids = list(prompt)
    for _ in range(n):
        logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits
        ids.append(int(logits[0, -1].argmax()))
    return ids[len(prompt):]


def fit_drafter(target, tcfg: dict, prompts: list[list[int]], steps: int = 150, seed: int = 0) -> Eagle3Drafter:
    """A "trained-ish" drafter: fit on the target's own greedy continuations of ``prompts``.

    Step 1 learns (features at t, token t+1) -> target argmax at t+1; step 2 feeds the drafter's own
    hidden back (a short training-time test), which is what makes chained drafts agree.
    """
    torch.manual_seed(seed)
    plain = Engine(target, None)
    seqs = [p + plain.generate(p, NEW + 8, ignore_eos=True).output_ids for p in prompts]
    width = min(len(s) for s in seqs)
    ids = torch.tensor([s[:width] for s in seqs])
    layer_ids = aux_layer_ids_for(None, tcfg)
    aux, logits = target_features(target, ids, layer_ids)
    greedy = logits.argmax(-1)
    m = 96
    top = torch.sort(torch.topk(torch.bincount(ids.flatten(), minlength=VOCAB), m).indices).values
    drafter = Eagle3Drafter(tiny_drafter_config(tcfg, draft_vocab_size=m)).to(dtype=DT)
    init_weights(drafter, seed)
    drafter.d2t.copy_(top - torch.arange(m))
    drafter.t2d.zero_()
    drafter.t2d[top] = True
    drafter.load_target_embeddings(target.get_input_embeddings().weight)
    drafter.config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": layer_ids}
    to_draft = torch.full((VOCAB,), -1, dtype=torch.long)
    to_draft[top] = torch.arange(m)
    opt = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=3e-3)
    t = ids.shape[1]
    pos = torch.arange(t - 1).expand(ids.shape[0], -1)
    for _ in range(steps):
        lg1, h1 = drafter(ids[:, 1:], aux[:, :-1], pos)
        loss = F.cross_entropy(lg1.flatten(0, 1), to_draft[greedy[:, 1:]].flatten(), ignore_index=-1)
        lg2, _ = drafter(ids[:, 2:], h1[:, :-1], pos[:, :-1] + 1)
        loss = loss + 0.8 * F.cross_entropy(lg2.flatten(0, 1), to_draft[greedy[:, 2:]].flatten(), ignore_index=-1)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return drafter.eval()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Two targets (v1, and v2 = another seed of the same shape) and three drafters."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("engine")
    tiny_target(root / "v1", vocab_size=VOCAB, seed=0, tokenizer=False)
    tiny_target(root / "v2", vocab_size=VOCAB, seed=1, tokenizer=False)
    v1, v2 = load_target(root / "v1", dtype=DT), load_target(root / "v2", dtype=DT)
    tcfg = read_config(root / "v1")
    train_prompts = _prompts(12, seed=100)
    trained = fit_drafter(v1, tcfg, train_prompts)
    rnd = Eagle3Drafter(tiny_drafter_config(tcfg)).to(dtype=DT)
    init_weights(rnd, seed=7)
    rnd.d2t.copy_(torch.sort(torch.randperm(VOCAB, generator=torch.Generator().manual_seed(3))[:64]).values
                  - torch.arange(64))
    return {"v1": v1, "v2": v2, "tcfg": tcfg, "trained": trained, "random": rnd, "train_prompts": train_prompts}


CASES = {  # name -> (target, drafter)
    "trained": ("v1", "trained"),
    "random": ("v1", "random"),
    "v1-drafter-on-v2": ("v2", "trained"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_greedy_output_identical_to_target_only(world, case):
    tname, dname = CASES[case]
    target, drafter = world[tname], world[dname]
    prompts = world["train_prompts"][:3] + _prompts(3, seed=5)
    refs = [reference_greedy(target, p, NEW) for p in prompts]
    plain = Engine(target, None, eos_token_ids=())
    for p, ref in zip(prompts, refs):
        assert plain.generate(p, NEW).output_ids == ref
    for k in KS:
        eng = Engine(target, drafter, num_steps=k, eos_token_ids=())
        hist = [0] * (k + 1)
        for p, ref in zip(prompts, refs):
            res = eng.generate(p, NEW)
            assert res.output_ids == ref, f"{case}, k={k}, prompt {p}"
            hist = [a + b for a, b in zip(hist, res.accept_histogram)]
        if case == "trained" and k > 1:
            # partial acceptances happened, so rollback to a mid-chain position was exercised
            assert sum(hist[1:k]) > 0, hist


def test_trained_drafter_is_accepted_and_random_is_not(world):
    prompts = world["train_prompts"][:6]
    lengths = {}
    for name in ("trained", "random"):
        eng = Engine(world["v1"], world[name], num_steps=3, eos_token_ids=())
        res = [eng.generate(p, NEW) for p in prompts]
        lengths[name] = sum(r.completion_tokens for r in res) / sum(r.spec_verify_ct for r in res)
    assert lengths["trained"] > 2.0, lengths
    assert lengths["random"] < 1.3, lengths


@pytest.mark.parametrize("k", [1, 3, 5])
def test_counters_follow_sglang_semantics(world, k):
    eng = Engine(world["v1"], world["trained"], num_steps=k, eos_token_ids=())
    for p in world["train_prompts"][:4]:
        res = eng.generate(p, NEW)
        assert res.completion_tokens == len(res.output_ids) == NEW
        assert res.prompt_tokens == len(p)
        assert sum(res.accept_histogram) == res.spec_verify_ct == res.verify_calls
        assert len(res.accept_histogram) == k + 1 and len(res.accept_by_position) == k
        # accepted at position i <=> the verify accepted more than i drafts
        assert res.accept_by_position == [sum(res.accept_histogram[i + 1:]) for i in range(k)]
        # first token from prefill, then accepted + bonus per verify (the last cycle may be truncated)
        produced = 1 + sum((j + 1) * c for j, c in enumerate(res.accept_histogram))
        assert res.completion_tokens <= produced < res.completion_tokens + k + 1
        assert res.spec_accept_length == pytest.approx(res.completion_tokens / res.spec_verify_ct)
        assert res.draft_tokens <= k * res.spec_verify_ct
        assert res.draft_time > 0 and res.verify_time > 0 and res.prefill_time > 0
        meta = meta_info(res, "r", num_draft_tokens=k + 1)
        assert meta["spec_verify_ct"] == res.spec_verify_ct
        assert meta["spec_accept_length"] == pytest.approx(NEW / res.spec_verify_ct)
        assert meta["spec_num_proposed_drafts"] == k * res.spec_verify_ct  # SGLang's rule, even for a short last cycle
        assert meta["spec_num_correct_drafts"] == sum(res.accept_by_position)


def test_plain_counters_have_no_speculation(world):
    res = Engine(world["v1"], None, eos_token_ids=()).generate([5, 6, 7], 10)
    assert res.completion_tokens == 10 and res.spec_verify_ct == 0 and res.spec_accept_length is None
    assert res.verify_calls == 9  # one prefill + 9 single-token decode steps
    meta = meta_info(res, "r", num_draft_tokens=1)
    assert "spec_verify_ct" not in meta and "spec_accept_length" not in meta
    assert meta["completion_tokens"] == 10


@pytest.mark.parametrize("speculative", [False, True])
def test_stops_at_eos_inclusive_and_respects_max_new_tokens(world, speculative):
    p = world["train_prompts"][0]
    ref = reference_greedy(world["v1"], p, NEW)
    stop = ref[9]
    first = ref.index(stop)
    drafter = world["trained"] if speculative else None
    eng = Engine(world["v1"], drafter, num_steps=5, eos_token_ids=[stop])
    res = eng.generate(p, NEW)
    assert res.output_ids == ref[: first + 1] and res.finish_reason == "stop"
    assert eng.generate(p, NEW, ignore_eos=True).output_ids == ref
    for n in (1, 2, 7):
        out = Engine(world["v1"], drafter, num_steps=5, eos_token_ids=()).generate(p, n)
        assert out.output_ids == ref[:n] and out.finish_reason == "length"
    stopped = Engine(world["v1"], drafter, num_steps=5, eos_token_ids=()).generate(p, NEW, stop_token_ids=[stop])
    assert stopped.output_ids == ref[: first + 1]


def test_drafts_equal_a_fresh_drafter_run_every_cycle(world):
    """Rollback check: each cycle's drafts equal those of a drafter run from scratch on the committed text."""
    target, drafter, k = world["v1"], world["trained"], 3
    eng = Engine(target, drafter, num_steps=k, eos_token_ids=())
    eng.trace = []
    p = world["train_prompts"][1]
    out = eng.generate(p, NEW).output_ids
    layer_ids = aux_layer_ids_for(None, world["tcfg"])
    seq = p + out
    assert any(0 < c["accepted"] < k for c in eng.trace)
    for cycle in eng.trace[:12]:
        n = cycle["length"]  # tokens in the target cache; seq[n] is the pending token
        with torch.no_grad():
            aux, _ = target_features(target, torch.tensor([seq[:n]]), layer_ids)
            cache = DrafterCache()
            lg, h = drafter(torch.tensor([seq[1 : n + 1]]), aux, torch.arange(n).unsqueeze(0), cache)
            drafts = []
            for j in range(len(cycle["drafts"])):
                tok = drafter.draft_to_target(lg[:, -1].argmax(-1, keepdim=True))
                drafts.append(int(tok))
                lg, h = drafter(tok, h[:, -1:], torch.tensor([[n + j]]), cache)
        assert drafts == cycle["drafts"], cycle


def test_crop_cache_rolls_back_transformers_cache(world):
    from transformers import DynamicCache

    model = world["v1"]
    kw = _cache_kwarg(model)
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=torch.tensor([[1, 2, 3, 4, 5]]), use_cache=True, **{kw: cache})
        crop_cache(cache, 3)
        assert cache.get_seq_length() == 3
        got = model(input_ids=torch.tensor([[9, 8]]), use_cache=True, **{kw: cache}).logits
        want = model(input_ids=torch.tensor([[1, 2, 3, 9, 8]]), use_cache=False).logits[:, 3:]
    torch.testing.assert_close(got, want)
    with pytest.raises(ValueError):
        crop_cache(cache, 99)


def test_bad_requests_are_user_errors(world):
    eng = Engine(world["v1"], world["random"], num_steps=2)
    with pytest.raises(DraftlabError, match="empty"):
        eng.generate([], 4)
    with pytest.raises(DraftlabError, match="outside the target vocabulary"):
        eng.generate([1, VOCAB + 5], 4)
    with pytest.raises(DraftlabError, match="max_new_tokens"):
        eng.generate([1, 2], 0)


def test_drafter_for_another_hidden_size_is_refused(world, tmp_path):
    cfg = tiny_drafter_config(world["tcfg"], target_hidden_size=48)
    wrong = Eagle3Drafter(cfg).to(dtype=DT)
    with pytest.raises(DraftlabError, match="another target"):
        Engine(world["v1"], wrong, num_steps=2)
