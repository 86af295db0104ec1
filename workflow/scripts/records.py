"""Adapter for rule records: hand the rule's declared input files and the config to draftlab.experiment.records."""

import contextlib

from draftlab.experiment.records import RecordInputs, records_of, write_records

sm = snakemake  # noqa: F821 - injected by Snakemake

with open(sm.log[0], "w") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
    servers = [tuple(s) for s in sm.params.servers]
    clients = list(sm.params.clients)
    frame = records_of(
        RecordInputs.from_rule(sm.input, servers, clients),
        sm.params.config,
        servers=servers,
        clients=clients,
    )
    write_records(frame, sm.output.csv, sm.output.parquet)
    print(f"{len(frame)} rows -> {sm.output.csv}, {sm.output.parquet}")
