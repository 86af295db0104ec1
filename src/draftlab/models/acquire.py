"""Bring a drafter (config + safetensors) or a target's config.json into the experiment folder.

``hf:ORG/NAME[@REV]`` goes through huggingface_hub's ``snapshot_download`` restricted to
``config.json``, ``*.safetensors`` and the shard index, so pickles, optimizer states and READMEs
never download; the user's HF cache and ``HF_HUB_OFFLINE`` are honoured, and the commit the
revision resolved to is recorded in ``acquire.json``. Files are linked from the cache, not copied.
Local folders are accepted the same way. Tokens come from huggingface_hub's usual places
(``HF_TOKEN``, the saved login) and are passed through, never written anywhere.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from draftlab.formats.checkpoint import INDEX_SUFFIX, read_checkpoint
from draftlab.errors import DraftlabError
from draftlab.fsutil import atomic_dir, link_file, same_file, to_json, write_json
from draftlab.hf_cache import hub_call, is_hf_source, is_offline, parse_hf_source, snapshot_commit
from draftlab.formats.target_config import load_json_config, resolve_config_path
from draftlab.fsutil import sha256_file as _sha256_file

ALLOW_PATTERNS = ["config.json", "*.safetensors", "*" + INDEX_SUFFIX]
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


def _wanted(name: str) -> bool:
    return name == "config.json" or name.endswith(".safetensors") or name.endswith(INDEX_SUFFIX)


def sha256_file(path: Path, progress: bool = True) -> str:
    """sha256 of a (possibly multi-GB) file, with a tqdm bar on stderr for big ones."""
    return _sha256_file(path, progress=progress)


def _resolve_source(
    source: str, revision: str | None, cache_dir: str | os.PathLike | None, token: str | None
) -> tuple[Path, dict[str, Any]]:
    """The local folder holding ``source``'s files, and the provenance fields of acquire.json."""
    if is_hf_source(source):
        hub = parse_hf_source(source)
        if revision and hub.revision and revision != hub.revision:
            raise DraftlabError(f"{source}: --revision {revision!r} contradicts the revision in the source")
        hub = type(hub)(hub.repo_id, revision or hub.revision)
        from huggingface_hub import snapshot_download  # deferred: huggingface_hub (~100 ms)

        snapshot = Path(
            hub_call(
                hub,
                "config.json + *.safetensors",
                lambda: snapshot_download(
                    hub.repo_id,
                    revision=hub.revision,
                    cache_dir=cache_dir,
                    allow_patterns=ALLOW_PATTERNS,
                    local_files_only=is_offline(),
                    token=token,
                ),
            )
        )
        return snapshot, {
            "source": str(hub),
            "repo_id": hub.repo_id,
            "requested_revision": hub.revision,
            "resolved_commit": snapshot_commit(snapshot / "config.json") or snapshot.name,
        }
    if revision:
        raise DraftlabError(f"{source}: --revision applies to hf:ORG/NAME sources only, not local folders")
    folder = Path(source)
    if not folder.is_dir():
        raise DraftlabError(f"{folder}: no such folder (expected a drafter folder or hf:ORG/NAME[@REV])")
    return folder, {"source": str(source), "repo_id": None, "requested_revision": None, "resolved_commit": None}


def acquire(
    source: str,
    out: str | os.PathLike,
    revision: str | None = None,
    cache_dir: str | os.PathLike | None = None,
    token: str | None = None,
) -> dict[str, Any]:
    """Put ``source``'s config.json + safetensors into ``out`` (linked) with ``acquire.json``; return it."""
    out = Path(out)
    folder, record = _resolve_source(str(source), revision, cache_dir, token)
    if not (folder / "config.json").is_file():
        raise DraftlabError(f"{record['source']}: no config.json in {folder}")
    info = read_checkpoint(folder)  # validates every header before anything is written
    if not info.tensors:
        raise DraftlabError(f"{record['source']}: no safetensors weights in {folder} (pickle weights are not acquired)")
    names = sorted(p.name for p in folder.iterdir() if _wanted(p.name) and p.is_file())
    record["files"] = []  # filled below
    old = _existing(out, record, folder, names)
    if old is not None:
        return {**old, "skipped": True}
    files = []
    for name in names:
        src = (folder / name).resolve()
        entry: dict[str, Any] = {"name": name, "size": src.stat().st_size}
        if name.endswith(".safetensors"):
            entry["sha256"] = digest = sha256_file(src)
            if _SHA256_RE.fullmatch(src.name) and src.name != digest:
                raise DraftlabError(f"{folder / name}: content sha256 {digest} differs from its cache blob name {src.name}")
        files.append(entry)
    record["files"] = files
    record["num_bytes"] = sum(f["size"] for f in files)
    with atomic_dir(out, stage="acquire", inputs=(folder,)) as tmp:
        for name in names:
            link_file(folder / name, tmp / name)
        (tmp / "acquire.json").write_text(to_json(record))
    return {**record, "skipped": False}


def _existing(out: Path, record: dict, folder: Path, names: list[str]) -> dict | None:
    """The previous acquire.json when ``out`` already holds exactly these files (linked), else None."""
    try:
        old = json.loads((out / "acquire.json").read_text())
    except (OSError, ValueError):
        return None
    same = all(old.get(k) == record[k] for k in ("source", "repo_id", "requested_revision", "resolved_commit"))
    listed = [f.get("name") for f in old.get("files", [])]
    if not same or listed != names:
        return None
    if not all(same_file(folder / n, out / n) for n in names):
        return None
    return old


def fetch_config(
    source: str, out: str | os.PathLike, cache_dir: str | os.PathLike | None = None
) -> dict[str, Any]:
    """Write only ``source``'s config.json to ``out`` (atomically); return where it came from."""
    path = resolve_config_path(source, cache_dir)
    cfg = load_json_config(path)
    write_json(out, cfg)
    hub = parse_hf_source(source) if is_hf_source(source) else None
    return {
        "source": str(source),
        "repo_id": hub.repo_id if hub else None,
        "requested_revision": hub.revision if hub else None,
        "resolved_commit": snapshot_commit(path),
        "out": str(out),
    }
