"""CLI for static analysis: inspect, compare, patch-config, doctor (``d2t`` has its own module).

Every command prints a human summary (or JSON with ``--json``), can write its JSON document
atomically with ``--out`` where the result is not itself a folder, and a short Markdown summary with
``--summary FILE`` (what the Snakemake rules put beside the JSON). Library modules are imported
inside the handlers so ``draftlab inspect`` never loads torch or huggingface_hub.
"""

from __future__ import annotations

import argparse

from draftlab.commands._common import add_output_flags, add_record_flags, emit, finish, fmt_bytes, write_record
from draftlab.textsafe import code, md

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
    """Add inspect, compare, patch-config and doctor to the draftlab parser."""
    p = sub.add_parser("inspect", help="config + safetensors headers of a checkpoint (never reads weights)",
                       description="Show a checkpoint's config keys that matter for EAGLE-3 serving and every "
                                   "tensor's name, shape and dtype, read from the safetensors headers only (fast "
                                   "on multi-GB files; weights are never loaded).")
    p.add_argument("source", help="folder, .safetensors file or hf:ORG/NAME[@REV]")
    add_output_flags(p, out_help="also write the JSON document to FILE")
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
    add_output_flags(p, out_help="also write the JSON document to FILE")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("patch-config", help="drafter folder with max_position_embeddings following the target")
    p.add_argument("--drafter", required=True, help="drafter folder")
    p.add_argument("--target", required=True, help="target config.json, folder or hf:ORG/NAME[@REV]")
    p.add_argument("--out", required=True, help="patched drafter folder to write")
    add_output_flags(p)
    p.set_defaults(func=cmd_patch_config)

    p = sub.add_parser("doctor", help="preflight checks of a drafter against its target",
                       description="Check, before a server is launched, that an EAGLE-3 drafter fits its target: "
                                   "d2t present and valid, vocab and hidden sizes, context length, aux layer ids, "
                                   "the speculative algorithm, missing or mis-shaped tensors, non-finite weights, "
                                   "dtype and rope. Exits 1 when any finding is an error.")
    p.add_argument("--drafter", required=True, help="drafter folder, .safetensors file or hf: source")
    p.add_argument("--target", required=True, help="target config.json, folder or hf: source")
    p.add_argument("--algorithm", default="EAGLE3", help="speculative algorithm it will be served with")
    p.add_argument("--backend", default="sglang", choices=("builtin", "sglang", "vllm"),
                   help="server it will be served with (vLLM reads aux layer ids from another config key)")
    p.add_argument("--cache-dir", help="huggingface_hub cache folder for hf: sources (default: HF_HUB_CACHE / HF_HOME)")
    p.add_argument("--serve-only", action="store_true",
                   help="a drafter only served, never trained by draftlab (the reference): the limits of draftlab's "
                        "own trainer and engine are not checked where another server serves it")
    add_record_flags(p)
    p.set_defaults(func=_doctor)


def cmd_inspect(args: argparse.Namespace) -> int:
    from draftlab.static.inspect import inspect_checkpoint

    doc = inspect_checkpoint(args.source, cache_dir=args.cache_dir)
    return finish(args, doc, inspect_markdown(args.source, doc), args.out)


def inspect_markdown(source: str, doc: dict) -> str:
    cfg = doc["config"] or {}
    lines = [
        f"# inspect {code(source)}",
        "",
        f"- format: **{md(doc['format'])}**",
        f"- tensors: {len(doc['tensors'])}, parameters: {doc['num_params']:,}, data: {fmt_bytes(doc['num_bytes'])}",
    ]
    if doc["config"] is None:
        lines.append("- config.json: none")
    else:
        for key in CONFIG_KEYS:
            if key in cfg:
                lines.append(f"- `{key}`: {md(cfg[key])}")
        aux = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
        if aux is not None:
            lines.append(f"- `eagle_config.eagle_aux_hidden_state_layer_ids`: {md(aux)}")
    lines += ["", "| tensor | shape | dtype |", "|---|---|---|"]
    for name, t in doc["tensors"].items():
        lines.append(f"| {code(name)} | {md(t['shape'])} | {md(t['dtype'])} |")
    return "\n".join(lines)


def cmd_compare(args: argparse.Namespace) -> int:
    from draftlab.static.compare import compare_checkpoints

    doc = compare_checkpoints(args.a, args.b, cache_dir=args.cache_dir, hash_weights=args.hash_weights)
    return finish(args, doc, compare_markdown(args.a, args.b, doc), args.out)


def compare_markdown(a: str, b: str, doc: dict) -> str:
    verdict = "compatible (same tensor names and shapes)" if doc["compatible"] else "NOT compatible"
    lines = [f"# compare {code(a)} (a) vs {code(b)} (b)", "", f"- tensor headers: **{verdict}**"]
    differ = doc.get("weights_differ")
    if not doc.get("weights_hashed"):
        lines.append("- weights: not compared (headers only; --hash-weights hashes every shared tensor)")
    elif differ:
        lines.append(f"- weights: **{len(differ)} tensors differ**: {_names(differ)}")
    else:
        lines.append("- weights: identical (every shared tensor hashed)")
    lines.append(f"- only in a: {_names(doc['only_in_a']) or 'none'}")
    lines.append(f"- only in b: {_names(doc['only_in_b']) or 'none'}")
    for key, label in (("shape_mismatch", "shape"), ("dtype_mismatch", "dtype")):
        if doc[key]:
            lines.append(f"- {label} mismatches:")
            lines += [f"  - {code(n)}: {md(va)} vs {md(vb)}" for n, (va, vb) in doc[key].items()]
        else:
            lines.append(f"- {label} mismatches: none")
    lines += ["", "## config diff (configs can lie: compatibility above is decided by tensors)", ""]
    if doc["config_diff"]:
        lines += ["| key | a | b |", "|---|---|---|"]
        lines += [f"| {code(k)} | {md(va)} | {md(vb)} |" for k, (va, vb) in doc["config_diff"].items()]
    else:
        lines.append("identical")
    return "\n".join(lines)


def _names(names) -> str:
    """Tensor or file names read from a checkpoint, each escaped, at most 50 of them."""
    names = list(names)
    more = f", ... ({len(names) - 50} more)" if len(names) > 50 else ""
    return ", ".join(code(n) for n in names[:50]) + more


def cmd_patch_config(args: argparse.Namespace) -> int:
    from draftlab.static.patch_config import patch_config

    doc = patch_config(args.drafter, args.target, args.out, cache_dir=args.cache_dir)
    return finish(args, doc, patch_markdown(args.out, doc))


def patch_markdown(out: str, doc: dict) -> str:
    lines = [f"# patch-config → {code(out)}", "", f"- drafter: {code(doc['drafter'])}", f"- target: {code(doc['target'])}"]
    if doc.get("target_text_config"):
        lines.append(f"- target config read through its nested {code(doc['target_text_config'])}")
    lines.append(f"- weights linked, not copied: {_names(doc['linked'])}")
    lines += ["", "## changed", ""]
    if doc["changed"]:
        lines += [f"- {code(c['field'])}: {md(c['before'])} → {md(c['after'])} ({md(c['reason'], 500)})"
                  for c in doc["changed"]]
    else:
        lines.append("nothing (already patched)")
    lines += ["", "## left alone", ""]
    lines += [f"- {code(c['field'])}: drafter {md(c['drafter'])}, target {md(c['target'])} — {md(c['reason'], 500)}"
              for c in doc["left_alone"]]
    return "\n".join(lines)


def _doctor(args: argparse.Namespace) -> int:
    from draftlab.static import doctor

    report = doctor.run_doctor(args.drafter, args.target, algorithm=args.algorithm, backend=args.backend,
                               cache_dir=args.cache_dir, serve_only=args.serve_only)
    write_record(args, report, doctor.to_markdown(report))
    emit(args, report, doctor.to_text)
    return 1 if report["errors"] else 0
