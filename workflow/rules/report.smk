# Report: a Markdown summary and plots per experiment (also in `snakemake --report report.html`),
# and where every drafter stands against break-even and the throughput goals (draftlab breakeven).


rule breakeven:
    """Each drafter's measured accept length against the baseline's break-even and the goals."""
    input:
        baseline=L.bench_result(variants.BASELINE, "plain", "{client}"),
        drafters=lambda wildcards: [
            L.bench_result(v, wildcards.spec, wildcards.client) for v in get_drafted()
        ],
    output:
        # shown in the HTML report through the summary's break-even table (JSON has no view there)
        standing=L.standing("{spec}", "{client}"),
    log:
        L.log("breakeven", "{spec}-{client}.log"),
    conda:
        "../../envs/analysis.yaml"
    params:
        drafters=lambda wildcards, input: shlex.join(
            arg
            for v, path in zip(get_drafted(), input.drafters)
            for arg in ("--drafter", f"{v}={path}")
        ),
        target_tps=shlex.join(str(t) for t in S.breakeven.target_tps),
        num_steps=lambda wildcards: SPECS[wildcards.spec].num_steps,
    shell:
        "draftlab breakeven --baseline {input.baseline:q} {params.drafters}"
        " --target-tps {params.target_tps} --num-steps {params.num_steps:q}"
        " --out {output.standing:q} > {log:q} 2>&1"


rule report:
    input:
        # the files of the variants the probe gate let exist (a checkpoint): get_report_inputs
        unpack(get_report_inputs),
        records=L.records_csv,
        gate=L.gate,
        d2t=L.d2t_diff(),
        coverage=L.d2t_coverage(),
        patch=L.patch_record,
        compare=get_compare_outputs(),
        inspect=[L.inspect(w) for w in ["target", "drafter"]],
        data_stats=[L.generate_stats] if S.data.generated else [],
        leak_check=L.leak_check,
    output:
        # snakemake --report shows PNG and HTML inline, Markdown/CSV/JSON only as dead data: links,
        # so what a person reads there is HTML (rendered from the Markdown) with captions
        summary=L.summary,
        recommendation=L.recommendation,
        summary_html=report(
            L.report_output("summary_html"),
            caption="../report/summary.rst",
            category="1. Decision",
        ),
        decision_fragment=L.report_output("decision_fragment"),
        accept=report(
            L.report_output("accept"),
            caption="../report/accept_length.rst",
            category="2. Plots",
        ),
        tps=report(
            L.report_output("tps"),
            caption="../report/throughput.rst",
            category="2. Plots",
        ),
        ttt=report(
            L.report_output("ttt"),
            caption="../report/ttt_accuracy.rst",
            category="2. Plots",
        ),
        records_html=report(
            L.report_output("records_html"),
            caption="../report/records.rst",
            category="3. Records",
        ),
        static_html=report(
            L.report_output("static_html"),
            caption="../report/static.rst",
            category="4. Static analysis",
        ),
    log:
        L.log("report.log"),
    conda:
        "../../envs/analysis.yaml"
    params:
        exp_dir=lambda wildcards, output: os.path.dirname(
            os.path.dirname(output.summary)
        ),
        out_dir=lambda wildcards, output: os.path.dirname(output.summary),
        target_tps=shlex.join(str(t) for t in S.breakeven.target_tps),
        inputs=get_report_args,
    shell:
        # every file the report reads is an input above, named on this line after its flag: nothing is globbed
        "draftlab report --exp-dir {params.exp_dir:q} --out-dir {params.out_dir:q}"
        " --target-tps {params.target_tps} {params.inputs} > {log:q} 2>&1"
