# Report: a Markdown summary and plots per experiment (also in `snakemake --report report.html`),
# and where every drafter stands against break-even and the throughput goals (draftlab breakeven).


rule breakeven:
    """Each drafter's measured accept length against the baseline's break-even and the goals."""
    input:
        baseline=L.bench_result("baseline", "plain", "{client}"),
        drafters=lambda wildcards: [
            L.bench_result(v, wildcards.spec, wildcards.client) for v in DRAFTED
        ],
    output:
        # shown in the HTML report through the summary's break-even table (JSON has no view there)
        standing=L.standing("{spec}", "{client}"),
    log:
        L.log("breakeven", "{spec}-{client}.log"),
    conda:
        "../../envs/analysis.yaml"
    params:
        drafters=lambda wildcards, input: " ".join(
            f"--drafter {v}={path}" for v, path in zip(DRAFTED, input.drafters)
        ),
        target_tps=" ".join(str(t) for t in S.breakeven.target_tps),
        num_steps=lambda wildcards: SPECS[wildcards.spec].num_steps,
    shell:
        "draftlab breakeven --baseline {input.baseline} {params.drafters}"
        " --target-tps {params.target_tps} --num-steps {params.num_steps}"
        " --out {output.standing} > {log} 2>&1"


rule report:
    input:
        records=L.records_csv,
        gate=L.gate,
        doctor=[L.doctor(v) for v in DRAFTED],
        d2t=L.d2t_diff(),
        coverage=L.d2t_coverage(),
        patch=L.patch_record,
        compare=get_compare_outputs(),
        inspect=[L.inspect(w) for w in ["target", "drafter"]],
        train=[L.train_dir(arm) for arm in ARMS],
        standing=get_standing_files(),
        static_md=get_static_summaries(),
        data_stats=[L.generate_stats] if S.data.generated else [],
        # per-request rows: paired speedups, per-category results, chain predictions
        bench=get_bench_results(),
        # the servers' plans: the recommendation's launch command comes from the same builder
        plans=[L.bench_plan(v, s) for v, s in get_server_jobs() if v != "baseline"],
    output:
        # snakemake --report shows PNG and HTML inline, Markdown/CSV/JSON only as dead data: links,
        # so what a person reads there is HTML (rendered from the Markdown) with captions
        summary=L.summary,
        recommendation=L.recommendation,
        summary_html=report(
            L.report_file("summary.html"),
            caption="../report/summary.rst",
            category="1. Decision",
        ),
        decision_fragment=L.report_file("decision-fragment.html"),
        accept=report(
            L.report_file("accept_length.png"),
            caption="../report/accept_length.rst",
            category="2. Plots",
        ),
        tps=report(
            L.report_file("throughput.png"),
            caption="../report/throughput.rst",
            category="2. Plots",
        ),
        ttt=report(
            L.report_file("ttt_accuracy.png"),
            caption="../report/ttt_accuracy.rst",
            category="2. Plots",
        ),
        records_html=report(
            L.report_file("records.html"),
            caption="../report/records.rst",
            category="3. Records",
        ),
        static_html=report(
            L.report_file("static.html"),
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
        target_tps=" ".join(str(t) for t in S.breakeven.target_tps),
        data_stats=lambda wildcards, input: (
            f"--data-stats {input.data_stats}" if input.data_stats else ""
        ),
    shell:
        # every file the report reads is an input above and named on this line: nothing is globbed
        "draftlab report --exp-dir {params.exp_dir} --out-dir {params.out_dir} --records {input.records}"
        " --target-tps {params.target_tps} --standing {input.standing}"
        " --gate {input.gate} --doctor {input.doctor} --train {input.train}"
        " --d2t-diff {input.d2t} --d2t-coverage {input.coverage}"
        " --static-md {input.static_md} {params.data_stats}"
        " --bench {input.bench} --plans {input.plans} > {log} 2>&1"
