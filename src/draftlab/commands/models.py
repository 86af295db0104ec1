"""CLI for the models layer: ``acquire``, ``fetch-config``, ``demo-models``, ``resolve-target``.

Each command names its rule (``acquire``, ``demo_models``, ``resolve_target``) and its module in
``draftlab.models``; ``resolve-model`` stays as an alias of ``resolve-target``.
"""

from __future__ import annotations

import argparse

from draftlab.commands._common import SEED, add_json_flag, add_output_flags, emit, finish, fmt_bytes, number
from draftlab.settings.model import schema_default
from draftlab.textsafe import code, md


def register(sub) -> None:
    """acquire, fetch-config, demo-models, resolve-target (alias resolve-model)."""
    p = sub.add_parser("acquire", help="config.json + *.safetensors of a drafter into DIR (HF cache, offline ok)")
    p.add_argument("source", help="hf:ORG/NAME[@REV] or a local folder")
    p.add_argument("--out", required=True, help="folder to write (files linked + acquire.json)")
    p.add_argument("--revision", help="branch, tag or commit to pin (hf: sources)")
    add_output_flags(p)
    p.set_defaults(func=cmd_acquire)

    p = sub.add_parser("fetch-config", help="only the config.json of a (target) model")
    p.add_argument("source", help="hf:ORG/NAME[@REV], a folder or a config.json")
    p.add_argument("--out", required=True, help="config.json file to write")
    add_output_flags(p)
    p.set_defaults(func=cmd_fetch_config)

    p = sub.add_parser("demo-models", help="build the offline demo target pair and v1 drafter as HF repos")
    p.add_argument("--out", required=True, help="folder to build in (an HF cache lands in OUT/hf_cache)")
    p.add_argument("--size", choices=["smoke", "default", "gpu"], default=schema_default("size"),
                   help="smoke / default: CPU-sized; gpu: a ~110M-parameter target (build it with --device cuda)")
    p.add_argument("--device", default=schema_default("demo.device"),
                   help="cpu (default: the config's demo.device; 1 torch thread per process, reproducible) or cuda / cuda:N")
    p.add_argument("--seed", type=number(int, **SEED), default=0)
    p.add_argument("--threads", type=number(int, minimum=1), default=1,
                   help="build stages that may run at once (>= 2: target v2 and the v1 drafter train side by "
                        "side); every process uses one torch thread, so the weights do not depend on it")
    p.add_argument("--force", action="store_true", help="rebuild even when the manifest matches")
    p.add_argument("--log", default=None, help="append one line per finished stage to this file")
    add_json_flag(p)
    p.set_defaults(func=_demo_models)

    p = sub.add_parser("resolve-target", aliases=["resolve-model"], help="link a local folder holding the target (hf: sources downloaded at a revision)")
    p.add_argument("source")
    p.add_argument("--revision")
    p.add_argument("--link", required=True, help="symlink to create (a fixed path rules can print)")
    p.add_argument("--out", required=True, help="JSON record: resolved commit, weights sha256")
    add_json_flag(p)
    p.set_defaults(func=_resolve_target)


def cmd_acquire(args: argparse.Namespace) -> int:
    from draftlab.models.acquire import acquire

    doc = acquire(args.source, args.out, revision=args.revision, cache_dir=args.cache_dir)
    return finish(args, doc, acquire_markdown(args.out, doc))


def acquire_markdown(out: str, doc: dict) -> str:
    lines = [
        f"# acquire {code(doc['source'])} → {code(out)}",
        "",
        f"- requested revision: {md(doc['requested_revision'] or '(default)')}",
        f"- resolved commit: {md(doc['resolved_commit'] or '(local folder)')}",
        f"- {'already present, skipped' if doc.get('skipped') else 'written'}; {fmt_bytes(doc['num_bytes'])}",
        "",
        "| file | size | sha256 |",
        "|---|---|---|",
    ]
    lines += [f"| {code(f['name'])} | {md(f['size'])} | {md(f.get('sha256', ''))} |" for f in doc["files"]]
    return "\n".join(lines)


def cmd_fetch_config(args: argparse.Namespace) -> int:
    from draftlab.models.acquire import fetch_config

    doc = fetch_config(args.source, args.out, cache_dir=args.cache_dir)
    summary = "\n".join(
        [
            f"# fetch-config {code(doc['source'])} → {code(doc['out'])}",
            "",
            f"- resolved commit: {md(doc['resolved_commit'] or '(local)')}",
        ]
    )
    return finish(args, doc, summary)


def _demo_models(args: argparse.Namespace) -> int:
    from draftlab.training.demo_models import build_demo_models

    result = build_demo_models(args.out, size=args.size, seed=args.seed, threads=args.threads, force=args.force,
                               log_file=args.log, device=args.device)
    emit(args, result, lambda r: "\n".join(f"{k}: {v}" for k, v in r.items()))
    return 0


def _resolve_target(args: argparse.Namespace) -> int:
    from draftlab.models.resolve_target import resolve_model

    record = resolve_model(args.source, args.revision, args.link, args.out)
    emit(args, record, lambda r: f"{r['source']} -> {r['folder']} (commit {r['resolved_commit']})")
    return 0
