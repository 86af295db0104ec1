"""Offline target features: dump the target's aux hidden states to bf16 safetensors shards, read them back.

Training offline trades disk for GPU time: the target runs once, the drafter trains for many epochs.
The price is disk, so the dump first prints its estimate and refuses when the disk cannot hold it:

    bytes = tokens x (3 aux + 1) x hidden x 2        (store="last_hidden", bf16)
    bytes = tokens x (3 x hidden + vocab) x 2        (store="logits")

Layout of a dump folder::

    index.json                  {"format": "draftlab-hidden-states/1", "target", "aux_layer_ids",
                                 "hidden_size", "vocab_size", "store", "samples", "tokens",
                                 "shards": [{"file", "samples": [first, count]}]}
    shard-00000.safetensors     per sample j: "{j}.input_ids" int64 [T], "{j}.loss_mask" int8 [T],
                                "{j}.aux" bf16 [T, 3H], and "{j}.last" bf16 [T, H] (the target's
                                final normed hidden state) or "{j}.logits" bf16 [T, V]

With ``last_hidden`` the trainer turns the last hidden state into logits with the target's own
``lm_head``, read alone from the target's safetensors (the full target is never loaded).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any, Sequence

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor
from tqdm import tqdm

from draftlab.errors import DraftlabError
from draftlab.fsutil import atomic_dir, read_json, to_json
from draftlab.formats.aux_layers import check_output_ids
from draftlab.formats.data import read_tokens
from draftlab.formats.target_config import text_config
from draftlab.models.target import aux_hidden, aux_layer_ids_for, load_target, read_config

FORMAT = "draftlab-hidden-states/1"
STORES = ("last_hidden", "logits")


def storage_estimate(n_tokens: int, hidden_size: int, *, store: str = "last_hidden", vocab_size: int = 0,
                     n_aux: int = 3, bytes_per_value: int = 2) -> int:
    """Bytes a dump needs: tokens x (n_aux x hidden + (hidden | vocab)) x bytes."""
    per_token = n_aux * hidden_size + (hidden_size if store == "last_hidden" else vocab_size)
    return int(n_tokens) * per_token * bytes_per_value


def _gb(n: int) -> str:
    return f"{n / 1e9:.3f} GB" if n < 1e12 else f"{n / 1e12:.2f} TB"


def check_disk(out: str | os.PathLike, needed: int) -> int:
    """Free bytes on the disk that will hold ``out``; raises when it cannot hold ``needed``."""
    probe = Path(out).resolve()
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if needed > free:
        raise DraftlabError(f"{out}: the hidden-state dump needs {_gb(needed)} but the disk holding {probe} has "
                            f"only {_gb(free)} free (train online instead, or dump fewer tokens)")
    return free


def dump_hidden_states(target: str | os.PathLike, tokens: str | os.PathLike, out: str | os.PathLike, *,
                       store: str = "last_hidden", aux_layer_ids: Sequence[int] | None = None,
                       drafter_config: dict | None = None, shard_samples: int = 256, max_length: int | None = None,
                       device: str | None = None, dtype: torch.dtype | None = None, trust_remote_code: bool = False,
                       progress: bool = True) -> dict[str, Any]:
    """Run the target over a tokens file and write the shards; returns the index dict."""
    if store not in STORES:
        raise DraftlabError(f"store {store!r}: expected one of {', '.join(STORES)}")
    raw = read_config(target)
    tcfg = text_config(raw)
    hidden, vocab = int(tcfg["hidden_size"]), int(tcfg["vocab_size"])
    ids = check_output_ids(aux_layer_ids, raw, "--aux-layer-ids") if aux_layer_ids is not None \
        else aux_layer_ids_for(drafter_config, raw)
    samples = read_tokens(tokens, vocab_size=vocab)
    if max_length:
        samples = [{k: v[:max_length] for k, v in s.items()} for s in samples]
    n_tokens = sum(len(s["input_ids"]) for s in samples)
    needed = storage_estimate(n_tokens, hidden, store=store, vocab_size=vocab, n_aux=len(ids))
    free = check_disk(out, needed)
    print(f"hidden-state dump: {n_tokens} tokens x ({len(ids)} aux + 1) x {hidden if store == 'last_hidden' else f'(hidden {hidden} | vocab {vocab})'}"
          f" x 2 bytes = {_gb(needed)} (disk free: {_gb(free)})", file=sys.stderr)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = load_target(target, dtype=dtype, device=device, trust_remote_code=trust_remote_code)
    shards: list[dict[str, Any]] = []
    with atomic_dir(out, stage="hidden-states", inputs=(target, tokens)) as tmp:
        buf: dict[str, Tensor] = {}
        first = 0
        for j, s in enumerate(tqdm(samples, desc="dumping hidden states", unit="sample", disable=not progress or None)):
            x = torch.tensor([s["input_ids"]], device=device)
            with torch.no_grad():
                out_ = model(input_ids=x, output_hidden_states=True, use_cache=False)
            buf[f"{j}.input_ids"] = x[0].cpu()
            buf[f"{j}.loss_mask"] = torch.tensor(s["loss_mask"], dtype=torch.int8)
            buf[f"{j}.aux"] = aux_hidden(out_.hidden_states, ids)[0].to(torch.bfloat16).cpu()
            if store == "last_hidden":
                buf[f"{j}.last"] = out_.hidden_states[-1][0].to(torch.bfloat16).cpu()
            else:
                buf[f"{j}.logits"] = out_.logits[0].to(torch.bfloat16).cpu()
            if (j + 1 - first) >= shard_samples or j == len(samples) - 1:
                name = f"shard-{len(shards):05d}.safetensors"
                save_file({k: v.contiguous() for k, v in buf.items()}, str(tmp / name))
                shards.append({"file": name, "samples": [first, j + 1 - first]})
                buf, first = {}, j + 1
        index = {"format": FORMAT, "target": str(target), "aux_layer_ids": ids, "hidden_size": hidden,
                 "vocab_size": vocab, "store": store, "samples": len(samples), "tokens": n_tokens,
                 "bytes_estimate": needed, "shards": shards}
        (tmp / "index.json").write_text(to_json(index), encoding="utf-8")
    return index


class HiddenStateShards:
    """Random access to a dump folder: ``shards[i]`` -> dict of tensors for sample ``i``."""

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)
        path = self.folder / "index.json"
        if not path.is_file():
            raise DraftlabError(f"{path}: not found (expected a folder written by draftlab dump-hidden-states)")
        self.index = read_json(path, "hidden-state index")
        if self.index.get("format") != FORMAT:
            raise DraftlabError(f"{path}: key 'format' is {self.index.get('format')!r}, expected {FORMAT!r}")
        self._where: list[tuple[str, int]] = []
        for shard in self.index["shards"]:
            first, count = shard["samples"]
            self._where += [(shard["file"], first + k) for k in range(count)]

    @property
    def aux_layer_ids(self) -> list[int]:
        return list(self.index["aux_layer_ids"])

    @property
    def store(self) -> str:
        return self.index["store"]

    def __len__(self) -> int:
        return len(self._where)

    def __getitem__(self, i: int) -> dict[str, Tensor]:
        file, j = self._where[i]
        out = {}
        with safe_open(str(self.folder / file), framework="pt") as f:
            for key in ("input_ids", "loss_mask", "aux", "last", "logits"):
                name = f"{j}.{key}"
                if name in f.keys():
                    out[key] = f.get_tensor(name)
        return out

    def token_samples(self) -> list[dict[str, list[int]]]:
        """The tokens of every sample (for vocab counting and validation splits)."""
        return [{"input_ids": s["input_ids"].tolist(), "loss_mask": s["loss_mask"].tolist()}
                for s in (self[i] for i in range(len(self)))]


def read_target_tensors(target: str | os.PathLike, names: Sequence[str]) -> dict[str, Tensor]:
    """Read a few named tensors from a target's safetensors (single or sharded) without loading the model."""
    folder = Path(target)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = read_json(index, "safetensors index").get("weight_map")
        if not isinstance(weight_map, dict):
            raise DraftlabError(f"{index}: key 'weight_map': expected an object of tensor name -> shard file")
    else:
        files = sorted(folder.glob("*.safetensors"))
        if not files:
            raise DraftlabError(f"{folder}: no *.safetensors file")
        weight_map = {}
        for f_ in files:
            with safe_open(str(f_), framework="pt") as f:
                weight_map.update({k: f_.name for k in f.keys()})
    out = {}
    for name in names:
        if name in weight_map:
            with safe_open(str(folder / weight_map[name]), framework="pt") as f:
                out[name] = f.get_tensor(name)
    return out


def target_head_and_embeddings(target: str | os.PathLike) -> tuple[Tensor, Tensor]:
    """(lm_head [V, H], input embeddings [V, H]) of a Llama-style target; tied heads reuse the embeddings."""
    t = read_target_tensors(target, ["lm_head.weight", "model.embed_tokens.weight",
                                     "model.language_model.embed_tokens.weight"])
    embed = t.get("model.embed_tokens.weight", t.get("model.language_model.embed_tokens.weight"))
    if embed is None:
        raise DraftlabError(f"{target}: tensor 'model.embed_tokens.weight' not found in its safetensors")
    head = t.get("lm_head.weight", embed)
    return head, embed
