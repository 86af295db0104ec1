"""What a checkpoint holds, learned from its config and safetensors headers alone.

Sources: a local folder (single-file or sharded through ``model.safetensors.index.json``), a local
``.safetensors`` file, or ``hf:ORG/NAME[@REV]``. For Hub sources the cached snapshot is read when
the weights are there; otherwise huggingface_hub's header-only metadata call is used, so a 2 GB
drafter is inspected without downloading it. Tensor data is read only by :func:`load_tensors`.
Pickle weights (``.bin``/``.pt``/``.pth``) are listed, never unpickled.
"""

from __future__ import annotations

import hashlib
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from safetensors import safe_open

from draftlab.errors import DraftlabError
from draftlab.hf_cache import HubSource, hub_call, is_hf_source, is_offline, parse_hf_source, snapshot_commit
from draftlab.formats.safetensors_header import TensorInfo, parse_header, read_header
from draftlab.formats.target_config import load_json_config

if TYPE_CHECKING:
    import torch

PICKLE_SUFFIXES = (".bin", ".pt", ".pth")
INDEX_SUFFIX = ".safetensors.index.json"


@dataclass
class CheckpointInfo:
    """A checkpoint's config and tensor headers; ``root`` is None when nothing is on local disk."""

    source: str
    root: Path | None
    config: dict | None
    tensors: dict[str, TensorInfo]
    weight_files: list[Path]
    pickle_files: list[Path] = field(default_factory=list)
    commit: str | None = None  # resolved Hub commit for hf: sources

    @property
    def num_params(self) -> int:
        return sum(t.numel for t in self.tensors.values())

    @property
    def num_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())


def read_checkpoint(source: str | os.PathLike, cache_dir: str | os.PathLike | None = None) -> CheckpointInfo:
    """Config + tensor headers of a folder, a ``.safetensors`` file or ``hf:ORG/NAME[@REV]``."""
    if is_hf_source(source):
        return _read_hub(parse_hf_source(str(source)), cache_dir)
    path = Path(source)
    if path.is_dir():
        return _read_folder(path, str(source))
    if path.is_file():
        if path.name.endswith(INDEX_SUFFIX):
            return _read_folder(path.parent, str(source), index=path)
        if path.suffix != ".safetensors":
            raise DraftlabError(f"{path}: expected a folder, a .safetensors file or hf:ORG/NAME[@REV]")
        sibling = path.parent / "config.json"
        config = load_json_config(sibling) if sibling.is_file() else None
        return CheckpointInfo(str(source), path.parent, config, read_header(path), [path], [])
    raise DraftlabError(f"{path}: no such file or folder (expected a drafter folder, a .safetensors file or hf:ORG/NAME)")


def _read_folder(folder: Path, source: str, index: Path | None = None, config: dict | None = None) -> CheckpointInfo:
    if config is None:
        cfg_path = folder / "config.json"
        if not cfg_path.is_file():
            raise DraftlabError(f"{folder}: folder has no config.json (expected a model or drafter folder)")
        config = load_json_config(cfg_path)
    if index is None:
        indexes = sorted(folder.glob("*" + INDEX_SUFFIX))
        index = indexes[0] if indexes else None
    if index is not None:
        tensors, files = _read_sharded(folder, index)
    else:
        files = sorted(folder.glob("*.safetensors"))
        tensors = {}
        for f in files:
            for name, info in read_header(f).items():
                if name in tensors:
                    raise DraftlabError(f"{f}: tensor '{name}' also appears in {tensors[name].file}")
                tensors[name] = info
    pickles = sorted(p for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES and p.is_file())
    return CheckpointInfo(source, folder, config, tensors, files, pickles, snapshot_commit(folder / "config.json"))


def _read_sharded(folder: Path, index: Path) -> tuple[dict[str, TensorInfo], list[Path]]:
    """Read every shard named by a ``*.safetensors.index.json`` and check the map against the shards."""
    doc = load_json_config(index)
    weight_map = doc.get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise DraftlabError(f"{index}: key 'weight_map' must map tensor names to shard file names")
    tensors: dict[str, TensorInfo] = {}
    for name in sorted(set(weight_map.values())):
        parts = Path(name).parts
        if not name or Path(name).is_absolute() or ".." in parts or len(parts) != 1 or "\\" in name:
            raise DraftlabError(f"{index}: key 'weight_map': shard {name!r} is not a file name inside {folder} "
                                "(expected a plain name such as model-00001-of-00002.safetensors)")
    files = [folder / name for name in sorted(set(weight_map.values()))]
    for f in files:
        if not os.path.lexists(f):
            raise DraftlabError(f"{index}: shard '{f.name}' listed in 'weight_map' is missing from {folder}")
        for name, info in read_header(f).items():
            if name in tensors:
                raise DraftlabError(f"{f}: tensor '{name}' also appears in {tensors[name].file}")
            tensors[name] = info
    for name, shard in weight_map.items():
        if name not in tensors or Path(tensors[name].file).name != shard:
            raise DraftlabError(f"{index}: 'weight_map' places tensor '{name}' in '{shard}', which does not hold it")
    return tensors, files


def _read_hub(hub: HubSource, cache_dir: str | os.PathLike | None) -> CheckpointInfo:
    """Config from the Hub (or cache); tensors from cached shards when present, else header-only metadata."""
    from huggingface_hub import hf_hub_download  # deferred: huggingface_hub (~100 ms)

    offline = is_offline()
    cfg_path = Path(
        hub_call(
            hub,
            "config.json",
            lambda: hf_hub_download(
                hub.repo_id, "config.json", revision=hub.revision, cache_dir=cache_dir, local_files_only=offline
            ),
        )
    )
    config = load_json_config(cfg_path)
    commit = snapshot_commit(cfg_path)
    snapshot = cfg_path.parent
    local = any(snapshot.glob("*.safetensors")) or any(snapshot.glob("*" + INDEX_SUFFIX))
    if local or any(p.suffix in PICKLE_SUFFIXES for p in snapshot.iterdir()):
        info = _read_folder(snapshot, str(hub), config=config)
        info.commit = commit
        return info
    if offline:
        raise DraftlabError(
            f"{hub}: the cached snapshot {commit or snapshot} has no safetensors weights and HF_HUB_OFFLINE is set; "
            "run `draftlab acquire` online first"
        )
    return _read_hub_metadata(hub, config, commit)


def _read_hub_metadata(hub: HubSource, config: dict, commit: str | None) -> CheckpointInfo:
    from huggingface_hub import HfApi  # deferred: huggingface_hub (~100 ms)
    from huggingface_hub.errors import NotASafetensorsRepoError, SafetensorsParsingError  # deferred: huggingface_hub (~100 ms)

    api = HfApi()
    revision = commit or hub.revision
    try:
        meta = hub_call(hub, "safetensors headers", lambda: api.get_safetensors_metadata(hub.repo_id, revision=revision))
    except NotASafetensorsRepoError:
        names = hub_call(hub, "file list", lambda: api.list_repo_files(hub.repo_id, revision=revision))
        pickles = [Path(n) for n in sorted(names) if Path(n).suffix in PICKLE_SUFFIXES]
        return CheckpointInfo(str(hub), None, config, {}, [], pickles, commit)
    except SafetensorsParsingError as exc:
        raise DraftlabError(f"{hub}: invalid safetensors header on the Hub ({exc})") from None
    tensors: dict[str, TensorInfo] = {}
    for filename, fmeta in sorted(meta.files_metadata.items()):
        raw = {
            name: {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": list(t.data_offsets)}
            for name, t in fmeta.tensors.items()
        }
        parsed, _ = parse_header(raw, file=filename, data_size=None)
        tensors.update(parsed)
    return CheckpointInfo(str(hub), None, config, tensors, [Path(f) for f in sorted(meta.files_metadata)], [], commit)


def checkpoint_format(config: dict | None, tensors: dict[str, Any]) -> str:
    """``"eagle3"`` for an EAGLE-3 drafter (decided by tensors; by the config only when there are none)."""
    if tensors:
        is_eagle3 = "fc.weight" in tensors and any(n.startswith("midlayer.") for n in tensors)
        return "eagle3" if is_eagle3 else "other"
    archs = (config or {}).get("architectures") or []
    return "eagle3" if any("Eagle3" in str(a) for a in archs) else "other"


def tensor_sha256(t: TensorInfo) -> str:
    """sha256 of one tensor's raw bytes, read from its safetensors file by the header's offsets."""
    h = hashlib.sha256()
    with open(t.file, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        fh.seek(8 + n + t.offsets[0])
        left = t.nbytes
        while left > 0:
            chunk = fh.read(min(left, 8 << 20))
            if not chunk:
                raise DraftlabError(f"{t.file}: file ends before tensor data ends (truncated?)")
            h.update(chunk)
            left -= len(chunk)
    return h.hexdigest()


def load_tensors(info: CheckpointInfo, names: Iterable[str]) -> dict[str, "torch.Tensor"]:
    """Read the data of the named tensors (and only those) through safetensors' ``safe_open``."""
    names = list(names)
    missing = [n for n in names if n not in info.tensors]
    if missing:
        raise DraftlabError(f"{info.source}: no tensor named {', '.join(repr(n) for n in missing)}")
    if info.root is None:
        raise DraftlabError(
            f"{info.source}: tensor data is not on local disk (only headers were read); run `draftlab acquire` first"
        )
    by_file: dict[str, list[str]] = {}
    for n in names:
        by_file.setdefault(info.tensors[n].file, []).append(n)
    out: dict[str, torch.Tensor] = {}
    for file, group in by_file.items():
        try:
            with safe_open(file, framework="pt") as fh:
                for n in group:
                    out[n] = fh.get_tensor(n)
        except (OSError, RuntimeError, ValueError) as exc:
            raise DraftlabError(f"{file}: could not read tensor data ({exc})") from None
    return out
