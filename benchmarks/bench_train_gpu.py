"""Trainer step throughput of the builtin TTT trainer at the production drafter shape (one GPU).

Shape (Kimi-K2 EAGLE-3 drafter): hidden 7168, 64 heads x head_dim 128 (64 KV heads by default),
intermediate 18432, vocab 163840, draft vocab 32000, sequence 2048, TTT 7. Target features are
synthetic (random aux hidden states and target logits), so only the drafter's training step is
timed: fused target distribution over the draft vocab, 7 TTT steps with cross-step attention,
backward, grad clip, AdamW. fp32 master weights under bf16 autocast, as ``draftlab train`` runs.

Model FLOPs per optimizer step (counted honestly, forward x 3 for forward + backward):

    per token, TTT step i:   2 * (P_qkv + P_o + P_mlp + P_head)            (matmuls)
                           + 4 * n_heads * hd * ((T + 1) / 2 + i)           (QK^T and AV: causal keys
                                                                             + i cross-step keys)
    per token, once:         2 * P_fc
    total = 3 * B * T * (sum over i of the above + 2 * P_fc)

where P_* are the weight counts (P_qkv = 2H*(nh+2*nkv)*hd, P_o = nh*hd*H, P_mlp = 3*H*I,
P_head = H*M, P_fc = 3*Ht*H). Masked-out attention work is not counted; the frozen embedding
lookup is free. MFU = FLOPs / step time / 989e12 (H200 dense bf16 peak).

    python benchmarks/bench_train_gpu.py                    # production shape, cuda
    python benchmarks/bench_train_gpu.py --compile          # torch.compile the TTT step
    python benchmarks/bench_train_gpu.py --tiny             # CPU smoke check
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from draftlab.formats.eagle3_format import drafter_config
from draftlab.models.eagle3 import Eagle3Drafter, init_weights
from draftlab.training.loss import TTTModule

PEAK_TFLOPS = 989.0


def shape(tiny: bool) -> dict:
    if tiny:
        return dict(hidden=64, heads=4, kv_heads=4, head_dim=16, inter=128, vocab=512, draft=128, seq=128, ttt=3)
    return dict(hidden=7168, heads=64, kv_heads=64, head_dim=128, inter=18432, vocab=163840, draft=32000, seq=2048,
                ttt=7)


def step_flops(s: dict, batch: int) -> float:
    h, nh, nkv, hd, inter, m, t, k = (s["hidden"], s["heads"], s["kv_heads"], s["head_dim"], s["inter"], s["draft"],
                                       s["seq"], s["ttt"])
    p_layer = 2 * h * (nh + 2 * nkv) * hd + nh * hd * h + 3 * h * inter + h * m
    p_fc = 3 * h * h
    per_token = 2 * p_fc + sum(2 * p_layer + 4 * nh * hd * ((t + 1) / 2 + i) for i in range(k))
    return 3.0 * batch * t * per_token


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="tiny shape on CPU (smoke check)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int)
    ap.add_argument("--ttt", type=int)
    ap.add_argument("--kv-heads", type=int)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--compile", action="store_true", help="torch.compile the TTT forward")
    ap.add_argument("--device", default=None)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    ap.add_argument("--out", help="also write the JSON result here")
    ap.add_argument("--profile", action="store_true", help="print the top kernels of two profiled steps")
    args = ap.parse_args(argv)

    s = shape(args.tiny)
    for key, val in (("seq", args.seq), ("ttt", args.ttt), ("kv_heads", args.kv_heads)):
        if val:
            s[key] = val
    dev = torch.device(args.device or ("cpu" if args.tiny or not torch.cuda.is_available() else "cuda"))
    if args.threads:
        torch.set_num_threads(args.threads)
    bf16 = dev.type == "cuda"
    cfg = drafter_config(hidden_size=s["hidden"], intermediate_size=s["inter"], num_attention_heads=s["heads"],
                         num_key_value_heads=s["kv_heads"], head_dim=s["head_dim"], vocab_size=s["vocab"],
                         draft_vocab_size=s["draft"], max_position_embeddings=max(4096, s["seq"]),
                         target_hidden_size=s["hidden"], aux_layer_ids=[1, 29, 57], rope_theta=50000.0)
    torch.manual_seed(0)
    with torch.device(dev):
        drafter = Eagle3Drafter(cfg)
    init_weights(drafter, seed=0) if args.tiny else None
    drafter.embed_tokens.weight.data = drafter.embed_tokens.weight.data.to(torch.bfloat16 if bf16 else torch.float32)
    ids = torch.randperm(s["vocab"], device=dev)[: s["draft"]].sort().values
    drafter.d2t.copy_(ids - torch.arange(s["draft"], device=dev))
    drafter.t2d.zero_()
    drafter.t2d[ids] = True
    module = TTTModule(drafter, s["ttt"])
    fwd = torch.compile(module) if args.compile else module
    params = [p for p in drafter.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95), fused=dev.type == "cuda")
    b, t = args.batch, s["seq"]
    feat_dtype = torch.bfloat16 if bf16 else torch.float32
    input_ids = torch.randint(0, s["vocab"], (b, t), device=dev)
    loss_mask = torch.ones(b, t, dtype=torch.long, device=dev)
    aux = torch.randn(b, t, 3 * s["hidden"], device=dev, dtype=feat_dtype)
    target_logits = (torch.randn(b, t, s["vocab"], device=dev, dtype=feat_dtype) * 3)

    def step() -> float:
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
            loss, _ = fwd(input_ids, loss_mask, aux, target_logits)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 0.5)
        opt.step()
        return float(loss.detach())

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    for _ in range(args.warmup):
        step()
    sync()
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t0)
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            step()
            step()
            sync()
        print(prof.key_averages().table(sort_by="cuda_time_total" if dev.type == "cuda" else "cpu_time_total",
                                        row_limit=30, max_name_column_width=60), file=sys.stderr)
    times.sort()
    median = times[len(times) // 2]
    flops = step_flops(s, b)
    result = {
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "shape": s, "batch": b, "compile": args.compile, "precision": "bf16 autocast, fp32 master" if bf16 else "fp32",
        "trainable_params": sum(p.numel() for p in params),
        "step_s_median": median, "step_s_min": times[0],
        "tokens_per_s": b * t / median,
        "model_tflops_per_step": flops / 1e12,
        "achieved_tflops": flops / median / 1e12,
        "mfu_vs_989": flops / median / 1e12 / PEAK_TFLOPS,
        "peak_memory_gib": torch.cuda.max_memory_allocated(dev) / 2**30 if dev.type == "cuda" else None,
        "command": " ".join(["python", "benchmarks/bench_train_gpu.py"] + (argv if argv is not None else sys.argv[1:])),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        from draftlab.fsutil import write_text

        write_text(args.out, text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
