# Records: one row per benchmark result for this experiment, then appended (by key, never rewriting
# old rows) into the global results/records.csv and results/records.parquet.


rule records:
    input:
        # the servers the probe gate let exist (a checkpoint): the trained arms' only when it opened
        unpack(get_records_inputs),
        target=L.target_record,
        drafter=L.acquire_record("drafter"),
        reference=[L.acquire_record("reference")] if HAS_REFERENCE else [],
        # the launches that run whatever the gate says (probe, reference), named before the gate has run: a
        # first `-n -p` lists the reference's launch too
        before_gate=get_before_gate_results(),
        gate=L.gate,
    output:
        csv=L.records_csv,
        parquet=L.records_parquet,
    log:
        L.log("records.log"),
    conda:
        "../../envs/analysis.yaml"
    params:
        config=config,
        clients=CLIENTS,
        servers=get_server_jobs,
    script:
        "../scripts/records.py"


rule records_merge:
    """Append this experiment's new rows to the global tables (atomic, under a lock)."""
    input:
        csv=L.records_csv,
    output:
        receipt=L.merged_receipt,
    log:
        L.log("records_merge.log"),
    conda:
        "../../envs/analysis.yaml"
    shell:
        # the global tables are in results/ (--global-dir's default), beside every experiment's folder
        "draftlab records-merge --merge {input.csv:q} --out {output.receipt:q} > {log:q} 2>&1"
