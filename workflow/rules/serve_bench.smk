# Serve + benchmark: one job per launch of the target (experiment.launches: probe, plain, arms), every
# variant of a launch benched in turn with its draft weights swapped in, every client variant against each.
# Then the probe gate: a checkpoint whose decision says whether the trained arms exist.


rule bench_plan:
    """One variant's server (as launched alone: the report's deploy command) and every client variant."""
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


rule launch_plan:
    """What one launch job runs: its server (the first variant's), every variant's bench plan in order, the
    swaps' rule and checks, and (the plain launch) the generate-data step."""
    output:
        plan=L.launch_plan("{launch}"),
    log:
        L.log("launch_plan", "{launch}.log"),
    localrule: True
    conda:
        "../../envs/analysis.yaml"
    params:
        plan=get_launch_plan,
    script:
        "../scripts/params_json.py"


# One job per launch of the target (experiment.launches): the probe launches (probe, then the reference
# swapped in), the plain launch (baseline, then the fine-tune data), one arms launch per setting and swap
# group (every trained arm, draft weights swapped between benches). Each job writes every (variant, spec,
# client) result it measures, so records and the report read the same files as before; `-n -p` lists
# them and prints, after the command, what the launch benches and swaps.
for _launch in LAUNCHES:

    rule:
        name:
            _launch.rule_name
        input:
            unpack(functools.partial(get_launch_inputs, _launch)),
        output:
            **launch_outputs(_launch),
        log:
            bench=L.log("serve_launch", f"{_launch.id}.log"),
            server=L.launch_log(_launch.id),
        benchmark:
            L.benchmark("serve_launch", f"{_launch.id}.tsv")
        conda:
            "../../envs/serving.yaml"
        threads: launch_threads(_launch)
        resources:
            **gpu_resources(SERVER_GPUS),
            # a cluster profile's `set-resources: serve_launch:` (every launch job)
            **launch_cluster_resources(),
            # tok/s of two benchmarks on one host interfere: the profiles allow one at a time
            # (bench_slot: 1); raise it there or with --resources bench_slot=N to run more at once.
            bench_slot=1,
        params:
            command=functools.partial(get_launch_command, _launch.id),
            # a function: the note holds the literal `{url}` of the generate-data command
            note=functools.partial(get_launch_note, _launch),
        shell:
            "draftlab serve-launch --plan {input.plan:q} -- {params.command} > {log.bench:q} 2>&1{params.note}"


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
        # comment lines after the command (`-n -p` prints them): what runs past the gate if it opens (draftlab plan)
        note=get_gate_note,
    shell:
        "draftlab probe-gate {input:q} --min-accept-length {params.min_accept_length:q} --out {output.gate:q} > {log:q} 2>&1{params.note}"
