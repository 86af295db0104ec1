"""Tokenize training data with the target's tokenizer and mark the loss (rule ``tokenize``, ``draftlab tokenize``).

Conversations are rendered with the tokenizer's chat template when it has one, else with the simple
format of :func:`draftlab.formats.data.render_simple`. The loss mask is 1 on assistant tokens (from
the start of the assistant content to the end of that turn's rendering, so the template's
end-of-turn marker is learned too; the role header is not), and 1 on every token of plain text. An assistant
turn that carries the ids the target emitted (``token_ids``, kept by data generation) is trained on those ids,
not on its text tokenized again (:func:`_spliced`; ``draftlab token-check`` measures how often they agree).
File formats in and out: :mod:`draftlab.formats.data`.
"""

from __future__ import annotations

import os
from typing import Any

from tqdm import tqdm

from draftlab.errors import DraftlabError, require_int
from draftlab.settings.model import schema_default
from draftlab.formats.data import read_records, render_simple, write_tokens


def _render(tokenizer, messages: list[dict[str, str]]) -> str:
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False) if messages else ""
    return render_simple(messages)


def conversation_spans(tokenizer, messages: list[dict[str, str]]) -> tuple[str, list[tuple[int, int]]]:
    """The rendered text and the character spans of the assistant turns in it."""
    full = _render(tokenizer, messages)
    spans: list[tuple[int, int]] = []
    cursor = 0
    for i, m in enumerate(messages):
        before = _render(tokenizer, messages[:i])
        after = _render(tokenizer, messages[: i + 1])
        stable = full.startswith(after) and after.startswith(before)
        start_search = len(before) if stable else cursor
        start = full.find(m["content"], start_search) if m["content"] else start_search
        if start < 0:
            start = start_search
        end = len(after) if stable else start + len(m["content"])
        if m["role"] == "assistant":
            spans.append((start, end))
        cursor = max(cursor, end)
    return full, spans


# Characters tokenized per wanted token in the first try; a window that yields too few tokens grows
# (x4) until it does or covers the text. Real tokenizers average 3-5 characters per token.
CHARS_PER_TOKEN = 8
# Tokens beyond max_length the window must reach, so the cut through the last word cannot change
# the tokens that are kept.
_CUT_MARGIN = 16


def tokenize_record(tokenizer, record: dict[str, Any], max_length: int | None = None) -> dict[str, list[int]]:
    """``{"input_ids", "loss_mask"}`` for one sample (truncated to ``max_length`` tokens).

    Only a prefix of the text is tokenized (about ``max_length * CHARS_PER_TOKEN`` characters,
    grown when it falls short), so a 10 MB line costs what ``max_length`` tokens cost, not 2 GB.
    """
    if "text" in record:
        text, spans, special = record["text"], None, True
    else:
        text, spans = conversation_spans(tokenizer, record["messages"])
        special = not bool(getattr(tokenizer, "chat_template", None))
        if not special and any(m.get("token_ids") for m in record["messages"]):
            ids, mask = _spliced(tokenizer, text, spans, [m for m in record["messages"] if m["role"] == "assistant"])
            return {"input_ids": ids[:max_length] if max_length else ids, "loss_mask": mask[:max_length] if max_length else mask}
    window = max_length * CHARS_PER_TOKEN if max_length else len(text)
    while True:
        part = text[:window]
        ids, mask = _encode(tokenizer, part, spans, special)
        if len(part) == len(text) or len(ids) >= max_length + _CUT_MARGIN:
            break
        window *= 4
    if max_length:
        ids, mask = ids[:max_length], mask[:max_length]
    return {"input_ids": ids, "loss_mask": mask}


def _spliced(tokenizer, text: str, spans: list[tuple[int, int]], answers: list[dict[str, Any]]) -> tuple[list[int], list[int]]:
    """Token-exact ids of a rendered conversation: the text between assistant turns tokenized piece by piece (the
    prompt as the server tokenized it, up to the assistant header), each assistant turn the ids the target emitted
    where they decode to the start of its rendering (the rest of the turn's rendering, e.g. a newline after the
    end-of-turn token, tokenized after them), else its rendering tokenized. Re-tokenizing emitted text can split it
    otherwise than the target did; the drafter must learn what the target emits."""
    ids: list[int] = []
    mask: list[int] = []

    def add(piece: str, bit: int) -> None:
        if piece:
            part = list(tokenizer(piece, add_special_tokens=False)["input_ids"])
            ids.extend(part)
            mask.extend([bit] * len(part))

    pos = 0
    for (start, end), m in zip(spans, answers):
        add(text[pos:start], 0)
        emitted = m.get("token_ids")
        covered = _covered(tokenizer, emitted, text[start:end]) if emitted else None
        if covered is not None:
            ids.extend(emitted)
            mask.extend([1] * len(emitted))
            add(text[start + covered:end], 1)
        else:
            add(text[start:end], 1)
        pos = end
    add(text[pos:], 0)
    return ids, mask


def _covered(tokenizer, emitted: list[int], turn: str) -> int | None:
    """How many characters of the turn's rendering the emitted ids stand for, or None where they do not begin it.
    A server decodes the answer without special tokens (SGLang's and the builtin's default), so a special token
    the target emitted inside its answer is not in the stored text: the ids still stand for the text they decode
    to without it, and for the end-of-turn token the template writes after it."""
    said = tokenizer.decode(emitted, skip_special_tokens=False)
    if turn.startswith(said):
        return len(said)
    plain = tokenizer.decode(emitted, skip_special_tokens=True)
    if not turn.startswith(plain):
        return None
    last = tokenizer.decode(emitted[-1:], skip_special_tokens=False)
    closes = last != tokenizer.decode(emitted[-1:], skip_special_tokens=True) and turn.startswith(last, len(plain))
    return len(plain) + (len(last) if closes else 0)


def _encode(tokenizer, text: str, spans: list[tuple[int, int]] | None, special: bool) -> tuple[list[int], list[int]]:
    """Token ids and loss mask of ``text``: all 1 for plain text (``spans`` None), else 1 on tokens
    overlapping an assistant span."""
    if spans is None:
        ids = list(tokenizer(text, add_special_tokens=special)["input_ids"])
        return ids, [1] * len(ids)
    enc = tokenizer(text, add_special_tokens=special, return_offsets_mapping=True)
    mask = [1 if b > a and any(a < e and b > s for s, e in spans) else 0  # token overlaps an assistant span
            for a, b in enc["offset_mapping"]]
    return list(enc["input_ids"]), mask


def tokenize_file(target: str | os.PathLike, data: str | os.PathLike, out: str | os.PathLike,
                  max_length: int | None = schema_default("train.max_length"), trust_remote_code: bool = False) -> dict[str, Any]:
    """Tokenize a data file with the target's tokenizer into ``out``; returns counts."""
    from draftlab.models.target import load_tokenizer  # deferred: loads torch

    if max_length is not None:
        require_int("--max-length", max_length)
    tok = load_tokenizer(target, trust_remote_code=trust_remote_code)
    samples = [tokenize_record(tok, r, max_length)
               for r in tqdm(list(read_records(data)), desc="tokenizing", unit="sample", disable=None)]
    samples = [s for s in samples if len(s["input_ids"]) >= 2]
    if not samples:
        raise DraftlabError(f"{data}: no sample has at least 2 tokens")
    write_tokens(out, samples)
    return {
        "out": str(out),
        "samples": len(samples),
        "tokens": sum(len(s["input_ids"]) for s in samples),
        "loss_tokens": sum(sum(s["loss_mask"]) for s in samples),
        "chat_template": bool(getattr(tok, "chat_template", None)),
    }
