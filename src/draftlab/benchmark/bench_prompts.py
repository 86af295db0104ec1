"""The benchmark's prompt sets: the shipped default, any prompt file, and a stratified sample of it."""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from draftlab.errors import DraftlabError
from draftlab.formats.prompt_file import first_user_turn, iter_prompts

# --- prompt sets ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Prompt:
    id: str
    category: str
    text: str


def default_prompts_path() -> Path:
    """The prompt set shipped with draftlab (chat, code, math, reasoning, long and short prompts)."""
    return Path(__file__).resolve().parents[1] / "data" / "prompts.jsonl"


def resolve_prompts_path(path: str | Path) -> Path:
    """``"default"`` means the shipped set; anything else is a path."""
    return default_prompts_path() if str(path) == "default" else Path(path)


def file_sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


MAX_PROMPT_ID_CHARS = 200


def load_prompts(path: str | Path, category: str | None = None) -> list[Prompt]:
    """Read a prompt set in any format :mod:`draftlab.formats.prompt_file` reads (the shipped JSONL, MT-Bench,
    HumanEval ``.jsonl.gz``, GSM8K, ShareGPT, OpenAI messages, plain lines).

    Each prompt sends its **first user turn** as the request text (MT-Bench's later turns are about
    the model's own earlier answer, which a fixed prompt set does not have; data generation replays
    them). Its id is the record's own (``id``, ``question_id``, ``task_id``), else its position in the
    file (``"0"``, ``"1"``, ...); its category is the record's ``category``, else ``category`` (the
    client's name in the workflow), else ``"misc"``."""
    path = resolve_prompts_path(path)
    try:
        os.lstat(path)
    except FileNotFoundError:
        raise DraftlabError(f"{path}: prompt file not found (use --prompts default for the shipped set)") from None
    except OSError as exc:  # a folder this user may not enter is not a missing file
        raise DraftlabError(f"{path}: cannot read the prompt file ({exc.strerror})") from None
    prompts: list[Prompt] = []
    seen: set[str] = set()
    for p in iter_prompts(path):
        where = f"{path}:{p.line}"
        pid = p.source_id if p.source_id is not None else p.id
        if (not isinstance(pid, (str, int)) or isinstance(pid, bool) or str(pid) == ""
                or len(str(pid)) > MAX_PROMPT_ID_CHARS):
            raise DraftlabError(f"{where}: key 'id': expected a non-empty string or integer of at most "
                                f"{MAX_PROMPT_ID_CHARS} characters, got {pid!r:.80}")
        pid = str(pid)
        if pid in seen:
            raise DraftlabError(f"{where}: key 'id': duplicate prompt id {pid!r}")
        seen.add(pid)
        text = first_user_turn(p)
        if not text:
            roles = ", ".join(m["role"] for m in p.messages)
            raise DraftlabError(f"{where}: expected a non-empty user turn to send, got turns: {roles}")
        prompts.append(Prompt(pid, p.category or category or "misc", text))
    return prompts


def load_prompt_files(paths: Sequence[str | Path], category: str | None = None) -> tuple[list[Prompt], dict]:
    """Several prompt files benched as one set (the client's ``prompts`` and its ``in_domain`` file), in order,
    each keeping its own categories; and the record of where they came from: ``path`` (the first, as a
    one-file set records it), ``paths``, and ``sha256`` over the files' own hashes (results pair only on it).
    A prompt id that two files share is refused: the per-prompt pairing keys on ids."""
    prompts: list[Prompt] = []
    seen: dict[str, Path] = {}
    for raw in paths:
        path = resolve_prompts_path(raw)
        for p in load_prompts(path, category):
            if p.id in seen:
                raise DraftlabError(f"{path}: key 'id': prompt id {p.id!r} is also in {seen[p.id]}; the prompt "
                                    "files a client benches together need distinct ids")
            seen[p.id] = path
            prompts.append(p)
    resolved = [str(resolve_prompts_path(p)) for p in paths]
    digest = hashlib.sha256("\n".join(file_sha256(p) for p in resolved).encode()).hexdigest()
    return prompts, {"path": resolved[0], "paths": resolved, "sha256": digest}


def stratified_sample(prompts: Sequence[Prompt], limit: int | None, seed: int = 0) -> list[Prompt]:
    """``limit`` prompts drawn across categories in proportion to their sizes, in file order.

    Every category gets one prompt first when ``limit`` reaches the number of categories; the rest go,
    one at a time, to the category furthest below its proportional share ``limit * n_c / n`` (ties: the
    category that comes first in the file), never beyond its size. With fewer slots than categories the
    largest categories get them. Which prompts of a category are drawn is a seeded shuffle of that
    category alone (``random.Random(f"{seed}/{category}")``), so the sample is the same on every run and
    host and one category's size never changes another's draw. ``limit`` None or >= the set: all."""

    if limit is None or limit >= len(prompts):
        return list(prompts)
    groups: dict[str, list[int]] = {}
    for i, p in enumerate(prompts):
        groups.setdefault(p.category, []).append(i)
    total = len(prompts)
    take = {c: (1 if limit >= len(groups) else 0) for c in groups}
    for _ in range(limit - sum(take.values())):
        open_ = [c for c in groups if take[c] < len(groups[c])]
        c = max(open_, key=lambda c: limit * len(groups[c]) / total - take[c])  # max keeps the first of ties
        take[c] += 1
    chosen: list[int] = []
    for c, members in groups.items():
        chosen += random.Random(f"{seed}/{c}").sample(members, take[c])
    return [prompts[i] for i in sorted(chosen)]
