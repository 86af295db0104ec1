"""CLI for the benchmark layer: ``bench``, ``serve-bench``, ``probe-gate`` (alias ``gate``), ``leak-check``, ``gated``,
``breakeven`` and its old name for the measured form, ``standing``: measure, then decide."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from draftlab.commands._common import FRACTION, SEED, add_json_flag, emit, number
from draftlab.errors import DraftlabError
from draftlab.fsutil import read_json, write_json
from draftlab.settings.model import schema_default


def _client_default(key: str):
    """A ``bench.clients`` item's default from the settings model: ``draftlab bench`` runs what a client runs."""
    return schema_default(f"bench.clients.{key}")


def register(sub) -> None:
    """Add this area's subcommands to the draftlab parser."""
    _register_bench(sub)
    _register_serve_bench_and_gate(sub)
    _register_breakeven(sub)


def _register_bench(sub) -> None:
    p = sub.add_parser(
        "bench",
        help="benchmark a running server: output tok/s, accept length, cycle time, TTFT",
        description="Send a prompt set to a running server (builtin/SGLang /generate, or vLLM "
        "/v1/completions + /metrics) and write per-request rows and a summary as JSON and CSV.",
    )
    p.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:30000")
    p.add_argument("--prompts", required=True,
                   help="prompt file ('default' = the shipped set; JSONL of text/prompt/question, MT-Bench turns, "
                   "ShareGPT conversations or OpenAI messages, .jsonl.gz read gzipped, or plain lines)")
    p.add_argument("--api", choices=("sglang", "vllm"), default="sglang", help="server protocol (builtin = sglang)")
    p.add_argument("--max-new-tokens", type=number(int, setting="bench.clients.max_new_tokens"), default=_client_default("max_new_tokens"))
    p.add_argument("--repeats", type=number(int, setting="bench.clients.repeats"), default=_client_default("repeats"), help="timed passes over the prompt set")
    p.add_argument("--warmup", type=number(int, setting="bench.clients.warmup"), default=_client_default("warmup"), help="unrecorded requests before timing")
    p.add_argument("--concurrency", type=number(int, setting="bench.clients.concurrency"), default=_client_default("concurrency"), help="requests in flight at once")
    p.add_argument("--limit", type=number(int, setting="bench.clients.limit"), default=None,
                   help="use N prompts: a seeded sample stratified by category (at least one of each when N allows)")
    p.add_argument("--sample-seed", type=number(int, **SEED), default=0, help="seed of the --limit sample (default 0)")
    p.add_argument("--category", default=None,
                   help="category of prompts whose record has none (default 'misc'; the workflow passes the client name)")
    p.add_argument("--model", default=None, help="vLLM model name (default: first of /v1/models)")
    p.add_argument("--ignore-eos", action="store_true", help="always generate --max-new-tokens tokens")
    p.add_argument("--no-ttft", action="store_true", help="skip the streaming time-to-first-token pass")
    p.add_argument("--ttft-limit", type=number(int, setting="bench.clients.ttft_limit"), default=None,
                   help="stream N prompts in the TTFT pass: a seeded sample stratified by category (default: all)")
    p.add_argument("--timeout", type=number(float, above=0), default=600.0,
                   help="seconds for each whole request (connect, send, headers and body together)")
    p.add_argument(
        "--require-speculation",
        action="store_true",
        help="fail (and write nothing) unless the server reports speculative verification",
    )
    p.add_argument("--num-steps", type=number(int, setting="speculative.num_steps"), default=None,
                   help="draft steps the server was launched with; bounds its answers when it does not report "
                   "them (no /server_info)")
    p.add_argument("--out", required=True, help="result JSON")
    p.add_argument("--csv", default=None, help="per-request CSV (default: --out with .csv suffix)")
    p.add_argument("--no-progress", action="store_true")
    add_json_flag(p)
    p.set_defaults(func=_bench)


def _register_serve_bench_and_gate(sub) -> None:
    p = sub.add_parser("serve-bench", help="launch one server, run every client variant of a plan, tear it down",
                       description="Launch the server of PLAN once (the command after -- must be the plan's own "
                                   "launch command, so the printed rule shows what runs), run each client variant "
                                   "with the benchmark, write each result atomically and always stop the server.")
    p.add_argument("--plan", required=True, help="plan JSON written by the workflow (server + clients + outputs)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("argv", nargs=argparse.REMAINDER, help="-- the server launch command")
    add_json_flag(p)
    p.set_defaults(func=_serve_bench)

    p = sub.add_parser("serve-launch", help="launch the target once, bench every variant of a launch plan in turn "
                       "(draft weights swapped between benches), check every swap, tear it down",
                       description="Run one launch plan (workflow rule launch_<id>): the command after -- must be "
                                   "the plan's own launch command. Before each bench the server's drafter checksum "
                                   "is compared with the file swapped in; a launch that swapped benches its first "
                                   "drafter again and refuses every result when the accept lengths differ beyond "
                                   "the repeats' spread. Results are written only when every check passed.")
    p.add_argument("--plan", required=True, help="launch plan JSON written by the workflow (rule launch_plan)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("argv", nargs=argparse.REMAINDER, help="-- the server launch command")
    add_json_flag(p)
    p.set_defaults(func=_serve_launch)

    p = sub.add_parser("probe-gate", aliases=["gate"], help="probe gate: fine-tune only if the probe's accept length is high enough")
    p.add_argument("results", nargs="+", help="probe benchmark result JSON files")
    p.add_argument("--min-accept-length", type=number(float, setting="gate.min_accept_length"), required=True)
    p.add_argument("--out", required=True)
    add_json_flag(p)
    p.set_defaults(func=_probe_gate)

    p = sub.add_parser("leak-check", help="refuse fine-tune data that holds a bench prompt (rule leak_check)",
                       description="Look for every prompt of the --bench files in every --data file (a whole "
                                   "message, or inside one for longer prompts); a leak is refused in one line, "
                                   "a clean check writes --out.")
    p.add_argument("--bench", nargs="+", required=True, help="the bench's prompt files ('default' = the shipped set)")
    p.add_argument("--data", nargs="+", required=True, help="the fine-tune data and the prompts it was generated from")
    p.add_argument("--out", required=True, help="the check's record (JSON)")
    add_json_flag(p)
    p.set_defaults(func=_leak_check)

    p = sub.add_parser("gated", help="run a command unless the gate is closed (then write explicit skipped outputs)")
    p.add_argument("--gate", help="gate decision JSON")
    p.add_argument("--unless-skipped", metavar="DIR", help="also skip when DIR holds a SKIPPED.json marker")
    p.add_argument("--skip-dir", action="append", help="folder to create with a SKIPPED.json when skipping")
    p.add_argument("--skip-file", action="append", help="JSON file to write {skipped, reason} to when skipping")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- the command")
    p.set_defaults(func=_gated)


def _register_breakeven(sub) -> None:
    b = sub.add_parser(
        "breakeven",
        help="break-even accept length: where measured drafters stand (--baseline FILE --drafter NAME=FILE, "
        "the breakeven rule) or what a tok/s goal needs (--baseline-tps X --cycle-ms C)",
        description="Throughput of speculation = accept length / cycle time; break-even accept length = X*C/1000. "
        "Measured form (as `draftlab standing`): read a baseline bench JSON and drafter bench JSONs and report "
        "each drafter's accept length against its break-even and every --target-tps. Calculator form: from "
        "--baseline-tps and --cycle-ms, print per target T what accept length and per-step acceptance it takes.",
    )
    b.add_argument("--baseline", metavar="JSON", help="bench JSON of plain decoding (measured form)")
    b.add_argument("--drafter", action="append", metavar="NAME=FILE", help="bench JSON of a drafter (measured form)")
    b.add_argument("--baseline-tps", type=number(float, above=0), help="plain decoding tok/s (X; calculator form)")
    b.add_argument("--cycle-ms", type=number(float, above=0), help="ms per verify cycle incl. drafting (C; calculator form)")
    b.add_argument("--num-steps", type=number(int, setting="speculative.num_steps"), default=None, help="draft steps per cycle (K)")
    b.add_argument("--target-tps", type=number(float, above=0), nargs="+", required=True, help="throughput goals (T)")
    b.add_argument("--step-acceptance", type=number(float, **FRACTION), default=None,
                   help="per-step acceptance P to forecast (calculator form)")
    b.add_argument("--out", default=None, help="write the result as JSON here")
    add_json_flag(b)
    b.set_defaults(func=_breakeven)

    s = sub.add_parser(
        "standing",
        help="where measured drafters stand against break-even and throughput goals (= breakeven --baseline FILE)",
        description="Read a baseline bench JSON and drafter bench JSONs; report each drafter's "
        "accept length against its break-even and against every --target-tps.",
    )
    s.add_argument("--baseline", required=True, help="bench JSON of plain decoding")
    s.add_argument("--drafter", action="append", required=True, metavar="NAME=FILE", help="bench JSON of a drafter")
    s.add_argument("--target-tps", type=number(float, above=0), nargs="+", required=True)
    s.add_argument("--num-steps", type=number(int, setting="speculative.num_steps"), default=None, help="K, to report the implied per-step acceptance")
    s.add_argument("--out", default=None, help="write the standing as JSON here")
    add_json_flag(s)
    s.set_defaults(func=_standing)


def _check_outputs(out: Path, csv_path: Path) -> None:
    """The result JSON and the per-request CSV: two different files, neither a folder."""
    if csv_path.resolve() == out.resolve():
        raise DraftlabError(f"{out}: the per-request CSV would overwrite the result JSON here; name --out *.json "
                            "or pass --csv FILE")
    for path in (out, csv_path):
        if path.is_dir():
            raise DraftlabError(f"{path}: is a folder; expected the path of a file to write")


def _bench(args: argparse.Namespace) -> int:
    from draftlab.benchmark.bench import human_summary, run_benchmark, write_results

    out = Path(args.out)
    csv_path = Path(args.csv) if args.csv else out.with_suffix(".csv")
    _check_outputs(out, csv_path)  # before the benchmark: its minutes are not spent on a result that cannot land
    result = run_benchmark(
        args.url,
        args.prompts,
        api=args.api,
        max_new_tokens=args.max_new_tokens,
        repeats=args.repeats,
        warmup=args.warmup,
        concurrency=args.concurrency,
        require_speculation=args.require_speculation,
        model=args.model,
        progress=not args.no_progress,
        measure_ttft=not args.no_ttft,
        ignore_eos=args.ignore_eos,
        limit=args.limit,
        ttft_limit=args.ttft_limit,
        request_timeout_s=args.timeout,
        num_steps=args.num_steps,
        category=args.category,
        sample_seed=args.sample_seed,
    )
    write_results(result, out, csv_path)
    emit(args, result.summary, lambda _: human_summary(result) + f"\nwrote {out} and {csv_path}")
    return 0


def _breakeven(args: argparse.Namespace) -> int:
    """The measured form (``--baseline FILE``, what the breakeven rule runs) or the calculator form."""
    measured = ("--baseline", "--drafter")
    calculator = ("--baseline-tps", "--cycle-ms", "--step-acceptance")
    given = {flag for flag in measured + calculator if getattr(args, flag[2:].replace("-", "_")) is not None}
    if given & set(measured) and given & set(calculator):
        raise DraftlabError(f"breakeven: {', '.join(sorted(given & set(measured)))} (measured) and "
                            f"{', '.join(sorted(given & set(calculator)))} (calculator) do not go together")
    if given & set(measured):
        missing = [flag for flag in measured if flag not in given]
        if missing:
            raise DraftlabError(f"breakeven: the measured form needs {' and '.join(missing)}")
        return _standing(args)
    missing = [flag for flag in ("--baseline-tps", "--cycle-ms") if flag not in given]
    if missing:
        raise DraftlabError("breakeven: give --baseline FILE --drafter NAME=FILE (measured drafters) or "
                            "--baseline-tps X --cycle-ms C (calculator); missing " + " and ".join(missing))
    from draftlab.benchmark.breakeven import breakeven_table

    table = breakeven_table(
        args.baseline_tps,
        args.cycle_ms,
        args.target_tps,
        num_steps=args.num_steps,
        step_acceptance=args.step_acceptance,
    )
    if args.out:
        write_json(args.out, table)
    emit(args, table, _human_breakeven)
    return 0


def _human_breakeven(t: dict) -> str:
    def f(v, fmt="{:.3f}"):
        return "unreachable" if v is None else fmt.format(v)

    lines = [
        f"baseline {t['baseline_tps']:g} tok/s at {t['cycle_ms']:g} ms/cycle: "
        f"break-even accept length {t['break_even_accept_length']:.3f}"
    ]
    for r in t["rows"]:
        lines.append(
            f"  {r['target_tps']:g} tok/s: accept length {r['required_accept_length']:.3f}, "
            f"step acceptance {r['required_step_acceptance']:.3f} (unbounded)"
            + (f", {f(r['required_step_acceptance_at_num_steps'])} at K={t['num_steps']}" if t["num_steps"] else "")
            + f", needs K >= {r['min_num_steps']}"
        )
    if "expected_tps" in t:
        lines.append(
            f"P={t['step_acceptance']:g}: expected accept length {t['expected_accept_length']:.3f}, "
            f"expected {t['expected_tps']:.1f} tok/s"
        )
    return "\n".join(lines)


def _standing(args: argparse.Namespace) -> int:
    from draftlab.benchmark.breakeven import drafter_standing

    drafters = {}
    for item in args.drafter:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise DraftlabError(f"--drafter: expected NAME=FILE, got {item!r}")
        if name in drafters:
            raise DraftlabError(f"--drafter: duplicate drafter name {name!r}")
        drafters[name] = path
    standing = drafter_standing(args.baseline, drafters, args.target_tps, num_steps=args.num_steps)
    if args.out:
        write_json(args.out, standing)
    emit(args, standing, _human_standing)
    return 0


def _human_standing(s: dict) -> str:
    from draftlab.benchmark.bench import is_verify_cycle

    lines = [f"baseline {s['baseline_tps']:.2f} tok/s"]
    for d in s["drafters"]:
        if d.get("skipped"):
            lines.append(f"  {d['name']}: skipped ({d.get('reason')})")
            continue
        lines.append(
            f"  {d['name']}: accept {d['accept_length']:.3f} vs break-even {d['break_even_accept_length']:.3f} "
            f"({'above' if d['above_break_even'] else 'BELOW'}), cycle {d['cycle_ms']:.2f} ms"
            + ("" if is_verify_cycle(d.get("cycle_ms_source"))
               else f" (from {d.get('cycle_ms_source')}: prefill and queueing included)")
        )
        for g in d["goals"]:
            lines.append(
                f"    {g['target_tps']:g} tok/s needs {g['required_accept_length']:.3f}: "
                f"{'met' if g['meets_by_accept_length'] else 'not met'}"
            )
    return "\n".join(lines)


def _plan_and_argv(args: argparse.Namespace, what: str):
    """The plan file of serve-bench / serve-launch and the launch command printed after ``--`` (or None)."""
    argv = list(args.argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    return read_json(args.plan, what), argv or None


def _serve_bench(args: argparse.Namespace) -> int:
    from draftlab.benchmark.serve_bench import run_plan

    plan, argv = _plan_and_argv(args, "serve-bench plan")
    summary = run_plan(plan, argv, progress=not args.no_progress)
    emit(args, summary, lambda s: f"{s['variant']} {s['spec_id']}: launches {s['launches']}"
         + (f", skipped: {s['reason']}" if s.get("skipped") else ""))
    return 0


def _serve_launch(args: argparse.Namespace) -> int:
    from draftlab.benchmark.serve_launch import run_launch

    plan, argv = _plan_and_argv(args, "serve-launch plan")
    summary = run_launch(plan, argv, progress=not args.no_progress)
    emit(args, summary, lambda s: f"launch {s['launch']}: {len(s['benches'])} bench(es), {len(s['swaps'])} swap(s)"
         + (f", fresh check {s['fresh_check']['fresh']:.3f} vs {s['fresh_check']['after_swaps']:.3f}"
            if s.get("fresh_check") else ""))
    return 0


def _probe_gate(args: argparse.Namespace) -> int:
    from draftlab.benchmark.probe_gate import gate_decision

    decision = gate_decision(args.results, args.min_accept_length)
    write_json(args.out, decision)
    print(f"probe gate: {decision['decision'].upper()}: {decision['reason']}", file=sys.stderr)
    emit(args, decision, lambda d: f"{d['decision']}: {d['reason']}")
    return 0


def _leak_check(args: argparse.Namespace) -> int:
    from draftlab.benchmark.leak_check import leak_check

    record = leak_check(args.bench, args.data, args.out)
    emit(args, record, lambda r: f"leak-check: no bench prompt of {r['bench_prompts']} in the fine-tune data")
    return 0


def _gated(args: argparse.Namespace) -> int:
    from draftlab.benchmark.probe_gate import run_gated

    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        print("error: gated: give the command after --", file=sys.stderr)
        return 2
    return run_gated(cmd, gate=args.gate, unless_skipped=args.unless_skipped,
                     skip_dirs=args.skip_dir or (), skip_files=args.skip_file or ())
