"""Prompt files for data generation, streamed: every prompt with its id and a digest of its content.

Formats users bring (one prompt per line):
- ShareGPT JSONL: ``{"id": ..., "conversations": [{"from": "human"|"gpt"|"system", "value": ...}]}``;
- OpenAI JSONL: ``{"messages": [{"role", "content"}, ...]}``;
- JSONL ``{"prompt": str}`` or ``{"text": str}``;
- any other file: plain text, one prompt per non-blank line.

A conversation's trailing assistant turns are dropped (the target writes that turn again); the rest
is the prompt. With every turn regenerated (``turn_segments``), the target answers each user turn in
order, its own earlier answers in the context, as SpecForge's regeneration does. The prompt id is
the prompt's position in the file (0, 1, 2, ... over non-blank lines): answers are stored and sorted
by it, and sampled answers are seeded with ``seed + id``. The digest ties a stored answer to the
prompt it answered, so an edited prompt file never pairs an old answer with a new prompt. A
record's own ``id`` (ShareGPT's) travels into the output row.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from draftlab.errors import DraftlabError


@dataclass(frozen=True)
class Prompt:
    id: int                             # position in the file (0-based, blank lines not counted)
    messages: tuple[dict[str, str], ...]  # ends in a non-assistant turn
    digest: str                         # sha256 of the messages (canonical JSON), first 16 hex digits
    source_id: Any = None               # the record's own "id", when it has one

    @property
    def chars(self) -> int:
        return sum(len(m["content"]) for m in self.messages)

    def as_messages(self) -> list[dict[str, str]]:
        return [dict(m) for m in self.messages]


def prompt_digest(messages: list[dict[str, str]] | tuple[dict[str, str], ...]) -> str:
    blob = json.dumps([[m["role"], m["content"]] for m in messages], ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def iter_prompts(path: str | os.PathLike) -> Iterator[Prompt]:
    """Every prompt of ``path`` in file order, streamed (a million-line file is never held whole)."""
    from draftlab.formats.data import iter_lines

    path = Path(path)
    as_json = path.suffix in (".jsonl", ".json")
    n = 0
    for lineno, obj in iter_lines(path, "prompt file"):
        messages, source_id = (([{"role": "user", "content": obj}], None) if not as_json
                               else _messages(obj, f"{path}:{lineno}"))
        yield Prompt(n, tuple(messages), prompt_digest(messages), source_id)
        n += 1
    if n == 0:
        raise DraftlabError(f"{path}: no prompts (expected one per non-blank line)")


def _messages(obj: Any, where: str) -> tuple[list[dict[str, str]], Any]:
    from draftlab.formats.data import parse_turns

    source_id = obj.get("id") if isinstance(obj, dict) else None
    text = obj.get("prompt", obj.get("text")) if isinstance(obj, dict) else None
    if isinstance(text, str):
        return [{"role": "user", "content": text}], source_id
    turns = obj.get("messages", obj.get("conversations")) if isinstance(obj, dict) else None
    if not isinstance(turns, list):
        raise DraftlabError(f"{where}: expected a key 'prompt' or 'text' (a string), 'messages' (OpenAI turns) "
                            "or 'conversations' (ShareGPT turns)")
    messages = parse_turns(turns, where)
    while messages and messages[-1]["role"] == "assistant":
        messages.pop()
    if not messages:
        raise DraftlabError(f"{where}: the conversation has no user turn to answer")
    return messages, source_id


def turn_segments(messages: list[dict[str, str]] | tuple[dict[str, str], ...]) -> list[list[dict[str, str]]]:
    """The conversation as the target answers it turn by turn: one segment per user turn (with the
    system or other non-assistant messages before it), each to be followed by the target's answer.
    The data's own assistant turns are dropped: the target writes every one of them again. Messages
    after the last user turn join the last segment; a conversation without a user turn is one segment.
    """
    segments: list[list[dict[str, str]]] = []
    current: list[dict[str, str]] = []
    for m in messages:
        if m["role"] == "assistant":
            continue
        current.append(dict(m))
        if m["role"] == "user":
            segments.append(current)
            current = []
    if current:
        if segments:
            segments[-1].extend(current)
        else:
            segments.append(current)
    return segments


def read_prompts(path: str | os.PathLike) -> list[list[dict[str, str]]]:
    """Every prompt of ``path`` as a message list (small files and tests; generation streams)."""
    return [p.as_messages() for p in iter_prompts(path)]
