"""Prompt files, the one reader of them: data generation and the benchmark read prompts through here.

Formats users bring (one record per line; a name ending in ``.gz`` is read gzipped, its format from the
name without ``.gz``, so ``HumanEval.jsonl.gz`` is gzipped JSONL):
- the shipped set / JSONL ``{"id", "category", "text"}`` or ``{"prompt": str}`` (HumanEval's
  ``HumanEval.jsonl.gz``: ``task_id``, ``prompt``);
- GSM8K ``test.jsonl``: ``{"question", "answer"}`` (the question is the prompt; the answer is not sent);
- MT-Bench ``question.jsonl``: ``{"question_id", "category", "turns": [str, ...]}``, one user turn each;
- ShareGPT JSONL: ``{"id": ..., "conversations": [{"from": "human"|"gpt"|"system", "value": ...}]}``;
- OpenAI JSONL: ``{"messages": [{"role", "content"}, ...]}``;
- any other file: plain text, one prompt per non-blank line.

A record's own id (``id``, MT-Bench's ``question_id``, HumanEval's ``task_id``) is kept as
``source_id`` and its ``category`` (a short printable string) as ``category``. A conversation's trailing
assistant turns are dropped (the target writes that turn again); the rest is the prompt. With every
turn regenerated (``turn_segments``), the target answers each user turn in order, its own earlier
answers in the context, as SpecForge's regeneration does. The prompt id is the prompt's position in
the file (0, 1, 2, ... over non-blank lines): answers are stored and sorted by it, and sampled answers
are seeded with ``seed + id``. The digest ties a stored answer to the prompt it answered, so an edited
prompt file never pairs an old answer with a new prompt.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from draftlab.errors import DraftlabError
from draftlab.formats.data import is_json_file, iter_lines, parse_turns


@dataclass(frozen=True)
class Prompt:
    id: int                             # position in the file (0-based, blank lines not counted)
    messages: tuple[dict[str, str], ...]  # ends in a non-assistant turn
    digest: str                         # sha256 of the messages (canonical JSON), first 16 hex digits
    source_id: Any = None               # the record's own id ("id", "question_id", "task_id"), when it has one
    category: str | None = None         # the record's own "category", when it has one
    line: int = 0                       # line number in the file (1-based; 0 when not read from a file)

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
    path = Path(path)
    as_json = is_json_file(path)
    n = 0
    for lineno, obj in iter_lines(path, "prompt file"):
        where = f"{path}:{lineno}"
        if as_json:
            messages, source_id, category = _record(obj, where)
        else:
            messages, source_id, category = [{"role": "user", "content": obj}], None, None
        yield Prompt(n, tuple(messages), prompt_digest(messages), source_id, category, lineno)
        n += 1
    if n == 0:
        raise DraftlabError(f"{path}: no prompts (expected one per non-blank line)")


ID_KEYS = ("id", "question_id", "task_id")  # ShareGPT and ours, MT-Bench, HumanEval
TEXT_KEYS = ("prompt", "text", "question")  # HumanEval / ours, ours, GSM8K
MAX_CATEGORY_CHARS = 64
FORMATS = ("expected a key 'text' or 'prompt' (a string), 'question' (GSM8K), 'turns' (MT-Bench), "
           "'messages' (OpenAI turns) or 'conversations' (ShareGPT turns)")


def _record(obj: Any, where: str) -> tuple[list[dict[str, str]], Any, str | None]:
    """(messages, the record's own id, its category) of one JSON record, in whichever format it is."""
    if not isinstance(obj, dict):
        raise DraftlabError(f"{where}: {FORMATS}, got a JSON {type(obj).__name__}")
    source_id = next((obj[k] for k in ID_KEYS if obj.get(k) is not None), None)
    category = _category(obj.get("category"), where)
    key = next((k for k in TEXT_KEYS + ("turns", "messages", "conversations") if obj.get(k) is not None), None)
    if key is None:
        raise DraftlabError(f"{where}: {FORMATS}")
    value = obj[key]
    if key in TEXT_KEYS:
        if not isinstance(value, str) or not value.strip():
            raise DraftlabError(f"{where}: key '{key}': expected a non-empty string, got {value!r:.60}")
        return [{"role": "user", "content": value}], source_id, category
    if key == "turns":
        if not isinstance(value, list) or not value or not all(isinstance(t, str) and t.strip() for t in value):
            raise DraftlabError(f"{where}: key 'turns': expected a list of non-empty strings (MT-Bench user turns), "
                                f"got {value!r:.60}")
        return [{"role": "user", "content": t} for t in value], source_id, category

    if not isinstance(value, list):
        raise DraftlabError(f"{where}: key '{key}': expected a list of turns, got {value!r:.60}")
    messages = parse_turns(value, where)
    while messages and messages[-1]["role"] == "assistant":
        messages.pop()
    if not messages:
        raise DraftlabError(f"{where}: the conversation has no user turn to answer")
    return messages, source_id, category


def _category(value: Any, where: str) -> str | None:
    """A record's category: kept only as a short printable string (it labels rows and report tables)."""
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_CATEGORY_CHARS or not value.isprintable():
        raise DraftlabError(f"{where}: key 'category': expected a printable string of 1-{MAX_CATEGORY_CHARS} "
                            f"characters, got {value!r:.80}")
    return value.strip()


def first_user_turn(prompt: Prompt) -> str | None:
    """The text of the prompt's first user turn (what the benchmark sends), None when it has none."""
    return next((m["content"] for m in prompt.messages if m["role"] == "user"), None)


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
