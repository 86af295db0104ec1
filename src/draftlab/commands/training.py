"""CLI for the training layer: ``generate-data`` (alias ``generate``), ``tokenize``, ``dump-hidden-states``,
``train``, ``eval-drafter`` (the builtin trainer) and ``specforge-command``, ``import-specforge``
(the SpecForge backend)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys
from pathlib import Path

from draftlab.commands._common import FRACTION, SEED, add_json_flag, emit, number
from draftlab.errors import DraftlabError
from draftlab.settings.model import schema_default
from draftlab.datagen.answerers import TURN_MODES
from draftlab.fsutil import parse_json_text, read_json, write_json
from draftlab.settings.config import load_config, read_yaml
from draftlab.training.config import ATTENTION_CHOICES, INIT_MODES, VOCAB_MODES, TrainConfig
from draftlab.training.config import default as train_default


def register(sub) -> None:
    """Add this area's subcommands to the draftlab parser."""
    for add in (_add_tokenize, _add_dump, _add_train, _add_eval, _add_generate_data, _add_specforge, _add_capture):
        add(sub)


def _add_tokenize(sub) -> None:
    """tokenize: data -> tokens.jsonl with the target's tokenizer."""
    p = sub.add_parser("tokenize", help="tokenize training data with the target's tokenizer (tokens.jsonl)")
    p.add_argument("--target", required=True, help="target model folder (its tokenizer is used)")
    p.add_argument("--data", required=True, help="JSONL conversations / {'text'} lines, or a plain text file")
    p.add_argument("--out", required=True, help="tokens.jsonl to write")
    p.add_argument("--max-length", type=number(int, minimum=1), default=train_default("max_length"))
    p.add_argument("--trust-remote-code", action="store_true")
    add_json_flag(p)
    p.set_defaults(func=_tokenize)

    p = sub.add_parser("token-check", help="render every stored conversation as training renders it and compare each "
                                           "assistant turn with the ids the target emitted (rate of exact turns, the "
                                           "first mismatch decoded); below --min-match: one error line, exit 2")
    p.add_argument("--target", required=True, help="target model folder (its tokenizer and chat template)")
    p.add_argument("--data", required=True, help="the generated conversations (assistant turns with token_ids)")
    p.add_argument("--out", help="record JSON to write (written before a floor refuses the run)")
    p.add_argument("--rendering", choices=["tokenize", "text"], default="tokenize",
                   help="tokenize: draftlab tokenize's (the builtin trainer); text: the conversation's text tokenized "
                        "again, as SpecForge's capture does")
    p.add_argument("--sample", type=number(int, minimum=1), default=None, help="check a seeded sample of N "
                                                                             "conversations (default: every one)")
    p.add_argument("--min-match", type=number(float, minimum=0), default=1.0,
                   help="the floor of exact turns (data.min_token_match)")
    p.add_argument("--trust-remote-code", action="store_true")
    add_json_flag(p)
    p.set_defaults(func=_token_check)


def _add_dump(sub) -> None:
    """dump-hidden-states: the target's aux hidden states for offline training."""
    p = sub.add_parser("dump-hidden-states", help="run the target once and store aux hidden states (bf16 shards)")
    p.add_argument("--target", required=True)
    p.add_argument("--tokens", required=True, help="tokens.jsonl")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--store", choices=["last_hidden", "logits"], default="last_hidden",
                   help="keep the target's last hidden state (logits recomputed with its lm_head) or its logits")
    p.add_argument("--drafter", help="drafter folder whose eagle_aux_hidden_state_layer_ids to use")
    p.add_argument("--aux-layer-ids", help="comma-separated output-of-layer ids, -1 = embeddings (default: the layers "
                   "SGLang feeds the drafter on this target, else 1,N/2-1,N-4)")
    p.add_argument("--max-length", type=number(int, minimum=1), default=None)
    p.add_argument("--shard-samples", type=number(int, minimum=1), default=256)
    p.add_argument("--device")
    add_json_flag(p)
    p.set_defaults(func=_dump)


def _add_train(sub) -> None:
    """train: the builtin TTT trainer; every default is TrainConfig's (the config's train.<key> where it has one)."""
    p = _add_train_inputs(sub)
    _add_train_optimisation(p)
    _add_train_run(p)


def _add_train_inputs(sub) -> argparse.ArgumentParser:
    """train's inputs: target, data (one of three forms), initialisation, vocab mapping."""
    p = sub.add_parser("train", help="train an EAGLE-3 drafter with the builtin TTT trainer (torchrun-ready)")
    p.add_argument("--target", required=True, help="target model folder")
    p.add_argument("--out", required=True, help="run folder (drafter/, metrics.csv, validation.json, summary.json)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--tokens", help="tokens.jsonl from draftlab tokenize")
    src.add_argument("--data", help="raw training data (tokenized on the fly)")
    src.add_argument("--hidden-states", help="folder from draftlab dump-hidden-states (offline features)")
    p.add_argument("--vocab-mapping", help="d2t/t2d mapping file (default: built from the data)")
    p.add_argument("--init", choices=INIT_MODES, default=train_default("init"))
    p.add_argument("--checkpoint", help="drafter folder to start from (--init checkpoint)")
    p.add_argument("--vocab-mode", choices=VOCAB_MODES, default=train_default("vocab_mode"))
    p.add_argument("--draft-vocab-size", type=number(int, minimum=1), help="scratch without --vocab-mapping (default 32000)")
    return p


def _add_train_optimisation(p: argparse.ArgumentParser) -> None:
    """train's optimisation settings (the run identity --resume checks)."""
    p.add_argument("--ttt-length", type=number(int, setting="train.ttt_length"), default=train_default("ttt_length"))
    p.add_argument("--epochs", type=number(int, minimum=1), default=train_default("epochs"))
    p.add_argument("--max-steps", type=number(int, minimum=1))
    p.add_argument("--batch-size", type=number(int, setting="train.batch_size"), default=train_default("batch_size"),
                   help="per rank (default %(default)s, the config's train.batch_size)")
    p.add_argument("--max-length", type=number(int, minimum=1), default=train_default("max_length"))
    p.add_argument("--lr", type=number(float, setting="train.lr"), default=train_default("lr"))
    p.add_argument("--warmup-ratio", type=number(float, **FRACTION), default=train_default("warmup_ratio"))
    p.add_argument("--grad-clip", type=number(float, minimum=0), default=train_default("grad_clip"))
    p.add_argument("--weight-decay", type=number(float, minimum=0), default=train_default("weight_decay"))
    p.add_argument("--adam-betas", type=number(float, minimum=0, below=1), nargs=2, default=train_default("adam_betas"), metavar=("B1", "B2"),
                   help="AdamW betas (default torch's, as SpecForge 0.2.0's BF16Optimizer)")
    p.add_argument("--loss-norm", choices=["positions", "valid"], default=train_default("loss_norm"),
                   help="divide each TTT step's loss by the B*T positions (SpecForge 0.2.0) or the valid ones")
    p.add_argument("--mask-alignment", choices=["specforge", "predicted"], default=train_default("mask_alignment"),
                   help="loss mask of the fed position t+i (SpecForge 0.2.0) or of the predicted token t+2+i")


def _add_train_run(p: argparse.ArgumentParser) -> None:
    """train's run settings: seed, precision, checkpoints, resume, devices, logging."""
    p.add_argument("--seed", type=number(int, **SEED), default=train_default("seed"))
    p.add_argument("--precision", choices=["auto", "bf16", "fp32"], default=train_default("precision"))
    p.add_argument("--checkpoint-every", type=number(int, setting="train.checkpoint_every"), default=train_default("checkpoint_every"),
                   help="save a resumable checkpoint every N steps")
    p.add_argument("--keep-checkpoints", type=number(int, minimum=1), default=train_default("keep_checkpoints"))
    p.add_argument("--resume", nargs="?", const=True, default=train_default("resume"), choices=["auto"],
                   help="continue from the latest checkpoint in the state folder (refusing other settings or "
                        "inputs); '--resume auto': continue only if that checkpoint is this same run (settings, "
                        "input files, code), else move the stale state aside and start fresh")
    p.add_argument("--state-dir", help="checkpoints and run.json (default: <out>/checkpoints); keep it outside "
                                       "--out when a workflow deletes --out after a failure")
    p.add_argument("--val-samples", type=number(int, minimum=0), help="held-out samples for validation.json (default 5%%, <= 64)")
    p.add_argument("--aux-layer-ids", help="comma-separated output-of-layer ids, -1 = embeddings (default: the layers "
                   "SGLang feeds the drafter on this target, else 1,N/2-1,N-4); written to the drafter config "
                   "the way SGLang reads them back")
    p.add_argument("--drafter-config", help="JSON object of drafter config overrides for --init scratch")
    p.add_argument("--device", help="auto (default: this rank's GPU if CUDA is available, else cpu), cpu, cuda or cuda:N")
    p.add_argument("--log", dest="log_file", help="append per-step JSON lines here")
    p.add_argument("--stop-after", type=number(int, minimum=1), help="stop after N steps as if preempted (resume later)")
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--compile", action="store_true", help="torch.compile the TTT step (GPU throughput)")
    p.add_argument("--attention", choices=list(ATTENTION_CHOICES), default=train_default("attention"),
                   help="TTT attention: auto (flex attention on CUDA from 512 tokens, else the dense mask), sdpa "
                        "(the dense mask: no compile, more memory) or flex")
    add_json_flag(p)
    p.set_defaults(func=_train)


def _add_eval(sub) -> None:
    """eval-drafter: per-step accuracy of a saved drafter."""
    p = sub.add_parser("eval-drafter", help="per-TTT-step accuracy of a drafter against a target on tokens")
    p.add_argument("--drafter", required=True)
    p.add_argument("--target", required=True)
    p.add_argument("--tokens", required=True)
    p.add_argument("--ttt-length", type=number(int, setting="train.ttt_length"), default=train_default("ttt_length"))
    p.add_argument("--max-samples", type=number(int, minimum=1))
    p.add_argument("--device")
    add_json_flag(p)
    p.set_defaults(func=_eval)


def _add_generate_data(sub) -> None:
    """generate-data: the target answers prompts (conversations for fine-tuning)."""
    g = sub.add_parser(
        "generate-data", aliases=["generate"], help="the target answers prompts: JSONL conversations for fine-tuning",
        description="Answer every prompt with the target and write the conversations (sorted by prompt id). "
                    "Engines: a server (--server SPEC: launched and torn down; the command after -- must be the "
                    "one SPEC launches; or --url of servers already running), N requests in flight through "
                    "/v1/chat/completions; else transformers in this process. Resumable: answers are stored in "
                    "--state-dir as they arrive, and a rerun answers only what is missing.")
    g.add_argument("--target", required=True, help="target model folder")
    g.add_argument("--prompts", required=True,
                   help="JSONL (ShareGPT 'conversations', OpenAI 'messages', 'prompt' or 'text') or text, one per line")
    g.add_argument("--out", required=True, help="output JSONL of {'messages': [...]} conversations")
    g.add_argument("--max-new-tokens", type=number(int, setting="data.max_new_tokens"), default=schema_default("data.max_new_tokens"),
                   help="the longest answer, in tokens")
    mode = g.add_mutually_exclusive_group()
    mode.add_argument("--greedy", action="store_true", help="greedy decoding (the default)")
    mode.add_argument("--temperature", type=number(float, above=0), default=None, help="sample at this temperature")
    g.add_argument("--top-p", type=number(float, above=0, maximum=1), default=1.0)
    g.add_argument("--seed", type=number(int, **SEED), default=schema_default("train.seed"), help="prompt i is sampled under seed+i")
    g.add_argument("--limit", type=number(int, setting="data.limit"), default=None, help="only the first N prompts")
    g.add_argument("--max-prompt-chars", type=number(int, setting="data.max_prompt_chars"), default=schema_default("data.max_prompt_chars"),
                   help="skip prompts longer than this (counted in the stats)")
    g.add_argument("--turns", choices=TURN_MODES, default=schema_default("data.turns"),
                   help="multi-turn prompts: answer every user turn in order, the target's own earlier answers in "
                        "the context (all, the default, as SpecForge regenerates), or only the last one (last)")
    g.add_argument("--chat-template-kwargs", default=None,
                   help='JSON object passed to the chat template, e.g. \'{"thinking": false}\'')
    g.add_argument("--no-separate-reasoning", dest="separate_reasoning", action="store_false",
                   help="ask the server for the answer's text as emitted, thinking included (SGLang's "
                        "separate_reasoning: false), not split into reasoning_content and content")
    _add_generate_engines(g)


def _add_generate_engines(g: argparse.ArgumentParser) -> None:
    """generate-data's engines: a server (launched or running) or transformers in this process."""
    srv = g.add_argument_group("server engine")
    where = srv.add_mutually_exclusive_group()
    where.add_argument("--server", default=None,
                       help="server spec (JSON/YAML mapping of draftlab.serving.server_spec.ServerSpec) to launch")
    where.add_argument("--url", nargs="+", default=None, metavar="URL",
                       help="servers already running, of the same model, e.g. http://127.0.0.1:30000 (several "
                            "share the prompts, --concurrency requests in flight each)")
    srv.add_argument("--server-log", default=None, help="log of the launched server (default generate-data-server.log)")
    srv.add_argument("--concurrency", type=number(int, setting="data.concurrency"), default=schema_default("data.concurrency"),
                     help="requests in flight per server")
    srv.add_argument("--retries", type=number(int, setting="data.retries"), default=schema_default("data.retries"),
                     help="retries of a failed request before its prompt is listed as failed")
    srv.add_argument("--request-timeout", type=number(float, above=0), default=1800.0, help="seconds one request may take")
    g.add_argument("--max-failed-fraction", type=number(float, setting="data.max_failed_fraction"), default=schema_default("data.max_failed_fraction"),
                   help="fail (keeping the answers) when more prompts than this fraction failed")
    loc = g.add_argument_group("transformers engine (no --server/--url)")
    loc.add_argument("--device", default=None, help="auto, cpu, cuda or cuda:N (default: cpu)")
    loc.add_argument("--batch-size", type=number(int, setting="data.batch_size"), default=schema_default("data.batch_size"),
                     help="greedy prompts decoded together, left-padded (a GPU wants 32-64)")
    g.add_argument("--trust-remote-code", action="store_true")
    g.add_argument("--state-dir", default=None, help="where answers are stored until the end (default: OUT.parts)")
    g.add_argument("--stats", default=None, help="write the run's stats JSON here")
    g.add_argument("--no-progress", action="store_true")
    g.add_argument("argv", nargs=argparse.REMAINDER, help="-- the launch command of --server (checked against it)")
    add_json_flag(g)
    g.set_defaults(func=_generate_data)


def _add_specforge(sub) -> None:
    """the SpecForge backend: run config out, features, preflight, checkpoint in."""
    _add_specforge_command(sub)
    _add_specforge_features(sub)
    _add_specforge_preflight(sub)
    _add_import_specforge(sub)


def _add_specforge_command(sub) -> None:
    """Run config out: what the arm is made of, where its features come from, where the run writes."""
    s = sub.add_parser("specforge-command",
                       help="write the SpecForge 0.2.0 run config of an arm and print `specforge train --config FILE`")
    s.add_argument("--config", required=True,
                   help="a job file (YAML/JSON, keys of draftlab.training.specforge.SpecForgeJob) "
                        "or an experiment config, e.g. the merged one the pipeline writes (then give the paths below)")
    _add_specforge_arm_paths(s)
    _add_specforge_feature_source(s)
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


def _add_specforge_arm_paths(s) -> None:
    """The arm's inputs an experiment config does not carry itself (a job file has them as keys)."""
    s.add_argument("--target", help="target model path as SpecForge sees it (experiment config only)")
    s.add_argument("--draft-config", help="drafter config.json (experiment config only)")
    s.add_argument("--data", help="training JSONL conversations (experiment config only)")
    s.add_argument("--tokens", help="draftlab tokens.jsonl of the same data: SpecForge's data.prompts_path (the "
                                    "builtin trainer's exact tokens); its sample count sets num_epochs")
    s.add_argument("--mapping", help="vocab mapping to pin through model.vocab_mapping_path (experiment config only)")


def _add_specforge_feature_source(s) -> None:
    """Offline features instead of a capture server: a converted dump, or the one-host capture's record."""
    s.add_argument("--hidden-states", default=None,
                   help="SpecForge's offline mode: a folder of its .ckpt features (draftlab specforge-features); "
                        "data.hidden_states_path, deployment local_colocated, no capture server")
    s.add_argument("--capture", default=None,
                   help="the one-host capture's record (rule capture: results/<exp>/capture/capture.json): its features "
                        "become data.hidden_states_path (local_colocated), after checking they are of this target "
                        "and this drafter's aux ids")


def _add_specforge_features(sub) -> None:
    """Features: a draftlab hidden-state dump converted to SpecForge's offline format."""
    f = sub.add_parser("specforge-features",
                       help="a draftlab hidden-state dump (--store last_hidden) as SpecForge 0.2.0's offline .ckpt features")
    f.add_argument("--dump", required=True, help="folder written by draftlab dump-hidden-states")
    f.add_argument("--out", required=True, help="folder of .ckpt files for data.hidden_states_path")
    add_json_flag(f)
    f.set_defaults(func=_specforge_features)


def _add_specforge_preflight(sub) -> None:
    """Preflight: the capture servers and Mooncake asked what they are before a run is spent on them."""
    c = sub.add_parser("specforge-preflight",
                       help="before `specforge train`: ask each capture server and the Mooncake master what they are")
    c.add_argument("--job", required=True, help="draftlab_specforge_job.json written by specforge-command")
    c.add_argument("--expect-model", action="append", default=[],
                   help="another name the capture server's model_path may give the target (hub id, local folder)")
    c.add_argument("--timeout", type=number(float, above=0), default=10.0, help="seconds per question")
    add_json_flag(c)
    c.set_defaults(func=_specforge_preflight)


def _add_import_specforge(sub) -> None:
    """Checkpoint in: a SpecForge checkpoint checked against the run and turned into a drafter folder."""
    i = sub.add_parser("import-specforge", help="turn a SpecForge checkpoint into a draftlab drafter folder")
    i.add_argument("src", help="SpecForge output_dir (latest <run_id>-step<N>/), one step folder, or an export")
    i.add_argument("--out", required=True)
    i.add_argument("--expect-mapping", default=None,
                   help="mapping pinned for the run: fail if the checkpoint's d2t differs")
    i.add_argument("--draft-config", default=None,
                   help="drafter config.json the run trained (default: the one in the run's job file)")
    i.add_argument("--expect-steps", type=number(int, minimum=1), default=None,
                   help="fail unless the checkpoint is at this optimizer step (train.steps)")
    add_json_flag(i)
    i.set_defaults(func=_import_specforge)


def _ids(text: str | None) -> list[int] | None:
    return [int(x) for x in text.split(",")] if text else None


def _tokenize(args: argparse.Namespace) -> int:
    from draftlab.training.tokenize import tokenize_file

    r = tokenize_file(args.target, args.data, args.out, args.max_length, args.trust_remote_code)
    emit(args, r, lambda r: f"{r['samples']} samples, {r['tokens']} tokens ({r['loss_tokens']} in the loss) -> {r['out']}")
    return 0


def _token_check(args: argparse.Namespace) -> int:
    from draftlab.models.target import load_tokenizer
    from draftlab.training import token_check

    tok = load_tokenizer(args.target, trust_remote_code=args.trust_remote_code)
    r = token_check.check_file(tok, args.data, args.sample, rendering=args.rendering)
    r["min_match"] = args.min_match
    if args.out:
        write_json(args.out, r)
    token_check.check_floor(r, args.min_match)
    emit(args, r, lambda r: (f"token check ({r['rendering']}): {r['exact']}/{r['turns']} assistant turns render to the "
                             f"ids the target emitted" + (f" ({r['match_rate']:.1%})" if r["turns"] else "")
                             + (f"; first mismatch: {token_check.mismatch_text(r['first_mismatch'])}"
                                if r["first_mismatch"] else "")))
    return 0


def _dump(args: argparse.Namespace) -> int:
    from draftlab.training.hidden_states import dump_hidden_states

    dcfg = json.loads((Path(args.drafter) / "config.json").read_text()) if args.drafter else None
    r = dump_hidden_states(args.target, args.tokens, args.out, store=args.store, aux_layer_ids=_ids(args.aux_layer_ids),
                           drafter_config=dcfg, shard_samples=args.shard_samples, max_length=args.max_length,
                           device=args.device)
    emit(args, r, lambda r: f"{r['samples']} samples, {r['tokens']} tokens, aux layers {r['aux_layer_ids']} -> {args.out}")
    return 0


def _train(args: argparse.Namespace) -> int:
    from draftlab.training.train import train_drafter

    overrides = {}
    if args.drafter_config:
        try:
            overrides = json.loads(args.drafter_config)
        except json.JSONDecodeError as exc:
            raise DraftlabError(f"--drafter-config: not a JSON object ({exc})") from exc

    # every TrainConfig field the command line has a flag for (the others keep their defaults)
    keys = [f.name for f in dataclasses.fields(TrainConfig)
            if hasattr(args, f.name) and f.name not in ("aux_layer_ids", "drafter_overrides")]
    r = train_drafter(**{k: getattr(args, k) for k in keys}, aux_layer_ids=_ids(args.aux_layer_ids),
                      drafter_overrides=overrides)
    if "stopped_at" in r:
        emit(args, r, lambda r: f"stopped after step {r['stopped_at']}; continue with --resume (or --resume auto)")
        return 3
    emit(args, r, _human_summary)
    return 0


def _human_summary(r: dict) -> str:
    acc = ", ".join(f"{a:.3f}" for a in (r["validation"] or {}).get("acc", []))
    return f"{r['steps']} steps on {r['world_size']} rank(s); drafter -> {r['drafter']}; validation acc per step: [{acc}]"


def _eval(args: argparse.Namespace) -> int:
    from draftlab.training.eval_drafter import evaluate_drafter

    r = evaluate_drafter(args.drafter, args.target, args.tokens, ttt_length=args.ttt_length,
                         max_samples=args.max_samples, device=args.device)
    emit(args, r, lambda r: "acc per step: [" + ", ".join(f"{a:.3f}" for a in r["acc"]) + f"] over {r['tokens']} tokens")
    return 0


def _generate_data(args: argparse.Namespace) -> int:
    from draftlab.datagen.generate_data import generate
    from draftlab.serving.server_spec import ServerSpec, check_command

    argv = list(args.argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    server = None
    if args.server:
        # YAML or JSON (a YAML subset): one server description, read once, checked and launched
        server = ServerSpec.from_dict(read_yaml(args.server), source=args.server)
        check_command(server.command(), argv, "generate-data")
    elif argv:
        raise DraftlabError("generate-data: a command after -- needs --server (the spec it is checked against)")
    kwargs = None
    if args.chat_template_kwargs:
        kwargs = parse_json_text(args.chat_template_kwargs, "--chat-template-kwargs")
        if not isinstance(kwargs, dict):
            raise DraftlabError("--chat-template-kwargs: expected a JSON object")
    result = generate(
        args.target, args.prompts, args.out, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
        top_p=args.top_p, seed=args.seed, limit=args.limit, device=args.device,
        trust_remote_code=args.trust_remote_code, batch_size=args.batch_size, server=server,
        server_log=args.server_log, url=args.url, concurrency=args.concurrency, retries=args.retries,
        request_timeout_s=args.request_timeout, max_prompt_chars=args.max_prompt_chars,
        max_failed_fraction=args.max_failed_fraction, template_kwargs=kwargs, turns=args.turns,
        separate_reasoning=args.separate_reasoning,
        state_dir=args.state_dir,
        stats=args.stats, progress=not args.no_progress,
    )
    emit(args, result, lambda r: (f"wrote {r['answers']} of {r['prompts']} conversations ({r['generated_tokens']} "
                                  f"tokens, {r['mode']}, {r['failed']} failed) to {r['out']} in {r['seconds']} s"))
    return 0


def _specforge_command(args: argparse.Namespace) -> int:
    from draftlab.training import specforge

    data = specforge.read_job_file(args.config)
    if "experiment" in data:
        need = {"--target": args.target, "--draft-config": args.draft_config, "--data": args.data,
                "--output-dir": args.output_dir}
        missing = [k for k, v in need.items() if not v]
        if missing:
            raise DraftlabError(f"{args.config}: an experiment config needs {', '.join(missing)} on the command line")

        cfg = load_config(args.config)  # the merged JSON the pipeline writes, or a YAML file
        if args.chat_template:
            cfg["train"]["chat_template"] = args.chat_template
        job = specforge.job_from_experiment(
            cfg, target_model_path=args.target, draft_model_config=args.draft_config, train_data_path=args.data,
            output_dir=args.output_dir, vocab_mapping=args.mapping, ckpt_dir=args.ckpt_dir,
            num_samples=_count_samples(args.tokens) if args.tokens else None, prompts_path=args.tokens,
        )
        if args.hidden_states:
            job.hidden_states_path = args.hidden_states
        if args.capture:
            from draftlab.training.specforge import check_capture_for

            rec = check_capture_for(args.capture, args.target, args.draft_config)
            job.hidden_states_path, job.num_samples = rec["features"], int(rec["samples"])
    else:
        job = specforge.job_from_mapping(data, str(args.config))
    result = specforge.prepare(job, write=not args.dry_run)
    emit(args, result, lambda r: "\n".join([shlex.join(r["argv"])] + [f"warning: {w}" for w in r["warnings"]]
                                           + [f"capture host: {c}" for c in r["capture_host"]]))
    return 0


def _specforge_features(args: argparse.Namespace) -> int:
    from draftlab.training.specforge import write_features

    r = write_features(args.dump, args.out)
    emit(args, r, lambda r: f"{r['samples']} samples, {r['tokens']} tokens, aux layers {r['aux_layer_ids']} -> {r['out']}")
    return 0


def _specforge_preflight(args: argparse.Namespace) -> int:
    from draftlab.training import specforge

    job = read_json(args.job)
    cfg = job.get("run_config") if isinstance(job, dict) else None
    if not isinstance(cfg, dict):
        raise DraftlabError(f"{args.job}: key 'run_config' missing (expected the job file of draftlab specforge-command)")
    expected = [str(cfg.get("model", {}).get("target_model_path", ""))] + list(args.expect_model)
    r = specforge.preflight(cfg, expected_models=expected, timeout=args.timeout)

    def text(r):
        if r.get("note"):
            return r["note"]
        lines = [f"Mooncake master {r['mooncake']['master']} and metadata server {r['mooncake']['metadata_server']}: up"]
        lines += [f"capture server {s['url']}: sglang {s['version']}, {s['model_path']}, capture {s['method']} "
                  f"aux ids {s['aux_layer_ids']}" for s in r["servers"]]
        return "\n".join(lines)

    emit(args, r, text)
    return 0


def _count_samples(tokens: str) -> int:
    """Training samples in a tokens JSONL: lines with at least one loss-masked token (as SpecForge keeps them)."""
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
    from draftlab.training.specforge import import_checkpoint

    result = import_checkpoint(args.src, args.out, expect_mapping=args.expect_mapping,
                               draft_config=args.draft_config, expect_steps=args.expect_steps)
    emit(args, result, lambda r: f"imported {r['source']} -> {r['out']} (embeddings stripped: "
                                 f"{r['embeddings_stripped']}, mapping check: {r['mapping_check']})")
    return 0


def _add_capture(sub) -> None:
    """capture-preflight, capture-record: the one-host SpecForge capture stage (rule capture)."""
    for name, text in (("capture-preflight", "before the capture: the SpecForge checkout, the features folder, the "
                                             "disk estimate against the free space; prints the data path handed over"),
                       ("capture-record", "after the capture: samples, tokens, bytes, the listing's digest and the "
                                          "corpus-derived vocab mapping, written to --out")):
        p = sub.add_parser(name, help=text)
        p.add_argument("--engine", choices=["specforge", "draftlab"], default="specforge",
                       help="who captured: SpecForge's prepare_hidden_states.py, or draftlab dump-hidden-states")
        p.add_argument("--target", required=True, help="target model folder")
        p.add_argument("--drafter", required=True, help="patched drafter folder (its config gives the aux layers)")
        p.add_argument("--tokens", required=True, help="draftlab tokens.jsonl of the data (the disk estimate)")
        p.add_argument("--data", required=True, help="the fine-tune conversations JSONL ({\"messages\": [...]})")
        p.add_argument("--state", required=True, help="capture-state folder (features/ inside)")
        p.add_argument("--chat-template", default=schema_default("train.chat_template"))
        p.add_argument("--max-length", type=number(int, minimum=1), default=schema_default("train.max_length"))
        p.add_argument("--checkout", default=None, help="SpecForge checkout at the v0.2.0 release")
        p.add_argument("--budget-gb", type=number(float, above=0), default=None,
                       help="the features' disk budget in GB: the capture keeps the data's first samples up to "
                            "budget / (--max-length x bytes a token) (train.specforge.capture_budget_gb)")
        if name == "capture-record":
            p.add_argument("--out", required=True, help="the record JSON to write")
            p.add_argument("--mapping-out", required=True, help="the corpus-derived vocab mapping to write")
            p.add_argument("--mapping", default=None, help="draftlab engine: draftlab's vocab mapping of the data")
        else:
            p.add_argument("--free-bytes", type=number(int, minimum=0), default=None, help=argparse.SUPPRESS)  # tests: a full disk
        add_json_flag(p)
        p.set_defaults(func=_capture_preflight if name == "capture-preflight" else _capture_record)


def _capture_plan(args: argparse.Namespace):
    from draftlab.training.specforge import CapturePlan

    return CapturePlan(engine=args.engine, target=args.target, drafter=args.drafter, tokens=args.tokens,
                       data=args.data, state=args.state, chat_template=args.chat_template,
                       max_length=args.max_length, checkout=args.checkout,
                       budget_bytes=int(args.budget_gb * 10**9) if args.budget_gb else None)


def _capture_preflight(args: argparse.Namespace) -> int:
    from draftlab.training.specforge import capture_preflight, human

    r = capture_preflight(_capture_plan(args), free=args.free_bytes)
    est = r["estimate"]
    sf = r["specforge"]
    lines = [f"SpecForge {sf['release']} at {sf['path']} (commit {sf['commit'] or 'unknown: not a git checkout'})"
             if sf else "draftlab capture (dump-hidden-states), filed in SpecForge's offline format"]
    lines += r["notes"]
    lines.append(f"aux layer ids {r['aux_layer_ids']} (outputs of layers {r['aux_output_layers']})")
    if est.get("budget_samples") is not None:
        lines.append(f"disk budget {human(est['budget_bytes'])}: the first {est['budget_samples']} samples of the data "
                     "are captured (budget / (max length x bytes a token))")
    lines.append(f"disk estimate: {est['samples']} samples, {est['tokens']} tokens x {est['bytes_per_token']} B = "
                 f"{human(est['bytes'])}; already captured {r['have']['samples']} files, {human(r['have']['bytes'])}; "
                 f"needs {human(r['need_bytes'])} more, {human(r['free_bytes'])} free at {r['features']}")
    if args.json:
        emit(args, r, str)
    else:
        print("\n".join(lines), file=sys.stderr)
        if r["data_path"]:
            print(r["data_path"])  # the capture's --data-path ($DATA in the rule's shell)
    return 0


def _capture_record(args: argparse.Namespace) -> int:
    from draftlab.training.specforge import capture_record, human

    r = capture_record(_capture_plan(args), args.out, args.mapping_out, args.mapping)
    emit(args, r, lambda r: (f"captured {r['samples']} samples, {r['tokens']} tokens, {human(r['bytes'])} in "
                             f"{r['features']} (listing sha256 {r['listing_sha256'][:16]}); "
                             f"{r['seconds_per_million_tokens']} s per million tokens in the last attempt"))
    return 0
