"""CLI commands the workflow's rules call: serve-bench, gate, gated, resolve-model, records, report, config."""

from __future__ import annotations

import argparse
import sys

from draftlab.commands._common import add_json_flag, emit


def _serve_bench(args: argparse.Namespace) -> int:
    from draftlab.evaluate import read_json, run_plan

    plan = read_json(args.plan, "serve-bench plan")
    argv = list(args.argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    summary = run_plan(plan, argv or None, progress=not args.no_progress)
    emit(args, summary, lambda s: f"{s['variant']} {s['spec_id']}: launches {s['launches']}"
         + (f", skipped: {s['reason']}" if s.get("skipped") else ""))
    return 0


def _gate(args: argparse.Namespace) -> int:
    from draftlab.evaluate import gate_decision
    from draftlab.fsutil import write_json

    decision = gate_decision(args.results, args.min_accept_length)
    write_json(args.out, decision)
    print(f"probe gate: {decision['decision'].upper()}: {decision['reason']}", file=sys.stderr)
    emit(args, decision, lambda d: f"{d['decision']}: {d['reason']}")
    return 0


def _gated(args: argparse.Namespace) -> int:
    from draftlab.evaluate import run_gated

    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        print("error: gated: give the command after --", file=sys.stderr)
        return 2
    return run_gated(cmd, gate=args.gate, unless_skipped=args.unless_skipped,
                     skip_dirs=args.skip_dir or (), skip_files=args.skip_file or ())


def _resolve_model(args: argparse.Namespace) -> int:
    from draftlab.evaluate import resolve_model

    record = resolve_model(args.source, args.revision, args.link, args.out)
    emit(args, record, lambda r: f"{r['source']} -> {r['folder']} (commit {r['resolved_commit']})")
    return 0


def _records(args: argparse.Namespace) -> int:
    from draftlab.records import merge_into_global

    info = merge_into_global(args.merge, args.global_dir, args.out)
    emit(args, info, lambda i: f"records: {i['appended']} new rows ({i['already_present']} already present), "
                               f"{i['total']} in {i['csv']}")
    return 0


def _report(args: argparse.Namespace) -> int:
    from draftlab.report import write_report

    out = write_report(args.exp_dir, args.out_dir, args.records, target_tps=args.target_tps, standing=args.standing,
                       static_md=args.static_md)
    emit(args, out, lambda o: f"report: {o['summary']}")
    return 0


def _check_config(args: argparse.Namespace) -> int:
    from draftlab.config import deep_merge, load_config, read_yaml

    raw: dict = {}
    for path in args.configfile:
        raw = deep_merge(raw, read_yaml(path))
    cfg = load_config(raw, source=" + ".join(args.configfile))
    emit(args, cfg, lambda c: f"{' + '.join(args.configfile)}: valid (experiment {c['experiment']})")
    return 0


def register(sub) -> None:
    """serve-bench, gate, gated, resolve-model, records, report, check-config."""
    p = sub.add_parser("serve-bench", help="launch one server, run every client variant of a plan, tear it down",
                       description="Launch the server of PLAN once (the command after -- must be the plan's own "
                                   "launch command, so the printed rule shows what runs), run each client variant "
                                   "with the benchmark, write each result atomically and always stop the server.")
    p.add_argument("--plan", required=True, help="plan JSON written by the workflow (server + clients + outputs)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("argv", nargs=argparse.REMAINDER, help="-- the server launch command")
    add_json_flag(p)
    p.set_defaults(func=_serve_bench)

    p = sub.add_parser("gate", help="probe gate: fine-tune only if the probe's accept length is high enough")
    p.add_argument("results", nargs="+", help="probe benchmark result JSON files")
    p.add_argument("--min-accept-length", type=float, required=True)
    p.add_argument("--out", required=True)
    add_json_flag(p)
    p.set_defaults(func=_gate)

    p = sub.add_parser("gated", help="run a command unless the gate is closed (then write explicit skipped outputs)")
    p.add_argument("--gate", help="gate decision JSON")
    p.add_argument("--unless-skipped", metavar="DIR", help="also skip when DIR holds a SKIPPED.json marker")
    p.add_argument("--skip-dir", action="append", help="folder to create with a SKIPPED.json when skipping")
    p.add_argument("--skip-file", action="append", help="JSON file to write {skipped, reason} to when skipping")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- the command")
    p.set_defaults(func=_gated)

    p = sub.add_parser("resolve-model", help="link a local folder holding the target (hf: sources downloaded at a revision)")
    p.add_argument("source")
    p.add_argument("--revision")
    p.add_argument("--link", required=True, help="symlink to create (a fixed path rules can print)")
    p.add_argument("--out", required=True, help="JSON record: resolved commit, weights sha256")
    add_json_flag(p)
    p.set_defaults(func=_resolve_model)

    p = sub.add_parser("records", help="append an experiment's records to results/records.{csv,parquet} (by row_id)")
    p.add_argument("--merge", required=True, metavar="CSV", help="the experiment's records CSV")
    p.add_argument("--global-dir", default="results", help="folder of the global records files")
    p.add_argument("--out", help="receipt JSON (what was appended)")
    add_json_flag(p)
    p.set_defaults(func=_records)

    p = sub.add_parser("report", help="Markdown summary and plots of one experiment")
    p.add_argument("--exp-dir", required=True)
    p.add_argument("--out-dir", required=True)
    p.add_argument("--records", required=True, help="the experiment's records CSV")
    p.add_argument("--target-tps", type=float, nargs="*", default=[],
                   help="throughput goals (kept for compatibility: the break-even section shows the goals of the "
                        "--standing files)")
    p.add_argument("--standing", nargs="*", default=[], metavar="JSON",
                   help="break-even standing files of `draftlab standing` (report/breakeven/<spec>/<client>.json)")
    p.add_argument("--static-md", nargs="*", default=[], metavar="MD",
                   help="static-analysis Markdown summaries to gather into static.html (inspect, compare, doctor...)")
    add_json_flag(p)
    p.set_defaults(func=_report)

    p = sub.add_parser("check-config", help="validate experiment config files (merged in order, as Snakemake does)")
    p.add_argument("configfile", nargs="+")
    add_json_flag(p)
    p.set_defaults(func=_check_config)
