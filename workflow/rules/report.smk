# Report: a Markdown summary and plots per experiment (also in `snakemake --report report.html`),
# and where every drafter stands against break-even and the throughput goals (draftlab standing).


rule breakeven:
    """Each drafter's measured accept length against the baseline's break-even and the goals."""
    input:
        baseline=f"{R}/bench/baseline/plain/{{client}}.json",
        drafters=lambda wildcards: [
            f"{R}/bench/{v}/{wildcards.spec}/{wildcards.client}.json" for v in DRAFTED
        ],
    output:
        standing=report(
            f"{R}/report/breakeven/{{spec}}/{{client}}.json", category="Break-even"
        ),
    log:
        f"{LOGS}/breakeven/{{spec}}-{{client}}.log",
    conda:
        "../../envs/analysis.yaml"
    params:
        drafters=lambda wildcards, input: " ".join(
            f"--drafter {v}={path}" for v, path in zip(DRAFTED, input.drafters)
        ),
        target_tps=" ".join(str(t) for t in config["breakeven"]["target_tps"]),
        num_steps=lambda wildcards: SPECS[wildcards.spec]["num_steps"],
    shell:
        "draftlab standing --baseline {input.baseline} {params.drafters}"
        " --target-tps {params.target_tps} --num-steps {params.num_steps}"
        " --out {output.standing} > {log} 2>&1"


rule report:
    input:
        records=f"{R}/records/records.csv",
        gate=GATE,
        doctor=[f"{R}/static/doctor-{v}.json" for v in DRAFTED],
        d2t=f"{R}/static/d2t-diff.json",
        coverage=f"{R}/static/d2t-coverage.json",
        patch=f"{PATCHED}/patch.json",
        compare=[f"{R}/static/compare-drafter-vs-patched.json"]
        + ([f"{R}/static/compare-patched-vs-reference.json"] if HAS_REFERENCE else []),
        inspect=[f"{R}/static/inspect-{w}.json" for w in ["target", "drafter"]],
        train=[f"{R}/train/{arm}" for arm in ARMS],
        standing=expand(
            f"{R}/report/breakeven/{{spec}}/{{client}}.json",
            spec=SPECS,
            client=CLIENTS,
        ),
    output:
        summary=report(f"{R}/report/summary.md", category="Summary"),
        accept=report(f"{R}/report/accept_length.png", category="Plots"),
        tps=report(f"{R}/report/throughput.png", category="Plots"),
        ttt=report(f"{R}/report/ttt_accuracy.png", category="Plots"),
    log:
        f"{LOGS}/report.log",
    conda:
        "../../envs/analysis.yaml"
    params:
        exp_dir=lambda wildcards, output: os.path.dirname(
            os.path.dirname(output.summary)
        ),
        out_dir=lambda wildcards, output: os.path.dirname(output.summary),
        target_tps=" ".join(str(t) for t in config["breakeven"]["target_tps"]),
    shell:
        "draftlab report --exp-dir {params.exp_dir} --out-dir {params.out_dir} --records {input.records}"
        " --target-tps {params.target_tps} > {log} 2>&1"
