# Serve + benchmark: one job (one launch) per distinct server configuration; every client variant
# runs against it. Then the probe gate: a checkpoint whose decision says whether the trained arms exist.


rule bench_plan:
    """What one server job runs: the server config and every client variant (from the config)."""
    output:
        plan=L.bench_plan("{variant}", "{spec}"),
    log:
        L.log("bench_plan", "{variant}-{spec}.log"),
    localrule: True
    conda:
        "../../envs/analysis.yaml"
    params:
        plan=get_plan,
    script:
        "../scripts/params_json.py"


rule serve_bench:
    """Launch the server once (command shown after --), run all clients, always tear it down."""
    input:
        unpack(get_serve_bench_inputs),
    output:
        results=[L.bench_result("{variant}", "{spec}", c) for c in CLIENTS],
        tables=[L.bench_result("{variant}", "{spec}", c, "csv") for c in CLIENTS],
        serve=L.serve_summary("{variant}", "{spec}"),
    log:
        bench=L.log("serve_bench", "{variant}-{spec}.log"),
        server=L.server_log("{variant}", "{spec}"),
    benchmark:
        L.benchmark("serve_bench", "{variant}-{spec}.tsv")
    conda:
        "../../envs/serving.yaml"
    resources:
        **gpu_resources(SERVER_GPUS),
        # tok/s of two benchmarks on one host interfere: the profiles allow one at a time
        # (bench_slot: 1); raise it there or with --resources bench_slot=N to run more at once.
        bench_slot=1,
    params:
        command=get_server_command,
    shell:
        "draftlab serve-bench --plan {input.plan:q} -- {params.command} > {log.bench:q} 2>&1"


checkpoint probe_gate:
    """Fine-tune only when the transferred drafter already drafts something on the new target: the rules
    after it ask get_open_arms, so a closed gate leaves the arms (train, doctor, serve_bench) out of the DAG.
    """
    input:
        get_gate_results(),
    output:
        gate=L.gate,
    log:
        L.log("probe_gate.log"),
    conda:
        "../../envs/analysis.yaml"
    params:
        min_accept_length=S.gate.min_accept_length,
    shell:
        "draftlab probe-gate {input:q} --min-accept-length {params.min_accept_length:q} --out {output.gate:q} > {log:q} 2>&1"
