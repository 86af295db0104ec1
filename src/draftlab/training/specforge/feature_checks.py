"""What the capture's readers check before a feature file is counted or trained on.

Why: the features folder is read by three stages (the capture's preflight, its record, a train job's check),
and each used to trust what it listed. A target with new weights under the same ``config.json`` was taken
for the same target; a file of another hidden size was counted; an unreadable file (garbage that even ends
in a zip record) crashed the record; a symlink out of the folder was counted and trained on; a damaged
identity JSON crashed the stage. Here each is read with care: a one-line reason naming the file, never a
crash, never a count.
"""

from __future__ import annotations

import collections
import gzip
import hashlib
import os
import re
from pathlib import Path
from typing import Any

from draftlab.errors import DraftlabError
from draftlab.formats.checkpoint import INDEX_SUFFIX
from draftlab.fsutil import named_digest, sha256_file

SAMPLE_BYTES = 1 << 20  # of each weight file too big to hash whole: its first and last MiB of data
_HASH_WHOLE_BYTES = 2 << 30  # a folder of weights this small is hashed whole


# --- the target's weights ---------------------------------------------------------------------------


def _sampled_sha256(path: Path) -> str:
    """sha256 of a safetensors file's size, header and the first and last MiB of its data: new weights under
    the same names and shapes change the data, and a 600 GB target costs milliseconds."""
    h = hashlib.sha256()
    size = path.stat().st_size
    h.update(f"{size}\n".encode())
    with open(path, "rb") as fh:
        head = fh.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else 0
        h.update(head + fh.read(min(n, size)))
        h.update(fh.read(SAMPLE_BYTES))
        fh.seek(max(0, size - SAMPLE_BYTES))
        h.update(fh.read(SAMPLE_BYTES))
    return h.hexdigest()


def target_weights_sha256(target: str | os.PathLike) -> str | None:
    """One digest of the target's weights: each ``*.safetensors`` file by its HF-cache blob name (the file's
    sha256), else by its whole sha256 in a small folder, else by its size, header and first and last MiB;
    plus the shard index. None for a folder without safetensors (nothing to pin)."""
    folder = Path(target)
    weights = sorted(p for p in folder.iterdir() if p.name.endswith(".safetensors") and p.is_file())
    if not weights:
        return None
    whole = sum(p.stat().st_size for p in weights) <= _HASH_WHOLE_BYTES
    pairs = []
    for p in weights:
        blob = p.resolve().name
        digest = blob if re.fullmatch(r"[0-9a-f]{64}", blob) else sha256_file(p) if whole else _sampled_sha256(p)
        pairs.append((p.name, digest))
    pairs += [(p.name, sha256_file(p)) for p in sorted(folder.glob(f"*{INDEX_SUFFIX}")) if p.is_file()]
    return named_digest(pairs)


# --- paths that leave the folder -----------------------------------------------------------------------


def escaping_paths(folder: str | os.PathLike) -> list[tuple[Path, Path]]:
    """``(path, where it leads)`` for every entry under ``folder`` that leads outside it (a symlink out, or a
    symlinked folder): SpecForge writes its samples as files of its own, and a sample read from elsewhere is
    not the capture's. Symlinked folders are not walked into."""
    root = Path(folder)
    if not root.is_dir():
        return []
    real_root = Path(os.path.realpath(root))
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            if not p.is_symlink():
                continue
            real = Path(os.path.realpath(p))
            if real_root not in real.parents:
                out.append((p, real))
    return sorted(out)


def refuse_escaping(folder: str | os.PathLike, doing: str) -> None:
    """One line naming the first path that leads outside ``folder``, and how many do."""
    escaping = escaping_paths(folder)
    if escaping:
        p, real = escaping[0]
        raise DraftlabError(f"{p}: leads to {real}, outside the features folder {folder} ({len(escaping)} such "
                            f"path(s)); a sample read from elsewhere is not the capture's: refused, {doing}; move "
                            "the link away and rerun the capture rule")


# --- one feature file --------------------------------------------------------------------------------


def _load(path: Path) -> Any:
    import torch  # deferred: loads torch

    if path.name.endswith(".gz"):
        with gzip.open(path, "rb") as fh:
            return torch.load(fh, map_location="cpu", weights_only=True)
    return torch.load(path, map_location="cpu", weights_only=True, mmap=True)


def read_feature(path: Path, hidden: int, n_aux: int) -> tuple[int | None, str | None, str | None]:
    """``(tokens, dtype, problem)`` of one SpecForge feature file, read through mmap (the tensors stay on disk):
    the four tensors, ``hidden_state`` ``[1, T, hidden]`` and ``aux_hidden_state`` ``[1, T, n_aux x hidden]`` of
    one floating dtype, ``input_ids`` and ``loss_mask`` of ``T``. ``problem`` says what is wrong, else None."""
    import torch  # deferred: loads torch

    try:
        data = _load(path)
    except Exception as exc:  # noqa: BLE001 - a file of any content: each failure of the reader is a finding
        text = " ".join(str(exc).split())[:120]
        return None, None, f"unreadable ({type(exc).__name__}: {text})"
    want = ("input_ids", "loss_mask", "hidden_state", "aux_hidden_state")
    if not isinstance(data, dict) or not all(isinstance(data.get(k), torch.Tensor) for k in want):
        keys = sorted(map(str, data)) if isinstance(data, dict) else type(data).__name__
        return None, None, f"holds {keys}; expected the tensors {list(want)}"
    ids, mask, last, aux = (data[k] for k in want)
    t = int(ids.numel())
    if ids.dim() != 1 or tuple(mask.shape) != (t,):
        return None, None, f"input_ids {list(ids.shape)}, loss_mask {list(mask.shape)}; expected [T] each"
    if tuple(last.shape) != (1, t, hidden):
        return None, None, (f"hidden_state {list(last.shape)}; expected [1, {t}, {hidden}] (the target's hidden "
                            "size): another target's features")
    if tuple(aux.shape) != (1, t, n_aux * hidden):
        return None, None, (f"aux_hidden_state {list(aux.shape)}; expected [1, {t}, {n_aux * hidden}] ({n_aux} aux "
                            f"layers of hidden size {hidden}): other aux layers' or another target's features")
    if last.dtype != aux.dtype or not last.dtype.is_floating_point:
        return None, None, f"hidden_state {last.dtype}, aux_hidden_state {aux.dtype}; expected one floating dtype"
    return t, str(last.dtype).removeprefix("torch."), None


def check_features(files: list[Path], hidden: int, n_aux: int) -> tuple[int, list[tuple[Path, str]]]:
    """``(tokens of the good files, [(file, problem)])``; a file whose dtype differs from the folder's (the most
    common one) is a problem too: one capture writes one dtype."""
    tokens, dtypes, bad = {}, {}, []
    for p in files:
        t, dtype, problem = read_feature(p, hidden, n_aux)
        if problem:
            bad.append((p, problem))
        else:
            tokens[p], dtypes[p] = t, dtype
    if dtypes:
        common = collections.Counter(dtypes.values()).most_common(1)[0][0]
        for p, dtype in dtypes.items():
            if dtype != common:
                bad.append((p, f"dtype {dtype}; the folder's other files are {common}: another capture's"))
                tokens.pop(p)
    return sum(tokens.values()), sorted(bad)


def describe(bad: list[tuple[Path, str]]) -> str:
    p, problem = bad[0]
    return f"{len(bad)} feature file(s) not of this capture (first {p}: {problem})"


# --- the identity and the record ----------------------------------------------------------------------


def _bad(path: Path, key: str, want: str, got: Any) -> DraftlabError:
    return DraftlabError(f"{path}: key {key!r}: expected {want}, got {got!r:.60}; the file is damaged (draftlab "
                         "writes it): move it away and rerun the capture rule")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_identity_file(path: Path, ident: dict[str, Any]) -> dict[str, Any]:
    """The keys the capture's stages read from ``identity.json``, each of the type draftlab writes."""
    attempts = ident.get("attempts", [])
    if not isinstance(attempts, list) or not all(isinstance(a, dict) and all(_number(a.get(k, 0)) for k in (
            "started", "samples_before", "bytes_before")) for a in attempts):
        raise _bad(path, "attempts", "a list of {started, samples_before, bytes_before} numbers", attempts)
    est = ident.get("estimate")
    if est is not None and not (isinstance(est, dict) and all(_number(est.get(k)) for k in (
            "bytes_per_token", "tokens", "samples")) and est["bytes_per_token"] > 0):
        raise _bad(path, "estimate", "{bytes_per_token > 0, tokens, samples} numbers", est)
    ids = ident.get("aux_layer_ids")
    if ids is not None and not (isinstance(ids, list) and all(isinstance(i, int) for i in ids)):
        raise _bad(path, "aux_layer_ids", "a list of integers", ids)
    return ident


def check_record(path: Path, rec: dict[str, Any]) -> dict[str, Any]:
    """The keys a train job reads from the capture's record, each of the type draftlab writes."""
    for key, want, ok in (("features", "a folder path", lambda v: isinstance(v, str) and v),
                          ("identity", "an object", lambda v: isinstance(v, dict)),
                          ("listing_sha256", "a sha256", lambda v: isinstance(v, str)),
                          ("samples", "a count", lambda v: isinstance(v, int) and not isinstance(v, bool))):
        if not ok(rec.get(key)):
            raise _bad(path, key, want, rec.get(key))
    return rec
