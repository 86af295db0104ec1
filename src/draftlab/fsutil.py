"""Atomic file writes: an artifact is either complete or absent, never half-written.

Every output goes to a temporary sibling first and is renamed into place, so a kill at any point
leaves the old file or none, and Snakemake never sees a truncated result as complete.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import math
import os
import re
import shutil
import stat
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterable, Iterator

from draftlab.errors import DraftlabError


# Errors of the disk, not of draftlab: full, over quota, read-only, file too large.
DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG)


def current_umask() -> int:
    """The process umask, read from /proc (no window where it is changed); elsewhere set and restored."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def replacement_mode(path: str | os.PathLike, *, folder: bool = False) -> int:
    """The permission bits a rewrite of ``path`` must carry: the ones it has now, or for a new path
    what ``open``/``mkdir`` would give it (0666/0777 less the umask).

    Why: ``mkstemp``/``mkdtemp`` create 0600/0700, and renaming that into place would lock out the
    teammates a shared results folder is shared with."""
    with contextlib.suppress(OSError):
        return stat.S_IMODE(os.stat(path).st_mode)
    return (0o777 if folder else 0o666) & ~current_umask()


def _open_up_private(folder: Path) -> None:
    """Give the files and folders under a new ``folder`` that a temp-then-rename writer left private
    (0600/0700: safetensors' ``save_file``, transformers' ``save_pretrained``) the umask's default.

    Hard links (a linked input, the user's file) and symlinks are never touched."""
    umask = current_umask()
    for root, dirs, files in os.walk(folder):
        for names, private, default in ((dirs, 0o700, 0o777), (files, 0o600, 0o666)):
            for name in names:
                entry = os.path.join(root, name)
                st = os.lstat(entry)
                if stat.S_ISLNK(st.st_mode) or (not stat.S_ISDIR(st.st_mode) and st.st_nlink > 1):
                    continue
                if stat.S_IMODE(st.st_mode) == private:
                    os.chmod(entry, default & ~umask)


def _cannot_write(path: Path, exc: OSError):
    return DraftlabError(f"{path}: cannot write this output ({exc.strerror or exc}); nothing was written there")


# torch.save's writer on a failed write (a full disk, a quota, a file-size limit): a RuntimeError from
# caffe2's inline_container.cc that carries no errno ("unexpected pos N vs M", "file write failed")
_TORCH_WRITE_FAILED = re.compile(r"inline_container\.cc.*(unexpected pos|file write failed|failed writing)", re.S)


def os_error(exc: BaseException) -> OSError | None:
    """The operating system's error behind ``exc``: ``exc`` itself, the ``(os error N)`` that
    safetensors' writer wraps into a ``SafetensorError`` (a full disk reaches us that way), or torch's
    writer failing a write (read as a full disk: it says no more, and that is what makes it fail)."""
    if isinstance(exc, OSError):
        return exc
    if isinstance(exc, RuntimeError) and _TORCH_WRITE_FAILED.search(str(exc)):
        return OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} (torch's writer: "
                                     f"{' '.join(str(exc).split())[:80]})")
    found = re.search(r"\(os error (\d+)\)", str(exc)) if type(exc).__name__ == "SafetensorError" else None
    return OSError(int(found.group(1)), os.strerror(int(found.group(1)))) if found else None


def disk_error(exc: BaseException) -> OSError | None:
    """The disk's own error behind ``exc`` (full, over quota, read-only, too large), else None:
    a full disk is the user's to fix, whichever library met it."""
    err = os_error(exc)
    return err if err is not None and err.errno in DISK_ERRNOS else None


def environment_error(exc: BaseException) -> str | None:
    """The one-line message of an error of the user's disk or permissions, else None (a bug).

    The last net of the CLI: a folder this user may not enter or write, or a disk that fills up,
    wherever it meets draftlab, is named in one line, not reported as draftlab crashing."""
    err = os_error(exc)
    if err is None or err.errno not in (*DISK_ERRNOS, errno.EACCES, errno.EPERM):
        return None
    where = err.filename or "a file draftlab reads or writes"
    if err.errno in DISK_ERRNOS:
        return f"{where}: {err.strerror}; free space (or fix the mount) and run again"
    return (f"{where}: {err.strerror}: this user may not read, enter or write it "
            "(check the owner and mode of it and of its folders)")


@contextlib.contextmanager
def disk_errors_as(path: str | os.PathLike) -> Iterator[None]:
    """Inside the block, a disk error (:func:`disk_error`) is the one-line user error naming ``path``."""
    try:
        yield
    except Exception as exc:
        err = disk_error(exc)
        if err is None:
            raise
        raise _cannot_write(Path(path), err) from None


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` only if the block succeeds.

    A folder at ``path``, a folder that cannot be written, or a disk that fills up while the block
    writes is one user error naming ``path`` (the old file, if any, is kept).
    """
    path = Path(path)
    if path.is_dir():
        raise DraftlabError(f"{path}: is a folder; expected the path of a file to write")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise _cannot_write(path, exc) from None
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        with disk_errors_as(path):
            yield tmp_path
        try:
            os.chmod(tmp_path, replacement_mode(path))
            os.replace(tmp_path, path)
        except OSError as exc:
            raise _cannot_write(path, exc) from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()


MARKER = ".draftlab-output.json"
# Folders written before the marker existed are recognised by the record file their stage always
# wrote into them (so upgrading does not strand a results folder).
LEGACY_RECORDS = {"acquire": "acquire.json", "patch-config": "patch.json", "train": "train_config.json"}


def check_replaceable(path: str | os.PathLike, stage: str, inputs: Iterable[str | os.PathLike] = ()) -> None:
    """Refuse to let ``stage`` replace ``path`` unless it is draftlab's own earlier output of that stage.

    Why: an ``--out`` that names a user's folder (or one holding the input) must never be wiped.
    ``path`` may be absent or an empty folder (folders in it, but no file: Snakemake makes the folders of a
    job's declared outputs before the job runs); otherwise it must hold :data:`MARKER` naming ``stage``.
    It may never equal or contain one of ``inputs``, whether or not it exists yet.
    """
    path = Path(path)
    out = path.resolve()
    for inp in inputs:
        src = Path(inp).resolve()
        if src == out or out in src.parents:
            raise DraftlabError(f"{path}: output folder {'is' if src == out else 'contains'} the input {inp}; "
                                "choose an --out outside it")
    if not os.path.lexists(path):
        return
    if path.is_symlink() or not path.is_dir():
        raise DraftlabError(f"{path}: exists and is not a folder draftlab wrote; refusing to replace it")
    if not any(not p.is_dir() or p.is_symlink() for p in path.rglob("*")):
        return
    owner = output_stage(path)
    if owner is None and stage in LEGACY_RECORDS and (path / LEGACY_RECORDS[stage]).is_file():
        return
    if owner != stage:
        what = f"draftlab's {owner!r} output" if owner else f"not draftlab's output (no {MARKER})"
        raise DraftlabError(f"{path}: exists and is {what}; {stage} replaces only its own earlier output: "
                            "remove it or choose another --out")


def output_stage(path: str | os.PathLike) -> str | None:
    """The stage named by the marker draftlab wrote into ``path``, or None."""
    try:
        data = json.loads((Path(path) / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data.get("stage") if isinstance(data, dict) and isinstance(data.get("stage"), str) else None


def mark_output(folder: str | os.PathLike, stage: str) -> None:
    """Write the marker that lets a later run of ``stage`` replace ``folder``."""
    write_text(Path(folder) / MARKER, json.dumps({"stage": stage}) + "\n")


def claim_dir(path: str | os.PathLike, stage: str, inputs: Iterable[str | os.PathLike] = ()) -> Path:
    """Create (or reuse) ``path`` as ``stage``'s output folder that is written into in place."""
    check_replaceable(path, stage, inputs)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    if output_stage(path) != stage:
        mark_output(path, stage)
    return path


def remove_own(path: str | os.PathLike, stage: str) -> None:
    """Delete ``path`` only when it is absent, empty or ``stage``'s own output (else refuse)."""
    check_replaceable(path, stage)
    shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike, *, stage: str, inputs: Iterable[str | os.PathLike] = ()) -> Iterator[Path]:
    """Yield a temporary directory beside ``path``; it replaces ``path`` only if the block succeeds.

    ``path`` is checked by :func:`check_replaceable` before the block (so a refusal costs nothing)
    and again before the swap; the new folder carries the marker naming ``stage``.
    """
    inputs = tuple(inputs)
    check_replaceable(path, stage, inputs)
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    except OSError as exc:
        raise _cannot_write(path, exc) from None
    try:
        with disk_errors_as(path):
            yield tmp
        replace_dir(tmp, path, stage, inputs)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def replace_dir(tmp: Path, path: Path, stage: str, inputs: tuple = ()) -> None:
    """Put the finished folder ``tmp`` (a sibling of ``path``) in place of ``path``, marked as ``stage``'s."""
    mark_output(tmp, stage)
    check_replaceable(path, stage, inputs)
    _open_up_private(tmp)
    os.chmod(tmp, replacement_mode(path, folder=True))
    if path.exists():
        old = path.with_name(f".{path.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, path)


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def to_json(obj: Any, where: str = "JSON output", **dumps: Any) -> str:
    """``obj`` as JSON text; a NaN or an infinity anywhere is one user error naming its key.

    Why: Python writes them as bare ``NaN``/``Infinity``, which is not JSON (jq, browsers and most
    readers refuse the file), and a number that is not finite is never a result draftlab stands behind."""
    try:
        return json.dumps(obj, **{"indent": 2, **dumps}, default=_json_default, allow_nan=False) + "\n"
    except ValueError:
        found = first_non_finite(obj)
        if found is None:
            raise
        key, value = found
        raise DraftlabError(f"{where}: key {key!r} is {value}, not a finite number; JSON has no NaN or "
                            "infinity, and draftlab records no such number: nothing was written") from None


def first_non_finite(obj: Any) -> tuple[str, float] | None:
    """(key path, value) of the first NaN or infinity in ``obj``, looking through what JSON writes."""
    stack: list[tuple[str, Any]] = [("", obj)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, float):
            if not math.isfinite(value):
                return path or "(the value)", value
        elif isinstance(value, dict):
            stack.extend((f"{path}.{k}" if path else str(k), v) for k, v in value.items())
        elif isinstance(value, (list, tuple)):
            stack.extend((f"{path}[{i}]", v) for i, v in enumerate(value))
        elif not isinstance(value, (str, int, bool, type(None))):
            with contextlib.suppress(TypeError):
                stack.append((path, _json_default(value)))
    return None


def write_json(path: str | os.PathLike, obj: Any) -> None:
    write_text(path, to_json(obj, str(path)))


def open_regular(path: str | os.PathLike, what: str) -> int:
    """A read-only descriptor of the regular file ``path``; FIFOs, sockets and devices are refused.

    ``O_NONBLOCK`` makes opening a FIFO return at once, and the type is checked on the open
    descriptor, so neither a FIFO nor a special file swapped in after a check can make a reader hang.
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise DraftlabError(f"{path}: {what} not found") from None
    except IsADirectoryError:
        raise DraftlabError(f"{path}: expected a {what}, got a directory") from None
    except OSError as exc:
        raise DraftlabError(f"{path}: cannot read the {what} ({exc.strerror or exc})") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = "a directory" if stat.S_ISDIR(mode) else "a special file (FIFO, socket or device)"
        raise DraftlabError(f"{path}: expected a regular file ({what}), got {kind}")
    os.set_blocking(fd, True)
    return fd


@contextlib.contextmanager
def locked(path: str | os.PathLike, what: str, *, wait: bool = True, busy: str = "") -> Iterator[int]:
    """Hold an exclusive ``flock`` on the lock file ``path`` (created if absent) for the block.

    Why: a lock file is opened for writing, so a symlink planted at its name would make draftlab
    create or open a file elsewhere; it is opened ``O_NOFOLLOW`` and must be a regular file.
    ``wait=False`` refuses at once when another process holds it (``busy`` says what to do).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags, 0o666)  # the umask decides, as for every file draftlab writes
    except OSError as exc:
        kind = "a symlink" if path.is_symlink() else (exc.strerror or str(exc))
        raise DraftlabError(f"{path}: cannot open the {what} ({kind}); draftlab opens only a regular file "
                            "it creates there: remove it") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise DraftlabError(f"{path}: the {what} is not a regular file; remove it")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            raise DraftlabError(f"{path}: held by another process ({what}){'; ' + busy if busy else ''}") from None
        yield fd
    finally:
        os.close(fd)  # closing releases the lock


# A config or record JSON larger than this is not one draftlab (or transformers) writes.
MAX_JSON_BYTES = 64 << 20


def read_text_file(path: str | os.PathLike, what: str, limit: int = MAX_JSON_BYTES) -> str:
    """The UTF-8 text of a regular file of at most ``limit`` bytes; every failure is one user error."""
    fd = open_regular(path, what)
    with os.fdopen(fd, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        if size > limit:
            raise DraftlabError(f"{path}: {what} is {size} bytes; expected at most {limit} bytes")
        try:
            data = fh.read(limit + 1)
        except OSError as exc:
            raise DraftlabError(f"{path}: cannot read the {what} ({exc.strerror or exc})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DraftlabError(f"{path}: {what} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def parse_json_text(text: str, where: str, what: str = "JSON") -> Any:
    """``json.loads`` whose every failure (syntax, nesting too deep, a 5000-digit number) is one user error."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise DraftlabError(f"{where}: invalid JSON in the {what} ({exc})") from None
    except RecursionError:
        raise DraftlabError(f"{where}: {what} nests too deeply to be a config or record") from None
    except ValueError as exc:  # e.g. an integer literal longer than Python's 4300-digit limit
        raise DraftlabError(f"{where}: {what} is not usable JSON ({' '.join(str(exc).split())[:120]})") from None


def read_json(path: str | os.PathLike, what: str = "JSON file") -> dict[str, Any]:
    """Read a JSON object; a missing/unreadable/special file, bad UTF-8 or JSON, or a non-object is a
    user error naming ``path``."""
    data = parse_json_text(read_text_file(path, what), str(path), what)
    if not isinstance(data, dict):
        raise DraftlabError(f"{path}: {what}: expected a JSON object, got {type(data).__name__}")
    return data


def _json_default(obj: Any) -> Any:
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if hasattr(obj, "item"):
        return obj.item()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


# --- file hashes ----------------------------------------------------------------------------------


def sha256_file(path: str | os.PathLike, progress: bool = False) -> str:
    """sha256 of a (possibly multi-GB) file, read in 8 MiB chunks; a tqdm bar on stderr for big ones
    when ``progress``. The one file hash of draftlab (records, acquire, resolve-model, resume, hf_cache)."""
    path = Path(path)
    h = hashlib.sha256()
    size = path.stat().st_size
    bar = None
    if progress and size >= (64 << 20):
        from tqdm import tqdm  # deferred: tqdm (~100 ms)

        bar = tqdm(total=size, unit="B", unit_scale=True, desc=f"sha256 {path.name}", file=sys.stderr, leave=False)
    try:
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(8 << 20), b""):
                h.update(chunk)
                if bar is not None:
                    bar.update(len(chunk))
    finally:
        if bar is not None:
            bar.close()
    return h.hexdigest()


def named_digest(pairs: Iterable[tuple[str, str]]) -> str:
    """One sha256 over ``(name, sha256)`` pairs (a model folder's weight files), as records and
    resolve-model both state a folder's weights."""
    return hashlib.sha256("".join(f"{name}:{sha}\n" for name, sha in pairs).encode()).hexdigest()


def link_file(src: Path, dst: Path) -> str:
    """Hard-link ``src`` to ``dst``; fall back to an absolute symlink (never a copy)."""
    src = src.resolve()
    try:
        os.link(src, dst)
        return "hardlink"
    except OSError:
        os.symlink(src, dst)
        return "symlink"


def same_file(a: Path, b: Path) -> bool:
    """Whether two paths are one file (a hard link counts); a missing path is not."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False
