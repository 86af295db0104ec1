"""The capture stage of the one-host SpecForge path: the target's features, once, on disk, for every arm.

Why: a user with one GPU host (Kimi-K2.5 filling all eight GPUs) cannot run SpecForge's disaggregated online
mode, which needs a second host for the capture server and a Mooncake master. SpecForge 0.2.0's own one-host
path (its DeepSeek-V3 671B recipe) captures the target's features first, under ``torchrun`` with
``--tp-size``, through a local SGLang target (``scripts/prepare_hidden_states.py`` in SpecForge's
repository, not in its wheel), then trains ``local_colocated`` from disk on the same GPUs. The features
depend on the target and the data, not on the drafter, so one capture feeds every arm.

What the script does, read at SpecForge's v0.2.0 release (``version.txt`` 0.2.0, commit a6b6b023):

- the aux layers come from ``--draft-model-config`` (``eagle_config.eagle_aux_hidden_state_layer_ids``, else
  the target's ``[1, N/2-1, N-4]``; ``algorithms/model_providers.py::resolve_eagle_capture_layers``) and go
  to SGLang's ``set_eagle3_layers_to_capture`` unchanged; it has no aux-ids flag. So draftlab writes the
  drafter's config with the ids that SGLang's rule for this target maps onto the layers the drafter is served
  with (:func:`capture_ids`), and hands that file over.
- one file per sample, ``OUT/rows_<g>-<g+2000>/data_<i>.ckpt`` (``torch.save`` of ``input_ids``,
  ``loss_mask``, ``hidden_state``, ``aux_hidden_state``), plus ``OUT/vocab_mapping/vocab_mapping.pt``.
- a rerun skips every sample whose file exists (``HiddenStatesGenerator._check_existing_files_batch``), so
  it continues. Two traps draftlab closes: a kill during ``torch.save`` leaves a torn file that the rerun
  would skip and the trainer would fail on (:func:`torn_files` moves them aside first), and the script
  caches the processed data by the *path* of ``--data-path`` (``cache_params_string``; datasets'
  ``from_generator`` cache too), so the data is handed over under a path named by its digest
  (:func:`conversations_path`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any, Iterator

from draftlab.errors import DraftlabError
from draftlab.formats import aux_layers
from draftlab.formats import eagle3_format as fmt
from draftlab.formats.target_config import load_json_config, text_config
from draftlab.fsutil import read_json, write_json, write_text
from draftlab.training.specforge.config import SPECFORGE_VERSION
from draftlab.training.specforge.feature_checks import (check_features, check_identity_file, check_record, describe,
                                                        refuse_escaping, target_weights_sha256)

SPECFORGE_RELEASE = SPECFORGE_VERSION  # the release whose script, flags and feature format draftlab speaks
SCRIPT = "scripts/prepare_hidden_states.py"
FEATURE_SUFFIXES = (".ckpt", ".ckpt.gz")  # what SpecForge's offline reader lists (offline_reader.py)
SPECFORGE_MAPPING = "vocab_mapping/vocab_mapping.pt"  # under --output-path (_generate_shared_vocab_mapping)
IDENTITY_FILE = "identity.json"  # beside the features folder: what it holds and how far the capture got
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
ID_BYTES = 16  # input_ids and loss_mask, int64 each, per token
# Identity keys: a change of these makes the features another target's (refused, never trained on) ...
FOREIGN_KEYS = ("target_config_sha256", "target_weights_sha256", "aux_layer_ids", "engine")
# ... and of these the same target's features of other data (moved aside, kept; the capture starts fresh).
STALE_KEYS = ("data_sha256", "max_length", "chat_template")


@dataclasses.dataclass(frozen=True)
class CapturePlan:
    """One capture, as the rule runs it (paths as the job sees them)."""

    engine: str  # "specforge" (prepare_hidden_states.py) or "draftlab" (dump-hidden-states)
    target: str  # the target model folder
    drafter: str  # the patched drafter folder (its config gives the aux layers)
    tokens: str  # draftlab's tokens.jsonl of the data (the disk estimate; the draftlab engine's input)
    data: str  # the fine-tune conversations (the specforge engine's input)
    state: str  # capture-state/: features/, identity, the handed-over config and data, SpecForge's cache
    chat_template: str = "llama3"
    max_length: int = 2048
    checkout: str | None = None
    budget_bytes: int | None = None  # the features' disk budget: caps the samples (specforge engine)

    @property
    def features(self) -> Path:
        return Path(self.state) / "features"


# --- what the capture needs to know ------------------------------------------------------------------


def checkout_info(checkout: str | None, where: str = "train.specforge.checkout") -> dict[str, Any]:
    """The SpecForge checkout: its script must exist and its ``version.txt`` say 0.2.0; the commit is read
    when it is a git checkout. Checked before any GPU work (Snakefile ``onstart``, and the capture job)."""
    if not checkout:
        raise DraftlabError(f"{where}: not set (a checkout of SpecForge's repository at its v{SPECFORGE_RELEASE} "
                            f"release; its {SCRIPT} is not in the wheel)")
    root = Path(checkout)
    script = root / SCRIPT
    if not script.is_file():
        raise DraftlabError(f"{where}: {script} not found (expected a checkout of SpecForge's repository at its "
                            f"v{SPECFORGE_RELEASE} release: git clone https://github.com/sgl-project/SpecForge)")
    version = root / "version.txt"
    release = version.read_text(encoding="utf-8").strip() if version.is_file() else None
    if release != SPECFORGE_RELEASE:
        raise DraftlabError(f"{where}: {version} says {release!r}, draftlab speaks SpecForge {SPECFORGE_RELEASE} "
                            f"(its {SCRIPT} flags and feature format)")
    return {"path": str(root), "script": str(script), "release": release, "commit": _git_commit(root)}


def _git_commit(root: Path) -> str | None:
    if not (root / ".git").exists():
        return None
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=30, check=False)
    except OSError:
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def capture_ids(drafter_cfg: dict[str, Any], target_cfg: dict[str, Any]) -> tuple[list[int], list[int]]:
    """``(config ids, output layers)``: the ids SpecForge's script hands SGLang unchanged, which SGLang's rule
    for this target maps onto the output layers the drafter is served with."""
    outputs = aux_layers.fed_output_ids(fmt.aux_layer_ids(drafter_cfg), target_cfg,
                                        fmt.num_aux_hidden_states(drafter_cfg))
    return aux_layers.config_ids_for(outputs, target_cfg), list(outputs)


def bytes_per_token(target_cfg: dict[str, Any], n_aux: int = 3, dtype: str | None = None) -> dict[str, Any]:
    """Feature bytes a token costs: (aux layers + 1) x hidden x dtype bytes (the aux states and the final
    hidden state), plus the int64 ``input_ids`` and ``loss_mask``. The dtype is the target's (SpecForge's script
    captures in the config's dtype) unless given (draftlab's dump stores bf16)."""
    text = text_config(target_cfg)
    hidden = int(text["hidden_size"])
    dtype = dtype or str(text.get("torch_dtype") or text.get("dtype") or target_cfg.get("torch_dtype") or "bfloat16")
    width = DTYPE_BYTES.get(dtype.removeprefix("torch."), 2)
    return {"hidden_size": hidden, "aux_layers": n_aux, "dtype": dtype, "dtype_bytes": width,
            "bytes_per_token": (n_aux + 1) * hidden * width + ID_BYTES}


def count_tokens(tokens: str | os.PathLike, max_length: int, limit: int | None = None) -> tuple[int, int]:
    """``(samples, tokens)`` of draftlab's tokens.jsonl: rows with a loss token, each cut at ``max_length``;
    ``limit``: only the first rows (the samples a disk budget keeps)."""
    samples = total = rows = 0
    path = Path(tokens)
    if not path.is_file():
        raise DraftlabError(f"{path}: not found (the tokenized fine-tune data, rule tokenize)")
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            rows += 1
            if limit is not None and rows > limit:
                break
            try:
                row = json.loads(line)
                ids, mask = row["input_ids"], row["loss_mask"]
            except (ValueError, KeyError, TypeError):
                raise DraftlabError(f"{path}: line {n}: expected {{\"input_ids\", \"loss_mask\"}} (draftlab tokenize)") from None
            if any(mask):
                samples += 1
                total += min(len(ids), max_length)
    return samples, total


def budget_samples(budget_bytes: int | None, max_length: int, per_token: int) -> int | None:
    """Samples a disk budget keeps: budget / (max_length x bytes a token), so samples of the longest length fit
    too; None without a budget."""
    return None if budget_bytes is None else int(budget_bytes // (max_length * per_token))


def estimate(plan: CapturePlan, target_cfg: dict[str, Any], n_aux: int = 3) -> dict[str, Any]:
    """The capture's size before it starts: tokens of the data (the first ``budget_samples`` rows under a
    budget) x feature bytes a token."""
    per = bytes_per_token(target_cfg, n_aux, None if plan.engine == "specforge" else "bfloat16")
    cap = budget_samples(plan.budget_bytes, plan.max_length, per["bytes_per_token"]) if plan.engine == "specforge" else None
    samples, tokens = count_tokens(plan.tokens, plan.max_length, cap)
    return {**per, "samples": samples, "tokens": tokens, "bytes": tokens * per["bytes_per_token"],
            "budget_bytes": plan.budget_bytes if cap is not None else None, "budget_samples": cap}


def free_bytes(path: str | os.PathLike) -> int:
    """Free space of the filesystem ``path`` will be on (its nearest existing folder)."""
    p = Path(path).absolute()
    while not p.exists():
        p = p.parent
    return shutil.disk_usage(p).free


def human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def check_disk(features: Path, need: int, have: int | None = None) -> int:
    """Refuse, in one line with both numbers and the path, a capture the filesystem cannot hold."""
    have = free_bytes(features) if have is None else have
    if need > have:
        raise DraftlabError(f"{features}: the capture needs about {human(need)} ({need} bytes) more, the filesystem "
                            f"has {human(have)} ({have} bytes) free; free space or move results/ (nothing was written)")
    return have


# --- the features folder -------------------------------------------------------------------------------


def feature_files(folder: str | os.PathLike) -> list[Path]:
    """Every feature file under ``folder``, sorted, as SpecForge's offline reader lists them."""
    root = Path(folder)
    if not root.is_dir():
        return []
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name.endswith(FEATURE_SUFFIXES))


def is_torn(path: Path) -> bool:
    """A ``.ckpt`` cut short by a kill: ``torch.save`` writes a zip whose end-of-central-directory record
    (``PK\\x05\\x06``, 22 bytes, no comment) comes last, so a file without it was never finished. ``.ckpt.gz``
    (``--compress``, which draftlab never passes) is not checked."""
    if path.name.endswith(".gz"):
        return False
    size = path.stat().st_size
    if size < 22:
        return True
    with open(path, "rb") as fh:
        fh.seek(size - 22)
        return fh.read(4) != b"PK\x05\x06"


def torn_files(folder: Path) -> list[Path]:
    return [p for p in feature_files(folder) if is_torn(p)]


def move_torn(plan: CapturePlan, torn: list[Path] | None = None, kind: str = "torn") -> tuple[list[str], str | None]:
    """Move torn feature files (a kill during ``torch.save``), or ``torn`` (files of ``kind``), out of the
    features folder, kept, so the rerun captures those samples again instead of skipping them; returns the
    files and where they went."""
    torn = torn_files(plan.features) if torn is None else torn
    if not torn:
        return [], None
    dest = Path(plan.state) / f"{kind}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}"
    for p in torn:
        rel = p.relative_to(plan.features)
        (dest / rel.parent).mkdir(parents=True, exist_ok=True)
        os.replace(p, dest / rel)
    return [str(p.relative_to(plan.features)) for p in torn], str(dest)


def live_writers(features: Path) -> list[int]:
    """Processes still running SpecForge's script into ``features``. torchrun starts its workers in sessions of
    their own (``subprocess_handler``: ``start_new_session``), so a job killed hard (SIGKILL, not Snakemake's
    SIGTERM, which torchrun passes on) leaves them writing; a second capture beside them would write the same
    files and find the GPUs full. Read from ``/proc`` (Linux); elsewhere nothing is found."""
    want, found = features.resolve(), []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            args = (proc / "cmdline").read_bytes().split(b"\0")
            if not any(a.endswith(SCRIPT.split("/")[-1].encode()) for a in args) or b"--output-path" not in args:
                continue
            out = Path(args[args.index(b"--output-path") + 1].decode())
            if (Path(os.readlink(proc / "cwd")) / out).resolve() == want:
                found.append(int(proc.name))
        except (OSError, IndexError, ValueError):
            continue
    return sorted(found)


def listing(folder: Path) -> dict[str, Any]:
    """Samples, bytes and a digest of the file listing (relative path and size of every feature file)."""
    h = hashlib.sha256()
    files = feature_files(folder)
    total = 0
    for p in files:
        size = p.stat().st_size
        total += size
        h.update(f"{p.relative_to(folder).as_posix()}\t{size}\n".encode())
    return {"samples": len(files), "bytes": total, "listing_sha256": h.hexdigest()}


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def identity(plan: CapturePlan, target_cfg_path: Path, aux_ids: list[int], outputs: list[int],
             data_sha: str) -> dict[str, Any]:
    """What the features are of: the target (its config and its weights), the aux layers, the data and how it
    was cut."""
    return {"engine": plan.engine, "target": plan.target, "target_config_sha256": sha256_file(target_cfg_path),
            "target_weights_sha256": target_weights_sha256(plan.target),
            "aux_layer_ids": aux_ids, "aux_output_layers": outputs, "data_sha256": data_sha,
            "max_length": plan.max_length, "chat_template": plan.chat_template if plan.engine == "specforge" else None}


def check_identity(features: Path, saved: dict[str, Any] | None, now: dict[str, Any]) -> list[str]:
    """Refuse features of another target or other aux ids; return the keys of other data (to move aside)."""
    if saved is None:
        if feature_files(features):
            raise DraftlabError(f"{features}: feature files without draftlab's {IDENTITY_FILE} beside them: of an "
                                "unknown target and aux layers, refused; move the folder away to capture here")
        return []
    foreign = [k for k in FOREIGN_KEYS if saved.get(k) != now.get(k)]
    if foreign and feature_files(features):
        shown = ", ".join(f"{k} {saved.get(k)!r} there, {now.get(k)!r} here" for k in foreign)
        raise DraftlabError(f"{features}: features of another target or other aux layers ({shown}); refused, not "
                            "trained on; move the folder away to capture this target")
    return [k for k in STALE_KEYS if saved.get(k) != now.get(k)] if feature_files(features) else []


def conversations(data: str, limit: int | None = None) -> tuple[str, str]:
    """The data as SpecForge's ``{"conversations": [...]}`` rows (``safe_conversations_generator``), and their digest;
    ``limit``: only the first rows (the samples a disk budget keeps)."""
    rows, h = [], hashlib.sha256()
    path = Path(data)
    if not path.is_file():
        raise DraftlabError(f"{path}: not found (the fine-tune conversations the capture runs the target on)")
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            if limit is not None and len(rows) >= limit:
                break
            try:
                rec = json.loads(line)
            except ValueError:
                raise DraftlabError(f"{path}: line {n}: not JSON") from None
            if not isinstance(rec, dict) or not isinstance(rec.get("messages"), list):
                raise DraftlabError(f"{path}: line {n}: expected {{\"messages\": [...]}} (SpecForge captures "
                                    "conversations, rendered by its chat template)")
            turns = [{k: v for k, v in m.items() if k != "token_ids"} if isinstance(m, dict) else m
                     for m in rec["messages"]]  # the emitted ids stay draftlab's (the token check's)
            out = json.dumps({"conversations": turns}, ensure_ascii=False) + "\n"
            rows.append(out)
            h.update(out.encode())
    return "".join(rows), h.hexdigest()


def conversations_path(state: Path, digest: str) -> Path:
    """Where the data is handed over: a path named by its digest, because the script caches the processed data
    by the path it is given (``cache_params_string``; datasets' ``from_generator``), so new data needs a new path."""
    return state / f"conversations-{digest[:16]}.jsonl"


def load_target_config(target: str) -> tuple[Path, dict[str, Any]]:
    path = Path(target) / "config.json"
    if not path.is_file():
        raise DraftlabError(f"{path}: not found (expected the target model folder)")
    return path, load_json_config(path)


def load_drafter_config(drafter: str) -> tuple[Path, dict[str, Any]]:
    path = Path(drafter) / "config.json" if Path(drafter).is_dir() else Path(drafter)
    if not path.is_file():
        raise DraftlabError(f"{path}: not found (expected the patched drafter's config.json)")
    return path, read_json(path)


# --- the stage: before the capture, after it, and what a train job checks -------------------------------


def _hidden(target_cfg: dict[str, Any]) -> int:
    return int(text_config(target_cfg)["hidden_size"])


def _saved_identity(path: Path, features: Path) -> dict[str, Any] | None:
    """The identity an earlier capture wrote, read with care: a damaged one is refused while feature files
    depend on it (their origin is unknown then), and replaced when the folder holds none."""
    if not path.is_file():
        return None
    try:
        return check_identity_file(path, read_json(path, "capture identity"))
    except DraftlabError:
        if feature_files(features):
            raise
        return None


def _identity_now(plan: CapturePlan) -> tuple[dict[str, Any], dict[str, Any], str | None]:
    target_path, target_cfg = load_target_config(plan.target)
    _, drafter_cfg = load_drafter_config(plan.drafter)
    ids, outputs = capture_ids(drafter_cfg, target_cfg)
    rows = None
    if plan.engine == "specforge":
        per = bytes_per_token(target_cfg, len(ids))["bytes_per_token"]
        rows, data_sha = conversations(plan.data, budget_samples(plan.budget_bytes, plan.max_length, per))
    else:
        data_sha = sha256_file(plan.tokens)
    return identity(plan, target_path, ids, outputs, data_sha), {"target": target_cfg, "drafter": drafter_cfg}, rows


def capture_preflight(plan: CapturePlan, *, free: int | None = None) -> dict[str, Any]:
    """Everything checked before the GPU is touched, and only then written: the checkout, the features folder's
    identity (another target's or other aux layers' refused; other data's moved aside, kept), the disk estimate
    against the free space, torn files moved aside, the drafter config with the capture's aux ids, the data."""
    checkout = checkout_info(plan.checkout) if plan.engine == "specforge" else None
    writers = live_writers(plan.features)
    if writers:
        raise DraftlabError(f"{plan.features}: a capture is still writing here (pids {writers}: the workers of a "
                            "killed run; torchrun starts them in sessions of their own); stop them, then rerun")
    refuse_escaping(plan.features, "nothing captured")
    state = Path(plan.state)
    saved = _saved_identity(state / IDENTITY_FILE, plan.features)
    ident_file = state / IDENTITY_FILE
    now, cfgs, rows = _identity_now(plan)
    stale = check_identity(plan.features, saved, now)
    est = estimate(plan, cfgs["target"], len(now["aux_layer_ids"]))
    have = listing(plan.features) if not stale else {"samples": 0, "bytes": 0}
    need = max(0, est["bytes"] - have["bytes"])
    free_now = check_disk(plan.features, need, free)
    notes = []
    if stale:
        moved = plan.features.with_name(f"features.stale-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}")
        os.replace(plan.features, moved)
        notes.append(f"{plan.features}: features of other data ({', '.join(stale)} changed) moved to {moved}, kept")
        saved = None
    torn, torn_to = move_torn(plan)
    if torn:
        notes.append(f"{len(torn)} torn feature file(s) of a killed capture moved to {torn_to}; captured again")
    _, bad = check_features(feature_files(plan.features), _hidden(cfgs["target"]), len(now["aux_layer_ids"]))
    if bad:
        _, bad_to = move_torn(plan, [p for p, _ in bad], "rejected")
        notes.append(f"{describe(bad)} moved to {bad_to}, kept; captured again")
    state.mkdir(parents=True, exist_ok=True)
    data_path = None
    if plan.engine == "specforge":
        data_path = conversations_path(state, now["data_sha256"])
        if not data_path.is_file():
            write_text(data_path, rows)
        drafter_cfg = dict(cfgs["drafter"])
        drafter_cfg["eagle_config"] = {**(drafter_cfg.get("eagle_config") or {}),
                                       "eagle_aux_hidden_state_layer_ids": now["aux_layer_ids"]}
        write_json(state / "draft_config.json", drafter_cfg)
    attempts = list((saved or {}).get("attempts", []))
    attempts.append({"started": time.time(), "samples_before": have["samples"], "bytes_before": have["bytes"]})
    write_json(ident_file, {**now, "status": "capturing", "specforge": checkout, "estimate": est,
                            "attempts": attempts})
    return {"data_path": str(data_path) if data_path else None, "features": str(plan.features), "estimate": est,
            "free_bytes": free_now, "need_bytes": need, "have": have, "torn": torn, "notes": notes,
            "aux_layer_ids": now["aux_layer_ids"], "aux_output_layers": now["aux_output_layers"],
            "specforge": checkout}


def _mapping_of_capture(plan: CapturePlan, draftlab_mapping: str | None, out: Path) -> dict[str, Any]:
    """The corpus-derived mapping the regenerate and scratch arms pin: SpecForge's own
    (``OUT/vocab_mapping/vocab_mapping.pt``) after its capture, draftlab's (same rule) after a dump."""
    from draftlab.static.d2t import VocabMapping, load_mapping, save_mapping  # deferred: loads torch

    if plan.engine == "specforge":
        import torch  # deferred: loads torch

        src = plan.features / SPECFORGE_MAPPING
        if not src.is_file():
            raise DraftlabError(f"{src}: not found (SpecForge's prepare_hidden_states.py writes it before capturing)")
        try:
            raw = torch.load(src, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - any content: the reader's failure is the finding
            raise DraftlabError(f"{src}: unreadable ({type(exc).__name__}: {' '.join(str(exc).split())[:120]}); "
                                "expected SpecForge's vocab mapping: rerun the capture rule") from None
        if not isinstance(raw, dict) or not all(isinstance(raw.get(k), torch.Tensor) for k in ("d2t", "t2d")):
            raise DraftlabError(f"{src}: expected {{'d2t', 't2d'}} (SpecForge's vocab mapping)")
        mapping = VocabMapping(d2t=raw["d2t"].to(torch.int64), t2d=raw["t2d"].to(torch.bool))
        source = str(src)
    else:
        if not draftlab_mapping:
            raise DraftlabError("capture-record: --mapping (draftlab's vocab mapping of the same data) is needed "
                                "after a draftlab capture")
        mapping, source = load_mapping(draftlab_mapping), draftlab_mapping
    save_mapping(out, mapping)
    return {"path": str(out), "source": source, "sha256": sha256_file(out)}


def capture_record(plan: CapturePlan, out: str | os.PathLike, mapping_out: str | os.PathLike,
           draftlab_mapping: str | None = None) -> dict[str, Any]:
    """What was captured, after the capture: samples, tokens, bytes, the listing's digest, the mapping, the
    SpecForge release and commit, and the time it took; written to ``out`` (the rule's output)."""
    ident_file = Path(plan.state) / IDENTITY_FILE
    if not ident_file.is_file():
        raise DraftlabError(f"{ident_file}: not found (capture-preflight writes it before the capture)")
    ident = check_identity_file(ident_file, read_json(ident_file, "capture identity"))
    if not isinstance(ident.get("estimate"), dict) or not isinstance(ident.get("aux_layer_ids"), list):
        raise DraftlabError(f"{ident_file}: keys 'estimate', 'aux_layer_ids' missing (capture-preflight writes them "
                            "before the capture); rerun the capture rule")
    refuse_escaping(plan.features, "not recorded")
    torn = torn_files(plan.features)
    if torn:
        raise DraftlabError(f"{plan.features}: {len(torn)} torn feature file(s) (first {torn[0].name}): the capture "
                            "did not finish; rerun the rule (capture-preflight moves them aside)")
    files = feature_files(plan.features)
    if not files:
        raise DraftlabError(f"{plan.features}: no feature files after the capture (see the capture log)")
    tokens, bad = check_features(files, _hidden(load_target_config(plan.target)[1]), len(ident["aux_layer_ids"]))
    if bad:
        raise DraftlabError(f"{plan.features}: {describe(bad)}; not recorded, never trained on: rerun the rule "
                            "(capture-preflight moves them aside, kept)")
    have = listing(plan.features)
    mapping = _mapping_of_capture(plan, draftlab_mapping, Path(mapping_out))
    last = (ident.get("attempts") or [{}])[-1]
    seconds = round(time.time() - float(last.get("started", time.time())), 1)
    new_tokens = (have["bytes"] - int(last.get("bytes_before", 0))) / ident["estimate"]["bytes_per_token"]
    result = {
        "features": str(plan.features), **have, "tokens": tokens, "engine": plan.engine,
        "identity": {k: ident.get(k) for k in ("target", "target_config_sha256", "target_weights_sha256", "aux_layer_ids",
                                               "aux_output_layers", "data_sha256", "max_length", "chat_template")},
        "specforge": ident.get("specforge"), "estimate": ident.get("estimate"), "mapping": mapping,
        "tokens_in_data": ident["estimate"]["tokens"], "samples_in_data": ident["estimate"]["samples"],
        "seconds_last_attempt": seconds, "attempts": len(ident.get("attempts") or []),
        "seconds_per_million_tokens": round(seconds / new_tokens * 1e6, 1) if new_tokens > 0 else None,
    }
    write_json(ident_file, {**ident, "status": "complete", "finished": time.time(), "listing_sha256":
                            have["listing_sha256"]})
    write_json(out, result)
    return result


def check_capture_for(record_file: str | os.PathLike, target: str, drafter_config: str) -> dict[str, Any]:
    """A train job's check of the features it is handed: the capture's record says the same target config and
    the aux ids this drafter is served with, and the folder still holds what was recorded. Anything else is
    refused in one line, never trained on."""
    rec_path = Path(record_file)
    if not rec_path.is_file():
        raise DraftlabError(f"{rec_path}: not found (the capture's record, rule capture)")
    rec = check_record(rec_path, read_json(rec_path, "capture record"))
    ident = rec["identity"]
    target_path, target_cfg = load_target_config(target)
    _, drafter_cfg = load_drafter_config(drafter_config)
    ids, _ = capture_ids(drafter_cfg, target_cfg)
    if ident.get("target_config_sha256") != sha256_file(target_path):
        raise DraftlabError(f"{rec['features']}: features of another target (recorded {ident.get('target')!r}, its "
                            f"config differs from {target_path}); refused, not trained on")
    if ident.get("target_weights_sha256") != target_weights_sha256(target):
        raise DraftlabError(f"{rec['features']}: features of another target's weights (recorded "
                            f"{ident.get('target')!r} with weights sha256 {str(ident.get('target_weights_sha256'))[:16]}, "
                            f"{target} holds other weights under the same config); refused, not trained on")
    if list(ident.get("aux_layer_ids") or []) != ids:
        raise DraftlabError(f"{rec['features']}: features of aux layer ids {ident.get('aux_layer_ids')}, this "
                            f"drafter is served with {ids}; refused, not trained on")
    refuse_escaping(rec["features"], "not trained on")
    now = listing(Path(rec["features"]))
    if now["listing_sha256"] != rec.get("listing_sha256"):
        raise DraftlabError(f"{rec['features']}: {now['samples']} files now, {rec.get('samples')} when captured (the "
                            f"listing's digest differs from {rec_path}); rerun the capture rule")
    return rec
