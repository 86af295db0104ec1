"""``train.backend: specforge``: the SpecForge command for a draftlab experiment, and its checkpoints back.

Why: a target too large for transformers (the K2.5 case) is trained with SpecForge, which captures
the target's features through SGLang itself (``--target-model-backend sglang``). draftlab does not
run SpecForge in its own environment (the ``specforge`` wheel pins torch, transformers and sglang
exactly; see ``envs/specforge.yaml``); it *builds* the run and *reads* the result:

1. :func:`build_argv` - the ``torchrun ... scripts/train_eagle3.py`` command line, flags as in
   SpecForge's ``scripts/train_eagle3.py`` (``--target-model-path``, ``--draft-model-config``,
   ``--train-data-path``, ``--output-dir``, ``--num-epochs``, ``--max-num-steps``, ``--batch-size``,
   ``--learning-rate``, ``--max-length``, ``--warmup-ratio``, ``--max-grad-norm``, ``--chat-template``,
   ``--ttt-length``, ``--seed``, ``--tp-size``, ``--target-model-backend``, ``--cache-dir``,
   ``--ckpt-dir``). The training scripts are not in the wheel: ``specforge_dir`` is a checkout of
   the SpecForge repository at the pinned version.
2. :func:`pin_vocab_mapping` - SpecForge builds the vocab mapping from the training data unless
   ``<cache-dir>/vocab_mapping/<key>.pt`` exists, ``key = md5(f"{train_data_path}-{max_length}-
   {chat_template}-{target_model_path}")``; it then loads that file as is. draftlab writes the
   experiment's mapping there first, so a warm start keeps the rows of ``lm_head`` meaningful
   (regenerating the mapping while keeping rows by index is the silent failure in the field notes).
3. :func:`import_checkpoint` - a SpecForge output (``<output-dir>/epoch_N_step_M/`` with
   ``config.json`` + ``model.safetensors`` and ``training_state.pt``) becomes a draftlab drafter
   folder: embeddings stripped, names canonical, ``d2t``/``t2d`` kept, and optionally checked against
   the pinned mapping so a regenerated mapping is caught, not served.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
from pathlib import Path
from typing import Any

import torch

from draftlab import eagle3_format as fmt
from draftlab.errors import DraftlabError
from draftlab.fsutil import atomic_dir, atomic_path, read_json, to_json, write_json

SPECFORGE_VERSION = "0.2.0"  # keep in step with envs/specforge.yaml
TRAIN_SCRIPT = "scripts/train_eagle3.py"
TARGET_BACKENDS = ("sglang", "hf", "custom")
CHECKPOINT_RE = re.compile(r"^epoch_(\d+)_step_(\d+)$")


@dataclasses.dataclass
class SpecForgeJob:
    """One SpecForge training run, in SpecForge's own terms (paths as SpecForge will see them)."""

    target_model_path: str
    draft_model_config: str  # a drafter config.json, or a drafter folder holding one
    train_data_path: str  # JSONL conversations
    output_dir: str
    vocab_mapping: str | None = None  # draftlab mapping file or drafter folder to pin; None = SpecForge builds one
    specforge_dir: str = "SpecForge"  # checkout of github.com/sgl-project/SpecForge at SPECFORGE_VERSION
    chat_template: str = "llama3"  # a name in SpecForge's TEMPLATE_REGISTRY (e.g. qwen, kimi-k2-instruct)
    target_model_backend: str = "sglang"
    ckpt_dir: str | None = None  # warm start from this drafter folder (fine-tune) instead of scratch
    num_epochs: int = 1
    max_num_steps: int | None = None
    batch_size: int = 1
    learning_rate: float = 1e-4
    max_length: int = 2048
    warmup_ratio: float = 0.015
    max_grad_norm: float = 0.5
    ttt_length: int = 7
    seed: int = 0
    nproc: int = 1
    tp_size: int = 1
    save_interval: int | None = None
    cache_dir: str | None = None  # default: <output_dir>/cache
    extra_args: list[str] = dataclasses.field(default_factory=list)

    def resolved_cache_dir(self) -> str:
        return self.cache_dir or os.path.join(self.output_dir, "cache")

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
                        ckpt_dir: str | None = None, **specforge: Any) -> SpecForgeJob:
    """The job for a loaded experiment config (its ``train`` section) and the pipeline's paths."""
    train = cfg.get("train", {})
    job = SpecForgeJob(
        target_model_path=target_model_path,
        draft_model_config=draft_model_config,
        train_data_path=train_data_path,
        output_dir=output_dir,
        vocab_mapping=vocab_mapping,
        ckpt_dir=ckpt_dir,
        max_num_steps=train.get("steps"),
        batch_size=train.get("batch_size", 1),
        learning_rate=train.get("lr", 1e-4),
        max_length=train.get("max_length", 2048),
        ttt_length=train.get("ttt_length", 7),
        seed=train.get("seed", 0),
        nproc=train.get("nproc", 1),
        extra_args=list(train.get("extra_args", [])),
        **specforge,
    )
    validate_job(job, "experiment config")
    return job


def validate_job(job: SpecForgeJob, source: str = "job") -> None:
    ints = ("num_epochs", "batch_size", "max_length", "ttt_length", "nproc", "tp_size")
    for name in ints:
        v = getattr(job, name)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise DraftlabError(f"{source}: key {name!r}: expected a positive integer, got {v!r}")
    for name in ("max_num_steps", "save_interval"):
        v = getattr(job, name)
        if v is not None and (not isinstance(v, int) or v < 1):
            raise DraftlabError(f"{source}: key {name!r}: expected a positive integer or null, got {v!r}")
    if not isinstance(job.learning_rate, (int, float)) or job.learning_rate <= 0:
        raise DraftlabError(f"{source}: key 'learning_rate': expected a number > 0, got {job.learning_rate!r}")
    if job.target_model_backend not in TARGET_BACKENDS:
        raise DraftlabError(f"{source}: key 'target_model_backend': expected one of {list(TARGET_BACKENDS)}, "
                            f"got {job.target_model_backend!r}")
    if job.nproc % job.tp_size:
        raise DraftlabError(f"{source}: key 'tp_size': {job.tp_size} must divide nproc={job.nproc}")
    if not isinstance(job.extra_args, list) or not all(isinstance(a, str) for a in job.extra_args):
        raise DraftlabError(f"{source}: key 'extra_args': expected a list of strings")


def build_argv(job: SpecForgeJob) -> list[str]:
    """The full ``torchrun`` command line of the job (no shell quoting needed: it is an argv)."""
    argv = [
        "torchrun", "--standalone", "--nproc_per_node", str(job.nproc),
        os.path.join(job.specforge_dir, TRAIN_SCRIPT),
        "--target-model-path", job.target_model_path,
        "--draft-model-config", job.draft_config_file(),
        "--train-data-path", job.train_data_path,
        "--output-dir", job.output_dir,
        "--cache-dir", job.resolved_cache_dir(),
        "--chat-template", job.chat_template,
        "--num-epochs", str(job.num_epochs),
        "--batch-size", str(job.batch_size),
        "--learning-rate", repr(float(job.learning_rate)),
        "--max-length", str(job.max_length),
        "--warmup-ratio", repr(float(job.warmup_ratio)),
        "--max-grad-norm", repr(float(job.max_grad_norm)),
        "--ttt-length", str(job.ttt_length),
        "--seed", str(job.seed),
        "--tp-size", str(job.tp_size),
        "--target-model-backend", job.target_model_backend,
    ]
    if job.max_num_steps is not None:
        argv += ["--max-num-steps", str(job.max_num_steps)]
    if job.save_interval is not None:
        argv += ["--save-interval", str(job.save_interval)]
    if job.ckpt_dir is not None:
        argv += ["--ckpt-dir", job.ckpt_dir]
    return argv + list(job.extra_args)


def vocab_cache_key(job: SpecForgeJob) -> str:
    """SpecForge's cache key for the processed dataset and the vocab mapping of this run."""
    s = f"{job.train_data_path}-{job.max_length}-{job.chat_template}-{job.target_model_path}"
    return hashlib.md5(s.encode()).hexdigest()


def vocab_mapping_cache_path(job: SpecForgeJob) -> Path:
    return Path(job.resolved_cache_dir()) / "vocab_mapping" / f"{vocab_cache_key(job)}.pt"


def pin_vocab_mapping(job: SpecForgeJob) -> Path | None:
    """Write the job's mapping where SpecForge looks before building its own; None when not pinned."""
    if job.vocab_mapping is None:
        return None
    from draftlab.vocab import load_mapping

    mapping = load_mapping(job.vocab_mapping)
    cfg = read_json(Path(job.draft_config_file()))
    want_m, want_v = fmt.draft_vocab_size(cfg), int(cfg["vocab_size"])
    if (mapping.draft_vocab_size, mapping.vocab_size) != (want_m, want_v):
        raise DraftlabError(
            f"{job.vocab_mapping}: mapping has draft vocab {mapping.draft_vocab_size} over vocab "
            f"{mapping.vocab_size}, {job.draft_config_file()} expects draft_vocab_size={want_m}, vocab_size={want_v}"
        )
    path = vocab_mapping_cache_path(job)
    with atomic_path(path) as tmp:
        torch.save({"d2t": mapping.d2t.to(torch.int64), "t2d": mapping.t2d.to(torch.bool)}, tmp)
    return path


def prepare(job: SpecForgeJob, write: bool = True) -> dict[str, Any]:
    """Everything a SpecForge run needs besides SpecForge: argv, the pinned mapping, warnings.

    With ``write`` the mapping is pinned and ``<output_dir>/draftlab_specforge_job.json`` records
    the job and argv (the Snakemake rule then only runs the argv in the SpecForge env).
    """
    warnings = []
    cfg_file = Path(job.draft_config_file())
    if cfg_file.is_file():
        cfg = read_json(cfg_file)
        ctx = int(cfg.get("max_position_embeddings") or 0)
        if ctx and ctx < job.max_length:
            warnings.append(f"{cfg_file}: max_position_embeddings={ctx} is below max_length={job.max_length}")
        if fmt.aux_layer_ids(cfg) is None:
            warnings.append(f"{cfg_file}: no eagle_config.eagle_aux_hidden_state_layer_ids; "
                            "SpecForge then uses its own default aux layers")
    elif write:
        raise DraftlabError(f"{cfg_file}: drafter config not found (key 'draft_model_config')")
    if job.vocab_mapping is None:
        warnings.append("no vocab mapping pinned: SpecForge builds one from the training data"
                        + (" and overwrites the warm-start checkpoint's d2t" if job.ckpt_dir else ""))
    pinned = pin_vocab_mapping(job) if write else None
    result = {
        "argv": build_argv(job),
        "specforge_version": SPECFORGE_VERSION,
        "cache_key": vocab_cache_key(job),
        "vocab_mapping_cache": str(vocab_mapping_cache_path(job)),
        "pinned_mapping": str(pinned) if pinned else None,
        "warnings": warnings,
        "job": dataclasses.asdict(job),
    }
    if write:
        write_json(Path(job.output_dir) / "draftlab_specforge_job.json", result)
    return result


# ---------------------------------------------------------------------------------------------
# reading SpecForge checkpoints


def find_checkpoint(src: str | os.PathLike) -> Path:
    """``src`` itself when it holds ``config.json``, else its latest ``epoch_N_step_M/`` child."""
    src = Path(src)
    if not src.is_dir():
        raise DraftlabError(f"{src}: not a folder (expected a SpecForge output dir or an epoch_N_step_M checkpoint)")
    if (src / "config.json").is_file():
        return src
    found = []
    for child in src.iterdir():
        m = CHECKPOINT_RE.match(child.name)
        if m and child.is_dir() and (child / "config.json").is_file():
            found.append(((int(m.group(1)), int(m.group(2))), child))
    if not found:
        raise DraftlabError(f"{src}: no config.json and no epoch_N_step_M/ checkpoint folder with one")
    return max(found)[1]


def import_checkpoint(src: str | os.PathLike, out: str | os.PathLike,
                      expect_mapping: str | os.PathLike | None = None) -> dict[str, Any]:
    """Turn a SpecForge checkpoint into a draftlab drafter folder at ``out`` (written atomically).

    With ``expect_mapping`` (the mapping pinned for the run) a ``d2t`` that differs is an error:
    SpecForge regenerated the mapping and the rows of ``lm_head`` now mean other tokens.
    """
    from safetensors.torch import save_file

    from draftlab.model import read_drafter_tensors

    ckpt = find_checkpoint(src)
    cfg = read_json(ckpt / "config.json")
    for key in ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size"):
        if key not in cfg:
            raise DraftlabError(f"{ckpt / 'config.json'}: key {key!r} is missing (expected an EAGLE-3 drafter config)")
    tensors = read_drafter_tensors(ckpt)  # canonical names, embed_tokens dropped
    had_embed = _has_embeddings(ckpt)
    cfg = dict(cfg)
    cfg["architectures"] = [fmt.ARCHITECTURE]
    cfg.setdefault("draft_vocab_size", int(tensors["lm_head.weight"].shape[0]) if "lm_head.weight" in tensors
                   else cfg["vocab_size"])
    expected = fmt.expected_tensor_shapes(cfg)
    missing = [k for k in expected if k not in tensors]
    if missing:
        raise DraftlabError(f"{ckpt}: tensors {missing} are missing from the checkpoint")
    for name, shape in expected.items():
        if tuple(tensors[name].shape) != tuple(shape):
            raise DraftlabError(f"{ckpt}: tensor {name} has shape {tuple(tensors[name].shape)}, "
                                f"config.json implies {tuple(shape)}")
    extra = sorted(set(tensors) - set(expected))
    tensors = {k: tensors[k].contiguous() for k in expected}
    tensors["d2t"] = tensors["d2t"].to(torch.int64)
    tensors["t2d"] = tensors["t2d"].to(torch.bool)
    mapping_check = None
    if expect_mapping is not None:
        from draftlab.vocab import load_mapping

        want = load_mapping(expect_mapping)
        same = torch.equal(want.d2t.to(torch.int64), tensors["d2t"]) and torch.equal(want.t2d.bool(), tensors["t2d"])
        if not same:
            differ = int((want.target_ids() != tensors["d2t"] + torch.arange(len(tensors["d2t"]))).sum()) \
                if want.draft_vocab_size == len(tensors["d2t"]) else len(tensors["d2t"])
            raise DraftlabError(
                f"{ckpt}: d2t differs from the pinned mapping {expect_mapping} in {differ} of "
                f"{len(tensors['d2t'])} draft ids: SpecForge regenerated the vocab mapping, so lm_head rows "
                "predict other tokens than the mapping the run was meant to keep"
            )
        mapping_check = "matches"
    dtype = str(tensors["fc.weight"].dtype).removeprefix("torch.")
    cfg["torch_dtype"] = dtype
    record = {
        "source": str(ckpt),
        "specforge_step": ckpt.name,
        "embeddings_stripped": had_embed,
        "ignored_tensors": extra,
        "mapping_check": mapping_check,
    }
    with atomic_dir(out) as tmp:
        (tmp / "config.json").write_text(to_json(cfg), encoding="utf-8")
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "draftlab_import.json").write_text(to_json(record), encoding="utf-8")
    return {"out": str(out), "dtype": dtype, "draft_vocab_size": int(cfg["draft_vocab_size"]), **record}


def _has_embeddings(folder: Path) -> bool:
    from safetensors import safe_open

    for path in folder.glob("*.safetensors"):
        with safe_open(str(path), framework="pt") as f:
            if any(k.endswith("embed_tokens.weight") for k in f.keys()):
                return True
    return False


def read_job_file(path: str | os.PathLike) -> dict[str, Any]:
    """A YAML or JSON mapping from ``path`` (a job file or an experiment config)."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise DraftlabError(f"{path}: config file not found")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise DraftlabError(f"{path}: not valid YAML/JSON: {exc}") from None
    if not isinstance(data, dict):
        raise DraftlabError(f"{path}: expected a mapping of keys at the top level")
    return data
