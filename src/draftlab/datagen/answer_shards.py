"""Answers of a data-generation run, appended in shards keyed by prompt id, so a killed run resumes.

Why: regenerating a million answers takes days; a job killed by SIGKILL or a lost node must go on
where it stopped, with no prompt lost and none answered twice, and its final file must be the file an
uninterrupted run writes. The state folder holds:

- ``run.json``: the stage and the run's identity (target, server, sampling settings). A different
  identity means the stored answers belong to another run: the folder is moved aside, never deleted.
- ``shard-NNNNN.jsonl``: one file per attempt, one JSON line per answer ``{"id", "digest", "row",
  "prompt_tokens", "completion_tokens", "finish_reason"}``. An attempt never appends to an older
  shard, so a line torn by a kill or a full disk stays the last line of its shard: the next run cuts it
  off (the shard ends at its last whole line) and answers that prompt again. Lines are flushed as they are written (a SIGKILL loses nothing written)
  and fsynced every few seconds (a lost node loses at most those seconds of answers).
- ``.lock``: held (``flock``) while a run writes; a second run on the same folder is refused.

:meth:`AnswerShards.merge` writes the final file sorted by prompt id, atomically, from the first
stored answer of each wanted prompt whose digest matches the prompt now in the file.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from draftlab.errors import DraftlabError
from draftlab.fsutil import atomic_path, locked, write_json

STAGE = "generate-data"
FSYNC_EVERY_S = 2.0


@dataclass(frozen=True, slots=True)
class Stored:
    """Where one stored answer is, and its counts (the index the merge and the stats read)."""

    shard: int
    offset: int
    length: int
    digest: str
    prompt_tokens: int
    completion_tokens: int


class AnswerShards:
    """The state folder of one generation run (see the module docstring)."""

    def __init__(self, folder: str | os.PathLike, identity: Mapping[str, Any],
                 say: Callable[[str], None] = lambda msg: None):
        self.folder = Path(folder)
        self.identity = json.loads(json.dumps(dict(identity), sort_keys=True, default=str))
        self.say = say
        self.index: dict[int, Stored] = {}
        self.torn_lines = 0
        self.duplicates = 0
        self._lock_fd: int | None = None
        self._fh = None
        self._shard = -1
        self._synced = time.monotonic()

    # -- opening: lock, identity, what is stored ---------------------------------------------------
    def open(self) -> "AnswerShards":
        """Lock the folder, keep or move aside what it holds, index the stored answers, start a new shard."""
        if self.folder.exists() and not self.folder.is_dir():
            raise DraftlabError(f"{self.folder}: expected a folder for the generation state, found a file")
        self.folder.mkdir(parents=True, exist_ok=True)
        self._lock()
        run = self.folder / "run.json"
        shards = self._shard_files()
        if run.is_file():
            try:
                stored = json.loads(run.read_text())
            except ValueError:
                stored = None
            if not isinstance(stored, dict) or stored.get("stage") != STAGE:
                self._refuse_foreign("its run.json is not a generate-data record")
            if stored.get("identity") != self.identity:
                self._move_aside(f"its answers came from other settings ({_diff(stored.get('identity'), self.identity)})")
                shards = []
        elif any(p.name != ".lock" for p in self.folder.iterdir()):
            self._refuse_foreign("it has files but no run.json")
        write_json(run, {"stage": STAGE, "identity": self.identity})
        for path in shards:
            self._index_shard(path)
        self._shard = 1 + max((_shard_number(p) for p in shards), default=-1)
        return self

    def _lock(self) -> None:
        self._lock_cm = locked(self.folder / ".lock", "generate-data state lock", wait=False,
                               busy="another generate-data run is writing here; wait for it or stop it")
        self._lock_fd = self._lock_cm.__enter__()

    def _refuse_foreign(self, why: str) -> None:
        raise DraftlabError(f"{self.folder}: not a generate-data state folder ({why}); draftlab will not "
                            "write into or delete it: move it away or pass another --state-dir")

    def _move_aside(self, why: str) -> None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        aside = self.folder.with_name(f"{self.folder.name}.stale-{stamp}")
        n = 0
        while aside.exists():
            n += 1
            aside = self.folder.with_name(f"{self.folder.name}.stale-{stamp}-{n}")
        aside.mkdir()
        for p in self.folder.iterdir():
            if p.name != ".lock":
                p.rename(aside / p.name)
        self.say(f"generate-data: {self.folder}: {why}; its answers were moved to {aside} and this run starts fresh")

    def _shard_files(self) -> list[Path]:
        return sorted(p for p in self.folder.glob("shard-*.jsonl") if _shard_number(p) >= 0)

    def _index_shard(self, path: Path) -> None:
        n = _shard_number(path)
        offset = 0
        tail = False
        with path.open("rb") as fh:
            for raw in fh:
                length = len(raw)
                rec = _parse(raw)
                tail = not raw.endswith(b"\n")
                if rec is None:
                    self.torn_lines += 1
                elif rec["id"] in self.index:
                    self.duplicates += 1
                else:
                    self.index[rec["id"]] = Stored(n, offset, length, rec["digest"], int(rec.get("prompt_tokens") or 0),
                                                   int(rec.get("completion_tokens") or 0))
                if not tail:  # only the last line can lack its newline
                    offset += length
        if tail:  # a line cut by a kill or a full disk: dropped (its prompt is answered again), never kept
            os.truncate(path, offset)
            self.say(f"generate-data: {path.name}: dropped its torn last line (a run stopped while writing it)")

    # -- queries -----------------------------------------------------------------------------------
    def answered(self, prompt_id: int, digest: str) -> bool:
        """Whether an answer to this prompt (this very text) is stored."""
        s = self.index.get(prompt_id)
        return s is not None and s.digest == digest

    # -- writing -----------------------------------------------------------------------------------
    def append(self, prompt_id: int, digest: str, row: Mapping[str, Any], prompt_tokens: int,
               completion_tokens: int, finish_reason: str | None) -> None:
        """Store one answer: one line, flushed now, fsynced every ``FSYNC_EVERY_S`` seconds."""
        if self._fh is None:
            path = self.folder / f"shard-{self._shard:05d}.jsonl"
            self._fh = open(path, "xb")
            self._offset = 0
        line = (json.dumps({"id": prompt_id, "digest": digest, "row": row, "prompt_tokens": prompt_tokens,
                            "completion_tokens": completion_tokens, "finish_reason": finish_reason},
                           ensure_ascii=False, separators=(",", ":")) + "\n").encode()
        try:
            self._fh.write(line)
            self._fh.flush()
        except OSError as exc:  # a full disk: what was stored stays, the torn line is dropped on resume
            self._abandon_shard()
            raise DraftlabError(f"{self.folder / f'shard-{self._shard:05d}.jsonl'}: cannot store the answer of "
                                f"prompt {prompt_id} ({exc.strerror or exc}); the {len(self.index)} answers stored "
                                "are kept: free space and rerun to answer the rest") from None
        if prompt_id not in self.index:
            self.index[prompt_id] = Stored(self._shard, self._offset, len(line), digest, prompt_tokens,
                                           completion_tokens)
        else:
            self.duplicates += 1
        self._offset += len(line)
        if time.monotonic() - self._synced >= FSYNC_EVERY_S:
            self.sync()

    def sync(self) -> None:
        if self._fh is not None:
            try:
                os.fsync(self._fh.fileno())
            except OSError as exc:
                self._abandon_shard()
                raise DraftlabError(f"{self.folder}: cannot sync the stored answers ({exc.strerror or exc}); "
                                    "free space and rerun to answer the rest") from None
        self._synced = time.monotonic()

    def _abandon_shard(self) -> None:
        """Close the current shard after a failed write; its torn tail is dropped when a run reopens it."""
        fh, self._fh = self._fh, None
        if fh is not None:
            try:
                fh.close()  # retries the buffered bytes once; the file is closed even when that fails
            except OSError:
                pass

    def close(self) -> None:
        """Sync and close the current shard and release the lock."""
        try:
            if self._fh is not None:
                self.sync()
                self._fh.close()
                self._fh = None
        finally:
            if self._lock_fd is not None:
                self._lock_cm.__exit__(None, None, None)
                self._lock_fd = None

    def __enter__(self) -> "AnswerShards":
        return self.open()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- the final file ----------------------------------------------------------------------------
    def merge(self, out: str | os.PathLike, wanted: Iterable[tuple[int, str]]) -> dict[str, int]:
        """Write the stored answers of ``wanted`` (prompt id, digest) to ``out``, sorted by id, atomically.

        Returns the rows written, their token counts and how many answers are blank. A wanted prompt
        without a matching answer is left out (the caller lists it as failed or skipped)."""
        if self._fh is not None:
            self.sync()
        picks = sorted((pid, s) for pid, digest in wanted if (s := self.index.get(pid)) and s.digest == digest)
        handles: dict[int, Any] = {}
        counts = {"rows": 0, "prompt_tokens": 0, "completion_tokens": 0, "empty": 0}
        try:
            with atomic_path(out) as tmp, open(tmp, "w", encoding="utf-8") as dst:
                for _, s in picks:
                    fh = handles.get(s.shard)
                    if fh is None:
                        fh = handles[s.shard] = open(self.folder / f"shard-{s.shard:05d}.jsonl", "rb")
                    fh.seek(s.offset)
                    rec = _parse(fh.read(s.length))
                    if rec is None:
                        raise DraftlabError(f"{self.folder}: shard-{s.shard:05d}.jsonl changed while merging "
                                            f"(offset {s.offset}); rerun to rebuild the index")
                    dst.write(json.dumps(rec["row"], ensure_ascii=False) + "\n")
                    counts["rows"] += 1
                    counts["empty"] += not _answer_text(rec["row"]).strip()
                    counts["prompt_tokens"] += s.prompt_tokens
                    counts["completion_tokens"] += s.completion_tokens
        finally:
            for fh in handles.values():
                fh.close()
        return counts


def stored_ids(folder: str | os.PathLike) -> list[int]:
    """The prompt id of every complete line in a state folder's shards, read only (no lock taken): what
    a run started now would count as answered, duplicates included (the tests and the benchmark count them)."""
    ids = []
    for shard in sorted(Path(folder).glob("shard-*.jsonl")):
        for raw in shard.read_bytes().splitlines(keepends=True):
            rec = _parse(raw)
            if rec is not None:
                ids.append(rec["id"])
    return ids


def _shard_number(path: Path) -> int:
    stem = path.name.removeprefix("shard-").removesuffix(".jsonl")
    return int(stem) if stem.isdigit() else -1


def _parse(raw: bytes) -> dict[str, Any] | None:
    """One complete shard line, or None for a torn or foreign one."""
    if not raw.endswith(b"\n"):
        return None
    try:
        rec = json.loads(raw)
    except ValueError:
        return None
    if (not isinstance(rec, dict) or not isinstance(rec.get("id"), int) or not isinstance(rec.get("digest"), str)
            or not isinstance(rec.get("row"), dict)):
        return None
    return rec


def _answer_text(row: Mapping[str, Any]) -> str:
    messages = row.get("messages") or [{}]
    last = messages[-1] if isinstance(messages[-1], dict) else {}
    return last.get("content") if isinstance(last.get("content"), str) else ""


def _diff(old: Any, new: Mapping[str, Any]) -> str:
    if not isinstance(old, dict):
        return "no identity recorded"
    keys = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    return ", ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in keys[:4]) or "identity changed"
