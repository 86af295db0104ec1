"""``draftlab serve``: the builtin EAGLE-3 HTTP server (SGLang-shaped endpoints, greedy only)."""

from __future__ import annotations

import argparse
import os
import sys

from draftlab.commands._common import PORT, number
from draftlab.errors import DraftlabError
from draftlab.settings.model import schema_default


def register(sub) -> None:
    """Add this area's subcommands to the draftlab parser."""
    p = sub.add_parser(
        "serve",
        help="serve a target (optionally with an EAGLE-3 drafter) over HTTP, SGLang-style",
        description="Serve greedy decoding of a transformers target, with EAGLE-3 speculation when --drafter "
                    "is given. Prints 'draftlab-serve listening on http://HOST:PORT' once ready; stops on "
                    "SIGTERM/SIGINT.",
    )
    p.add_argument("--target", required=True, help="target model folder (Hugging Face layout)")
    p.add_argument("--drafter", default=None, help="EAGLE-3 drafter folder; omit for plain decoding")
    p.add_argument("--num-steps", type=number(int, setting="speculative.num_steps"), default=3, help="draft steps per cycle: a chain's drafts, a tree's "
                                                             "depth (default 3)")
    p.add_argument("--topk", type=number(int, setting="speculative.topk"), default=1,
                   help="SGLang's --speculative-eagle-topk: branches per draft step (default 1: a chain; above 1 a "
                        "tree, decoded from the static-slot cache, eagerly on the CPU)")
    p.add_argument("--num-draft-tokens", type=number(int, setting="speculative.num_draft_tokens"), default=None,
                   help="SGLang's --speculative-num-draft-tokens: tokens one verify reads (a chain: num-steps + 1, "
                        "the default; a tree: the pending token and its best num-draft-tokens - 1 drafts)")
    p.add_argument("--host", default=schema_default("serve.host"), help="bind address (default %(default)s)")
    p.add_argument("--port", type=number(int, **PORT), default=schema_default("serve.port"),
                   help="port; 0 picks a free one and prints it (default %(default)s)")
    p.add_argument("--api-key", default=None,
                   help="the key every route but /health, /ready and /metrics needs (Authorization: Bearer KEY), "
                        "as SGLang's --api-key; default $DRAFTLAB_API_KEY (prefer it: a command line is visible "
                        "to every user of the host). Without a key, a non-loopback --host refuses the weight routes")
    p.add_argument("--admin-api-key", default=None,
                   help="the key the weight routes, /weights_checker and /flush_cache then need instead, as "
                        "SGLang's --admin-api-key; default $DRAFTLAB_ADMIN_API_KEY")
    p.add_argument("--device", default=schema_default("serve.device"), help="cpu, cuda or cuda:N (default %(default)s)")
    p.add_argument("--dtype", default=None, help="float32, bfloat16, float16 or float64 (default: float32)")
    p.add_argument("--trust-remote-code", action="store_true", help="allow custom model code in the target folder")
    p.add_argument("--threads", type=number(int, minimum=1), default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--health-timeout", type=number(float, above=0), default=20.0,
                   help="seconds /health_generate waits for a busy engine before answering 503 (default 20)")
    p.add_argument("--read-timeout", type=number(float, above=0), default=30.0,
                   help="seconds a client has to send a whole request (line, headers, body); also the idle "
                        "keep-alive limit (default 30)")
    p.add_argument("--max-batch-size", type=number(int, minimum=1), default=8,
                   help="requests decoded together (continuous batching; 1 serves one at a time; default 8)")
    p.add_argument("--max-prompts-per-request", type=number(int, minimum=1), default=256,
                   help="prompts one /generate or /v1/completions request may carry (413 above; default 256)")
    p.add_argument("--cuda-graph-max-bs", type=number(int, setting="serve.cuda_graph_max_bs"), default=None,
                   help="on CUDA: the largest batch decoded by a captured CUDA graph (SGLang's meaning; larger "
                        "batches run eagerly; 0: no graphs; default: --max-batch-size)")
    p.set_defaults(func=_serve)


def _serve(args: argparse.Namespace) -> int:
    from draftlab.serving.api_keys import Keys
    from draftlab.serving.server import load_state, serve

    if not 0 <= args.port <= 65535:
        raise DraftlabError(f"--port: expected 0-65535, got {args.port}")
    if args.drafter is not None and args.num_steps < 1:
        raise DraftlabError(f"--num-steps: expected an integer >= 1, got {args.num_steps}")
    for flag, value in (("--max-batch-size", args.max_batch_size), ("--max-prompts-per-request",
                                                                     args.max_prompts_per_request)):
        if value < 1:
            raise DraftlabError(f"{flag}: expected an integer >= 1, got {value}")
    if args.cuda_graph_max_bs is not None and args.cuda_graph_max_bs < 0:
        raise DraftlabError(f"--cuda-graph-max-bs: expected an integer >= 0, got {args.cuda_graph_max_bs}")
    for flag, value in (("--health-timeout", args.health_timeout), ("--read-timeout", args.read_timeout)):
        if not value > 0:
            raise DraftlabError(f"{flag}: expected a number of seconds > 0, got {value}")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    print(f"draftlab-serve: loading target {args.target}"
          + (f" and drafter {args.drafter} (num_steps {args.num_steps}, topk {args.topk}"
             f"{'' if args.num_draft_tokens is None else f', num_draft_tokens {args.num_draft_tokens}'})"
             if args.drafter else " (plain decoding)"),
          file=sys.stderr, flush=True)
    state = load_state(args.target, args.drafter, num_steps=args.num_steps, topk=args.topk,
                       num_draft_tokens=args.num_draft_tokens, device=args.device, dtype=args.dtype,
                       trust_remote_code=args.trust_remote_code, health_timeout_s=args.health_timeout,
                       read_timeout_s=args.read_timeout, max_batch_size=args.max_batch_size,
                       max_prompts=args.max_prompts_per_request, cuda_graph_max_bs=args.cuda_graph_max_bs)
    code = serve(state, args.host, args.port, Keys.for_bind(args.host, args.api_key, args.admin_api_key))
    # Skip the interpreter's teardown (torch/transformers finalization takes seconds on a busy host):
    # a stopped server must be gone within seconds, and it has no files to flush.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
