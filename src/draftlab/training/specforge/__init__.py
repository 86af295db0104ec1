"""``train.backend: specforge``: the SpecForge 0.2.0 run of a draftlab arm, as SpecForge's own typed config.

Why: a target too large for transformers (the K2.5 case) is trained with SpecForge, which captures
the target's features through SGLang. The ``specforge`` wheel pins torch, transformers and sglang
exactly, so draftlab never imports it: it *writes* the run and *reads* the result.

SpecForge 0.2.0 has one entry point, ``specforge train --config run.yaml``, over the strict config
``specforge.config.schema.Config``; the CLI self-launches ``deployment.trainer.nproc_per_node`` workers
(no torchrun around it). A run that trains from raw conversations must pin ``model.vocab_mapping_path``
(``application/planning.py::_validate_vocab_mapping``).

This package is that integration, one module per job (as SpecForge's own tree is one package per concern):

- ``job``: :class:`SpecForgeJob`, from a job file or an experiment config;
- ``config``: the run config, its argv, the target's weight keys and aux ids for SpecForge;
- ``run_dir``: :func:`prepare`, the run's folder (mapping, conversations, run config, identity, resume, job file);
- ``capture``: what the capture host must run; ``preflight``: asking it (and the Mooncake master);
- ``offline``: draftlab's hidden-state dump as SpecForge's offline features;
- ``importer``: a SpecForge checkpoint back into a drafter folder SGLang loads;
- ``workflow``: the commands of the pipeline's ``train`` rule for a SpecForge arm;
- ``local_capture``: the one-host path's capture stage (rule ``capture``): SpecForge's
  ``scripts/prepare_hidden_states.py`` once for every arm, its preflight (checkout, disk, features folder) and
  its record, and the check a train job makes of the features it is handed.

This module is the one door: commands, rules and scripts import from here, never a module inside
(tests/test_layers.py). It loads no torch: the importer's names (torch at import) load when first used.
"""

from __future__ import annotations

from draftlab.training.specforge.capture import PATCH_SCRIPT, SGLANG_CAPTURE_VERSION, capture_host_setup
from draftlab.training.specforge.config import (RUN_CONFIG, SPECFORGE_VERSION, build_argv, specforge_aux_ids,
                                                target_weight_keys)
from draftlab.training.specforge.local_capture import ID_BYTES, CapturePlan, budget_samples, bytes_per_token, capture_ids
from draftlab.training.specforge.local_capture import SCRIPT as CAPTURE_SCRIPT
from draftlab.training.specforge.local_capture import (capture_preflight, capture_record, check_capture_for,
                                                       checkout_info, count_tokens, free_bytes, human)
from draftlab.training.specforge.job import SpecForgeJob, job_from_experiment, job_from_mapping, read_job_file
from draftlab.training.specforge.offline import write_features
from draftlab.training.specforge.preflight import preflight
from draftlab.training.specforge.run_dir import prepare, write_conversations
from draftlab.training.specforge.workflow import specforge_commands, specforge_local_commands

_IMPORTER = ("import_checkpoint",)  # torch at import: loaded on first use

__all__ = ["CAPTURE_SCRIPT", "CapturePlan", "ID_BYTES", "RUN_CONFIG", "budget_samples", "bytes_per_token", "capture_ids",
           "capture_preflight", "capture_record", "check_capture_for", "checkout_info", "count_tokens", "free_bytes",
           "human", "PATCH_SCRIPT", "SGLANG_CAPTURE_VERSION", "SPECFORGE_VERSION", "SpecForgeJob", "build_argv",
           "capture_host_setup", "job_from_experiment", "job_from_mapping", "preflight", "prepare", "read_job_file",
           "specforge_aux_ids", "specforge_commands", "specforge_local_commands", "target_weight_keys", "write_conversations", "write_features",
           *_IMPORTER]


def __getattr__(name: str):
    if name in _IMPORTER:
        from draftlab.training.specforge import importer  # deferred: loads torch

        return getattr(importer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
