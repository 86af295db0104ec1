#!/usr/bin/env python
"""Builtin engine performance: speculative vs plain tok/s, and engine efficiency.

Self-contained (torch + transformers + draftlab): it builds its own target, trains an EAGLE-3
drafter on the target's own greedy outputs, then decodes held-out prompts plainly and with
speculation in the same engine, and prints one JSON document.

    python benchmarks/bench_engine.py                          # CPU, demo-like pair (~2-4 min on 2 cores)
    python benchmarks/bench_engine.py --device cuda --gpu-pair # one GPU, ~125M-parameter target (< 8 min)
    python benchmarks/bench_engine.py --target DIR --drafter DIR   # an existing pair (e.g. the demo models)

The target is a real ``LlamaForCausalLM`` (full compute of its size) with a *structured* random
init: embeddings of std ``--embed-std`` and ``lm_head[j] = sum of E[x] over x with f(x) = j`` for a
random map ``f`` (a permutation of a common quarter of the vocabulary, every other token mapped into
it), so its greedy next token is mostly ``f(current token)`` and, where the randomly initialised
layers outweigh the embedding, something context-dependent (``target_f_agreement`` reports how
often the former). The drafter is not constructed to agree: it is trained (a short EAGLE-3-style
run with a 3-step training-time test) on the target's features and greedy outputs, and its accept
length is measured. Timing does not depend on what the weights mean, only on the model sizes and
the measured accept length, which is why this stands in for a trained pair at GPU size.

Efficiency (see docs/serving.md):
    predicted = L_cycle * t_plain_step / (t_verify + k * t_draft)
    measured  = spec decode tok/s / plain decode tok/s        (prefill excluded from both)
    efficiency = measured / predicted
with t_* the median times of the bare forwards (target 1 token, target k+1 tokens with hidden
states; t_draft = per-call mean of the drafter's k calls in a cycle, k-1 chain steps and one extend
over L_cycle tokens) at a context of prompt + max_new/2 tokens, measured apart from the engine,
and L_cycle = tokens emitted by verify cycles per verify (the SGLang accept length minus the
prefill token's share). Everything the engine does besides those forwards (argmax transfers, the
acceptance loop, aux slicing, cache crops, Python) shows up as efficiency < 1.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from draftlab.engine.core import Engine, resolve_dtype
from draftlab.models.eagle3 import Eagle3Drafter, init_weights
from draftlab.formats.eagle3_format import default_aux_layer_ids, drafter_config

SIZES = {
    # demo-like: the shape of the demo "default" target (draftlab.training.demo_models.SIZES["default"])
    "cpu": dict(hidden_size=128, num_layers=8, heads=4, kv_heads=2, intermediate_size=384, vocab_size=2048,
                draft_vocab_size=1024, embed_std=0.1, prompts_train=128, train_len=80, train_steps=200,
                lr=3e-3, eval_prompts=8, max_new_tokens=96, batch=16),
    # GPU-sized: 12 x 768 Llama, vocab 32000 -> ~125M parameters
    "gpu": dict(hidden_size=768, num_layers=12, heads=12, kv_heads=4, intermediate_size=2048, vocab_size=32000,
                draft_vocab_size=16000, embed_std=0.35, prompts_train=512, train_len=128, train_steps=800,
                lr=2e-3, eval_prompts=10, max_new_tokens=200, batch=32),
}


def log(msg: str) -> None:
    print(f"[bench_engine] {msg}", file=sys.stderr, flush=True)


def build_target(size: dict, embed_std: float, device, dtype, seed: int = 0):
    """A Llama target whose greedy choice is mostly f(current token), context-dependent elsewhere."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=size["hidden_size"], intermediate_size=size["intermediate_size"],
                      num_hidden_layers=size["num_layers"], num_attention_heads=size["heads"],
                      num_key_value_heads=size["kv_heads"], vocab_size=size["vocab_size"],
                      max_position_embeddings=2048, tie_word_embeddings=False, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    g = torch.Generator().manual_seed(seed)
    v, h = cfg.vocab_size, cfg.hidden_size
    emb = torch.randn(v, h, generator=g) * embed_std
    # f: a permutation of a common subset S (a quarter of the vocabulary); other tokens map into S
    order = torch.randperm(v, generator=g)
    common = order[: v // 4]
    f = common[torch.randint(0, len(common), (v,), generator=g)]
    f[common] = common[torch.randperm(len(common), generator=g)]
    head = torch.zeros(v, h).index_add_(0, f, emb / embed_std)  # row j scores every x with f(x) = j
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(emb)
        model.lm_head.weight.copy_(head)
    model.eval().requires_grad_(False)
    return model.to(device=device, dtype=dtype), f.to(device)


@torch.inference_mode()
def greedy_batch(model, prompts: torch.Tensor, n: int) -> torch.Tensor:
    """Batched greedy continuation (equal-length prompts, no padding): [B, P + n]."""
    from transformers import DynamicCache

    from draftlab.engine.core import _cache_kwarg

    kw = _cache_kwarg(model)
    cache = DynamicCache(config=model.config)
    out = model(input_ids=prompts, use_cache=True, logits_to_keep=1, **{kw: cache})
    toks = [prompts, out.logits[:, -1:].argmax(-1)]
    for _ in range(n - 1):
        out = model(input_ids=toks[-1], use_cache=True, **{kw: cache})
        toks.append(out.logits[:, -1:].argmax(-1))
    return torch.cat(toks, dim=1)


def train_drafter(target, size: dict, device, seed: int = 0, steps: int | None = None, ttt: int = 3):
    """A short EAGLE-3-style fit on the target's own greedy outputs (SpecForge-style vocab mapping)."""
    from draftlab.models.target import aux_hidden

    steps = steps or size["train_steps"]
    v, m, h = size["vocab_size"], size["draft_vocab_size"], size["hidden_size"]
    g = torch.Generator().manual_seed(seed + 1)
    prompts = torch.randint(1, v, (size["prompts_train"], 8), generator=g).to(device)
    t0 = time.perf_counter()
    seqs = greedy_batch(target, prompts, size["train_len"])
    layer_ids = default_aux_layer_ids(size["num_layers"])
    chunks_aux, chunks_greedy = [], []
    with torch.inference_mode():
        for chunk in seqs.split(32):
            out = target(input_ids=chunk, use_cache=False, output_hidden_states=True)
            chunks_aux.append(aux_hidden(out.hidden_states, layer_ids).float())
            chunks_greedy.append(out.logits.argmax(-1))
    aux, greedy = torch.cat(chunks_aux).clone(), torch.cat(chunks_greedy).clone()
    seqs = seqs.clone()
    log(f"drafter data: {tuple(seqs.shape)} greedy tokens in {time.perf_counter() - t0:.1f}s")
    counts = torch.bincount(seqs.flatten(), minlength=v).cpu()
    top = torch.sort(torch.topk(counts, m).indices).values  # SpecForge: most frequent ids, sorted
    cfg = drafter_config(hidden_size=h, intermediate_size=size["intermediate_size"],
                         num_attention_heads=size["heads"], num_key_value_heads=size["kv_heads"], vocab_size=v,
                         draft_vocab_size=m, max_position_embeddings=2048, target_hidden_size=h,
                         aux_layer_ids=layer_ids, torch_dtype="float32")
    drafter = Eagle3Drafter(cfg)
    init_weights(drafter, seed)
    drafter.d2t.copy_(top - torch.arange(m))
    drafter.t2d.zero_()
    drafter.t2d[top] = True
    drafter.load_target_embeddings(target.get_input_embeddings().weight.float().cpu())
    drafter.to(device)
    to_draft = torch.full((v,), -1, dtype=torch.long, device=device)
    to_draft[top.to(device)] = torch.arange(m, device=device)
    opt = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=size["lr"])
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=size["lr"], total_steps=steps, pct_start=0.05)
    b, t = seqs.shape
    batch = min(b, size["batch"])
    t0 = time.perf_counter()
    for step in range(steps):
        idx = torch.randint(0, b, (batch,), device=device)
        ids, a, gr = seqs[idx], aux[idx], greedy[idx]
        pos = torch.arange(t - 1, device=device).expand(batch, -1)
        hidden, loss, acc = a[:, :-1], 0.0, []
        for s in range(ttt):  # step s: token t+1+s, hidden from step s-1, predicts the target's choice at t+1+s
            n = t - 1 - s
            lg, hidden_out = drafter(ids[:, 1 + s:], hidden[:, :n], pos[:, :n] + s)
            lab = to_draft[gr[:, 1 + s:]]
            loss = loss + (0.8 ** s) * F.cross_entropy(lg.flatten(0, 1), lab.flatten(), ignore_index=-1)
            acc.append(float((lg.detach().argmax(-1) == lab).float().mean()))
            hidden = hidden_out[:, :-1]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 0.5)
        opt.step()
        sched.step()
        if step % 100 == 0 or step == steps - 1:
            log(f"drafter step {step}: loss {float(loss.detach()):.3f}, acc per step {[round(x, 3) for x in acc]}")
    log(f"drafter trained in {time.perf_counter() - t0:.1f}s")
    return drafter.eval().requires_grad_(False)


@torch.inference_mode()
def forward_costs(target, drafter, k: int, ctx: int, extend: int, reps: int = 60) -> dict:
    """Median times of the bare forwards at context ``ctx``: target 1 token, target k+1 tokens, drafter 1
    chain step, drafter extend over ``extend`` tokens (fusing aux states); ``t_draft_s`` = their per-call
    mean in a cycle, ((k-1) chain steps + 1 extend) / k."""
    from transformers import DynamicCache

    from draftlab.engine.core import _cache_kwarg, crop_cache
    from draftlab.models.eagle3 import DrafterCache

    clock = Engine.clock
    dev = next(target.parameters()).device
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    kw = _cache_kwarg(target)
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(1, target.config.vocab_size, (1, ctx), generator=g).to(dev)
    cache = DynamicCache(config=target.config)
    out = target(input_ids=ids, use_cache=True, output_hidden_states=True, **{kw: cache})
    dcache = DrafterCache()
    layer_ids = default_aux_layer_ids(target.config.num_hidden_layers)
    aux = torch.cat([out.hidden_states[i + 1] for i in layer_ids], dim=-1)
    _, hid = drafter(ids, aux, torch.arange(ctx, device=dev).unsqueeze(0), dcache)

    one, many = ids[:, -1:], ids[:, -(k + 1):]
    pos = torch.full((1, 1), ctx, device=dev)
    ext_pos = torch.arange(ctx, ctx + extend, device=dev).unsqueeze(0)
    calls = {  # name -> (forward, undo); timed in rounds, one of each per round, against load drift
        "t_plain_step_s": (lambda: target(input_ids=one, use_cache=True, **{kw: cache}), lambda: crop_cache(cache, ctx)),
        "t_verify_s": (lambda: target(input_ids=many, use_cache=True, output_hidden_states=True, **{kw: cache}),
                       lambda: crop_cache(cache, ctx)),
        "t_draft_step_s": (lambda: drafter(one, hid[:, -1:], pos, dcache), lambda: dcache.crop(ctx)),
        "t_draft_extend_s": (lambda: drafter(ids[:, -extend:], aux[:, -extend:], ext_pos, dcache),
                             lambda: dcache.crop(ctx)),
    }
    times: dict = {name: [] for name in calls}
    for i in range(reps + 3):
        for name, (fn, undo) in calls.items():
            sync()
            t0 = clock()
            fn()
            sync()
            if i >= 3:
                times[name].append(clock() - t0)
            undo()
    out = {"context": ctx}
    out.update({name: sorted(ts)[len(ts) // 2] for name, ts in times.items()})
    out["extend_tokens"] = extend
    out["t_draft_s"] = ((k - 1) * out["t_draft_step_s"] + out["t_draft_extend_s"]) / k
    return out


def summarize(rows: list, speculative: bool) -> dict:
    comp = sum(r.completion_tokens for r in rows)
    e2e = sum(r.e2e_time for r in rows)
    decode = sum(r.e2e_time - r.prefill_time for r in rows)
    out = {
        "completion_tokens": comp,
        "tok_per_s": comp / e2e,
        "decode_tok_per_s": (comp - len(rows)) / decode,
        "outputs": [r.output_ids for r in rows],
        # per call, everything inside the engine's timers included
        "engine_t_verify_s": sum(r.verify_time for r in rows) / sum(r.verify_calls for r in rows),
    }
    if speculative:
        vct = sum(r.spec_verify_ct for r in rows)
        out["spec_verify_ct"] = vct
        out["accept_length"] = comp / vct  # SGLang: completion_tokens / spec_verify_ct
        out["accept_length_cycle"] = (comp - len(rows)) / vct
        out["engine_t_draft_s"] = sum(r.draft_time for r in rows) / sum(r.draft_calls for r in rows)
        out["accept_histogram"] = [sum(col) for col in zip(*(r.accept_histogram for r in rows))]
    return out


def run_interleaved(engines: dict, prompts: list[list[int]], max_new: int) -> dict:
    """Each prompt through every engine in turn, so load drift on a shared machine hits all alike."""
    for eng in engines.values():
        eng.generate(prompts[0], min(16, max_new), ignore_eos=True)  # warm-up
    rows: dict = {key: [] for key in engines}
    for p in prompts:
        for key, eng in engines.items():
            rows[key].append(eng.generate(p, max_new, ignore_eos=True))
    return {key: summarize(rows[key], engines[key].speculative) for key in engines}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--gpu-pair", action="store_true", help="GPU-sized target (~125M params)")
    ap.add_argument("--dtype", default="float32",
                    help="float32 (default: greedy outputs stay bit-identical to plain decoding) or bfloat16 (the "
                         "k+1-token verify and the 1-token plain step round differently, so a near-tie can flip)")
    ap.add_argument("--num-steps", type=int, nargs="+", default=None, help="k values (default: 1 2 3 5 CPU, 2 3 5 GPU)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch CPU threads (default 1: on a shared machine OpenMP spin-waits make 2+ threads far slower)")
    ap.add_argument("--embed-std", type=float, default=None)
    ap.add_argument("--train-steps", type=int, default=None)
    ap.add_argument("--prompts", type=int, default=None, help="held-out prompts per mode")
    ap.add_argument("--train-prompts", type=int, default=None, help="prompts whose greedy outputs train the drafter")
    ap.add_argument("--train-len", type=int, default=None, help="greedy tokens per training prompt")
    ap.add_argument("--max-new-tokens", type=int, default=None)
    ap.add_argument("--target", default=None, help="use an existing target folder instead of building one")
    ap.add_argument("--drafter", default=None, help="with --target: an existing EAGLE-3 drafter folder")
    ap.add_argument("--prompt-file", default=None, help="with --target: text prompts, one per line")
    ap.add_argument("--clock", choices=["wall", "cpu"], default=None,
                    help="timer: cpu = this thread's CPU time (default on CPU with 1 thread: immune to other "
                         "processes on a shared machine), wall = perf_counter (default on cuda)")
    ap.add_argument("--out", default=None, help="also write the JSON here")
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = torch.device(args.device)
    size = dict(SIZES["gpu" if args.gpu_pair else "cpu"])
    for key, val in (("embed_std", args.embed_std), ("train_steps", args.train_steps),
                     ("eval_prompts", args.prompts), ("max_new_tokens", args.max_new_tokens),
                     ("prompts_train", args.train_prompts), ("train_len", args.train_len)):
        if val is not None:
            size[key] = val
    dtype = resolve_dtype(args.dtype)
    clock = args.clock or ("cpu" if device.type == "cpu" and args.threads == 1 else "wall")
    if clock == "cpu":
        Engine.clock = staticmethod(time.thread_time)
    ks = args.num_steps or ([2, 3, 5] if args.gpu_pair else [1, 2, 3, 5])
    t_start = time.perf_counter()
    result: dict = {"device": str(device), "dtype": str(dtype).removeprefix("torch."), "threads": args.threads,
                    "clock": clock,
                    "machine": platform.machine(), "torch": torch.__version__}
    if device.type == "cuda":
        result["gpu"] = torch.cuda.get_device_name(device)

    if args.target:
        from draftlab.models.target import load_target, load_tokenizer

        target = load_target(args.target, dtype=dtype, device=device)
        drafter = Eagle3Drafter.from_pretrained(args.drafter, dtype=dtype, device=device) if args.drafter else None
        if drafter is None:
            raise SystemExit("--target needs --drafter")
        if args.prompt_file:
            tok = load_tokenizer(args.target)
            lines = [l for l in Path(args.prompt_file).read_text().splitlines() if l.strip()][: size["eval_prompts"]]
            prompts = [tok.encode(l) for l in lines]
        else:
            g = torch.Generator().manual_seed(1234)
            prompts = [torch.randint(1, target.config.vocab_size, (12,), generator=g).tolist()
                       for _ in range(size["eval_prompts"])]
        result["pair"] = {"target": args.target, "drafter": args.drafter}
    else:
        target, fmap = build_target(size, size["embed_std"], device, dtype)
        n_params = sum(p.numel() for p in target.parameters())
        drafter = train_drafter(target, size, device, steps=size["train_steps"]).to(dtype=dtype)
        g = torch.Generator().manual_seed(1234)  # held out: not the training prompts (seed 1)
        prompts = [torch.randint(1, size["vocab_size"], (12,), generator=g).tolist() for _ in range(size["eval_prompts"])]
        seqs = greedy_batch(target, torch.tensor(prompts, device=device), 32)
        agree = float((seqs[:, 13:] == fmap[seqs[:, 12:-1]]).float().mean())
        result["pair"] = {"built": "structured random Llama target + drafter trained on its greedy outputs",
                          "target_params": n_params, "target_layers": size["num_layers"],
                          "hidden_size": size["hidden_size"], "vocab_size": size["vocab_size"],
                          "draft_vocab_size": size["draft_vocab_size"], "embed_std": size["embed_std"],
                          "drafter_train_steps": size["train_steps"], "target_f_agreement": round(agree, 3)}

    max_new = size["max_new_tokens"]
    engines = {0: Engine(target, None, eos_token_ids=())}
    for k in ks:
        engines[k] = Engine(target, drafter, num_steps=k, eos_token_ids=())
    runs = run_interleaved(engines, prompts, max_new)
    plain = runs[0]
    result["plain"] = {k: v for k, v in plain.items() if k != "outputs"}
    result["speculative"] = []
    ctx = len(prompts[0]) + max_new // 2
    for k in ks:
        spec = runs[k]
        costs = forward_costs(target, drafter, k, ctx, extend=max(1, round(spec["accept_length_cycle"])))
        predicted = spec["accept_length_cycle"] * costs["t_plain_step_s"] / (costs["t_verify_s"] + k * costs["t_draft_s"])
        measured = spec["decode_tok_per_s"] / plain["decode_tok_per_s"]
        same = sum(a == b for a, b in zip(spec["outputs"], plain["outputs"])) / len(prompts)
        row = {"num_steps": k, **{key: v for key, v in spec.items() if key != "outputs"},
               "forward_costs": costs,
               "speedup_e2e": spec["tok_per_s"] / plain["tok_per_s"], "speedup_decode": measured,
               "predicted_speedup": predicted, "efficiency": measured / predicted,
               "identical_outputs": same}
        result["speculative"].append(row)
        log(f"k={k}: accept {spec['accept_length']:.2f}, {spec['tok_per_s']:.1f} vs {plain['tok_per_s']:.1f} tok/s, "
            f"speedup {measured:.2f} (predicted {predicted:.2f}, efficiency {measured / predicted:.2f}), "
            f"identical {same:.2f}")
    best = max(result["speculative"], key=lambda r: r["speedup_decode"])
    result["best"] = {"num_steps": best["num_steps"], "speedup_decode": best["speedup_decode"],
                      "speedup_e2e": best["speedup_e2e"], "accept_length": best["accept_length"],
                      "efficiency": best["efficiency"]}
    result["wall_s"] = time.perf_counter() - t_start
    text = json.dumps(result, indent=2, default=lambda o: o if not isinstance(o, float) or math.isfinite(o) else None)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
