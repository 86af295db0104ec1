"""Regenerate training data with the target itself: run it over a prompt set, write conversations.

Why: a drafter learns to predict *its target's* next token, so the best fine-tune data is the
target's own output on prompts like the ones it will serve (the usual recipe before SpecForge
training). Output is JSONL, one conversation per prompt::

    {"messages": [{"role": "user", "content": ...}, {"role": "assistant", "content": <generated>}]}

Prompt files: JSONL with ``{"prompt": str}``, ``{"text": str}`` or ``{"messages"|"conversations":
[...]}`` (trailing assistant turns are dropped, the rest is the prompt), or plain text with one
prompt per non-blank line. Greedy by default; with a temperature each prompt ``i`` is sampled under
the seed ``seed + i`` so the output does not depend on order or on where a run stopped.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from draftlab.errors import DraftlabError
from draftlab.fsutil import atomic_path


def read_prompts(path: str | os.PathLike) -> list[list[dict[str, str]]]:
    """Every prompt of ``path`` as a message list ending in a non-assistant turn."""
    from draftlab.formats.data import iter_lines, parse_turns

    path = Path(path)
    prompts: list[list[dict[str, str]]] = []
    as_json = path.suffix in (".jsonl", ".json")
    for lineno, obj in iter_lines(path, "prompt file"):
        if not as_json:
            prompts.append([{"role": "user", "content": obj}])
            continue
        where = f"{path}:{lineno}"
        if isinstance(obj, dict) and isinstance(obj.get("prompt", obj.get("text")), str):
            prompts.append([{"role": "user", "content": obj.get("prompt", obj.get("text"))}])
            continue
        turns = obj.get("messages", obj.get("conversations")) if isinstance(obj, dict) else None
        if not isinstance(turns, list):
            raise DraftlabError(f"{where}: expected a key 'prompt' or 'text' (a string) or 'messages' (a list of turns)")
        messages = parse_turns(turns, where)
        while messages and messages[-1]["role"] == "assistant":
            messages.pop()
        if not messages:
            raise DraftlabError(f"{where}: 'messages' has no user turn to answer")
        prompts.append(messages)
    if not prompts:
        raise DraftlabError(f"{path}: no prompts")
    return prompts


def prompt_ids(tokenizer, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of the prompt with the assistant header appended (chat template, else ``role: text``)."""
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        return list(ids)
    from draftlab.formats.data import render_simple

    return list(tokenizer(render_simple(messages) + "assistant: ")["input_ids"])


def generate(
    target: str | os.PathLike,
    prompts: str | os.PathLike,
    out: str | os.PathLike,
    *,
    max_new_tokens: int = 128,
    temperature: float | None = None,
    top_p: float = 1.0,
    seed: int = 0,
    limit: int | None = None,
    device: str | None = None,
    trust_remote_code: bool = False,
    batch_size: int = 1,
) -> dict[str, Any]:
    """Answer every prompt with the target and write the conversations to ``out`` (atomically).

    ``temperature=None`` (or 0) is greedy decoding. ``device``: None = the CPU, else auto | cpu | cuda[:N].
    ``batch_size`` > 1 decodes greedy prompts in left-padded batches. Returns counts and timing.
    """
    from draftlab.models.target import load_target, load_tokenizer, read_config
    from draftlab.formats.target_config import text_config

    if max_new_tokens < 1:
        raise DraftlabError(f"--max-new-tokens: expected a positive integer, got {max_new_tokens}")
    if temperature is not None and temperature < 0:
        raise DraftlabError(f"--temperature: expected a value >= 0, got {temperature}")
    sampled = bool(temperature)
    items = read_prompts(prompts)[: limit or None]
    cfg = text_config(read_config(target))
    context = int(cfg.get("max_position_embeddings") or 0) or None
    tokenizer = load_tokenizer(target, trust_remote_code=trust_remote_code)
    from draftlab.serving.devices import resolve_device

    if batch_size < 1:
        raise DraftlabError(f"--batch-size: expected a positive integer, got {batch_size}")
    where = resolve_device(device, what="generate: --device") if device is not None else None
    model = load_target(target, device=where, trust_remote_code=trust_remote_code)
    dev = next(model.parameters()).device
    eos = _eos_ids(model, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos[0] if eos else 0)

    t0 = time.perf_counter()
    n_new = n_truncated = n_empty = 0
    jobs = []  # (messages, prompt ids, token budget), in prompt order
    for messages in items:
        ids = prompt_ids(tokenizer, messages)
        budget = max_new_tokens
        if context is not None and len(ids) + budget > context:
            keep = max(1, context - budget)
            if keep < len(ids):
                ids = ids[-keep:]  # keep the end of the prompt: it holds the assistant header
                n_truncated += 1
            budget = min(budget, context - len(ids))
        jobs.append((messages, ids, budget))
    # Greedy prompts go through in left-padded batches of batch_size (a GPU decodes 64 at the cost of
    # one); sampled ones one at a time, so that prompt i is always sampled under seed + i.
    per_batch = 1 if sampled else max(1, int(batch_size))
    out = Path(out)
    bar = tqdm(total=len(jobs), desc="generate", unit="prompt", file=sys.stderr, disable=None)
    with atomic_path(out) as tmp, tmp.open("w", encoding="utf-8") as fh:
        for start in range(0, len(jobs), per_batch):
            chunk = jobs[start:start + per_batch]
            width = max(len(ids) for _, ids, _ in chunk)
            x = torch.tensor([[pad] * (width - len(ids)) + ids for _, ids, _ in chunk], device=dev)
            att = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for _, ids, _ in chunk], device=dev)
            kwargs: dict[str, Any] = dict(max_new_tokens=min(b for _, _, b in chunk), eos_token_id=eos or None,
                                          pad_token_id=pad, attention_mask=att)
            if sampled:
                torch.manual_seed(seed + start)
                kwargs.update(do_sample=True, temperature=float(temperature), top_p=top_p, top_k=0)
            else:
                kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
            with torch.no_grad():
                seqs = model.generate(x, **kwargs)[:, width:].tolist()
            for (messages, _, _), seq in zip(chunk, seqs):
                seq = _until_eos(seq, eos)
                n_new += len(seq)
                text = tokenizer.decode(seq, skip_special_tokens=True)
                n_empty += not text.strip()
                row = {"messages": messages + [{"role": "assistant", "content": text}]}
                fh.write(json.dumps(row, ensure_ascii=False) + "\n")
            bar.update(len(chunk))
    bar.close()
    seconds = time.perf_counter() - t0
    return {
        "out": str(out),
        "prompts": len(items),
        "generated_tokens": n_new,
        "empty": n_empty,
        "truncated_prompts": n_truncated,
        "mode": f"sampled (temperature {temperature}, top_p {top_p}, seed {seed})" if sampled else "greedy",
        "seconds": round(seconds, 3),
        "device": str(dev),
        "batch_size": per_batch,
        "tokens_per_s": round(n_new / seconds, 1) if seconds > 0 else None,
    }


def _until_eos(seq: list[int], eos: list[int]) -> list[int]:
    """The tokens before the first end-of-turn id (a batched row carries padding after it)."""
    for j, tok in enumerate(seq):
        if tok in eos:
            return seq[:j]
    return seq


def _eos_ids(model, tokenizer) -> list[int]:
    """End-of-turn ids: the generation config's, the model config's and the tokenizer's."""
    ids: list[int] = []
    for source in (getattr(model, "generation_config", None), model.config):
        value = getattr(source, "eos_token_id", None)
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if v is not None and v not in ids:
                ids.append(int(v))
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(int(tokenizer.eos_token_id))
    return ids
