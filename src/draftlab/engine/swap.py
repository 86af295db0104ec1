"""Replace the engine's drafter weights in place, and everything the engine derived from them.

What an :class:`~draftlab.engine.core.Engine` builds from its drafter's tensors at construction, and what a
swap must therefore redo: the hot ids (``_hot = d2t + arange``: SGLang's ``hot_token_id``), and the static
decoder (``static_decode.enable_static``: fused ``[q; k; v]`` / ``[gate; up]`` weight copies, RoPE tables,
CUDA graphs that captured the addresses of all of these). Hot ids are copied in place (same storage, so any
graph that holds them reads the new map); the static decoder is built again (fused copies re-derived, graphs
recaptured). The target and the drafter's config are untouched: a drafter of another shape or config needs
an engine of its own.

The caller (the server, ``serving.weight_swap``) holds the engine idle while this runs.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch

from draftlab.engine import static_decode
from draftlab.engine.core import Engine
from draftlab.errors import DraftlabError

NOT_SWAPPED = ("embed_tokens.weight", "inv_freq")  # the target's embedding; RoPE frequencies from the config


def drafter_state(engine: Engine) -> dict[str, torch.Tensor]:
    """The drafter's parameters and buffers a swap may replace, by name."""
    named = dict(engine.drafter.named_parameters())
    named.update(dict(engine.drafter.named_buffers()))
    return {n: t for n, t in named.items() if n not in NOT_SWAPPED}


def check_drafter_tensors(engine: Engine, named: Iterable[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Every refusal before any weight is touched: unknown names, other shapes or kinds, hot ids off the vocab."""
    if engine.drafter is None:
        raise DraftlabError("this engine decodes without a drafter; there is no draft model to update")
    held = drafter_state(engine)
    incoming: dict[str, torch.Tensor] = {}
    for name, t in named:
        if name in NOT_SWAPPED:
            raise DraftlabError(f"{name}: never sent in a drafter swap (the drafter's embedding is the target's)")
        if name not in held:
            raise DraftlabError(f"{name}: the served drafter has no such tensor (it has {len(held)}: "
                                f"{', '.join(sorted(held)[:6])}, ...)")
        if tuple(t.shape) != tuple(held[name].shape):
            raise DraftlabError(f"{name}: shape {list(t.shape)}, the served drafter's is {list(held[name].shape)}: "
                                "a drafter of another shape needs a launch of its own")
        if t.dtype.is_floating_point != held[name].dtype.is_floating_point:
            raise DraftlabError(f"{name}: dtype {t.dtype} where the served drafter holds {held[name].dtype}")
        incoming[name] = t
    if "d2t" in incoming:
        vocab = int(engine.target.get_output_embeddings().weight.shape[0])
        hot = incoming["d2t"].long() + torch.arange(incoming["d2t"].numel())
        if int(hot.min()) < 0 or int(hot.max()) >= vocab:
            raise DraftlabError(f"d2t: maps draft ids to target ids outside [0, {vocab}): not a map for this target")
    return incoming


def load_drafter_tensors(engine: Engine, incoming: dict[str, torch.Tensor], max_rows: int,
                         cuda_graph_max_bs: int | None) -> dict[str, Any] | None:
    """Copy checked tensors into the drafter, re-derive the hot ids in place and rebuild the static decoder.

    Returns the static decoder's new ``info()`` (what ``/server_info`` reports), or None when the engine has
    none (the dynamic-cache decoder reads the drafter's weights directly)."""
    held = drafter_state(engine)
    with torch.no_grad():
        for name, t in incoming.items():
            held[name].copy_(t.to(held[name].dtype))
        d2t = engine.drafter.d2t
        engine._hot.copy_(d2t + torch.arange(d2t.numel(), device=d2t.device))
    static_decode._SOLO.pop(engine, None)  # a tree's one-row decoder holds the old fused copies too
    if getattr(engine, "static_decoder", None) is None:
        return None
    engine.static_decoder = None  # its graphs and fused copies go before the new ones are captured
    if engine.device.type == "cuda":
        torch.cuda.empty_cache()
    return static_decode.enable_static(engine, max_rows, cuda_graph_max_bs)
