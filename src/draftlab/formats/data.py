"""Training data files: conversations or plain text in, ``tokens.jsonl`` out (tokenizing: training.tokenize).

Input formats (one sample per line):
- JSONL ``{"messages": [{"role", "content"}, ...]}`` or ``{"conversations": [...]}`` (ShareGPT's
  ``{"from": "human"|"gpt", "value"}`` turns are accepted too);
- JSONL ``{"text": "..."}``;
- any other file: plain text, one sample per non-blank line.
A name ending in ``.gz`` is read gzipped (``data.jsonl.gz`` is gzipped JSONL). Prompt files, which
take more formats (MT-Bench, HumanEval, GSM8K), are read by :mod:`draftlab.formats.prompt_file`.

Conversations are rendered with the tokenizer's chat template when it has one, else with the simple
format ``"{role}: {content}\\n"`` per turn. The loss mask is 1 on assistant tokens (from the start of
the assistant content to the end of that turn's rendering, so the template's end-of-turn marker is
learned too; the role header is not), and 1 on every token of plain text.

Output ``tokens.jsonl``: one line per sample, ``{"input_ids": [...], "loss_mask": [0/1, ...]}``.
"""

from __future__ import annotations

import gzip
import json
import os
import zlib
from pathlib import Path
from typing import Any, Iterator

from draftlab.errors import DraftlabError
from draftlab.fsutil import atomic_path, open_regular

ROLE_ALIASES = {"human": "user", "gpt": "assistant", "bot": "assistant", "model": "assistant"}


def is_gzip(path: str | os.PathLike) -> bool:
    return Path(path).suffix == ".gz"


def is_json_file(path: str | os.PathLike) -> bool:
    """A ``.jsonl``/``.json`` file, gzipped or not (``HumanEval.jsonl.gz``): one JSON value per line."""
    path = Path(path)
    return (path.with_suffix("") if is_gzip(path) else path).suffix in (".jsonl", ".json")


def text_lines(path: str | os.PathLike, what: str) -> Iterator[tuple[int, str]]:
    """``(line number, line)`` of a UTF-8 text file, streamed (a ``.gz`` name is read gzipped); a missing,
    special, non-UTF-8 or broken gzip file is one user error naming the file (and the line)."""
    path = Path(path)
    if not path.exists():
        raise DraftlabError(f"{path}: {what} not found")
    fd = open_regular(path, what)
    with os.fdopen(fd, "rb") as raw_file:
        f = gzip.GzipFile(fileobj=raw_file, mode="rb") if is_gzip(path) else raw_file
        lineno = 0
        try:
            for lineno, raw in enumerate(f, 1):
                try:
                    yield lineno, raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise DraftlabError(f"{path}:{lineno}: {what} is not UTF-8 text ({exc.reason} at byte {exc.start} "
                                        "of the line)") from None
        except (gzip.BadGzipFile, EOFError, zlib.error) as exc:
            raise DraftlabError(f"{path}:{lineno + 1}: {what} is not a readable gzip file "
                                f"({' '.join(str(exc).split())[:100] or type(exc).__name__})") from None


def json_line(line: str, where: str) -> Any:
    """One JSONL line parsed; bad JSON, nesting too deep or a 5000-digit number is one user error."""
    try:
        return json.loads(line)
    except json.JSONDecodeError as exc:
        raise DraftlabError(f"{where}: not valid JSON ({exc.msg})") from None
    except (RecursionError, ValueError) as exc:
        reason = "nests too deeply" if isinstance(exc, RecursionError) else " ".join(str(exc).split())[:100]
        raise DraftlabError(f"{where}: not usable JSON ({reason})") from None


def iter_lines(path: str | os.PathLike, what: str) -> Iterator[tuple[int, str | Any]]:
    """``(line number, item)`` for every non-blank line: the parsed JSON value in a ``.jsonl``/``.json``
    file, else the line's text (a plain-text file is one sample per line)."""
    path = Path(path)
    as_json = is_json_file(path)
    for lineno, line in text_lines(path, what):
        if not line.strip():
            continue
        if not as_json:
            yield lineno, line.rstrip("\n")
            continue
        yield lineno, json_line(line, f"{path}:{lineno}")


def read_records(path: str | os.PathLike) -> Iterator[dict[str, Any]]:
    """Yield ``{"messages": [...]}`` or ``{"text": ...}`` for every sample of a data file."""
    path = Path(path)
    as_json = is_json_file(path)
    for lineno, item in iter_lines(path, "training data file"):
        yield _normalise(item, path, lineno) if as_json else {"text": item}


def _normalise(obj: Any, path: Path, lineno: int) -> dict[str, Any]:
    if isinstance(obj, dict) and isinstance(obj.get("text"), str):
        return {"text": obj["text"]}
    turns = obj.get("messages", obj.get("conversations")) if isinstance(obj, dict) else None
    if not isinstance(turns, list):
        raise DraftlabError(f"{path}:{lineno}: expected a key 'messages', 'conversations' (a list of turns) "
                            f"or 'text' (a string)")
    return {"messages": parse_turns(turns, f"{path}:{lineno}")}


def parse_turns(turns: list, where: str) -> list[dict[str, str]]:
    """OpenAI-style (``role``/``content``) or ShareGPT-style (``from``/``value``) turns as messages."""
    messages = []
    for turn in turns:
        role = turn.get("role", turn.get("from")) if isinstance(turn, dict) else None
        content = turn.get("content", turn.get("value")) if isinstance(turn, dict) else None
        if not isinstance(role, str) or not isinstance(content, str):
            raise DraftlabError(f"{where}: each turn needs 'role' and 'content' strings "
                                f"(or ShareGPT 'from' and 'value'), got {turn!r:.80}")
        messages.append({"role": ROLE_ALIASES.get(role, role), "content": content})
        emitted = turn.get("token_ids")
        if emitted is not None:  # the ids the target emitted for this turn (data generation keeps them)
            if not isinstance(emitted, list) or not all(type(t) is int and t >= 0 for t in emitted):
                raise DraftlabError(f"{where}: a turn's 'token_ids' must be a list of token ids, got {emitted!r:.80}")
            messages[-1]["token_ids"] = emitted
    return messages


def render_simple(messages: list[dict[str, str]]) -> str:
    """The fallback conversation format for tokenizers without a chat template."""
    return "".join(f"{m['role']}: {m['content']}\n" for m in messages)


def chat_prompt_ids(tokenizer, messages: list[dict[str, str]], template_kwargs: dict[str, Any] | None = None,
                    ) -> list[int]:
    """Token ids of a prompt that asks for the assistant's turn: the chat template with the generation
    prompt, else the simple format ending in ``assistant: ``. One function for ``draftlab generate-data``
    and the builtin server's ``/v1/chat/completions``, so both send the target the same ids."""
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False,
                                            **(template_kwargs or {}))
        return list(ids)
    return list(tokenizer(render_simple(messages) + "assistant: ")["input_ids"])


def write_tokens(path: str | os.PathLike, samples) -> int:
    """Write samples to a tokens JSONL atomically; returns the number written."""
    n = 0
    with atomic_path(path) as tmp, tmp.open("w", encoding="utf-8") as f:
        for s in samples:
            f.write(json.dumps({"input_ids": s["input_ids"], "loss_mask": s["loss_mask"]}, separators=(",", ":")) + "\n")
            n += 1
    return n


def read_tokens(path: str | os.PathLike, vocab_size: int | None = None) -> list[dict[str, list[int]]]:
    """Read and check a tokens JSONL (equal lengths, 0/1 mask, ids in range)."""
    path = Path(path)
    out = []
    for lineno, line in text_lines(path, "tokens file"):
        if not line.strip():
            continue
        obj = json_line(line, f"{path}:{lineno}")
        if not isinstance(obj, dict):
            raise DraftlabError(f"{path}:{lineno}: expected an object with 'input_ids' and 'loss_mask'")
        ids, mask = obj.get("input_ids"), obj.get("loss_mask")
        if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
            raise DraftlabError(f"{path}:{lineno}: 'input_ids' must be a list of integers")
        if mask is None:
            mask = [1] * len(ids)
        if not isinstance(mask, list) or len(mask) != len(ids) or any(m not in (0, 1) for m in mask):
            raise DraftlabError(f"{path}:{lineno}: 'loss_mask' must be a 0/1 list as long as 'input_ids'")
        if vocab_size is not None and ids and (min(ids) < 0 or max(ids) >= vocab_size):
            raise DraftlabError(f"{path}:{lineno}: 'input_ids' has ids outside the target vocabulary "
                                f"0..{vocab_size - 1}")
        out.append({"input_ids": ids, "loss_mask": mask})
    if not out:
        raise DraftlabError(f"{path}: no samples")
    return out
