# Acquire: the demo pair (embedded default only), the target folder, the drafter(s).


if DEMO:

    rule demo_models:
        output:
            demo=f"{DEMO_DIR}/demo.json",
        log:
            f"{LOGS}/demo_models.log",
        benchmark:
            f"{BENCHMARKS}/demo_models.tsv"
        conda:
            "../../envs/training.yaml"
        threads: 2
        resources:
            gpu=DEMO_GPUS,
        params:
            out=lambda wildcards, output: os.path.dirname(output.demo),
            size=config["size"],
            device=config["demo"]["device"],
        shell:
            "draftlab demo-models --out {params.out} --size {params.size} --threads {threads}"
            " --device {params.device} --json"
            # stage lines and progress on the terminal too (a 5-minute job should not be silent); the JSON
            # goes beside the log, not into the demo folder, until draftlab has written the folder
            " > {log}.json 2> >(tee {log} >&2) && mv {log}.json {output.demo}"


rule resolve_target:
    input:
        get_demo(),
    output:
        model=f"{R}/models/target/model.json",
    log:
        f"{LOGS}/resolve_target.log",
    benchmark:
        f"{BENCHMARKS}/resolve_target.tsv"
    conda:
        "../../envs/analysis.yaml"
    params:
        source=get_target_source(),
        link=lambda wildcards, output: model_dir(output.model),
    shell:
        "draftlab resolve-target {params.source} --link {params.link} --out {output.model} > {log} 2>&1"


rule acquire:
    input:
        get_demo(),
    output:
        acquire=f"{R}/models/{{role}}/acquire.json",
        summary=f"{R}/static/acquire-{{role}}.md",
    log:
        f"{LOGS}/acquire-{{role}}.log",
    benchmark:
        f"{BENCHMARKS}/acquire-{{role}}.tsv"
    conda:
        "../../envs/analysis.yaml"
    params:
        source=lambda wc: get_source_args(wc.role),
        out=lambda wildcards, output: os.path.dirname(output.acquire),
    shell:
        "draftlab acquire {params.source} --out {params.out} --summary {output.summary} > {log} 2>&1"
