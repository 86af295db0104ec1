# Serve + benchmark: one job (one launch) per distinct server configuration; every client variant
# runs against it. Then the probe gate.


rule bench_plan:
    """What one server job runs: the server config and every client variant (from the config)."""
    output:
        plan=f"{R}/bench/{{variant}}/{{spec}}/plan.json",
    log:
        f"{LOGS}/bench_plan/{{variant}}-{{spec}}.log",
    localrule: True
    params:
        plan=get_plan,
    run:
        from draftlab.fsutil import write_json

        write_json(output.plan, params.plan)


rule serve_bench:
    """Launch the server once (command shown after --), run all clients, always tear it down."""
    input:
        unpack(get_serve_bench_inputs),
    output:
        results=expand(
            f"{R}/bench/{{{{variant}}}}/{{{{spec}}}}/{{client}}.json", client=CLIENTS
        ),
        tables=expand(
            f"{R}/bench/{{{{variant}}}}/{{{{spec}}}}/{{client}}.csv", client=CLIENTS
        ),
        serve=f"{R}/bench/{{variant}}/{{spec}}/serve.json",
    log:
        bench=f"{LOGS}/serve_bench/{{variant}}-{{spec}}.log",
        server=f"{LOGS}/server/{{variant}}-{{spec}}.log",
    benchmark:
        f"{BENCHMARKS}/serve_bench/{{variant}}-{{spec}}.tsv"
    conda:
        "../../envs/serving.yaml"
    resources:
        gpu=SERVER_GPUS,
        # tok/s of two benchmarks on one host interfere: the profiles allow one at a time
        # (bench_slot: 1); raise it there or with --resources bench_slot=N to run more at once.
        bench_slot=1,
    params:
        command=get_server_command,
    shell:
        "draftlab serve-bench --plan {input.plan} -- {params.command} > {log.bench} 2>&1"


rule probe_gate:
    """Fine-tune only when the transferred drafter already drafts something on the new target."""
    input:
        get_gate_results(),
    output:
        gate=GATE,
    log:
        f"{LOGS}/probe_gate.log",
    conda:
        "../../envs/analysis.yaml"
    params:
        min_accept_length=config["gate"]["min_accept_length"],
    shell:
        "draftlab probe-gate {input} --min-accept-length {params.min_accept_length} --out {output.gate} > {log} 2>&1"
