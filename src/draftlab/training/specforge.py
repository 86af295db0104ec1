"""``train.backend: specforge``: the SpecForge 0.2.0 run of a draftlab arm, as SpecForge's own typed config.

Why: a target too large for transformers (the K2.5 case) is trained with SpecForge, which captures
the target's features through SGLang. The ``specforge`` wheel pins torch, transformers and sglang
exactly, so draftlab never imports it: it *writes* the run and *reads* the result
(:mod:`draftlab.training.specforge_import`).

SpecForge 0.2.0 has one entry point, ``specforge train --config run.yaml``, over the strict config
``specforge.config.schema.Config`` (sections ``model``, ``data``, ``training``, ``deployment``).
The CLI self-launches ``deployment.trainer.nproc_per_node`` workers (no torchrun around it). Online
training (raw conversations in ``data.train_data_path``) is disaggregated only: an SGLang capture
server produces the features, a Mooncake store carries them, the trainer consumes them
(``deployment.mode: disaggregated``, ``deployment.disaggregated.backend: mooncake``), and such a run
must pin ``model.vocab_mapping_path`` (``application/planning.py::_validate_vocab_mapping``).

:func:`prepare` writes, under the run's ``output_dir``: the mapping as SpecForge loads it
(``torch.load`` of ``{"d2t": int64 [M], "t2d": bool [V]}``, ``DraftModel.load_vocab_mapping``), the
run config YAML, the run identity (settings + input fingerprints: a killed run resumes through
``training.resume_from`` only when both are unchanged) and the job file with the exact argv and
config. Checkpoints land in ``<output_dir>/draftlab-step<N>/training_state.pt``
(``training/checkpoint.py::CheckpointManager``); the final one is always written (``Trainer.fit``).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from pathlib import Path
from typing import Any, Mapping

from draftlab.formats import eagle3_format as fmt
from draftlab.errors import DraftlabError
from draftlab.settings.model import schema_default
from draftlab.fsutil import atomic_path, read_json, to_json, write_json
from draftlab.settings.config import load_yaml_text
from draftlab.settings.model import Settings
from draftlab.formats import aux_layers
from draftlab.formats.checkpoint import INDEX_SUFFIX, read_checkpoint
from draftlab.formats.data import read_records
from draftlab.formats.target_config import load_json_config
from draftlab.fsutil import read_text_file
from draftlab.training.specforge_capture import capture_host_setup
from draftlab.training.specforge_offline import TARGET_VIEW, write_target_view

SPECFORGE_VERSION = "0.2.0"  # keep in step with envs/specforge.yaml
RUN_ID = "draftlab"  # SpecForge's run_id: checkpoints are <output_dir>/draftlab-step<N>/
STATE_FILE = "training_state.pt"
RUN_CONFIG = "draftlab_run.yaml"
MAPPING_FILE = "draftlab_vocab_mapping.pt"
IDENTITY_FILE = "draftlab_run_identity.json"
JOB_FILE = "draftlab_specforge_job.json"
CONVERSATIONS_FILE = "draftlab_conversations.jsonl"  # without prompts_path: the data as SpecForge's rows
STEP_RE = re.compile(rf"^{RUN_ID}-step(\d+)$")
# Keys of the run config that name an attempt, not the run: left out of the run identity.
VOLATILE = (("deployment", "disaggregated", "control_dir"), ("training", "resume_from"))


@dataclasses.dataclass
class SpecForgeJob:
    """One SpecForge arm in draftlab's terms (paths as SpecForge will see them)."""

    target_model_path: str
    draft_model_config: str  # the drafter's config.json (a folder holding one is accepted)
    train_data_path: str  # JSONL conversations (draftlab's {"messages": [...]} rows)
    output_dir: str
    # The same data tokenized by `draftlab tokenize` ({"input_ids", "loss_mask"} rows): handed to SpecForge
    # as data.prompts_path, so it trains on exactly the builtin trainer's tokens. None: the conversations
    # are rewritten as SpecForge's {"conversations": [...]} rows and rendered by its chat_template.
    prompts_path: str | None = None
    # SpecForge's offline mode instead (no capture server, no Mooncake): a folder of its .ckpt feature files
    # (`draftlab specforge-features`), data.hidden_states_path, deployment.mode local_colocated.
    hidden_states_path: str | None = None
    vocab_mapping: str | None = None  # draftlab mapping file or drafter folder, pinned for SpecForge
    draft_checkpoint: str | None = None  # warm start (fine-tune arms); None = scratch
    # Defaults of the settings an experiment config also has are the schema's (train.<key>), the one set.
    chat_template: str = schema_default("train.chat_template")  # a SpecForge template name (kimi-k2-instruct, qwen, ...)
    trust_remote_code: bool = False
    steps: int = 1  # optimizer steps (train.steps)
    num_samples: int | None = None  # training conversations; sets num_epochs so `steps` steps can run
    batch_size: int = schema_default("train.batch_size")  # per trainer rank
    learning_rate: float = schema_default("train.lr")
    max_length: int = schema_default("train.max_length")
    warmup_ratio: float = 0.015
    max_grad_norm: float = 0.5
    ttt_length: int = schema_default("train.ttt_length")
    seed: int = schema_default("train.seed")
    nproc: int = schema_default("train.nproc")  # trainer processes on this host (deployment.trainer.nproc_per_node)
    save_interval: int = 0  # train.checkpoint_every; 0 = only the final checkpoint
    embedding_key: str | None = None  # None: read from the target's weight index
    lm_head_key: str | None = None
    aux_layer_ids: list[int] | None = None  # None: the drafter's, converted for SpecForge's capture
    deployment: dict[str, Any] = dataclasses.field(default_factory=dict)  # over deployment.disaggregated
    overrides: dict[str, Any] = dataclasses.field(default_factory=dict)  # deep-merged over the run config

    def draft_config_file(self) -> str:
        p = Path(self.draft_model_config)
        return str(p / "config.json") if p.is_dir() else self.draft_model_config


def job_from_mapping(data: dict[str, Any], source: str = "job") -> SpecForgeJob:
    """A job from a dict (a YAML/JSON job file); unknown keys and wrong types are user errors."""
    fields = {f.name: f for f in dataclasses.fields(SpecForgeJob)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise DraftlabError(f"{source}: unknown key(s) {unknown}; expected some of {sorted(fields)}")
    missing = [n for n, f in fields.items() if f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING and n not in data]
    if missing:
        raise DraftlabError(f"{source}: missing key(s) {missing}")
    job = SpecForgeJob(**data)
    validate_job(job, source)
    return job


def job_from_experiment(cfg: dict[str, Any], *, target_model_path: str, draft_model_config: str,
                        train_data_path: str, output_dir: str, vocab_mapping: str | None,
                        ckpt_dir: str | None = None, num_samples: int | None = None,
                        prompts_path: str | None = None) -> SpecForgeJob:
    """The job for a validated experiment config (its ``train`` and ``target`` sections) and the pipeline's paths.

    ``cfg`` is what :func:`draftlab.settings.config.load_config` returns (the merged config the pipeline wrote,
    read back): the values are typed through :class:`draftlab.settings.model.Settings`, so a bad
    one was already refused naming its ``train.<key>``.
    """
    s = cfg if isinstance(cfg, Settings) else Settings.from_validated(cfg, "experiment config")
    t = s.train
    job = SpecForgeJob(
        target_model_path=target_model_path,
        draft_model_config=draft_model_config,
        train_data_path=train_data_path,
        prompts_path=prompts_path,
        output_dir=output_dir,
        vocab_mapping=vocab_mapping,
        draft_checkpoint=ckpt_dir,
        chat_template=t.chat_template,
        trust_remote_code=s.target.trust_remote_code,
        steps=t.steps,
        num_samples=num_samples,
        batch_size=t.batch_size,
        learning_rate=t.lr,
        max_length=t.max_length,
        ttt_length=t.ttt_length,
        seed=t.seed,
        nproc=t.nproc,
        save_interval=t.checkpoint_every,
        deployment=_plain(t.specforge.deployment),
        overrides=_plain(t.specforge.overrides),
    )
    validate_job(job, s.source)
    return job


def _plain(value: Any) -> Any:
    """A settings value (read-only mappings, tuples) as the plain dicts and lists a job file holds."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def validate_job(job: SpecForgeJob, source: str = "job") -> None:
    for name in ("steps", "batch_size", "max_length", "ttt_length", "nproc"):
        v = getattr(job, name)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise DraftlabError(f"{source}: key {name!r}: expected a positive integer, got {v!r}")
    for name in ("save_interval",):
        v = getattr(job, name)
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise DraftlabError(f"{source}: key {name!r}: expected an integer >= 0, got {v!r}")
    if job.num_samples is not None and (not isinstance(job.num_samples, int) or job.num_samples < 0):
        raise DraftlabError(f"{source}: key 'num_samples': expected an integer >= 0 or null, got {job.num_samples!r}")
    if not isinstance(job.learning_rate, (int, float)) or job.learning_rate <= 0:
        raise DraftlabError(f"{source}: key 'learning_rate': expected a number > 0, got {job.learning_rate!r}")
    for name in ("deployment", "overrides"):
        if not isinstance(getattr(job, name), dict):
            raise DraftlabError(f"{source}: key {name!r}: expected a mapping")


# ---------------------------------------------------------------------------------------------
# what SpecForge needs to know about the target and the drafter


def target_weight_keys(target: str) -> tuple[str, str]:
    """``(embedding_key, lm_head_key)`` as named in the target's weight index.

    Kimi-K2.5 nests its text model (``language_model.model.embed_tokens.weight``,
    ``language_model.lm_head.weight``); SpecForge's defaults (``model.embed_tokens.weight``,
    ``lm_head.weight``) would not find them. A tied head without its own tensor reads the embedding.
    """
    folder = Path(target)
    indexes = sorted(folder.glob(f"*{INDEX_SUFFIX}")) if folder.is_dir() else []
    if indexes:  # a sharded target (Kimi: 64 shards): the index names every tensor, no shard is opened
        weight_map = read_json(indexes[0]).get("weight_map")
        if not isinstance(weight_map, dict):
            raise DraftlabError(f"{indexes[0]}: key 'weight_map' missing (expected a safetensors index)")
        names = sorted(weight_map)
    else:
        names = sorted(read_checkpoint(target).tensors)
    embed = _one_key(names, "embed_tokens.weight", target)
    heads = [n for n in names if n == "lm_head.weight" or n.endswith(".lm_head.weight")]
    if not heads:
        return embed, embed
    return embed, _one_key(heads, "lm_head.weight", target)


def _one_key(names: list[str], suffix: str, target: str) -> str:
    found = [n for n in names if n == suffix or n.endswith("." + suffix)]
    text = [n for n in found if not re.search(r"(vision|mm_projector|visual|audio|mtp)", n)]
    if len(text) == 1:
        return text[0]
    if not text:
        raise DraftlabError(f"{target}: no tensor named *{suffix} in the weight index (expected the target's "
                            f"{suffix.split('.')[0]} for SpecForge's model.{'embedding' if 'embed' in suffix else 'lm_head'}_key)")
    raise DraftlabError(f"{target}: several tensors named *{suffix} in the weight index: {text}; "
                        "set embedding_key / lm_head_key in the job")


def specforge_aux_ids(drafter_cfg: dict[str, Any], target_cfg: dict[str, Any]) -> list[int]:
    """``model.aux_hidden_state_layer_ids`` for SpecForge: ids its SGLang capture server turns into the
    same layers the drafter is served with.

    SpecForge hands the ids to SGLang unchanged (``launch_plan.py``: ``--spec-capture-aux-layer-ids``,
    SGLang's ``set_eagle3_layers_to_capture``), exactly as serving hands the drafter config's ids. So
    the output ids draftlab reads for this drafter (:func:`draftlab.models.target.aux_layer_ids_for`) become
    the config ids that SGLang's rule for the target's architecture maps back onto them.
    """
    from draftlab.models.target import aux_layer_ids_for  # deferred: loads torch

    return aux_layers.config_ids_for(aux_layer_ids_for(drafter_cfg, target_cfg), target_cfg)


def num_epochs_for(job: SpecForgeJob) -> tuple[int, list[str]]:
    """Prompt epochs so that ``job.steps`` optimizer steps run; refuses data shorter than one step.

    SpecForge's online producer streams ``num_prompts * num_epochs`` prompts and the consumer stops at
    ``training.max_steps``; one optimizer step takes ``nproc * batch_size`` samples
    (``training/schedule.py::resolve_online_total_steps``).
    """
    per_step = job.nproc * job.batch_size
    if job.num_samples is None:
        return 1, ["number of training samples unknown (no --tokens): num_epochs=1, the run ends early "
                   "if the data is shorter than train.steps"]
    if job.num_samples < per_step:
        raise DraftlabError(
            f"{job.train_data_path}: {job.num_samples} training samples, one optimizer step needs "
            f"{per_step} (nproc {job.nproc} x batch_size {job.batch_size}): the data is too short for SpecForge")
    return math.ceil(job.steps * per_step / job.num_samples), []


# ---------------------------------------------------------------------------------------------
# the run config


def run_config(job: SpecForgeJob, *, control_dir: str, resume_from: str | None = None,
               target_cfg: dict[str, Any] | None = None) -> tuple[dict[str, Any], list[str]]:
    """SpecForge's ``Config`` for the job, as a plain mapping (and warnings)."""
    warnings: list[str] = []
    out = Path(job.output_dir)
    embed, head = job.embedding_key, job.lm_head_key
    if embed is None or head is None:
        try:
            found = target_weight_keys(job.target_model_path)
        except DraftlabError as exc:
            if Path(job.target_model_path).exists():
                raise
            warnings.append(f"{exc}; SpecForge's default weight keys are shown (the job reads the index)")
            found = ("model.embed_tokens.weight", "lm_head.weight")
        embed, head = embed or found[0], head or found[1]
    aux = job.aux_layer_ids
    if aux is None:
        cfg_file = Path(job.draft_config_file())
        if target_cfg is not None and cfg_file.is_file():
            aux = specforge_aux_ids(read_json(cfg_file), target_cfg)
        else:
            warnings.append("target or drafter config not readable here: aux layer ids left to SpecForge")
    epochs, more = num_epochs_for(job)
    warnings += more
    model = {
        "target_model_path": job.target_model_path,
        "draft_model_config": job.draft_config_file(),
        "vocab_mapping_path": str(out / MAPPING_FILE),
        "embedding_key": embed,
        "lm_head_key": head,
        "trust_remote_code": bool(job.trust_remote_code),
        "target_backend": "sglang",
    }
    if aux is not None:
        model["aux_hidden_state_layer_ids"] = [int(i) for i in aux]
    if job.draft_checkpoint and resume_from is None:  # a resume restores the weights itself
        model["draft_checkpoint_path"] = job.draft_checkpoint
    training = {
        "strategy": "eagle3",
        "max_steps": job.steps,
        "total_steps": job.steps,  # the optimizer and loss schedules run over exactly these steps
        "num_epochs": epochs,
        "batch_size": job.batch_size,
        "accumulation_steps": 1,
        "learning_rate": float(job.learning_rate),
        "lr_scheduler": "cosine",
        "warmup_ratio": float(job.warmup_ratio),
        "max_grad_norm": float(job.max_grad_norm),
        "ttt_length": job.ttt_length,
        "save_interval": job.save_interval,
        "seed": job.seed,
    }
    if resume_from is not None:
        training["resume_from"] = resume_from
    cfg = {
        "run_id": RUN_ID,
        "output_dir": str(out),
        "model": model,
        "data": {
            **({"hidden_states_path": job.hidden_states_path} if job.hidden_states_path
               else {"prompts_path": job.prompts_path} if job.prompts_path
               else {"train_data_path": str(out / CONVERSATIONS_FILE)}),
            "chat_template": job.chat_template,
            "max_length": job.max_length,
            "cache_dir": str(out / "cache"),
        },
        "training": training,
        "deployment": {
            "mode": "disaggregated",
            "trainer": {"nnodes": 1, "nproc_per_node": job.nproc},
            "disaggregated": {"backend": "mooncake", **job.deployment, "control_dir": control_dir},
        },
    }
    if job.hidden_states_path:  # offline: SpecForge's own colocated trainer reads the features, nothing captures

        cfg["deployment"] = {"mode": "local_colocated", "trainer": {"nnodes": 1, "nproc_per_node": job.nproc}}
        model["target_model_path"] = str(out / TARGET_VIEW)
    return _deep_merge(cfg, job.overrides), warnings


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def build_argv(job: SpecForgeJob) -> list[str]:
    """SpecForge's own launcher: it starts ``deployment.trainer.nproc_per_node`` workers itself."""
    return ["specforge", "train", "--config", str(Path(job.output_dir) / RUN_CONFIG)]


# ---------------------------------------------------------------------------------------------
# resume: same settings + same inputs -> continue from SpecForge's latest checkpoint


def latest_checkpoint(output_dir: str | os.PathLike) -> Path | None:
    """The newest complete ``draftlab-step<N>/`` (it holds ``training_state.pt``), as CheckpointManager picks."""
    found = []
    folder = Path(output_dir)
    if folder.is_dir():
        for child in folder.iterdir():
            m = STEP_RE.fullmatch(child.name)
            if m and (child / STATE_FILE).is_file():
                found.append((int(m.group(1)), child))
    return max(found)[1] if found else None


def run_identity(job: SpecForgeJob, cfg: dict[str, Any]) -> dict[str, Any]:
    """Settings (the run config without attempt-only keys) and fingerprints of every input file."""
    import hashlib

    from draftlab.training.resume import path_fingerprint  # deferred: loads numpy, torch

    settings = _drop(cfg, VOLATILE)
    settings["model"].pop("draft_checkpoint_path", None)
    inputs = {"train_data": job.train_data_path, "prompts": job.prompts_path, "draft_config": job.draft_config_file(),
              "vocab_mapping": job.vocab_mapping, "draft_checkpoint": job.draft_checkpoint,
              "target_config": str(Path(job.target_model_path) / "config.json")}
    ident = {"config": {"run_config": settings, "specforge": SPECFORGE_VERSION},
             "inputs": {k: path_fingerprint(v) for k, v in inputs.items() if v},
             "world_size": job.nproc, "code": SPECFORGE_VERSION}
    ident["run_id"] = hashlib.sha256(to_json(ident).encode()).hexdigest()
    return ident


def _drop(cfg: dict[str, Any], paths) -> dict[str, Any]:
    import copy

    out = copy.deepcopy(cfg)
    for path in paths:
        node = out
        for k in path[:-1]:
            node = node.get(k, {})
        node.pop(path[-1], None)
    return out


def _resume_decision(job: SpecForgeJob, ident: dict[str, Any], write: bool) -> tuple[str | None, list[str]]:
    from draftlab.training.resume import identity_changes, move_aside  # deferred: loads numpy, torch

    out = Path(job.output_dir)
    latest = latest_checkpoint(out)
    if latest is None:
        return None, []
    saved = None
    if (out / IDENTITY_FILE).is_file():
        saved = read_json(out / IDENTITY_FILE)
    if saved and saved.get("run_id") == ident["run_id"]:
        if "managed_local" in job.deployment:
            return None, [f"{latest}: SpecForge refuses training.resume_from with managed_local; starting fresh"]
        return str(latest), [f"resuming from {latest} (same settings and inputs)"]
    changes = identity_changes(saved, ident)
    if not write:
        return None, [f"{out}: checkpoints of another run ({', '.join(changes)}) would be moved aside"]
    moved = move_aside(out)
    return None, [f"{out}: checkpoints of another run ({', '.join(changes)}) moved to {moved}"]


# ---------------------------------------------------------------------------------------------
# putting it together


def write_mapping(job: SpecForgeJob, path: Path) -> None:
    """The pinned mapping in the format ``DraftModel.load_vocab_mapping`` reads, sizes checked."""
    import torch

    from draftlab.static.d2t import load_mapping  # deferred: loads numpy, torch

    if job.vocab_mapping is None:
        raise DraftlabError(f"{job.output_dir}: SpecForge's disaggregated run needs a pinned vocab mapping "
                            "(key 'vocab_mapping' / --mapping); none given")
    mapping = load_mapping(job.vocab_mapping)
    cfg = read_json(Path(job.draft_config_file()))
    want_m, want_v = fmt.draft_vocab_size(cfg), int(cfg["vocab_size"])
    if (mapping.draft_vocab_size, mapping.vocab_size) != (want_m, want_v):
        raise DraftlabError(
            f"{job.vocab_mapping}: mapping has draft vocab {mapping.draft_vocab_size} over vocab "
            f"{mapping.vocab_size}, {job.draft_config_file()} expects draft_vocab_size={want_m}, vocab_size={want_v}"
        )
    with atomic_path(path) as tmp:
        torch.save({"d2t": mapping.d2t.to(torch.int64), "t2d": mapping.t2d.to(torch.bool)}, tmp)


def write_conversations(src: str | os.PathLike, dst: Path) -> int:
    """draftlab's conversation rows as SpecForge 0.2.0's loader wants them: ``{"conversations": [...]}``.

    ``build_eagle3_dataset`` (``data/preprocessing.py``) refuses any other column set without
    ``data.is_preformatted``; plain-text rows have no assistant turn to mask, so they are refused here.
    """
    import json

    n = 0
    with atomic_path(dst) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        for i, rec in enumerate(read_records(src), 1):
            if "messages" not in rec:
                raise DraftlabError(f"{src}: record {i} is plain text; SpecForge reads conversations (or give "
                                    "--tokens: the tokenized data goes through data.prompts_path)")
            fh.write(json.dumps({"conversations": rec["messages"]}, ensure_ascii=False) + "\n")
            n += 1
    return n


def _attempt_dir(out: Path) -> str:
    """A fresh control folder per attempt: SpecForge refuses to reuse one (``_claim_fresh_control_path``,
    managed_local's "requires a fresh control_dir"), and creates it itself, so the last job file counts too."""
    root = out / "control"
    used = set()
    if (out / JOB_FILE).is_file():
        try:
            used.add(read_json(out / JOB_FILE)["run_config"]["deployment"]["disaggregated"]["control_dir"])
        except (KeyError, TypeError, DraftlabError):
            pass
    n = 1
    while (root / f"attempt-{n}").exists() or str(root / f"attempt-{n}") in used:
        n += 1
    return str(root / f"attempt-{n}")


def prepare(job: SpecForgeJob, write: bool = True) -> dict[str, Any]:
    """Everything a SpecForge run needs besides SpecForge: the run config, argv, pinned mapping, identity.

    With ``write`` the files are written under ``output_dir`` (the job file last, recording the argv
    and the exact config that will run).
    """
    import yaml

    out = Path(job.output_dir)
    cfg_file = Path(job.draft_config_file())
    warnings: list[str] = []
    if not cfg_file.is_file() and write:
        raise DraftlabError(f"{cfg_file}: drafter config not found (key 'draft_model_config')")
    target_json = Path(job.target_model_path) / "config.json"
    target_cfg = load_json_config(target_json) if target_json.is_file() else None
    if cfg_file.is_file():
        ctx = int(read_json(cfg_file).get("max_position_embeddings") or 0)
        if ctx and ctx < job.max_length:
            warnings.append(f"{cfg_file}: max_position_embeddings={ctx} is below max_length={job.max_length}")
    control = _attempt_dir(out)
    fresh, more = run_config(job, control_dir=control, target_cfg=target_cfg)
    warnings += more
    ident = run_identity(job, fresh)
    resume_from, more = _resume_decision(job, ident, write)
    warnings += more
    cfg = fresh
    if resume_from is not None:
        cfg, _ = run_config(job, control_dir=control, resume_from=resume_from, target_cfg=target_cfg)
    result = {
        "argv": build_argv(job),
        "run_config": cfg,
        "run_config_path": str(out / RUN_CONFIG),
        "specforge_version": SPECFORGE_VERSION,
        "resume_from": resume_from,
        "warnings": warnings,
        "capture_host": _capture_host(cfg),
        "identity": ident,
        "job": dataclasses.asdict(job),
    }
    if write:
        out.mkdir(parents=True, exist_ok=True)
        write_mapping(job, out / MAPPING_FILE)
        if job.hidden_states_path:
            write_target_view(job.target_model_path, out)
        elif not job.prompts_path:
            write_conversations(job.train_data_path, out / CONVERSATIONS_FILE)
        with atomic_path(out / RUN_CONFIG) as tmp:
            Path(tmp).write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
        write_json(out / IDENTITY_FILE, ident)
        write_json(out / JOB_FILE, result)
    return result


def _capture_host(cfg: dict[str, Any]) -> list[str]:
    """The capture host's setup for this run config (none with managed_local: SpecForge starts it)."""
    dep = cfg.get("deployment", {})
    if dep.get("mode") != "disaggregated" or (dep.get("disaggregated") or {}).get("managed_local"):
        return []
    return capture_host_setup(cfg, specforge_version=SPECFORGE_VERSION)


def read_job_file(path: str | os.PathLike) -> dict[str, Any]:
    """A YAML or JSON mapping from ``path`` (a job file or an experiment config)."""
    path = Path(path)
    if not path.is_file():
        raise DraftlabError(f"{path}: config file not found")
    data = load_yaml_text(read_text_file(path, "config file"), str(path))
    if not isinstance(data, dict):
        raise DraftlabError(f"{path}: expected a mapping of keys at the top level")
    return data


def specforge_commands(cfg: Mapping[str, Any], arm: str, target: str, patched: str, data: str, mapping: str,
                       run: str, configfile: str, tokens: str, state_dir: str) -> list[list[str]]:
    """The commands of a SpecForge arm: write its run config, ask its capture servers and Mooncake master what
    they are (:mod:`draftlab.training.specforge_capture`), ``specforge train``, import the checkpoint.

    ``configfile`` is the merged experiment config the pipeline wrote (every --configfile and --config),
    so SpecForge gets the trainer's max length and settings. keep: warm start, the drafter's own
    mapping pinned; regenerate: warm start, the new mapping pinned (rows kept by index, the known trap,
    on purpose); scratch: no warm start, the new mapping. SpecForge's output (checkpoints, run config,
    job file) lives in ``state_dir``, outside the rule's output, so a killed job can resume.
    """
    mode = arm.removeprefix("finetune-") if arm != "scratch" else None
    if mode == "remap":
        raise DraftlabError(
            f"{configfile}: key 'train.finetune_modes': 'remap' is not available with train.backend "
            "specforge (SpecForge keeps lm_head rows by index); use keep or regenerate, or the builtin backend"
        )
    pinned = patched if mode == "keep" else mapping
    out = f"{state_dir}/specforge"
    draft_config = f"{patched}/config.json"
    prepare = ["draftlab", "specforge-command", "--config", configfile, "--target", target,
               "--draft-config", draft_config, "--data", data, "--tokens", tokens, "--mapping", pinned,
               "--output-dir", out]
    if mode:
        prepare += ["--ckpt-dir", patched]
    check = ["draftlab", "specforge-preflight", "--job", f"{out}/{JOB_FILE}"]
    for name in expected_model_names(cfg):
        check += ["--expect-model", name]
    train = ["specforge", "train", "--config", f"{out}/{RUN_CONFIG}"]
    imp = ["draftlab", "import-specforge", out, "--out", f"{run}/drafter", "--expect-mapping", pinned,
           "--draft-config", draft_config, "--expect-steps", str(int(cfg["train"]["steps"]))]
    return [prepare, check, train, imp]


def expected_model_names(cfg: Mapping[str, Any]) -> list[str]:
    """What a capture server's ``model_path`` may say for this experiment's target: its hub id, its local folder."""
    t = cfg.get("target") or {}
    names = []
    source = str(t.get("source") or "")
    if source.startswith("hf:"):
        names.append(source[3:])
    if t.get("model_path"):
        names.append(str(t["model_path"]))
    return names
