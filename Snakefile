# draftlab: probe, fine-tune and evaluate an EAGLE-3 drafter for a target model.
# The DAG only; all logic lives in the draftlab package (src/draftlab). See docs/pipeline.md.
import sys

from snakemake.utils import min_version

from draftlab.settings.config import experiment_layers
from draftlab.experiment.jobs import load_settings, register_gpu_shares
from draftlab.serving.hostcheck import host_warnings

min_version("9.0")


configfile: "config/config.yaml"


# The HTML report (snakemake --report report.html) opens on this page: the decision and the table.
report: "workflow/report/workflow.rst"


# config/config.yaml, every --configfile and --config merged as draftlab merges them (named list items
# by name; a file that sets `experiment` starts from the defaults), validated once into typed Settings
# (draftlab check-config runs the same); a bad key stops here with the key, the value and what is allowed.
SETTINGS = load_settings(
    *experiment_layers(
        "config/config.yaml",
        workflow.config_settings.configfiles,
        workflow.config_settings.config,
    )
)
config.clear()
config.update(SETTINGS.as_dict())


include: "workflow/rules/common.smk"


# Benchmarks that compare tok/s run one at a time unless asked otherwise: serve_bench takes one
# bench_slot, and a run given no bench_slot (no profile, or one without it) has exactly one.
# A profile's `resources: bench_slot: N` or `--resources bench_slot=N` allows N at once.
if "bench_slot" not in workflow.global_resources:
    workflow.register_resource("bench_slot", 1)

# Arms side by side (train.arms_per_gpu): each of the run's `gpu` is worth that many `gpu_share` units
# (rule resources: workflow/rules/common.smk gpu_resources). No `gpu` given: GPU jobs are not counted.
register_gpu_shares(workflow, SETTINGS.train.arms_per_gpu)

# A profile made for a bigger host (gpu8 on a laptop) warns before any job runs; it never refuses.
for _line in host_warnings(
    workflow.resource_settings.resources, workflow.resource_settings.cores
):
    print(f"draftlab WARNING: {_line}", file=sys.stderr)


include: "workflow/rules/acquire.smk"
include: "workflow/rules/analyze.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/serve_bench.smk"
include: "workflow/rules/capture.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/records.smk"
include: "workflow/rules/report.smk"


rule all:
    default_target: True
    input:
        get_final_outputs(),


onstart:
    # Before any job of a real run that launches the target or does GPU work: every input file a later
    # stage reads is here, and a one-host SpecForge capture has its checkout.
    check_ready_to_launch()


onsuccess:
    # The run ends by saying where to look (the summary) and how to get the HTML report.
    print(done_message(), file=sys.stderr)
