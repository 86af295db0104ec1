"""Adapter for rules that write one params value as JSON (bench_plan, generate_server).

A script rather than a ``run:`` block: Snakemake records a ``run:`` job's start only after its
block has run, so its statistics page plotted negative runtimes for these rules.
"""

from draftlab.fsutil import write_json, write_text

sm = snakemake  # noqa: F821 - injected by Snakemake

write_json(sm.output[0], sm.params[0])  # the rule's one param (plan, server), names kept from the run: blocks
if sm.log:
    write_text(sm.log[0], f"wrote {sm.output[0]}\n")
