"""Resolve the target model folder (rule ``resolve_target``, ``draftlab resolve-target``).

One fixed link per experiment gives every rule a path to print in its command line (SGLang's
``--model-path`` included) while the weights stay in the HF cache; the JSON record pins the
resolved commit and a weights digest so records can say which target was measured.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from draftlab.errors import DraftlabError
from draftlab.fsutil import named_digest, sha256_file, write_json
from draftlab.hf_cache import hub_call, is_hf_source, is_offline, parse_hf_source, snapshot_commit

# What a server and the data stages need from a target repo: config, weights, tokenizer, and the
# repo's own code for trust_remote_code models. Never pickles.
MODEL_PATTERNS = ["*.json", "*.safetensors", "*.model", "*.tiktoken", "*.txt", "*.py", "*.jinja"]
_HASH_LIMIT_BYTES = 2 << 30


def _link(target: Path, link: Path) -> None:
    """Point ``link`` at ``target`` (absolute), replacing an old link atomically."""
    if os.path.lexists(link) and not link.is_symlink():
        raise DraftlabError(f"{link}: --link exists and is not a symlink draftlab made; refusing to replace it")
    link.parent.mkdir(parents=True, exist_ok=True)
    tmp = link.with_name(f".{link.name}.tmp-{os.getpid()}")
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    os.symlink(os.path.abspath(target), tmp, target_is_directory=True)
    os.replace(tmp, link)


def _weights_digest(folder: Path) -> tuple[str | None, list[dict[str, Any]]]:
    """Per-file sha256 of the safetensors in ``folder`` and one digest over them.

    In an HF cache a weight file is a link to ``blobs/<sha256>``, so the name is the hash and a
    600 GB target costs nothing; other files are hashed when the folder is small enough.
    """
    files = []
    weights = sorted(p for p in folder.iterdir() if p.name.endswith(".safetensors"))
    total = sum(p.stat().st_size for p in weights)
    for p in weights:
        blob = p.resolve().name
        if re.fullmatch(r"[0-9a-f]{64}", blob):
            digest = blob
        elif total <= _HASH_LIMIT_BYTES:
            digest = sha256_file(p)
        else:
            digest = None
        files.append({"name": p.name, "size": p.stat().st_size, "sha256": digest})
    if not files or any(f["sha256"] is None for f in files):
        return None, files
    combined = named_digest((f["name"], f["sha256"]) for f in files)
    return combined, files


def resolve_model(source: str, revision: str | None, link: str | os.PathLike, out: str | os.PathLike) -> dict[str, Any]:
    """Make ``link`` point at a local folder holding ``source`` (downloading hf: sources at ``revision``).

    The link gives every rule one fixed path to print in its command line (the SGLang
    ``--model-path`` included) while the weights stay in the HF cache. Writes ``out`` (JSON).
    """
    if is_hf_source(source):
        hub = parse_hf_source(source)
        hub = type(hub)(hub.repo_id, revision or hub.revision)
        from huggingface_hub import snapshot_download  # deferred: huggingface_hub (~100 ms)

        folder = Path(hub_call(hub, "model files", lambda: snapshot_download(
            hub.repo_id, revision=hub.revision, allow_patterns=MODEL_PATTERNS, local_files_only=is_offline())))
        record = {"source": str(hub), "repo_id": hub.repo_id, "requested_revision": hub.revision,
                  "resolved_commit": snapshot_commit(folder / "config.json") or folder.name}
    else:
        folder = Path(source)
        if not (folder / "config.json").is_file():
            raise DraftlabError(f"{folder}: expected a model folder with config.json (target.model_path / target.source)")
        record = {"source": str(source), "repo_id": None, "requested_revision": revision, "resolved_commit": None}
    digest, files = _weights_digest(folder)
    record.update(path=str(Path(link)), folder=str(folder.resolve()), weights_sha256=digest, files=files)
    _link(folder, Path(link))
    write_json(out, record)
    return record
