# Report: a Markdown summary and plots per experiment (also in `snakemake --report report.html`),
# and where every drafter stands against break-even and the throughput goals (draftlab breakeven).


rule breakeven:
    """Each drafter's measured accept length against the baseline's break-even and the goals."""
    input:
        baseline=f"{R}/bench/baseline/plain/{{client}}.json",
        drafters=lambda wildcards: [
            f"{R}/bench/{v}/{wildcards.spec}/{wildcards.client}.json" for v in DRAFTED
        ],
    output:
        # shown in the HTML report through the summary's break-even table (JSON has no view there)
        standing=f"{R}/report/breakeven/{{spec}}/{{client}}.json",
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
        "draftlab breakeven --baseline {input.baseline} {params.drafters}"
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
        static_md=get_static_summaries(),
    output:
        # snakemake --report shows PNG and HTML inline, Markdown/CSV/JSON only as dead data: links,
        # so what a person reads there is HTML (rendered from the Markdown) with captions
        summary=f"{R}/report/summary.md",
        summary_html=report(
            f"{R}/report/summary.html",
            caption="../report/summary.rst",
            category="1. Decision",
        ),
        decision_fragment=f"{R}/report/decision-fragment.html",
        accept=report(
            f"{R}/report/accept_length.png",
            caption="../report/accept_length.rst",
            category="2. Plots",
        ),
        tps=report(
            f"{R}/report/throughput.png",
            caption="../report/throughput.rst",
            category="2. Plots",
        ),
        ttt=report(
            f"{R}/report/ttt_accuracy.png",
            caption="../report/ttt_accuracy.rst",
            category="2. Plots",
        ),
        records_html=report(
            f"{R}/report/records.html",
            caption="../report/records.rst",
            category="3. Records",
        ),
        static_html=report(
            f"{R}/report/static.html",
            caption="../report/static.rst",
            category="4. Static analysis",
        ),
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
        " --target-tps {params.target_tps} --standing {input.standing}"
        " --static-md {input.static_md} > {log} 2>&1"
