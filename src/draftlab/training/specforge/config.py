"""SpecForge 0.2.0's run config for a job: its typed ``Config`` (sections ``model``, ``data``, ``training``,
``deployment``) as a plain mapping, the argv that runs it, and what it must know of the target and drafter.

Online training (raw conversations in ``data.train_data_path``) is disaggregated only: an SGLang capture
server produces the features, a Mooncake store carries them, the trainer consumes them
(``deployment.mode: disaggregated``, ``deployment.disaggregated.backend: mooncake``); offline training
reads :mod:`.offline`'s features, colocated. The files a run writes are named here.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from draftlab.errors import DraftlabError
from draftlab.formats import aux_layers
from draftlab.formats.checkpoint import INDEX_SUFFIX, read_checkpoint
from draftlab.fsutil import read_json
from draftlab.training.specforge.job import SpecForgeJob
from draftlab.training.specforge.offline import TARGET_VIEW

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


def run_config(job: SpecForgeJob, *, control_dir: str, resume_from: str | None = None,
               target_cfg: dict[str, Any] | None = None) -> tuple[dict[str, Any], list[str]]:
    """SpecForge's ``Config`` for the job, as a plain mapping (and warnings)."""
    model, warnings = _model_section(job, resume_from, target_cfg)
    epochs, more = num_epochs_for(job)
    cfg = {
        "run_id": RUN_ID,
        "output_dir": str(Path(job.output_dir)),
        "model": model,
        "data": _data_section(job),
        "training": _training_section(job, epochs, resume_from),
        "deployment": _deployment_section(job, control_dir),
    }
    return _deep_merge(cfg, job.overrides), warnings + more


def _weight_keys(job: SpecForgeJob) -> tuple[str, str, list[str]]:
    """The target's embedding and lm_head keys: the job's own, else those its weight index names.

    A target that is not on this machine gets SpecForge's defaults and a warning (the job reads the index
    where it runs); a target that is here but names no such tensor is refused.
    """
    embed, head = job.embedding_key, job.lm_head_key
    if embed is not None and head is not None:
        return embed, head, []
    warnings = []
    try:
        found = target_weight_keys(job.target_model_path)
    except DraftlabError as exc:
        if Path(job.target_model_path).exists():
            raise
        warnings.append(f"{exc}; SpecForge's default weight keys are shown (the job reads the index)")
        found = ("model.embed_tokens.weight", "lm_head.weight")
    return embed or found[0], head or found[1], warnings


def _aux_ids(job: SpecForgeJob, target_cfg: dict[str, Any] | None) -> tuple[list[int] | None, list[str]]:
    """The aux layer ids: the job's own, else the ids the drafter config maps to for this target; ``None``
    (with a warning) leaves them to SpecForge when neither config can be read here."""
    if job.aux_layer_ids is not None:
        return job.aux_layer_ids, []
    cfg_file = Path(job.draft_config_file())
    if target_cfg is not None and cfg_file.is_file():
        return specforge_aux_ids(read_json(cfg_file), target_cfg), []
    return None, ["target or drafter config not readable here: aux layer ids left to SpecForge"]


def _model_section(job: SpecForgeJob, resume_from: str | None,
                   target_cfg: dict[str, Any] | None) -> tuple[dict[str, Any], list[str]]:
    """``model``: the target (offline: the view of it that :mod:`.offline` writes), the drafter, the weight
    keys and aux layer ids, and the checkpoint to start from; with the warnings of what was guessed."""
    embed, head, warnings = _weight_keys(job)
    aux, more = _aux_ids(job, target_cfg)
    out = Path(job.output_dir)
    model = {
        "target_model_path": str(out / TARGET_VIEW) if job.hidden_states_path else job.target_model_path,
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
    return model, warnings + more


def _data_section(job: SpecForgeJob) -> dict[str, Any]:
    """``data``: offline features, else the prompts a capture server turns into features, else the
    conversations draftlab writes as SpecForge's rows."""
    out = Path(job.output_dir)
    return {
        **({"hidden_states_path": job.hidden_states_path} if job.hidden_states_path
           else {"prompts_path": job.prompts_path} if job.prompts_path
           else {"train_data_path": str(out / CONVERSATIONS_FILE)}),
        "chat_template": job.chat_template,
        "max_length": job.max_length,
        "cache_dir": str(out / "cache"),
    }


def _training_section(job: SpecForgeJob, epochs: int, resume_from: str | None) -> dict[str, Any]:
    """``training``: EAGLE-3 for exactly ``job.steps`` optimizer steps, resumed from ``resume_from`` if given."""
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
    return training


def _deployment_section(job: SpecForgeJob, control_dir: str) -> dict[str, Any]:
    """``deployment``: online runs are disaggregated (a capture server feeds the trainer through Mooncake);
    offline runs use SpecForge's own colocated trainer, which reads the features, and nothing captures."""
    trainer = {"nnodes": 1, "nproc_per_node": job.nproc}
    if job.hidden_states_path:
        return {"mode": "local_colocated", "trainer": trainer}
    return {
        "mode": "disaggregated",
        "trainer": trainer,
        "disaggregated": {"backend": "mooncake", **job.deployment, "control_dir": control_dir},
    }


def _deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def build_argv(job: SpecForgeJob) -> list[str]:
    """SpecForge's own launcher: it starts ``deployment.trainer.nproc_per_node`` workers itself."""
    return ["specforge", "train", "--config", str(Path(job.output_dir) / RUN_CONFIG)]
