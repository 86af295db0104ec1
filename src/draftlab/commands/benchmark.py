"""``draftlab bench``, ``draftlab breakeven`` and ``draftlab standing``: measure, then decide."""

from __future__ import annotations

import argparse
from pathlib import Path

from draftlab.commands._common import add_json_flag, emit
from draftlab.errors import DraftlabError


def register(sub) -> None:
    """Add this area's subcommands to the draftlab parser."""
    p = sub.add_parser(
        "bench",
        help="benchmark a running server: output tok/s, accept length, cycle time, TTFT",
        description="Send a prompt set to a running server (builtin/SGLang /generate, or vLLM "
        "/v1/completions + /metrics) and write per-request rows and a summary as JSON and CSV.",
    )
    p.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:30000")
    p.add_argument("--prompts", required=True, help="JSONL prompt set, or 'default' for the shipped set")
    p.add_argument("--api", choices=("sglang", "vllm"), default="sglang", help="server protocol (builtin = sglang)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3, help="timed passes over the prompt set")
    p.add_argument("--warmup", type=int, default=1, help="unrecorded requests before timing")
    p.add_argument("--concurrency", type=int, default=1, help="requests in flight at once")
    p.add_argument("--limit", type=int, default=None, help="use only the first N prompts")
    p.add_argument("--model", default=None, help="vLLM model name (default: first of /v1/models)")
    p.add_argument("--ignore-eos", action="store_true", help="always generate --max-new-tokens tokens")
    p.add_argument("--no-ttft", action="store_true", help="skip the streaming time-to-first-token pass")
    p.add_argument("--timeout", type=float, default=600.0,
                   help="seconds for each whole request (connect, send, headers and body together)")
    p.add_argument(
        "--require-speculation",
        action="store_true",
        help="fail (and write nothing) unless the server reports speculative verification",
    )
    p.add_argument("--out", required=True, help="result JSON")
    p.add_argument("--csv", default=None, help="per-request CSV (default: --out with .csv suffix)")
    p.add_argument("--no-progress", action="store_true")
    add_json_flag(p)
    p.set_defaults(func=_bench)

    b = sub.add_parser(
        "breakeven",
        help="accept length / per-step acceptance needed to beat plain decoding or hit a tok/s goal",
        description="Throughput of speculation = accept length / cycle time. Prints the break-even "
        "accept length (X*C/1000) and, per target T, what accept length and per-step acceptance it takes.",
    )
    b.add_argument("--baseline-tps", type=float, required=True, help="plain decoding tok/s (X)")
    b.add_argument("--cycle-ms", type=float, required=True, help="ms per verify cycle incl. drafting (C)")
    b.add_argument("--num-steps", type=int, default=None, help="draft steps per cycle (K)")
    b.add_argument("--target-tps", type=float, nargs="+", required=True, help="throughput goals (T)")
    b.add_argument("--step-acceptance", type=float, default=None, help="per-step acceptance P to forecast")
    add_json_flag(b)
    b.set_defaults(func=_breakeven)

    s = sub.add_parser(
        "standing",
        help="where measured drafters stand against break-even and throughput goals",
        description="Read a baseline bench JSON and drafter bench JSONs; report each drafter's "
        "accept length against its break-even and against every --target-tps.",
    )
    s.add_argument("--baseline", required=True, help="bench JSON of plain decoding")
    s.add_argument("--drafter", action="append", required=True, metavar="NAME=FILE", help="bench JSON of a drafter")
    s.add_argument("--target-tps", type=float, nargs="+", required=True)
    s.add_argument("--num-steps", type=int, default=None, help="K, to report the implied per-step acceptance")
    s.add_argument("--out", default=None, help="write the standing as JSON here")
    add_json_flag(s)
    s.set_defaults(func=_standing)


def _bench(args: argparse.Namespace) -> int:
    from draftlab.bench import human_summary, run_benchmark, write_results

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
        request_timeout_s=args.timeout,
    )
    out = Path(args.out)
    csv_path = Path(args.csv) if args.csv else out.with_suffix(".csv")
    write_results(result, out, csv_path)
    emit(args, result.summary, lambda _: human_summary(result) + f"\nwrote {out} and {csv_path}")
    return 0


def _breakeven(args: argparse.Namespace) -> int:
    from draftlab.breakeven import breakeven_table

    table = breakeven_table(
        args.baseline_tps,
        args.cycle_ms,
        args.target_tps,
        num_steps=args.num_steps,
        step_acceptance=args.step_acceptance,
    )
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
    from draftlab.breakeven import drafter_standing
    from draftlab.fsutil import write_json

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
    from draftlab.bench import is_verify_cycle

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
