"""The draft vocabulary of an EAGLE-3 drafter: build it, save/load it, compare it, measure it.

An EAGLE-3 drafter predicts over a small draft vocabulary of M target token ids. Two tensors
describe it (see ``eagle3_format``):

- ``d2t [M]`` int64 offsets: ``target_id = draft_id + d2t[draft_id]`` (SGLang serves with this);
- ``t2d [V]`` bool mask over the target vocabulary: which target ids are in the draft vocabulary
  (the trainer uses it to restrict the target distribution).

Getting this mapping wrong fails silently (acceptance drops, nothing crashes), so this module
keeps it explicit: SpecForge's construction rule, a small safetensors file format for it, a diff
between two mappings and the coverage of a token stream. Everything here is pure (no CLI) so the
trainer imports the very same functions.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm import tqdm

from draftlab.errors import DraftlabError
from draftlab.fsutil import atomic_path, open_regular
from draftlab.formats.checkpoint import load_tensors, read_checkpoint
from draftlab.formats.target_config import MAX_VOCAB

MAPPING_FORMAT = "draftlab-vocab-mapping"
EXAMPLES = 10  # how many example ids a diff lists
_FLUSH_TOKENS = 1 << 20  # count token ids in batches of about this many


@dataclass
class VocabMapping:
    """A draft vocabulary: ``d2t`` int64 offsets ``[M]`` and ``t2d`` bool mask ``[V]``."""

    d2t: torch.Tensor
    t2d: torch.Tensor

    @property
    def draft_vocab_size(self) -> int:
        return int(self.d2t.numel())

    @property
    def vocab_size(self) -> int:
        return int(self.t2d.numel())

    def target_ids(self) -> torch.Tensor:
        """Target id of every draft id (``arange(M) + d2t``); ascending for a well-formed mapping."""
        return torch.arange(self.draft_vocab_size, dtype=torch.int64) + self.d2t.to(torch.int64)

    @classmethod
    def from_target_ids(cls, ids: torch.Tensor, vocab_size: int) -> "VocabMapping":
        """The mapping whose draft vocabulary is the target ids ``ids`` (sorted here)."""
        ids = torch.sort(torch.as_tensor(ids, dtype=torch.int64).flatten()).values
        if ids.numel() and (int(ids[0]) < 0 or int(ids[-1]) >= vocab_size):
            raise DraftlabError(f"target ids must lie in [0, {vocab_size}), got {int(ids[0])}..{int(ids[-1])}")
        t2d = torch.zeros(vocab_size, dtype=torch.bool)
        t2d[ids] = True
        return cls(d2t=ids - torch.arange(ids.numel(), dtype=torch.int64), t2d=t2d)


# ---------------------------------------------------------------------------------------------
# counting tokens


def count_tokens(tokens_path: str | os.PathLike, vocab_size: int, *, order: bool = False):
    """How often each target id occurs in a tokens file, as an int64 tensor ``[vocab_size]``.

    Formats: JSONL, one ``{"input_ids": [...], "loss_mask": [0/1, ...]}`` per line (only positions
    with ``loss_mask == 1`` count, as SpecForge counts the assistant tokens; every token counts
    when ``loss_mask`` is absent), or a ``.npy`` integer array (every element counts, one sample).
    With ``order`` also the ids in the order SpecForge's ``Counter`` first sees them (sample by
    sample, ascending within a sample: ``unique`` of each sample's loss-masked ids), the order
    :func:`build_mapping` breaks ties by: ``(counts, first_seen)``.
    """
    path = Path(tokens_path)
    if not path.is_file():
        raise DraftlabError(f"{path}: tokens file not found")
    vocab_size = check_vocab_size(vocab_size, f"{path}: target vocab size")
    if path.suffix == ".npy":
        counts = _count_npy(path, vocab_size)
        return (counts, torch.nonzero(counts).flatten()) if order else counts
    counts, first_seen = _count_jsonl(path, vocab_size)
    return (counts, first_seen) if order else counts


def _count_npy(path: Path, vocab_size: int) -> torch.Tensor:
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError) as exc:
        raise DraftlabError(f"{path}: not a readable .npy array ({exc})") from exc
    if not np.issubdtype(arr.dtype, np.integer):
        raise DraftlabError(f"{path}: expected an integer array of token ids, got dtype {arr.dtype}")
    flat = arr.reshape(-1)
    counts = np.zeros(vocab_size, dtype=np.int64)
    step = 1 << 24
    for start in tqdm(range(0, flat.size, step), desc="counting tokens", unit="chunk", disable=None):
        chunk = np.asarray(flat[start : start + step], dtype=np.int64)
        _check_range(chunk, vocab_size, f"{path}: elements {start}..{start + chunk.size - 1}")
        counts += np.bincount(chunk, minlength=vocab_size)
    return torch.from_numpy(counts)


def _count_jsonl(path: Path, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    counts = np.zeros(vocab_size, dtype=np.int64)
    seen = np.zeros(vocab_size, dtype=bool)
    first_seen: list[np.ndarray] = []
    pending: list[np.ndarray] = []
    pending_n = 0
    first_line = 1

    def flush(last_line: int) -> None:
        nonlocal pending, pending_n, first_line
        if pending:
            ids = np.concatenate(pending)
            _check_range(ids, vocab_size, f"{path}: lines {first_line}..{last_line}")
            counts[:] += np.bincount(ids, minlength=vocab_size)
        pending, pending_n, first_line = [], 0, last_line + 1

    lineno = 0
    for lineno, ids in _jsonl_ids(path):
        _check_range(ids, vocab_size, f"{path}: line {lineno}")
        uniq = np.unique(ids)
        fresh = uniq[~seen[uniq]]
        seen[fresh] = True
        first_seen.append(fresh)
        pending.append(ids)
        pending_n += ids.size
        if pending_n >= _FLUSH_TOKENS:
            flush(lineno)
    flush(lineno)
    order = np.concatenate(first_seen) if first_seen else np.zeros(0, dtype=np.int64)
    return torch.from_numpy(counts), torch.from_numpy(order.astype(np.int64))


def _jsonl_ids(path: Path) -> Iterator[tuple[int, np.ndarray]]:
    """Yield ``(line number, loss-masked ids)`` for every non-blank line of a tokens JSONL file."""
    size = path.stat().st_size
    with os.fdopen(open_regular(path, "tokens file"), "rb") as fh, tqdm(
        total=size, desc="counting tokens", unit="B", unit_scale=True, disable=None
    ) as bar:
        for lineno, raw in enumerate(fh, start=1):
            bar.update(len(raw))
            if not raw.strip():
                continue
            try:
                row = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise DraftlabError(f"{path}: line {lineno}: invalid JSON ({exc.msg})") from exc
            except (UnicodeDecodeError, RecursionError, ValueError) as exc:  # not UTF-8, too deep, too long a number
                reason = "nests too deeply" if isinstance(exc, RecursionError) else " ".join(str(exc).split())[:100]
                raise DraftlabError(f"{path}: line {lineno}: invalid JSON ({reason})") from None
            if not isinstance(row, dict) or "input_ids" not in row:
                raise DraftlabError(f"{path}: line {lineno}: expected an object with key 'input_ids'")
            ids = _int_array(row["input_ids"], path, lineno, "input_ids")
            mask = row.get("loss_mask")
            if mask is not None:
                mask = _int_array(mask, path, lineno, "loss_mask")
                if mask.shape != ids.shape:
                    raise DraftlabError(
                        f"{path}: line {lineno}: 'loss_mask' has {mask.size} entries, "
                        f"'input_ids' has {ids.size}; expected the same length"
                    )
                ids = ids[mask == 1]
            yield lineno, ids


def _int_array(value: Any, path: Path, lineno: int, key: str) -> np.ndarray:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise DraftlabError(f"{path}: line {lineno}: key '{key}': expected a flat list of integers")
    return np.asarray(value, dtype=np.int64)


def _check_range(ids: np.ndarray, vocab_size: int, where: str) -> None:
    if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
        bad = int(ids.min()) if ids.min() < 0 else int(ids.max())
        raise DraftlabError(
            f"{where}: token id {bad} outside the target vocabulary [0, {vocab_size}); "
            "wrong tokenizer or wrong --target-vocab-size?"
        )


# ---------------------------------------------------------------------------------------------
# building, checking, comparing


def build_mapping(counts: torch.Tensor, draft_vocab_size: int, first_seen: torch.Tensor | None = None) -> VocabMapping:
    """SpecForge 0.2.0's rule (``data/preprocessing.py::process_token_dict_to_mappings``), step for step.

    A ``Counter`` of the counted ids in ``first_seen`` order (default: ascending ids); with fewer
    than M distinct ids, ids from ``set(range(M))`` not yet counted are added at count 0 in that
    set's iteration order until there are M; ``most_common(M)`` keeps the first-seen id among equal
    counts; the ids are sorted ascending and ``d2t[i] = ids[i] - i``.
    """
    counts = torch.as_tensor(counts).to(torch.int64).flatten()
    vocab_size = counts.numel()
    if not 0 < draft_vocab_size <= vocab_size:
        raise DraftlabError(
            f"draft vocab size must be in [1, {vocab_size}] (the target vocabulary), got {draft_vocab_size}"
        )
    if bool((counts < 0).any()):
        raise DraftlabError("token counts must be non-negative")
    order = torch.nonzero(counts).flatten() if first_seen is None else torch.as_tensor(first_seen).flatten()
    values = counts.tolist()
    token_dict = Counter()
    for i in order.tolist():
        token_dict[i] = values[i]
    if len(token_dict) != int((counts > 0).sum()):
        raise DraftlabError("first_seen must list every counted id once (and no uncounted one)")
    if len(token_dict) < draft_vocab_size:
        for token in set(range(draft_vocab_size)) - set(token_dict.keys()):
            token_dict[token] = 0
            if len(token_dict) >= draft_vocab_size:
                break
    ids = torch.tensor(sorted(k for k, _ in token_dict.most_common(draft_vocab_size)), dtype=torch.int64)
    return VocabMapping.from_target_ids(ids, vocab_size)


def validate(mapping: VocabMapping, vocab_size: int | None = None) -> list[str]:
    """Problems that make a mapping wrong for a target with ``vocab_size`` ids (empty: fine)."""
    problems: list[str] = []
    vocab_size = mapping.vocab_size if vocab_size is None else int(vocab_size)
    if mapping.d2t.dtype.is_floating_point or mapping.d2t.dtype == torch.bool:
        problems.append(f"d2t has dtype {mapping.d2t.dtype}; expected integer offsets (int64)")
        return problems
    ids = mapping.target_ids()
    bad = ((ids < 0) | (ids >= vocab_size)).nonzero().flatten()
    if bad.numel():
        i = int(bad[0])
        problems.append(
            f"{bad.numel()} draft ids map outside the target vocabulary [0, {vocab_size}) "
            f"(first: draft id {i} -> target id {int(ids[i])})"
        )
    uniq, inverse, per = torch.unique(ids, return_inverse=True, return_counts=True)
    dup = (per > 1).nonzero().flatten()
    if dup.numel():
        t = int(uniq[dup[0]])
        where = (ids == t).nonzero().flatten()[:3].tolist()
        problems.append(
            f"{dup.numel()} target ids appear more than once (first: target id {t} at draft ids {where})"
        )
    if mapping.vocab_size != vocab_size:
        problems.append(f"t2d has {mapping.vocab_size} entries; expected the target vocab size {vocab_size}")
    elif not bad.numel():
        expected = torch.zeros(vocab_size, dtype=torch.bool)
        expected[ids] = True
        disagree = int((expected != mapping.t2d.to(torch.bool)).sum())
        if disagree:
            problems.append(f"t2d disagrees with d2t at {disagree} target ids; expected t2d to mark exactly d2t's ids")
    return problems


def coverage(mapping: VocabMapping, counts: torch.Tensor) -> float:
    """Share of token occurrences whose id is in the draft vocabulary (0.0 with no tokens).

    A drafter can only propose ids in its draft vocabulary, so this bounds per-token acceptance.
    """
    counts = torch.as_tensor(counts).to(torch.int64).flatten()
    total = int(counts.sum())
    if total == 0:
        return 0.0
    ids = mapping.target_ids()
    ids = torch.unique(ids[(ids >= 0) & (ids < counts.numel())])
    return int(counts[ids].sum()) / total


def diff_mappings(a: VocabMapping, b: VocabMapping) -> dict[str, Any]:
    """Compare two mappings by draft id (does row i predict the same token?) and as sets of ids.

    ``differing`` lists draft ids whose target id differs (ids beyond the shorter vocabulary count
    as differing); the set view says how much of one draft vocabulary the other one keeps.
    """
    ta, tb = a.target_ids(), b.target_ids()
    m = min(ta.numel(), tb.numel())
    differing = (ta[:m] != tb[:m]).nonzero().flatten().tolist()
    differing += list(range(m, max(ta.numel(), tb.numel())))
    sa, sb = set(ta.tolist()), set(tb.tolist())
    only_a, only_b = sorted(sa - sb), sorted(sb - sa)
    size = a.draft_vocab_size if a.draft_vocab_size == b.draft_vocab_size else [a.draft_vocab_size, b.draft_vocab_size]
    vocab = a.vocab_size if a.vocab_size == b.vocab_size else [a.vocab_size, b.vocab_size]
    return {
        "identical": not differing and a.vocab_size == b.vocab_size,
        "draft_vocab_size": size,
        "vocab_size": vocab,
        "num_differing": len(differing),
        "differing": differing,
        "differing_examples": [
            {"draft_id": i, "a": _at(ta, i), "b": _at(tb, i)} for i in differing[:EXAMPLES]
        ],
        "shared_target_ids": len(sa & sb),
        "only_in_a": len(only_a),
        "only_in_b": len(only_b),
        "only_in_a_examples": only_a[:EXAMPLES],
        "only_in_b_examples": only_b[:EXAMPLES],
    }


def _at(ids: torch.Tensor, i: int) -> int | None:
    return int(ids[i]) if i < ids.numel() else None


# ---------------------------------------------------------------------------------------------
# files


def save_mapping(path: str | os.PathLike, mapping: VocabMapping, meta: dict[str, Any] | None = None) -> Path:
    """Write a mapping file: safetensors with ``d2t`` (I64) and ``t2d`` (BOOL) plus metadata.

    The metadata holds ``format`` = ``draftlab-vocab-mapping``, the two sizes and ``meta``
    (non-string values JSON-encoded, as safetensors metadata is str -> str). Written atomically.
    """
    metadata = {
        "format": MAPPING_FORMAT,
        "draft_vocab_size": str(mapping.draft_vocab_size),
        "vocab_size": str(mapping.vocab_size),
    }
    for key, value in (meta or {}).items():
        metadata[str(key)] = value if isinstance(value, str) else json.dumps(value)
    tensors = {
        "d2t": mapping.d2t.to(torch.int64).contiguous(),
        "t2d": mapping.t2d.to(torch.bool).contiguous(),
    }
    path = Path(path)
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata=metadata)
    return path


def load_mapping(source: str | os.PathLike) -> VocabMapping:
    """Read a mapping from a mapping file, any ``.safetensors`` file holding ``d2t``, or a drafter.

    A drafter (folder or ``hf:`` source) is read through ``draftlab.formats.checkpoint`` (sharded files
    included). When it has ``d2t`` but no ``t2d`` (SGLang does not need one) ``t2d`` is rebuilt
    from ``d2t`` and the config's ``vocab_size``.
    """
    text = str(source)
    path = Path(text)
    if path.is_file():
        if path.suffix != ".safetensors":
            raise DraftlabError(f"{path}: expected a .safetensors mapping file or a drafter folder")
        return _load_file(path)

    info = read_checkpoint(text)
    if "d2t" not in info.tensors:
        raise DraftlabError(
            f"{text}: no 'd2t' tensor; expected an EAGLE-3 drafter with a draft vocabulary mapping "
            "(without one SGLang treats draft id i as target id i)"
        )
    names = ["d2t"] + (["t2d"] if "t2d" in info.tensors else [])
    tensors = load_tensors(info, names)
    vocab = None
    if "t2d" not in tensors:
        vocab = (info.config or {}).get("vocab_size")
        if vocab is None:
            raise DraftlabError(f"{text}: has 'd2t' but neither 't2d' nor config key 'vocab_size'; cannot size t2d")
    return mapping_from(tensors, text, vocab)


def _load_file(path: Path) -> VocabMapping:
    try:
        with safe_open(str(path), framework="pt") as fh:
            keys = set(fh.keys())
            meta = fh.metadata() or {}
            tensors = {k: fh.get_tensor(k) for k in ("d2t", "t2d") if k in keys}
    except DraftlabError:
        raise
    except Exception as exc:  # safetensors raises its own error types for broken files
        raise DraftlabError(f"{path}: not a readable safetensors file ({exc})") from exc
    if "d2t" not in tensors:
        raise DraftlabError(f"{path}: no 'd2t' tensor; expected a vocab mapping file (d2t, t2d)")
    vocab = meta.get("vocab_size")
    if "t2d" not in tensors and vocab is None:
        raise DraftlabError(f"{path}: has 'd2t' but no 't2d' tensor; cannot tell the target vocab size")
    return mapping_from(tensors, str(path), vocab)


def mapping_from(tensors: dict[str, torch.Tensor], where: str, vocab_size: int | None) -> VocabMapping:
    """A mapping from loaded tensors, checked as every reader needs it: 1-D integer ``d2t`` whose
    target ids lie in the vocabulary and are distinct, ``t2d`` a 1-D 0/1 mask marking exactly them."""
    d2t = tensors["d2t"]
    if d2t.dim() != 1:
        raise DraftlabError(f"{where}: key 'd2t': shape {list(d2t.shape)}; expected one dimension [draft_vocab_size]")
    if d2t.dtype.is_floating_point or d2t.dtype.is_complex or d2t.dtype == torch.bool:
        raise DraftlabError(f"{where}: key 'd2t': dtype {d2t.dtype}; expected integer offsets (I64)")
    if d2t.numel() == 0:
        raise DraftlabError(f"{where}: key 'd2t': empty; expected one offset per draft id")
    d2t = d2t.to(torch.int64)
    ids = torch.arange(d2t.numel()) + d2t
    if "t2d" in tensors:
        t2d = tensors["t2d"]
        if t2d.dim() != 1:
            raise DraftlabError(f"{where}: key 't2d': shape {list(t2d.shape)}; expected one dimension [vocab_size]")
        if t2d.dtype.is_floating_point or t2d.dtype.is_complex or (
                t2d.dtype != torch.bool and t2d.numel() and bool(((t2d != 0) & (t2d != 1)).any())):
            raise DraftlabError(f"{where}: key 't2d': dtype {t2d.dtype}; expected a boolean mask (BOOL, or 0/1)")
        _check_d2t_range(ids, t2d.numel(), where)
        mapping = VocabMapping(d2t=d2t, t2d=t2d.to(torch.bool))
    else:
        assert vocab_size is not None
        vocab_size = check_vocab_size(vocab_size, f"{where}: key 'vocab_size'")
        _check_d2t_range(ids, vocab_size, where)
        t2d = torch.zeros(vocab_size, dtype=torch.bool)
        t2d[ids] = True
        mapping = VocabMapping(d2t=d2t, t2d=t2d)
    problems = validate(mapping)
    if problems:
        key = "t2d" if problems[0].startswith("t2d") else "d2t"
        raise DraftlabError(f"{where}: key '{key}': {problems[0]}")
    return mapping


def check_vocab_size(value: Any, where: str) -> int:
    """An integer vocabulary size within :data:`MAX_VOCAB` (a dense ``t2d`` of it must be cheap)."""
    try:
        n = int(value) if not isinstance(value, bool) else None
    except (TypeError, ValueError):
        n = None
    if n is None or not 1 <= n <= MAX_VOCAB:
        raise DraftlabError(f"{where}: expected a vocabulary size in 1..{MAX_VOCAB}, got {str(value)[:40]!r}")
    return n


def _check_d2t_range(ids: torch.Tensor, vocab_size: int, where: str) -> None:
    """Refuse a d2t that sends draft ids outside the target vocabulary: every use of it would be wrong."""
    bad = ((ids < 0) | (ids >= vocab_size)).nonzero().flatten()
    if bad.numel():
        i = int(bad[0])
        raise DraftlabError(
            f"{where}: key 'd2t': {bad.numel()} draft ids map outside the target vocabulary [0, {vocab_size}) "
            f"(first: draft id {i} -> target id {int(ids[i])}); rebuild the mapping (draftlab d2t build)"
        )
