"""CLI: ``demo-models`` (offline demo pair), ``generate`` (target-written data), ``specforge-command``
and ``import-specforge`` (the SpecForge training backend)."""

from __future__ import annotations

import argparse

from draftlab.commands._common import add_json_flag, emit
from draftlab.errors import DraftlabError


def register(sub) -> None:
    """Add this area's subcommands to the draftlab parser."""
    p = sub.add_parser("demo-models", help="build the offline demo target pair and v1 drafter as HF repos")
    p.add_argument("--out", required=True, help="folder to build in (an HF cache lands in OUT/hf_cache)")
    p.add_argument("--size", choices=["smoke", "default", "gpu"], default="default",
                   help="smoke / default: CPU-sized; gpu: a ~110M-parameter target (build it with --device cuda)")
    p.add_argument("--device", default="cpu",
                   help="cpu (default; 1 torch thread per process, reproducible) or cuda / cuda:N")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1,
                   help="build stages that may run at once (>= 2: target v2 and the v1 drafter train side by "
                        "side); every process uses one torch thread, so the weights do not depend on it")
    p.add_argument("--force", action="store_true", help="rebuild even when the manifest matches")
    p.add_argument("--log", default=None, help="append one line per finished stage to this file")
    add_json_flag(p)
    p.set_defaults(func=_demo_models)

    g = sub.add_parser("generate", help="run the target over prompts and write JSONL conversations")
    g.add_argument("--target", required=True, help="target model folder (transformers)")
    g.add_argument("--prompts", required=True, help="JSONL ({'prompt'|'text'|'messages'}) or text, one per line")
    g.add_argument("--out", required=True, help="output JSONL of {'messages': [...]} conversations")
    g.add_argument("--max-new-tokens", type=int, default=128)
    mode = g.add_mutually_exclusive_group()
    mode.add_argument("--greedy", action="store_true", help="greedy decoding (the default)")
    mode.add_argument("--temperature", type=float, default=None, help="sample at this temperature")
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=0, help="prompt i is sampled under seed+i")
    g.add_argument("--limit", type=int, default=None, help="only the first N prompts")
    g.add_argument("--device", default=None, help="auto, cpu, cuda or cuda:N (default: cpu)")
    g.add_argument("--batch-size", type=int, default=1,
                   help="greedy prompts decoded together, left-padded (default 1; a GPU wants 32-64)")
    g.add_argument("--trust-remote-code", action="store_true")
    add_json_flag(g)
    g.set_defaults(func=_generate)

    s = sub.add_parser("specforge-command",
                       help="write the SpecForge 0.2.0 run config of an arm and print `specforge train --config FILE`")
    s.add_argument("--config", required=True,
                   help="a job file (YAML/JSON, keys of draftlab.specforge.SpecForgeJob) "
                        "or an experiment config, e.g. the merged one the pipeline writes (then give the paths below)")
    s.add_argument("--target", help="target model path as SpecForge sees it (experiment config only)")
    s.add_argument("--draft-config", help="drafter config.json (experiment config only)")
    s.add_argument("--data", help="training JSONL conversations (experiment config only)")
    s.add_argument("--tokens", help="draftlab tokens.jsonl of the same data: its sample count sets num_epochs")
    s.add_argument("--mapping", help="vocab mapping to pin through model.vocab_mapping_path (experiment config only)")
    s.add_argument("--output-dir", help="SpecForge output_dir: checkpoints, run config, job file (experiment config only)")
    s.add_argument("--ckpt-dir", help="warm-start drafter folder: model.draft_checkpoint_path (experiment config only)")
    s.add_argument("--specforge-dir", default=None,
                   help="unused since SpecForge 0.2.0: the wheel carries the `specforge` entry point")
    s.add_argument("--chat-template", default=None, help="SpecForge template name (default: train.chat_template)")
    s.add_argument("--target-backend", default="sglang", choices=["sglang"],
                   help="SpecForge 0.2.0 captures through SGLang only (model.target_backend)")
    s.add_argument("--dry-run", action="store_true", help="print the command and run config only; write nothing")
    add_json_flag(s)
    s.set_defaults(func=_specforge_command)

    i = sub.add_parser("import-specforge", help="turn a SpecForge checkpoint into a draftlab drafter folder")
    i.add_argument("src", help="SpecForge output_dir (latest <run_id>-step<N>/), one step folder, or an export")
    i.add_argument("--out", required=True)
    i.add_argument("--expect-mapping", default=None,
                   help="mapping pinned for the run: fail if the checkpoint's d2t differs")
    i.add_argument("--draft-config", default=None,
                   help="drafter config.json the run trained (default: the one in the run's job file)")
    i.add_argument("--expect-steps", type=int, default=None,
                   help="fail unless the checkpoint is at this optimizer step (train.steps)")
    add_json_flag(i)
    i.set_defaults(func=_import_specforge)


def _demo_models(args: argparse.Namespace) -> int:
    from draftlab.demo import build_demo_models

    result = build_demo_models(args.out, size=args.size, seed=args.seed, threads=args.threads, force=args.force,
                               log_file=args.log, device=args.device)
    emit(args, result, lambda r: "\n".join(f"{k}: {v}" for k, v in r.items()))
    return 0


def _generate(args: argparse.Namespace) -> int:
    from draftlab.generate import generate

    result = generate(
        args.target, args.prompts, args.out, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
        top_p=args.top_p, seed=args.seed, limit=args.limit, device=args.device,
        trust_remote_code=args.trust_remote_code, batch_size=args.batch_size,
    )
    emit(args, result, lambda r: (f"wrote {r['prompts']} conversations ({r['generated_tokens']} tokens, "
                                  f"{r['mode']}) to {r['out']} in {r['seconds']} s"))
    return 0


def _specforge_command(args: argparse.Namespace) -> int:
    import shlex

    from draftlab import specforge

    data = specforge.read_job_file(args.config)
    if "experiment" in data:
        need = {"--target": args.target, "--draft-config": args.draft_config, "--data": args.data,
                "--output-dir": args.output_dir}
        missing = [k for k, v in need.items() if not v]
        if missing:
            raise DraftlabError(f"{args.config}: an experiment config needs {', '.join(missing)} on the command line")
        from draftlab.config import load_config

        cfg = load_config(args.config)  # the merged JSON the pipeline writes, or a YAML file
        if args.chat_template:
            cfg["train"]["chat_template"] = args.chat_template
        job = specforge.job_from_experiment(
            cfg, target_model_path=args.target, draft_model_config=args.draft_config, train_data_path=args.data,
            output_dir=args.output_dir, vocab_mapping=args.mapping, ckpt_dir=args.ckpt_dir,
            num_samples=_count_samples(args.tokens) if args.tokens else None,
        )
    else:
        job = specforge.job_from_mapping(data, str(args.config))
    result = specforge.prepare(job, write=not args.dry_run)
    emit(args, result, lambda r: "\n".join([shlex.join(r["argv"])] + [f"warning: {w}" for w in r["warnings"]]))
    return 0


def _count_samples(tokens: str) -> int:
    """Training samples in a tokens JSONL: lines with at least one loss-masked token (as SpecForge keeps them)."""
    import json
    from pathlib import Path

    n = 0
    path = Path(tokens)
    if not path.is_file():
        raise DraftlabError(f"{path}: tokens file not found (key --tokens)")
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                row = json.loads(line)
                mask = row.get("loss_mask")
                n += bool(mask is None or any(mask))
    return n


def _import_specforge(args: argparse.Namespace) -> int:
    from draftlab.specforge_import import import_checkpoint

    result = import_checkpoint(args.src, args.out, expect_mapping=args.expect_mapping,
                               draft_config=args.draft_config, expect_steps=args.expect_steps)
    emit(args, result, lambda r: f"imported {r['source']} -> {r['out']} (embeddings stripped: "
                                 f"{r['embeddings_stripped']}, mapping check: {r['mapping_check']})")
    return 0
