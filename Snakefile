# draftlab: probe, fine-tune and evaluate an EAGLE-3 drafter for a target model.
# The DAG only; all logic lives in the draftlab package (src/draftlab). See docs/pipeline.md.
from snakemake.utils import min_version

from draftlab.config import load_config

min_version("9.0")


configfile: "config/config.yaml"


# Validate against workflow/schemas/config.schema.yaml and fill defaults; a bad key stops here
# with the key, the value and what is allowed.
config.update(
    load_config(config, source="config (config/config.yaml + --configfile/--config)")
)


include: "workflow/rules/common.smk"
include: "workflow/rules/acquire.smk"
include: "workflow/rules/analyze.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/serve_bench.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/records.smk"
include: "workflow/rules/report.smk"


rule all:
    default_target: True
    input:
        get_final_outputs(),
