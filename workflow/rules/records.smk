# Records: one row per benchmark result for this experiment, then appended (by key, never rewriting
# old rows) into the global results/records.csv and results/records.parquet.


rule records:
    input:
        results=get_bench_results(),
        servers=[f"{R}/bench/{v}/{s}/serve.json" for v, s in get_server_jobs()],
        target=f"{R}/models/target/model.json",
        drafter=f"{R}/models/drafter/acquire.json",
        reference=[f"{R}/models/reference/acquire.json"] if HAS_REFERENCE else [],
        train=[f"{R}/train/{arm}" for arm in ARMS],
        gate=GATE,
    output:
        csv=f"{R}/records/records.csv",
        parquet=f"{R}/records/records.parquet",
    log:
        f"{LOGS}/records.log",
    conda:
        "../../envs/analysis.yaml"
    params:
        config=config,
        clients=CLIENTS,
        servers=get_server_jobs(),
        results_dir=lambda wildcards, output: os.path.dirname(
            os.path.dirname(output.csv)
        ),
    script:
        "../scripts/records.py"


rule records_merge:
    """Append this experiment's new rows to the global tables (atomic, under a lock)."""
    input:
        csv=f"{R}/records/records.csv",
    output:
        receipt=f"{R}/records/merged.json",
    log:
        f"{LOGS}/records_merge.log",
    conda:
        "../../envs/analysis.yaml"
    shell:
        "draftlab records-merge --merge {input.csv} --global-dir results --out {output.receipt} > {log} 2>&1"
