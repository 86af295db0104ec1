# Acquire: the demo pair (embedded default only), the target folder, the drafter(s).


if DEMO:

    rule demo_models:
        output:
            demo=demo_record(DEMO_DIR),
            # the v2 slice split: generate_data's default prompts and the bench's held-out in-domain prompts
            finetune_prompts=demo_finetune_prompts(DEMO_DIR),
            bench_prompts=demo_bench_prompts(DEMO_DIR),
        log:
            L.log("demo_models.log"),
        benchmark:
            L.benchmark("demo_models.tsv")
        conda:
            "../../envs/training.yaml"
        threads: 2
        resources:
            **gpu_resources(DEMO_GPUS),
        params:
            out=lambda wildcards, output: os.path.dirname(output.demo),
            size=S.size,
            device=S.demo.device,
        shell:
            "draftlab demo-models --out {params.out:q} --size {params.size:q} --threads {threads}"
            " --device {params.device:q} --json"
            # stage lines and progress on the terminal too (a 5-minute job should not be silent); the JSON
            # goes beside the log, not into the demo folder, until draftlab has written the folder
            " > {log:q}.json 2> >(tee {log:q} >&2) && mv {log:q}.json {output.demo:q}"


rule resolve_target:
    input:
        get_demo(),
        local=get_local_source_files("target"),
    output:
        model=L.target_record,
    log:
        L.log("resolve_target.log"),
    benchmark:
        L.benchmark("resolve_target.tsv")
    conda:
        "../../envs/analysis.yaml"
    params:
        source=get_target_source(),
        link=lambda wildcards, output: model_dir(output.model),
    shell:
        "draftlab resolve-target {params.source} --link {params.link:q} --out {output.model:q} > {log:q} 2>&1"


rule acquire:
    input:
        get_demo(),
        local=lambda wc: get_local_source_files(wc.role),
    output:
        acquire=L.acquire_record("{role}"),
        summary=L.acquire_summary("{role}"),
    log:
        L.log("acquire-{role}.log"),
    benchmark:
        L.benchmark("acquire-{role}.tsv")
    conda:
        "../../envs/analysis.yaml"
    params:
        source=lambda wc: get_source_args(wc.role),
        out=lambda wildcards, output: os.path.dirname(output.acquire),
    shell:
        "draftlab acquire {params.source} --out {params.out:q} --summary {output.summary:q} > {log:q} 2>&1"
