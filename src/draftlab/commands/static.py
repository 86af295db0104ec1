"""CLI for static analysis: inspect, compare, patch-config, acquire, fetch-config.

Every command prints a human summary (or JSON with ``--json``), can write its JSON document
atomically with ``--out`` where the result is not itself a folder, and a short Markdown summary with
``--summary FILE`` (what the Snakemake rules put beside the JSON). Library modules are imported
inside the handlers so ``draftlab inspect`` never loads torch or huggingface_hub.
"""

from __future__ import annotations

import argparse
from typing import Any

from draftlab.commands._common import add_json_flag, emit

CONFIG_KEYS = (
    "architectures",
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "num_hidden_layers",
    "vocab_size",
    "draft_vocab_size",
    "target_hidden_size",
    "max_position_embeddings",
    "rope_theta",
    "torch_dtype",
)


def register(sub) -> None:
    """Add inspect, compare, patch-config, acquire and fetch-config to the draftlab parser."""
    p = sub.add_parser("inspect", help="config + safetensors headers of a checkpoint (never reads weights)",
                       description="Show a checkpoint's config keys that matter for EAGLE-3 serving and every "
                                   "tensor's name, shape and dtype, read from the safetensors headers only (fast "
                                   "on multi-GB files; weights are never loaded).")
    p.add_argument("source", help="folder, .safetensors file or hf:ORG/NAME[@REV]")
    _common(p, out_help="also write the JSON document to FILE")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("compare", help="config diff and tensor-header diff of two checkpoints",
                       description="Compare two checkpoints: config keys that differ, tensors only in one, shape "
                                   "and dtype mismatches. 'compatible' means the headers agree (one can be served "
                                   "where the other was); it says nothing about the values: --hash-weights also "
                                   "hashes every shared tensor and lists those whose weights differ.")
    p.add_argument("a", help="folder, .safetensors file or hf:ORG/NAME[@REV]")
    p.add_argument("b", help="folder, .safetensors file or hf:ORG/NAME[@REV]")
    p.add_argument("--hash-weights", action="store_true",
                   help="also read and hash every shared tensor (reads all weights: slow on big checkpoints)")
    _common(p, out_help="also write the JSON document to FILE")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("patch-config", help="drafter folder with max_position_embeddings following the target")
    p.add_argument("--drafter", required=True, help="drafter folder")
    p.add_argument("--target", required=True, help="target config.json, folder or hf:ORG/NAME[@REV]")
    p.add_argument("--out", required=True, help="patched drafter folder to write")
    _common(p)
    p.set_defaults(func=cmd_patch_config)

    p = sub.add_parser("acquire", help="config.json + *.safetensors of a drafter into DIR (HF cache, offline ok)")
    p.add_argument("source", help="hf:ORG/NAME[@REV] or a local folder")
    p.add_argument("--out", required=True, help="folder to write (files linked + acquire.json)")
    p.add_argument("--revision", help="branch, tag or commit to pin (hf: sources)")
    _common(p)
    p.set_defaults(func=cmd_acquire)

    p = sub.add_parser("fetch-config", help="only the config.json of a (target) model")
    p.add_argument("source", help="hf:ORG/NAME[@REV], a folder or a config.json")
    p.add_argument("--out", required=True, help="config.json file to write")
    _common(p)
    p.set_defaults(func=cmd_fetch_config)


def _common(p: argparse.ArgumentParser, out_help: str | None = None) -> None:
    add_json_flag(p)
    if out_help:
        p.add_argument("--out", help=out_help)
    p.add_argument("--summary", metavar="FILE", help="also write a short Markdown summary to FILE")
    p.add_argument("--cache-dir", help="huggingface_hub cache folder (default: HF_HUB_CACHE / HF_HOME)")


def _finish(args: argparse.Namespace, doc: Any, markdown: str, json_out: str | None = None) -> int:
    from draftlab.fsutil import write_json, write_text

    if json_out:
        write_json(json_out, doc)
    if args.summary:
        write_text(args.summary, markdown.rstrip("\n") + "\n")
    emit(args, doc, lambda _: markdown)
    return 0


# ---------------------------------------------------------------------------- inspect / compare


def cmd_inspect(args: argparse.Namespace) -> int:
    from draftlab.checkpoint import inspect_checkpoint

    doc = inspect_checkpoint(args.source, cache_dir=args.cache_dir)
    return _finish(args, doc, inspect_markdown(args.source, doc), args.out)


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1000
    return f"{n}"


def inspect_markdown(source: str, doc: dict) -> str:
    cfg = doc["config"] or {}
    lines = [
        f"# inspect `{source}`",
        "",
        f"- format: **{doc['format']}**",
        f"- tensors: {len(doc['tensors'])}, parameters: {doc['num_params']:,}, data: {_fmt_bytes(doc['num_bytes'])}",
    ]
    if doc["config"] is None:
        lines.append("- config.json: none")
    else:
        for key in CONFIG_KEYS:
            if key in cfg:
                lines.append(f"- `{key}`: {cfg[key]}")
        aux = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        if aux is not None:
            lines.append(f"- `eagle_config.eagle_aux_hidden_state_layer_ids`: {aux}")
    lines += ["", "| tensor | shape | dtype |", "|---|---|---|"]
    for name, t in doc["tensors"].items():
        lines.append(f"| `{name}` | {t['shape']} | {t['dtype']} |")
    return "\n".join(lines)


def cmd_compare(args: argparse.Namespace) -> int:
    from draftlab.checkpoint import compare_checkpoints

    doc = compare_checkpoints(args.a, args.b, cache_dir=args.cache_dir, hash_weights=args.hash_weights)
    return _finish(args, doc, compare_markdown(args.a, args.b, doc), args.out)


def compare_markdown(a: str, b: str, doc: dict) -> str:
    verdict = "compatible (same tensor names and shapes)" if doc["compatible"] else "NOT compatible"
    lines = [f"# compare `{a}` (a) vs `{b}` (b)", "", f"- tensor headers: **{verdict}**"]
    differ = doc.get("weights_differ")
    if not doc.get("weights_hashed"):
        lines.append("- weights: not compared (headers only; --hash-weights hashes every shared tensor)")
    elif differ:
        lines.append(f"- weights: **{len(differ)} tensors differ**: {', '.join(differ)}")
    else:
        lines.append("- weights: identical (every shared tensor hashed)")
    lines.append(f"- only in a: {', '.join(doc['only_in_a']) or 'none'}")
    lines.append(f"- only in b: {', '.join(doc['only_in_b']) or 'none'}")
    for key, label in (("shape_mismatch", "shape"), ("dtype_mismatch", "dtype")):
        if doc[key]:
            lines.append(f"- {label} mismatches:")
            lines += [f"  - `{n}`: {va} vs {vb}" for n, (va, vb) in doc[key].items()]
        else:
            lines.append(f"- {label} mismatches: none")
    lines += ["", "## config diff (configs can lie: compatibility above is decided by tensors)", ""]
    if doc["config_diff"]:
        lines += ["| key | a | b |", "|---|---|---|"]
        lines += [f"| `{k}` | {va} | {vb} |" for k, (va, vb) in doc["config_diff"].items()]
    else:
        lines.append("identical")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- patch / acquire / fetch


def cmd_patch_config(args: argparse.Namespace) -> int:
    from draftlab.patch_config import patch_config

    doc = patch_config(args.drafter, args.target, args.out, cache_dir=args.cache_dir)
    return _finish(args, doc, patch_markdown(args.out, doc))


def patch_markdown(out: str, doc: dict) -> str:
    lines = [f"# patch-config → `{out}`", "", f"- drafter: `{doc['drafter']}`", f"- target: `{doc['target']}`"]
    if doc.get("target_text_config"):
        lines.append(f"- target config read through its nested `{doc['target_text_config']}`")
    lines.append(f"- weights linked, not copied: {', '.join(doc['linked'])}")
    lines += ["", "## changed", ""]
    if doc["changed"]:
        lines += [f"- `{c['field']}`: {c['before']} → {c['after']} ({c['reason']})" for c in doc["changed"]]
    else:
        lines.append("nothing (already patched)")
    lines += ["", "## left alone", ""]
    lines += [f"- `{c['field']}`: drafter {c['drafter']}, target {c['target']} — {c['reason']}" for c in doc["left_alone"]]
    return "\n".join(lines)


def cmd_acquire(args: argparse.Namespace) -> int:
    from draftlab.acquire import acquire

    doc = acquire(args.source, args.out, revision=args.revision, cache_dir=args.cache_dir)
    return _finish(args, doc, acquire_markdown(args.out, doc))


def acquire_markdown(out: str, doc: dict) -> str:
    lines = [
        f"# acquire `{doc['source']}` → `{out}`",
        "",
        f"- requested revision: {doc['requested_revision'] or '(default)'}",
        f"- resolved commit: {doc['resolved_commit'] or '(local folder)'}",
        f"- {'already present, skipped' if doc.get('skipped') else 'written'}; {_fmt_bytes(doc['num_bytes'])}",
        "",
        "| file | size | sha256 |",
        "|---|---|---|",
    ]
    lines += [f"| `{f['name']}` | {f['size']} | {f.get('sha256', '')} |" for f in doc["files"]]
    return "\n".join(lines)


def cmd_fetch_config(args: argparse.Namespace) -> int:
    from draftlab.acquire import fetch_config

    doc = fetch_config(args.source, args.out, cache_dir=args.cache_dir)
    md = "\n".join(
        [
            f"# fetch-config `{doc['source']}` → `{doc['out']}`",
            "",
            f"- resolved commit: {doc['resolved_commit'] or '(local)'}",
        ]
    )
    return _finish(args, doc, md)
