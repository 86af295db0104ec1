"""The target model: load it frozen with transformers and read the aux hidden states EAGLE-3 fuses.

transformers returns ``hidden_states`` with the embeddings first, so the *output of layer L* is
``hidden_states[L + 1]``. draftlab's aux ids are such output ids; what a drafter's
``eagle_aux_hidden_state_layer_ids`` mean depends on the target's architecture in SGLang
(:mod:`draftlab.formats.aux_layers`), and :func:`aux_layer_ids_for` is the one place that translates them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import torch
from torch import Tensor

from draftlab.formats import aux_layers
from draftlab.formats import eagle3_format as fmt
from draftlab.errors import DraftlabError
from draftlab.formats.target_config import load_json_config


def read_config(folder: str | Path) -> dict[str, Any]:
    """A model folder's ``config.json`` (types checked by :mod:`draftlab.formats.target_config`)."""
    return load_json_config(Path(folder) / "config.json")


def load_target(folder: str | Path, *, dtype: torch.dtype | None = None, device: str | torch.device | None = None,
                trust_remote_code: bool = False):
    """``AutoModelForCausalLM`` from a local folder, in eval mode with every parameter frozen."""
    from transformers import AutoModelForCausalLM  # deferred: transformers (seconds)

    read_config(folder)  # clear error for a missing/broken config before transformers' own
    refuse_pickle_only(folder)
    try:
        model, info = AutoModelForCausalLM.from_pretrained(
            str(folder), dtype=dtype or torch.float32, trust_remote_code=trust_remote_code, local_files_only=True,
            output_loading_info=True, use_safetensors=True,
        )
    except OSError as exc:  # no weights, a truncated shard: transformers says which file it wanted
        raise DraftlabError(f"{folder}: cannot load the target's weights (expected model.safetensors or an "
                            f"index with its shards): {str(exc).splitlines()[0]}") from exc
    check_loaded(folder, info)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    if device is not None:
        model.to(device)
    return model


PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def refuse_pickle_only(folder: str | Path) -> None:
    """Refuse a target whose weights are pickles only (``pytorch_model.bin``): draftlab loads safetensors only.

    Why: unpickling a file can run any code it holds (draftlab lists pickles and never opens them), and
    transformers' fallback to ``torch.load`` crashed on a pickle holding more than tensors."""
    folder = Path(folder)
    if not folder.is_dir() or any(folder.glob("*.safetensors")) or any(folder.glob("*.safetensors.index.json")):
        return
    pickles = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise DraftlabError(f"{folder}: the target's weights are pickle files only ({', '.join(pickles[:3])}); "
                            "draftlab loads safetensors only (unpickling can run code): save the model with "
                            "safe_serialization=True (model.safetensors)")


def check_loaded(folder: str | Path, info: dict[str, Any]) -> None:
    """Refuse a target whose weights transformers had to invent: it initialises missing tensors at
    random (and mismatched ones afresh) with only a log line, and the model would then serve noise."""
    for key, what in (("missing_keys", "missing from its weight files"), ("mismatched_keys", "of another shape")):
        names = sorted(str(n if isinstance(n, str) else n[0]) for n in info.get(key) or ())
        if names:
            raise DraftlabError(f"{folder}: {len(names)} tensors the config needs are {what} ({', '.join(names[:3])}"
                                f"{', ...' if len(names) > 3 else ''}); transformers would fill them with random "
                                "values: the weights are incomplete or belong to another model")


def load_tokenizer(folder: str | Path, trust_remote_code: bool = False):
    from transformers import AutoTokenizer  # deferred: transformers (seconds)

    try:
        return AutoTokenizer.from_pretrained(str(folder), trust_remote_code=trust_remote_code, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise DraftlabError(f"{folder}: cannot load a tokenizer ({exc})") from exc


def aux_layer_ids_for(drafter_config: dict[str, Any] | None, target_config: dict[str, Any]) -> list[int]:
    """The target layers SGLang feeds this drafter, as output ids (``hidden_states[i + 1]``) in fc order.

    Read the way the target's SGLang model class reads the drafter's
    ``eagle_config.eagle_aux_hidden_state_layer_ids`` (or its default capture without them).
    """
    cfg = drafter_config or {}
    return aux_layers.fed_output_ids(fmt.aux_layer_ids(cfg), target_config, fmt.num_aux_hidden_states(cfg))


def aux_hidden(hidden_states: Sequence[Tensor], layer_ids: Sequence[int]) -> Tensor:
    """Concatenate the outputs of ``layer_ids`` (``hidden_states[L+1]``; -1 = embeddings) in order: [B, T, len(ids)*H]."""
    if min(layer_ids) < -1 or len(hidden_states) < max(layer_ids) + 2:
        raise DraftlabError(f"target returned {len(hidden_states) - 1} layers, aux layer ids {list(layer_ids)} need more")
    return torch.cat([hidden_states[i + 1] for i in layer_ids], dim=-1)


@torch.no_grad()
def target_features(model, input_ids: Tensor, layer_ids: Sequence[int],
                    attention_mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Run the frozen target once: (aux hidden [B,T,3H], logits [B,T,V])."""
    out = model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True, use_cache=False)
    return aux_hidden(out.hidden_states, layer_ids), out.logits


def input_embeddings(model) -> Tensor:
    return model.get_input_embeddings().weight.detach()
