"""Check on a GPU that the flex-attention TTT path gives the dense-mask SDPA path's outputs and gradients.

    python benchmarks/check_ttt_attention_gpu.py
"""

from __future__ import annotations

import json

import torch
import torch.nn.functional as F

from draftlab.training.attention import cross_step_attend


class _Attn:
    n_heads, n_kv, hd = 8, 4, 64

    def attend(self, q, k, v, mask, causal=False):
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        return out.transpose(1, 2).reshape(q.shape[0], q.shape[2], self.n_heads * self.hd)


def main() -> None:
    torch.manual_seed(0)
    dev, t, steps = "cuda", 512, 4
    q = torch.randn(2, 8, t, 64, device=dev, requires_grad=True)
    keys = [torch.randn(2, 4, t, 64, device=dev, requires_grad=True) for _ in range(steps)]
    values = [torch.randn(2, 4, t, 64, device=dev, requires_grad=True) for _ in range(steps)]
    report = {}
    for step in range(1, steps):
        ks, vs = keys[: step + 1], values[: step + 1]
        outs = {b: cross_step_attend(_Attn(), q, ks, vs, step, b) for b in ("sdpa", "flex")}
        grads = {b: torch.autograd.grad(o.square().sum(), [q, *ks, *vs]) for b, o in outs.items()}
        report[f"step{step}"] = {
            "out_max_abs_diff": (outs["sdpa"] - outs["flex"]).abs().max().item(),
            "grad_max_abs_diff": max((a - b).abs().max().item() for a, b in zip(grads["sdpa"], grads["flex"])),
        }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
