"""One SpecForge arm in draftlab's terms (:class:`SpecForgeJob`): from a job file or an experiment config, checked.

Paths are as SpecForge will see them; the defaults of settings an experiment config also has are the
schema's (``train.<key>``), the one set.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Mapping

from draftlab.errors import DraftlabError
from draftlab.fsutil import read_text_file
from draftlab.settings.config import load_yaml_text
from draftlab.settings.model import Settings, schema_default


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


def read_job_file(path: str | os.PathLike) -> dict[str, Any]:
    """A YAML or JSON mapping from ``path`` (a job file or an experiment config)."""
    path = Path(path)
    if not path.is_file():
        raise DraftlabError(f"{path}: config file not found")
    data = load_yaml_text(read_text_file(path, "config file"), str(path))
    if not isinstance(data, dict):
        raise DraftlabError(f"{path}: expected a mapping of keys at the top level")
    return data
