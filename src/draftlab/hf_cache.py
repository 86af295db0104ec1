"""Everything draftlab says to huggingface_hub: ``hf:`` sources, offline mode, errors, cache publishing.

``hf:ORG/NAME[@REV]`` sources are resolved by huggingface_hub itself, so the user's cache
(``HF_HOME`` / ``HF_HUB_CACHE`` / an explicit ``cache_dir``), ``HF_HUB_OFFLINE`` and tokens work as
they do for every other HF tool. :func:`publish_to_cache` lays a local folder into that same cache
layout so the offline demo and the tests go through the real huggingface_hub reader, not a stub.

huggingface_hub is imported inside functions: ``draftlab inspect DIR`` never pays for it.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, TypeVar

from draftlab.errors import DraftlabError
from draftlab.fsutil import sha256_file, to_json

HF_PREFIX = "hf:"
_REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
# Files the Hub stores through LFS: their cache blob is named by sha256 (git blob sha1 otherwise).
LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".npy", ".npz", ".parquet", ".arrow", ".gguf")
LFS_MIN_BYTES = 10 * 1024 * 1024

T = TypeVar("T")


@dataclass(frozen=True)
class HubSource:
    """A parsed ``hf:ORG/NAME[@REV]`` source."""

    repo_id: str
    revision: str | None

    def __str__(self) -> str:
        return f"{HF_PREFIX}{self.repo_id}" + (f"@{self.revision}" if self.revision else "")


def is_hf_source(source: Any) -> bool:
    return isinstance(source, str) and source.startswith(HF_PREFIX)


def parse_hf_source(source: str) -> HubSource:
    """``hf:ORG/NAME[@REV]`` -> :class:`HubSource`; a malformed string is a user error."""
    if not is_hf_source(source):
        raise DraftlabError(f"{source!r}: expected a source of the form hf:ORG/NAME[@REV]")
    body = source[len(HF_PREFIX):]
    repo_id, _, revision = body.partition("@")
    if not _REPO_RE.fullmatch(repo_id) or (body.count("@") and not revision):
        raise DraftlabError(f"{source!r}: expected a source of the form hf:ORG/NAME[@REV]")
    return HubSource(repo_id=repo_id, revision=revision or None)


def is_offline() -> bool:
    """True when HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) is set now, not only at import time."""
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(var, "").strip().upper() in ("1", "ON", "YES", "TRUE"):
            return True
    from huggingface_hub import constants  # deferred: huggingface_hub (~100 ms)

    return bool(constants.HF_HUB_OFFLINE)


def hub_call(source: HubSource, what: str, fn: Callable[[], T]) -> T:
    """Run a huggingface_hub call, turning its errors into one clear DraftlabError (never echoing tokens)."""
    from huggingface_hub import errors as hf_errors  # deferred: huggingface_hub (~100 ms)

    try:
        return fn()
    except hf_errors.RevisionNotFoundError:
        raise DraftlabError(f"{source}: revision {source.revision!r} not found on the Hub ({what})") from None
    except hf_errors.RepositoryNotFoundError:
        raise DraftlabError(f"{source}: repository {source.repo_id!r} not found or not accessible ({what})") from None
    except hf_errors.IncompleteSnapshotError:
        raise DraftlabError(
            f"{source}: the cached snapshot is incomplete ({what}) and the Hub cannot be reached to complete it"
        ) from None
    except hf_errors.LocalEntryNotFoundError:
        mode = "HF_HUB_OFFLINE is set" if is_offline() else "the Hub could not be reached"
        raise DraftlabError(
            f"{source}: {what} is not in the local HF cache and {mode}; "
            "set HF_HOME/HF_HUB_CACHE or --cache-dir to the cache that holds it, or go online"
        ) from None
    except hf_errors.EntryNotFoundError:
        raise DraftlabError(f"{source}: file not found in the repository ({what})") from None
    except hf_errors.HFValidationError as exc:
        raise DraftlabError(f"{source}: invalid repository id or revision ({exc})") from None
    except hf_errors.OfflineModeIsEnabled:
        raise DraftlabError(f"{source}: {what} needs the Hub but HF_HUB_OFFLINE is set") from None
    except hf_errors.HfHubHTTPError as exc:
        status = getattr(getattr(exc, "response", None), "status_code", "?")
        raise DraftlabError(f"{source}: Hub request failed with HTTP {status} ({what})") from None


def snapshot_commit(path: str | os.PathLike) -> str | None:
    """The commit hash of a file or folder inside ``.../snapshots/<commit>/...``, else None."""
    parts = Path(path).parts
    for i, part in enumerate(parts[:-1]):
        if part == "snapshots" and COMMIT_RE.fullmatch(parts[i + 1]):
            return parts[i + 1]
    return None


# --------------------------------------------------------------------------------------------
# Publishing a local folder into an HF cache


def git_blob_sha1(data: bytes) -> str:
    """The id git (and the Hub) gives a regular file's content."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _file_sha256(path: Path) -> str:
    return sha256_file(path)


def _is_lfs(path: Path) -> bool:
    return path.suffix in LFS_SUFFIXES or path.stat().st_size >= LFS_MIN_BYTES


def publish_to_cache(
    folder: str | os.PathLike,
    repo_id: str,
    cache_dir: str | os.PathLike,
    revision_name: str = "main",
) -> str:
    """Lay ``folder`` into ``cache_dir`` as huggingface_hub's cache does; return the commit hash.

    Layout (``models--ORG--NAME/``): ``blobs/<id>`` (sha256 for LFS-style files, git sha1 otherwise),
    ``snapshots/<commit>/<path>`` relative symlinks to the blobs, ``refs/<revision_name>`` holding
    the commit, and ``trees/<commit>.json`` (the listing huggingface_hub 2.x uses to tell a
    complete cached snapshot from a partial one). The commit hash is a sha1 of the file listing, so
    the same content always publishes to the same commit. Publishing twice is a no-op.
    """
    folder = Path(folder)
    if not _REPO_RE.fullmatch(repo_id):
        raise DraftlabError(f"{repo_id!r}: expected a repo id of the form ORG/NAME")
    files = _files_to_publish(folder)
    entries = {path.relative_to(folder).as_posix(): _blob_entry(path) for path in files}
    listing = "".join(f"{rel}\0{e.get('lfs_sha256') or e['blob_id']}\n" for rel, e in entries.items())
    commit = hashlib.sha1(f"draftlab-publish\n{repo_id}\n{listing}".encode()).hexdigest()

    repo_dir = Path(cache_dir) / ("models--" + repo_id.replace("/", "--"))
    (repo_dir / "blobs").mkdir(parents=True, exist_ok=True)
    for path in files:
        rel = path.relative_to(folder).as_posix()
        blob = _store_blob(path, repo_dir / "blobs" / (entries[rel].get("lfs_sha256") or entries[rel]["blob_id"]))
        _link(repo_dir / "snapshots" / commit / rel, blob)

    trees = repo_dir / "trees" / f"{commit}.json"
    trees.parent.mkdir(parents=True, exist_ok=True)
    tree_doc = {"format_version": 1, "files": {rel: entries[rel] for rel in sorted(entries)}}
    _write_small(trees, to_json(tree_doc, str(trees), indent=1).rstrip("\n"))
    ref = repo_dir / "refs" / revision_name
    ref.parent.mkdir(parents=True, exist_ok=True)
    _write_small(ref, commit)  # huggingface_hub reads refs without stripping: no newline
    return commit


def _files_to_publish(folder: Path) -> list[Path]:
    """Every file under ``folder`` (but a ``.cache`` folder's), sorted; none, or no folder, is an error."""
    if not folder.is_dir():
        raise DraftlabError(f"{folder}: not a folder to publish")
    files = sorted(p for p in folder.rglob("*") if p.is_file() and ".cache" not in p.relative_to(folder).parts)
    if not files:
        raise DraftlabError(f"{folder}: nothing to publish (no files)")
    return files


def _blob_entry(path: Path) -> dict[str, Any]:
    """A file's entry in the tree listing: its size and the Hub's blob id (with the sha256 of an LFS file)."""
    size = path.stat().st_size
    if not _is_lfs(path):
        return {"size": size, "blob_id": git_blob_sha1(path.read_bytes())}
    sha = _file_sha256(path)
    # the Hub's blob_id of an LFS file is the sha1 of its pointer file
    pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha}\nsize {size}\n".encode()
    return {"size": size, "blob_id": git_blob_sha1(pointer), "lfs_sha256": sha, "lfs_size": size}


def _store_blob(path: Path, blob: Path) -> Path:
    """Copy ``path`` to ``blob`` unless it is there (through ``.incomplete``, as the Hub's downloads do)."""
    if not blob.exists():
        tmp = blob.with_name(blob.name + ".incomplete")
        shutil.copyfile(path, tmp)
        os.replace(tmp, blob)
    return blob


def _link(link: Path, blob: Path) -> None:
    """``link`` -> ``blob`` as a relative symlink; one that already points there is kept."""
    link.parent.mkdir(parents=True, exist_ok=True)
    target = os.path.relpath(blob, link.parent)
    if link.is_symlink() and os.readlink(link) == target:
        return
    if link.exists() or link.is_symlink():
        link.unlink()
    os.symlink(target, link)


def _write_small(path: Path, text: str) -> None:
    if path.exists() and path.read_text() == text:
        return
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
