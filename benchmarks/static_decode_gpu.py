#!/usr/bin/env python
"""Without the demo build: the static decoder's CUDA graphs against ``Engine.generate``.

A Llama of the demo-gpu target's shape (16 x 768, GQA 12/4, MLP 2048, vocab 8192, context 512,
113M parameters) with random weights (decode speed does not depend on what they mean) and a random
EAGLE-3 drafter of the demo drafter's shape (draft vocab 4096). Measures decode tokens/s (prefill
excluded) of plain decoding at concurrency 1 through ``Engine.generate`` (dynamic cache, eager: the
path before the batching scheduler) and through ``StaticDecoder`` with graphs at 1 and 8 rows, its fused
layers (``engine/fused_llama.py``, ``fused_drafter.py``) against transformers' own (kernels per step by
the profiler; each piece of a speculative cycle timed alone, ``phase_ms``); the
speculative cycle time (k=3) at 1 and 8 rows; token identity of every static output with the engine's;
and the memory floor of a plain step (weight bytes read per token + KV bytes) / 4.3 TB/s.
A random drafter is rarely accepted, so the speculative speed-up is given as predicted for an accept
length A: A x t_plain_step / t_cycle (``--accept`` lists the A's; 1.85 is the gpu demo drafter's on its own target).

    python benchmarks/static_decode_gpu.py --device cuda            # prints one JSON document
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time

import torch
from decode_timing import parse_setting, static_run


def build(args):
    from transformers import LlamaConfig, LlamaForCausalLM

    from draftlab.formats.eagle3_format import default_aux_layer_ids, drafter_config
    from draftlab.models.eagle3 import Eagle3Drafter, init_weights

    dtype = getattr(torch, args.dtype)
    cfg = LlamaConfig(hidden_size=args.hidden, intermediate_size=args.inter, num_hidden_layers=args.layers,
                      num_attention_heads=args.heads, num_key_value_heads=args.kv_heads, vocab_size=args.vocab,
                      max_position_embeddings=args.ctx, tie_word_embeddings=False, bos_token_id=0, eos_token_id=0)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    target = LlamaForCausalLM(cfg).to(device=args.device, dtype=dtype).eval()
    dcfg = drafter_config(hidden_size=args.hidden, intermediate_size=args.inter, num_attention_heads=args.heads,
                          num_key_value_heads=args.kv_heads, vocab_size=args.vocab, draft_vocab_size=args.vocab // 2,
                          max_position_embeddings=args.ctx, target_hidden_size=args.hidden,
                          aux_layer_ids=default_aux_layer_ids(args.layers), torch_dtype=args.dtype)
    drafter = Eagle3Drafter(dcfg)
    init_weights(drafter, 1)
    drafter.d2t.zero_()
    return target, drafter.to(device=args.device, dtype=dtype)


def kernels_per_cycle(dec, b: int) -> int | None:
    """CUDA kernels one eager cycle of ``b`` rows launches (what its graph replays), by the profiler."""
    from torch.profiler import ProfilerActivity, profile

    if dec.engine.device.type != "cuda":
        return None
    try:
        with torch.inference_mode(), profile(activities=[ProfilerActivity.CUDA]) as prof:
            dec._cycle(b)
            torch.cuda.synchronize()
        return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    except Exception as exc:  # noqa: BLE001 - a profiler the host refuses costs the count, not the run
        print(f"kernel count unavailable: {exc}", file=sys.stderr)
        return None


def phase_times(spec, prompt: list[int], fused: bool, reps: int = 50) -> dict:
    """ms per run of each piece of a speculative cycle alone, at one row: the target forward over 1 and
    k+1 tokens, one drafter step, the drafter's extend over k+1 tokens, and the whole cycle. On CUDA
    each piece is captured as its own graph and replayed (CUDA events); elsewhere it runs eagerly.
    Where the cycle's time goes beyond a plain step, and what a chain of k costs (the chain prediction's fit)."""
    from draftlab.engine.static_decode import StaticDecoder

    dec = StaticDecoder(spec, max_rows=1, graph_max_bs=0, fused=fused)
    dec.add(prompt, 64, set())
    k, eng = dec.k, dec.engine
    drafter = dec.draft_step
    one, pos1 = dec.pending[:1], dec._clamp(dec.L[:1, None])
    many, posk = torch.zeros(1, k + 1, dtype=torch.long, device=eng.device), dec._clamp(dec.L[:1, None] + dec.span)
    with torch.inference_mode():
        _, aux = dec._target(many, posk, hidden=True)
    pieces = {
        "target_T1": lambda: dec._target(one, pos1, hidden=False),
        f"target_T{k + 1}": lambda: dec._target(many, posk, hidden=True),
        "drafter_step": lambda: drafter(one, dec.d_hidden[:1], pos1, dec.dslots),
        f"drafter_extend_T{k + 1}": lambda: drafter(many, aux, posk, dec.dslots),
        "whole_cycle": lambda: dec._cycle(1),
    }
    out, kernels = {}, {}
    cuda = eng.device.type == "cuda"
    for name, fn in pieces.items():
        with torch.inference_mode():
            if cuda:
                kernels[name] = kernel_table(fn)
                run = captured(fn).replay
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                run()
                start.record()
                for _ in range(reps):
                    run()
                end.record()
                torch.cuda.synchronize()
                out[name] = round(start.elapsed_time(end) / reps, 4)
                if name == "whole_cycle":  # one replay at a time, waited for: the launch latency a step() pays
                    t0 = time.perf_counter()
                    for _ in range(reps):
                        run()
                        torch.cuda.synchronize()
                    out["whole_cycle_synced"] = round((time.perf_counter() - t0) / reps * 1e3, 4)
            else:
                fn()
                t0 = time.perf_counter()
                for _ in range(reps):
                    fn()
                out[name] = round((time.perf_counter() - t0) / reps * 1e3, 4)
    if kernels:
        out["kernels"] = kernels
    return out


def captured(fn):
    """``fn`` captured as a CUDA graph after two warm-up calls on a side stream (lazy inits, kernel choice)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn(), fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def kernel_table(fn, top: int = 12) -> dict:
    """The CUDA kernels of one eager run of ``fn``: how many, their summed device time (the GPU busy
    part of a graph replay; the rest of the replay is the gaps between kernels), the costliest names."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    by_name: dict[str, list] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            row = by_name.setdefault(e.name[:90], [0, 0.0])
            row[0] += 1
            row[1] += e.time_range.elapsed_us()
    busy = sum(us for _, us in by_name.values())
    ranked = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:top]
    return {"n": sum(n for n, _ in by_name.values()), "busy_us": round(busy, 1),
            "top": [[name, n, round(us, 1)] for name, (n, us) in ranked]}


def _plain_decoder(plain):
    from draftlab.engine.static_decode import StaticDecoder

    dec = StaticDecoder(plain, max_rows=1, graph_max_bs=1)
    dec.capture()
    return dec


def static_arms(args, plain, spec, prompts, ref, fused: bool) -> dict:
    """Plain decode at 1 and 8 rows and the speculative cycle (k = num_steps) through ``StaticDecoder``."""
    from draftlab.engine.static_decode import StaticDecoder

    out = {}

    def decoder(engine, kind: str):  # kernels of one eager cycle, then graphs captured (timed)
        t0 = time.perf_counter()
        dec = StaticDecoder(engine, max_rows=8, graph_max_bs=8, fused=fused)
        out[f"kernels_per_{kind}"] = kernels_per_cycle(dec, 1)
        dec.reset().capture()
        out[f"capture_s_{kind}"] = round(time.perf_counter() - t0, 2)
        return dec

    dec = decoder(plain, "plain_step")
    out["static"] = dec.info()
    static_run(dec, prompts[:1], 8)  # warm-up
    outs1, w1, n1, _ = static_run(dec, prompts[:1], args.max_new)
    outs3 = [static_run(dec, [p], args.max_new)[0][0] for p in prompts[:3]]
    outs8, w8, n8, _ = static_run(dec, prompts, args.max_new)
    out["static_plain_c1_tok_s"] = round(n1 / w1, 1)
    out["static_plain_c8_tok_s"] = round(n8 / w8, 1)
    out["c8_over_c1"] = round((n8 / w8) / (n1 / w1), 2)
    out["t_plain_step_ms"] = round(w1 / n1 * 1e3, 4)
    out["plain_identical_to_engine"] = {"c1": outs3 == ref, "c8": outs8[:3] == ref}
    # the speculative cycle (random drafter: its cost; predicted speed-up at accept length A)
    sdec = decoder(spec, "spec_cycle")
    static_run(sdec, prompts[:1], 8)
    souts1, sw1, _, v1 = static_run(sdec, prompts[:1], args.max_new)
    souts8, sw8, _, v8 = static_run(sdec, prompts, args.max_new)
    out["t_cycle_c1_ms"] = round(sw1 / v1 * 1e3, 4)
    out["t_cycle_c8_ms"] = round(sw8 / (v8 / 8) * 1e3, 4)
    out["spec_identical_to_plain"] = {"c1": souts1[0] == outs1[0], "c8": souts8 == outs8}
    out["predicted_spec_speedup_c1"] = {str(a): round(a * out["t_plain_step_ms"] / out["t_cycle_c1_ms"], 2)
                                        for a in args.accept}
    return out


def tree_cycles(args, target, drafter, prompts, plain_c1: list[int], t_plain_ms: float) -> dict:
    """Each ``--trees`` setting's cycle (a chain too: ``3``) through the static decoder with graphs at concurrency 1 (fused
    layers): its time, in plain steps, and token identity with plain decoding. A tree verifies more tokens
    than a chain and drafts ``topk`` beams a step; what it buys is a longer accepted path (measured on a
    trained drafter by ``drafter_levers.py``), what it costs is this."""
    from draftlab.engine.core import Engine
    from draftlab.engine.static_decode import StaticDecoder

    out = {}
    for label in args.trees:
        steps, topk, tokens = parse_setting(label)
        eng = Engine(target, drafter, num_steps=steps, topk=topk, num_draft_tokens=tokens, eos_token_ids=())
        dec = StaticDecoder(eng, max_rows=1, graph_max_bs=1)
        dec.capture()
        static_run(dec, prompts[:1], 8)
        outs, wall, _, cycles = static_run(dec, prompts[:1], args.max_new)
        ms = wall / cycles * 1e3
        out[label] = {"t_cycle_c1_ms": round(ms, 4), "cycle_in_plain_steps": round(ms / t_plain_ms, 3),
                      "identical_to_plain": outs[0] == plain_c1, "kernels": kernels_per_cycle(dec, 1)}
        if args.device.startswith("cuda"):
            dec.add(prompts[0], args.max_new, set())
            with torch.inference_mode():
                out[label]["kernel_table"] = kernel_table(functools.partial(dec._cycle, 1), top=25)
        del dec, eng
    return out


def shape_args(ap: argparse.ArgumentParser) -> None:
    """The demo-gpu shapes and the decode setting (what cycle_breakdown.py times too)."""
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--inter", type=int, default=2048)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--num-steps", type=int, default=3)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    shape_args(ap)
    ap.add_argument("--accept", type=float, nargs="+", default=[1.85, 2.5, 3.0])
    ap.add_argument("--trees", nargs="*", default=[], help="tree settings to time (s3-k4-d8: steps, topk, tokens)")
    ap.add_argument("--skip-unfused", action="store_true", help="fused layers only (the served path)")
    args = ap.parse_args()

    from draftlab.engine.core import Engine

    target, drafter = build(args)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1, args.vocab, (args.prompt_len,), generator=g).tolist() for _ in range(8)]
    plain = Engine(target, None, eos_token_ids=())
    spec = Engine(target, drafter, num_steps=args.num_steps, eos_token_ids=())
    report = {"device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu", "torch": torch.__version__, "args": vars(args)}
    import transformers

    report["transformers"] = transformers.__version__
    # 1. Engine.generate, concurrency 1 (warm-up first)
    plain.generate(prompts[0], 8)
    ref, t, n = [], 0.0, 0
    for p in prompts[:3]:
        res = plain.generate(p, args.max_new)
        ref.append(res.output_ids)
        t += res.e2e_time - res.prefill_time
        n += len(res.output_ids) - 1
    report["engine_generate_c1_tok_s"] = round(n / t, 1)
    # 2.-3. the static decoder with graphs, fused layers (the default) and transformers' own layers
    for name, fused in (("fused", True), ("unfused", False))[: 1 if args.skip_unfused else 2]:
        report[name] = static_arms(args, plain, spec, prompts, ref, fused)
        try:
            report[name]["phase_ms"] = phase_times(spec, prompts[0], fused)
        except Exception as exc:  # noqa: BLE001 - a diagnostic: its failure must not cost the measurements above
            report[name]["phase_ms"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    report.update(report["fused"])  # the default path's figures at the top level
    if args.trees:
        c1 = static_run(_plain_decoder(plain), prompts[:1], args.max_new)[0][0]
        report["trees"] = tree_cycles(args, target, drafter, prompts, c1, report["t_plain_step_ms"])
    # 4. the memory floor of one plain step
    emb = target.get_input_embeddings().weight
    weights = sum(p.numel() * p.element_size() for p in target.parameters()) - emb.numel() * emb.element_size()
    hd = args.hidden // args.heads
    kv = 2 * args.layers * args.kv_heads * hd * emb.element_size() * (args.prompt_len + args.max_new / 2)
    report["floor"] = {"weight_bytes_per_token": weights, "kv_bytes_per_token": int(kv),
                       "floor_ms": round((weights + kv) / 4.3e12 * 1e3, 4),
                       "ceiling_tok_s": round(4.3e12 / (weights + kv), 1),
                       "static_c1_over_floor": round(report["t_plain_step_ms"] / ((weights + kv) / 4.3e12 * 1e3), 1)}
    print(json.dumps(report, indent=1))
    ok = all(all(report[n]["plain_identical_to_engine"].values()) and all(report[n]["spec_identical_to_plain"].values())
             for n in ("fused", "unfused") if n in report)
    ok = ok and all(t["identical_to_plain"] for t in report.get("trees", {}).values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
