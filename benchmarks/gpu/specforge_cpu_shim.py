#!/usr/bin/env python
"""`specforge train` on a machine without CUDA: a rehearsal of the specforge-keep-arm GPU job, never the GPU run.

SpecForge 0.2.0's offline trainer needs an accelerator in exactly three places (found by running it on CPU
with torch 2.13): FSDP (``training/backend.py::prepare_model``: "FSDP needs a non-CPU accelerator device"),
flex attention's backward (``modeling/draft/llama3_eagle.py``: "FlexAttention does not support backward on
CPU") and its Triton loss kernel (``core/loss.py::LogSoftmaxLoss``: no active Triton driver). The first two
are settings (``training.fsdp_sharding=NO_SHARD`` -> DDP over gloo, ``training.attention_backend=sdpa``),
which ``DEVICE=cpu bash benchmarks/gpu/run.sh specforge-keep-arm run`` passes; this harness swaps the third for
the reference formula in the same file (``_compute_loss``: mean over positions of -sum(mask * p * log_softmax(logits)),
what the kernel computes) and then runs SpecForge's own CLI, so everything else (config, warm start,
vocab mapping, offline feature reader, TargetHead, TTT loop, optimizer, checkpoint) is SpecForge's code.
Without Triton installed (CPU CI) ``specforge.core.loss`` is that one class alone (the module imports Triton
at the top; nothing else on this path uses it).

    python benchmarks/gpu/specforge_cpu_shim.py train --config RUN.yaml training.fsdp_sharding=NO_SHARD \
        training.attention_backend=sdpa
"""

import sys

import torch
from torch import nn


class ReferenceLogSoftmaxLoss:
    """``LogSoftmaxLoss.apply`` (a Triton kernel) as SpecForge's reference ``_compute_loss``, uncompiled."""

    @staticmethod
    def apply(logits, target, position_mask):
        logp = nn.LogSoftmax(dim=2)(logits.float())
        return -torch.sum(position_mask * (target * logp), 2).mean()


def main(argv: list[str]) -> int:
    import importlib.util
    import types

    if importlib.util.find_spec("triton") is not None:  # the real module, its kernel swapped
        from specforge.core import loss
    else:  # no Triton (CPU CI): the module's one class this path uses, without its kernels
        loss = types.ModuleType("specforge.core.loss")
        sys.modules[loss.__name__] = loss
    loss.LogSoftmaxLoss = ReferenceLogSoftmaxLoss
    import specforge.algorithms.eagle3.model as eagle3_model  # binds `from specforge.core.loss import LogSoftmaxLoss`

    assert eagle3_model.LogSoftmaxLoss is ReferenceLogSoftmaxLoss
    from specforge.cli import main as specforge_main

    return specforge_main(argv)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
