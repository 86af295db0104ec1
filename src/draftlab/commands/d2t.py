"""CLI for the draft vocabulary: ``draftlab d2t build|diff|coverage`` (rules vocab_mapping, d2t_diff, d2t_coverage).

Handlers are thin: parse arguments, call ``draftlab.static.d2t`` / ``draftlab.static.doctor``, write the JSON
(``--out``) and Markdown (``--summary``) records atomically, print a result, return the exit status.
"""

from __future__ import annotations

import argparse
from typing import Any

from draftlab.commands._common import add_json_flag, add_record_flags, emit, number, write_record
from draftlab.errors import DraftlabError
from draftlab.fsutil import write_json
from draftlab.textsafe import code


def register(sub) -> None:
    """Add ``d2t`` (with build/diff/coverage) to the draftlab parser."""
    d2t = sub.add_parser("d2t", help="draft vocabulary mapping: build, diff, coverage")
    d2t_sub = d2t.add_subparsers(dest="d2t_command", metavar="ACTION", required=True)

    p = d2t_sub.add_parser("build", help="build a mapping from token counts (SpecForge's rule)")
    p.add_argument("--tokens", required=True, help="tokens file: JSONL {input_ids, loss_mask} or .npy")
    p.add_argument("--target-vocab-size", type=number(int, minimum=1), required=True, help="target vocabulary size V")
    p.add_argument("--draft-vocab-size", type=number(int, minimum=1), required=True, help="draft vocabulary size M")
    p.add_argument("--out", required=True, help="mapping file to write (.safetensors with d2t, t2d)")
    p.add_argument("--report", help="also write the JSON report to this file")
    add_json_flag(p)
    p.set_defaults(func=_build)

    p = d2t_sub.add_parser("diff", help="compare two draft vocabularies (drafters or mapping files)")
    p.add_argument("a", help="drafter folder, hf: source, or mapping .safetensors")
    p.add_argument("b", help="drafter folder, hf: source, or mapping .safetensors")
    add_record_flags(p)
    p.set_defaults(func=_diff)

    p = d2t_sub.add_parser("coverage", help="share of tokens inside a drafter's draft vocabulary")
    p.add_argument("--drafter", required=True, help="drafter folder, hf: source, or mapping .safetensors")
    p.add_argument("--tokens", required=True, help="tokens file: JSONL {input_ids, loss_mask} or .npy")
    add_record_flags(p)
    p.set_defaults(func=_coverage)


# ---------------------------------------------------------------------------------------------
# d2t build


def _build(args: argparse.Namespace) -> int:
    from draftlab.static import d2t

    counts, first_seen = d2t.count_tokens(args.tokens, args.target_vocab_size, order=True)
    total = int(counts.sum())
    if total == 0:
        raise DraftlabError(f"{args.tokens}: no loss-masked tokens to count (every loss_mask is 0, or no samples); "
                            "a mapping built from nothing would be padding ids only")
    mapping = d2t.build_mapping(counts, args.draft_vocab_size, first_seen)
    distinct = int((counts > 0).sum())
    result = {
        "tokens": str(args.tokens),
        "out": str(args.out),
        "vocab_size": mapping.vocab_size,
        "draft_vocab_size": mapping.draft_vocab_size,
        "num_tokens": total,
        "distinct_ids": distinct,
        "padded_ids": max(0, mapping.draft_vocab_size - distinct),
        "coverage": d2t.coverage(mapping, counts),
    }
    meta = {k: result[k] for k in ("tokens", "num_tokens", "distinct_ids", "coverage")}
    meta["rule"] = "top-M by loss-masked count, ties to smaller id, pad with smallest unused ids"
    d2t.save_mapping(args.out, mapping, meta)
    if args.report:
        write_json(args.report, result)
    emit(args, result, lambda r: (
        f"wrote {r['out']}: {r['draft_vocab_size']} of {r['vocab_size']} ids from {r['num_tokens']} tokens "
        f"({r['distinct_ids']} distinct, {r['padded_ids']} padded); coverage {r['coverage']:.2%}"
    ))
    return 0


# ---------------------------------------------------------------------------------------------
# d2t diff


def _diff(args: argparse.Namespace) -> int:
    from draftlab.static import d2t

    a, b = d2t.load_mapping(args.a), d2t.load_mapping(args.b)
    result = {"a": args.a, "b": args.b, **d2t.diff_mappings(a, b)}
    write_record(args, result, _diff_markdown(result))
    emit(args, result, _diff_text)
    return 0


def _diff_text(r: dict[str, Any]) -> str:
    lines = [
        f"A: {r['a']}",
        f"B: {r['b']}",
        f"draft vocab size: {r['draft_vocab_size']}   target vocab size: {r['vocab_size']}",
        f"draft ids mapping to a different target id: {r['num_differing']}",
        f"target ids in both: {r['shared_target_ids']}   only in A: {r['only_in_a']}   only in B: {r['only_in_b']}",
    ]
    for ex in r["differing_examples"]:
        lines.append(f"  draft id {ex['draft_id']}: A -> {ex['a']}, B -> {ex['b']}")
    lines.append("identical" if r["identical"] else "mappings differ")
    return "\n".join(lines)


def _diff_markdown(r: dict[str, Any]) -> str:
    verdict = (
        "The two draft vocabularies are identical."
        if r["identical"]
        else f"**{r['num_differing']}** draft ids map to a different target id: `lm_head` rows are not "
        "interchangeable between these two without remapping."
    )
    return (
        "# d2t diff\n\n"
        f"- A: {code(r['a'])}\n- B: {code(r['b'])}\n\n"
        "| draft vocab | target vocab | differing draft ids | shared target ids | only in A | only in B |\n"
        "|---|---|---|---|---|---|\n"
        f"| {r['draft_vocab_size']} | {r['vocab_size']} | {r['num_differing']} | {r['shared_target_ids']} "
        f"| {r['only_in_a']} | {r['only_in_b']} |\n\n{verdict}\n"
    )


# ---------------------------------------------------------------------------------------------
# d2t coverage


def _coverage(args: argparse.Namespace) -> int:
    from draftlab.static import d2t

    mapping = d2t.load_mapping(args.drafter)
    counts = d2t.count_tokens(args.tokens, mapping.vocab_size)
    total = int(counts.sum())
    ids = mapping.target_ids()
    ids = ids[(ids >= 0) & (ids < mapping.vocab_size)].unique()
    best = d2t.coverage(d2t.build_mapping(counts, mapping.draft_vocab_size), counts)
    result = {
        "drafter": args.drafter,
        "tokens": args.tokens,
        "vocab_size": mapping.vocab_size,
        "draft_vocab_size": mapping.draft_vocab_size,
        "num_tokens": total,
        "covered_tokens": int(counts[ids].sum()),
        "coverage": d2t.coverage(mapping, counts),
        "distinct_ids": int((counts > 0).sum()),
        "distinct_ids_covered": int((counts[ids] > 0).sum()),
        "best_coverage": best,
    }
    write_record(args, result, _coverage_markdown(result))
    emit(args, result, lambda r: (
        f"coverage {r['coverage']:.2%} ({r['covered_tokens']} of {r['num_tokens']} tokens in the "
        f"{r['draft_vocab_size']}-id draft vocabulary); a mapping rebuilt from these tokens would reach "
        f"{r['best_coverage']:.2%}"
    ))
    return 0


def _coverage_markdown(r: dict[str, Any]) -> str:
    return (
        "# d2t coverage\n\n"
        f"Drafter {code(r['drafter'])} on tokens {code(r['tokens'])}.\n\n"
        "| tokens | in draft vocab | coverage | best possible with this draft vocab size |\n"
        "|---|---|---|---|\n"
        f"| {r['num_tokens']} | {r['covered_tokens']} | {r['coverage']:.2%} | {r['best_coverage']:.2%} |\n\n"
        "Coverage is an upper bound on per-token acceptance: the drafter cannot propose an id "
        "outside its draft vocabulary.\n"
    )


