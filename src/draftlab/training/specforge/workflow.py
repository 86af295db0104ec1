"""What the pipeline's ``train`` rule runs for a SpecForge arm: write the run config, ask the capture host (two
hosts) or check the one capture's features (one host), ``specforge train``, import the checkpoint (the commands,
joined by ``&&``)."""

from __future__ import annotations

from typing import Any, Mapping

from draftlab.errors import DraftlabError
from draftlab.training.specforge.config import JOB_FILE, RUN_CONFIG


def specforge_commands(cfg: Mapping[str, Any], arm: str, target: str, patched: str, data: str, mapping: str,
                       run: str, configfile: str, tokens: str, state_dir: str) -> list[list[str]]:
    """The commands of a SpecForge arm: write its run config, ask its capture servers and Mooncake master what
    they are (:mod:`.preflight`), ``specforge train``, import the checkpoint.

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


def arm_mode(arm: str) -> str | None:
    """The vocab mode of a SpecForge arm (``finetune-keep`` and ``specforge-keep``: keep), None for a scratch arm."""
    if arm in ("scratch", "specforge-scratch"):
        return None
    return arm.removeprefix("finetune-").removeprefix("specforge-")


def specforge_local_commands(arm: str, *, target: str, patched: str, data: str, tokens: str, capture_record: str,
                             capture_mapping: str, run: str, configfile: str, state_dir: str,
                             steps: int) -> list[list[str]]:
    """A SpecForge arm of the one-host path: its run config over the one capture's features
    (``data.hidden_states_path``, ``deployment.mode: local_colocated``), ``specforge train``, the import.

    keep pins the transferred drafter's own mapping; regenerate and scratch pin the mapping derived from the
    captured corpus (SpecForge's own after its script: ``capture_mapping``). ``--capture`` makes the prepare step
    refuse features of another target or other aux ids before anything trains."""
    mode = arm_mode(arm)
    if mode == "remap":
        raise DraftlabError(f"{configfile}: key 'train.finetune_modes': 'remap' is not available with SpecForge "
                            "(it keeps lm_head rows by index); use keep or regenerate, or the builtin backend")
    pinned = patched if mode == "keep" else capture_mapping
    out = f"{state_dir}/specforge"
    draft_config = f"{patched}/config.json"
    prepare = ["draftlab", "specforge-command", "--config", configfile, "--target", target,
               "--draft-config", draft_config, "--data", data, "--tokens", tokens, "--mapping", pinned,
               "--output-dir", out, "--capture", capture_record]
    if mode:
        prepare += ["--ckpt-dir", patched]
    train = ["specforge", "train", "--config", f"{out}/{RUN_CONFIG}"]
    imp = ["draftlab", "import-specforge", out, "--out", f"{run}/drafter", "--expect-mapping", pinned,
           "--draft-config", draft_config, "--expect-steps", str(int(steps))]
    return [prepare, train, imp]


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
