"""Adapter for rule records: hand the experiment's result files and config to draftlab.experiment.records."""

import contextlib

from draftlab.experiment.records import build_records, write_records

sm = snakemake  # noqa: F821 - injected by Snakemake

with open(sm.log[0], "w") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
    frame = build_records(
        sm.params.results_dir,
        sm.params.config,
        servers=[tuple(s) for s in sm.params.servers],
        clients=list(sm.params.clients),
    )
    write_records(frame, sm.output.csv, sm.output.parquet)
    print(f"{len(frame)} rows -> {sm.output.csv}, {sm.output.parquet}")
