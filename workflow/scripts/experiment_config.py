"""Adapter for rule experiment_config: the merged, validated config as one file.

A script rather than a ``run:`` block, so Snakemake's statistics see a start before the end.
"""

from draftlab.settings.model import Settings
from draftlab.fsutil import write_text

sm = snakemake  # noqa: F821 - injected by Snakemake

Settings.from_validated(sm.config, source="config (config/config.yaml + --configfile/--config)").write(sm.output[0])
write_text(sm.log[0], f"wrote {sm.output[0]}\n")
