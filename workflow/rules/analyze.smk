# Static analysis before any server launch: inspect, compare, patch config, d2t, doctor.


rule inspect:
    input:
        model=lambda wc: get_model_record(wc.what),
    output:
        json=L.inspect("{what}"),
        md=L.inspect("{what}", "md"),
    log:
        L.log("inspect-{what}.log"),
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
        "draftlab inspect {params.path:q} --out {output.json:q} --summary {output.md:q} > {log:q} 2>&1"


rule patch_config:
    input:
        drafter=L.acquire_record("drafter"),
        target=L.target_record,
    output:
        patch=L.patch_record,
        md=L.patch_summary,
    log:
        L.log("patch_config.log"),
    conda:
        "../../envs/analysis.yaml"
    params:
        drafter=lambda wildcards, input: os.path.dirname(input.drafter),
        target=lambda wildcards, input: model_dir(input.target),
        out=lambda wildcards, output: os.path.dirname(output.patch),
    shell:
        "draftlab patch-config --drafter {params.drafter:q} --target {params.target:q} --out {params.out:q}"
        " --summary {output.md:q} > {log:q} 2>&1"


rule compare:
    input:
        a=lambda wc: get_compare_input(wc.a),
        b=lambda wc: get_compare_input(wc.b),
    output:
        json=L.compare("{a}", "{b}"),
        md=L.compare("{a}", "{b}", "md"),
    log:
        L.log("compare-{a}-vs-{b}.log"),
    wildcard_constraints:
        a="drafter|patched",
        b="patched|reference",
    conda:
        "../../envs/analysis.yaml"
    params:
        a=lambda wildcards, input: os.path.dirname(input.a),
        b=lambda wildcards, input: os.path.dirname(input.b),
    shell:
        "draftlab compare {params.a:q} {params.b:q} --out {output.json:q} --summary {output.md:q} > {log:q} 2>&1"


rule doctor:
    """Preflight of a drafter against the target: an error finding fails the job, so no server of
    that drafter is launched (serve_bench takes this report as input)."""
    input:
        drafter=lambda wc: L.drafter_marker(wc.variant),
        target=L.target_record,
    output:
        json=L.doctor("{variant}"),
        md=L.doctor("{variant}", "md"),
    log:
        L.log("doctor-{variant}.log"),
    conda:
        "../../envs/analysis.yaml"
    params:
        drafter=get_drafter_dir,
        target=lambda wildcards, input: model_dir(input.target),
        algorithm=S.doctor.algorithm,
        backend=S.serve.backend,
        # the reference is only served: the checks of what draftlab's trainer needs are not its
        serve_only=lambda wildcards: (
            ["--serve-only"] if wildcards.variant == variants.REFERENCE else []
        ),
    shell:
        "draftlab doctor --drafter {params.drafter:q} --target {params.target:q}"
        " --algorithm {params.algorithm:q} --backend {params.backend:q} {params.serve_only:q} --out {output.json:q}"
        " --summary {output.md:q} > {log:q} 2>&1"


rule d2t_diff:
    """The transferred drafter's mapping against the one the fine-tune data calls for."""
    input:
        drafter=L.drafter_marker("probe"),
        mapping=L.vocab_mapping,
    output:
        json=L.d2t_diff(),
        md=L.d2t_diff("md"),
    log:
        L.log("d2t_diff.log"),
    conda:
        "../../envs/analysis.yaml"
    params:
        drafter=lambda wildcards, input: os.path.dirname(input.drafter),
    shell:
        "draftlab d2t diff {params.drafter:q} {input.mapping:q} --out {output.json:q} --summary {output.md:q} > {log:q} 2>&1"


rule d2t_coverage:
    """Share of the fine-tune tokens the transferred drafter's vocabulary can propose at all."""
    input:
        drafter=L.drafter_marker("probe"),
        tokens=L.tokens,
    output:
        json=L.d2t_coverage(),
        md=L.d2t_coverage("md"),
    log:
        L.log("d2t_coverage.log"),
    conda:
        "../../envs/analysis.yaml"
    params:
        drafter=lambda wildcards, input: os.path.dirname(input.drafter),
    shell:
        "draftlab d2t coverage --drafter {params.drafter:q} --tokens {input.tokens:q} --out {output.json:q}"
        " --summary {output.md:q} > {log:q} 2>&1"
