# Static analysis before any server launch: inspect, compare, patch config, d2t, doctor.


rule inspect:
    input:
        model=lambda wc: (
            f"{R}/models/target/model.json"
            if wc.what == "target"
            else f"{R}/models/{wc.what}/acquire.json"
        ),
    output:
        json=f"{R}/static/inspect-{{what}}.json",
        md=f"{R}/static/inspect-{{what}}.md",
    log:
        f"{LOGS}/inspect-{{what}}.log",
    wildcard_constraints:
        what="target|drafter|reference",
    conda:
        "../../envs/analysis.yaml"
    params:
        path=lambda wildcards, input: (
            model_dir(input.model)
            if wildcards.what == "target"
            else os.path.dirname(input.model)
        ),
    shell:
        "draftlab inspect {params.path} --out {output.json} --summary {output.md} > {log} 2>&1"


rule patch_config:
    input:
        drafter=f"{R}/models/drafter/acquire.json",
        target=f"{R}/models/target/model.json",
    output:
        patch=f"{PATCHED}/patch.json",
        md=f"{R}/static/patch-config.md",
    log:
        f"{LOGS}/patch_config.log",
    conda:
        "../../envs/analysis.yaml"
    params:
        drafter=lambda wildcards, input: os.path.dirname(input.drafter),
        target=lambda wildcards, input: model_dir(input.target),
        out=lambda wildcards, output: os.path.dirname(output.patch),
    shell:
        "draftlab patch-config --drafter {params.drafter} --target {params.target} --out {params.out}"
        " --summary {output.md} > {log} 2>&1"


rule compare:
    input:
        a=lambda wc: (
            get_drafter_marker("probe")
            if wc.a == "patched"
            else f"{R}/models/{wc.a}/acquire.json"
        ),
        b=lambda wc: (
            get_drafter_marker("probe")
            if wc.b == "patched"
            else f"{R}/models/{wc.b}/acquire.json"
        ),
    output:
        json=f"{R}/static/compare-{{a}}-vs-{{b}}.json",
        md=f"{R}/static/compare-{{a}}-vs-{{b}}.md",
    log:
        f"{LOGS}/compare-{{a}}-vs-{{b}}.log",
    wildcard_constraints:
        a="drafter|patched",
        b="patched|reference",
    conda:
        "../../envs/analysis.yaml"
    params:
        a=lambda wildcards, input: os.path.dirname(input.a),
        b=lambda wildcards, input: os.path.dirname(input.b),
    shell:
        "draftlab compare {params.a} {params.b} --out {output.json} --summary {output.md} > {log} 2>&1"


rule doctor:
    """Preflight of a drafter against the target: an error finding fails the job, so no server of
    that drafter is launched (serve_bench takes this report as input)."""
    input:
        drafter=lambda wc: get_drafter_marker(wc.variant),
        target=f"{R}/models/target/model.json",
    output:
        json=f"{R}/static/doctor-{{variant}}.json",
        md=f"{R}/static/doctor-{{variant}}.md",
    log:
        f"{LOGS}/doctor-{{variant}}.log",
    conda:
        "../../envs/analysis.yaml"
    params:
        drafter=get_drafter_dir_from,
        target=lambda wildcards, input: model_dir(input.target),
        algorithm=config["doctor"]["algorithm"],
        backend=config["serve"]["backend"],
        gated=lambda wc: (
            f"draftlab gated --unless-skipped {R}/train/{wc.variant}"
            f" --skip-file {R}/static/doctor-{wc.variant}.json"
            f" --skip-file {R}/static/doctor-{wc.variant}.md -- "
            if wc.variant in ARMS
            else ""
        ),
    shell:
        "{params.gated}draftlab doctor --drafter {params.drafter} --target {params.target}"
        " --algorithm {params.algorithm} --backend {params.backend} --out {output.json}"
        " --summary {output.md} > {log} 2>&1"


rule d2t_diff:
    """The transferred drafter's mapping against the one the fine-tune data calls for."""
    input:
        drafter=get_drafter_marker("probe"),
        mapping=f"{R}/data/vocab.safetensors",
    output:
        json=f"{R}/static/d2t-diff.json",
        md=f"{R}/static/d2t-diff.md",
    log:
        f"{LOGS}/d2t_diff.log",
    conda:
        "../../envs/analysis.yaml"
    params:
        drafter=lambda wildcards, input: os.path.dirname(input.drafter),
    shell:
        "draftlab d2t diff {params.drafter} {input.mapping} --out {output.json} --summary {output.md} > {log} 2>&1"


rule d2t_coverage:
    """Share of the fine-tune tokens the transferred drafter's vocabulary can propose at all."""
    input:
        drafter=get_drafter_marker("probe"),
        tokens=f"{R}/data/tokens.jsonl",
    output:
        json=f"{R}/static/d2t-coverage.json",
        md=f"{R}/static/d2t-coverage.md",
    log:
        f"{LOGS}/d2t_coverage.log",
    conda:
        "../../envs/analysis.yaml"
    params:
        drafter=lambda wildcards, input: os.path.dirname(input.drafter),
    shell:
        "draftlab d2t coverage --drafter {params.drafter} --tokens {input.tokens} --out {output.json}"
        " --summary {output.md} > {log} 2>&1"
