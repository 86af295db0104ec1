"""CLI for the experiment layer: ``records-merge`` (alias ``records``), ``report``, ``check-config``, ``plan``.
"""

from __future__ import annotations

import argparse

from draftlab.commands._common import add_json_flag, emit, number
from draftlab.settings.config import experiment_layers


def register(sub) -> None:
    """records-merge (alias records), report, check-config, plan."""
    p = sub.add_parser("records-merge", aliases=["records"], help="append an experiment's records to results/records.{csv,parquet} (by row_id)")
    p.add_argument("--merge", required=True, metavar="CSV", help="the experiment's records CSV")
    p.add_argument("--global-dir", default="results", help="folder of the global records files")
    p.add_argument("--out", help="receipt JSON (what was appended)")
    add_json_flag(p)
    p.set_defaults(func=_records_merge)

    p = sub.add_parser("report", help="Markdown summary and plots of one experiment")
    p.add_argument("--exp-dir", required=True)
    p.add_argument("--out-dir", required=True)
    p.add_argument("--records", required=True, help="the experiment's records CSV")
    p.add_argument("--target-tps", type=number(float, above=0), nargs="*", default=[],
                   help="throughput goals (kept for compatibility: the break-even section shows the goals of the "
                        "--standing files)")
    p.add_argument("--standing", nargs="*", default=[], metavar="JSON",
                   help="break-even standing files of `draftlab standing` (report/breakeven/<spec>/<client>.json)")
    p.add_argument("--static-md", nargs="*", default=[], metavar="MD",
                   help="static-analysis Markdown summaries to gather into static.html (inspect, compare, doctor...)")
    # The files the report reads; left out, those of the variants records.csv holds (never a glob).
    p.add_argument("--gate", metavar="JSON", help="probe gate decision (default <exp-dir>/gate/gate.json)")
    p.add_argument("--doctor", nargs="*", metavar="JSON",
                   help="doctor reports, one per drafter (default: static/doctor-<variant>.json of the records' variants)")
    p.add_argument("--train", nargs="*", metavar="DIR",
                   help="train folders of the arms (default: train/<arm> of the records' trained variants)")
    p.add_argument("--d2t-diff", metavar="JSON", help="d2t diff (default <exp-dir>/static/d2t-diff.json)")
    p.add_argument("--d2t-coverage", metavar="JSON", help="d2t coverage (default <exp-dir>/static/d2t-coverage.json)")
    p.add_argument("--data-stats", metavar="JSON",
                   help="generate_data's stats (the fine-tune data section); left out: the data was a given file")
    p.add_argument("--bench", nargs="*", metavar="JSON",
                   help="bench results with per-request rows (bench/<variant>/<spec>/<client>.json), for the paired "
                        "speedups and the chain predictions (default: those of the records' rows)")
    p.add_argument("--plans", nargs="*", metavar="JSON",
                   help="server plans (bench/<variant>/<spec>/plan.json) the recommendation's launch command is "
                        "built from (default: those of the records' rows, the baseline's included)")
    p.add_argument("--leak-check", metavar="JSON",
                   help="leak-check's record (no bench prompt in the fine-tune data), shown with the data "
                        "(default <exp-dir>/data/leak-check.json when it exists)")
    p.add_argument("--launches", nargs="*", metavar="JSON", help="arms launches' launch.json: their launch_check "
                   "sets the launch noise comparisons across launches must clear (left out: unmeasured)")
    add_json_flag(p)
    p.set_defaults(func=_report)

    p = sub.add_parser("check-config", help="validate experiment config files (merged in order over config/config.yaml, as the Snakefile "
                            "does: a file that sets `experiment` starts from the defaults)")
    p.add_argument("configfile", nargs="+")
    add_json_flag(p)
    p.set_defaults(func=_check_config)
    _register_plan(sub)


def _register_plan(sub) -> None:
    p = sub.add_parser("plan", help="the whole plan of an experiment before anything runs, past the probe gate: "
                            "launches (and what the reference drafter costs), capture and training commands, the "
                            "capture's disk bound against the free space, a rough timeline (the probe gate's notes "
                            "in snakemake -n -p)")
    p.add_argument("configfile", nargs="*", help="experiment config files, merged as check-config merges them "
                                                  "(none: config/config.yaml)")
    add_json_flag(p)
    p.set_defaults(func=_plan)


DEFAULT_CONFIG = "config/config.yaml"  # the Snakefile's `configfile:`, the base of an overlay


def _records_merge(args: argparse.Namespace) -> int:
    from draftlab.experiment.records import merge_into_global

    info = merge_into_global(args.merge, args.global_dir, args.out)
    emit(args, info, lambda i: f"records: {i['appended']} new rows ({i['already_present']} already present), "
                               f"{i['total']} in {i['csv']}")
    return 0


def _report(args: argparse.Namespace) -> int:
    from draftlab.experiment.report import write_report

    out = write_report(args.exp_dir, args.out_dir, args.records, target_tps=args.target_tps, standing=args.standing,
                       static_md=args.static_md, gate=args.gate, doctor=args.doctor, train=args.train,
                       d2t_diff=args.d2t_diff, d2t_coverage=args.d2t_coverage, data_stats=args.data_stats,
                       bench=args.bench, plans=args.plans, leak_check=args.leak_check,
                       launches=args.launches)
    emit(args, out, lambda o: f"report: {o['summary']}")
    return 0


def _settings(configfiles: list[str]):
    from draftlab.experiment.jobs import load_settings

    # Exactly the Snakefile's loading: config/config.yaml (when here), the files in order, one validation.
    raw, source = experiment_layers(DEFAULT_CONFIG, configfiles)
    return load_settings(raw, source)


def _check_config(args: argparse.Namespace) -> int:
    settings = _settings(args.configfile)
    emit(args, settings.as_dict(), lambda c: f"{' + '.join(args.configfile)}: valid (experiment {c['experiment']})")
    return 0


def _plan(args: argparse.Namespace) -> int:
    from draftlab.experiment import plan
    from draftlab.experiment.layout import Layout

    settings = _settings(args.configfile)
    layout = Layout(settings.experiment)
    data = plan.plan(settings, layout)
    emit(args, data, lambda d: "\n".join(plan.plan_lines(settings, layout, d)))
    return 0

