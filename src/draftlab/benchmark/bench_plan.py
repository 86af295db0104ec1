"""What one server job runs (rule ``bench_plan``): the server description, its command, every client variant.

A launch is the expensive step (~10 minutes for a 1T MoE on 8 GPUs), so the workflow groups every
client-side variant (prompt set, max new tokens, concurrency, repeats) that needs the same server
into one *plan*; ``draftlab serve-bench`` (:mod:`draftlab.benchmark.serve_bench`) runs it.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from draftlab.serving.server_spec import ServerSpec, server_fingerprint

PLAN_VERSION = 1


def plan_argv(plan: Mapping[str, Any]) -> list[str]:
    """The plan's launch command, as written with it (a plan from before ``argv`` was written: its server's)."""
    if plan.get("argv"):
        return list(plan["argv"])
    return ServerSpec.from_dict(plan["server"], source="plan server").command()


def build_plan(
    cfg: Mapping[str, Any],
    *,
    variant: str,
    spec_id: str,
    server: ServerSpec,
    result_path: Callable[[str, str], str],
    summary: str,
    server_log: str,
    gate: str | None = None,
    train_dir: str | None = None,
) -> dict[str, Any]:
    """Everything ``draftlab serve-bench`` needs for one server: the server description (``server``), the
    command it launches (``argv``, what the rule prints), and its client runs.

    ``result_path(client, ext)`` names a client's result (``json``/``csv``) and ``summary`` the server's
    own: the caller's Layout spells them (``Layout.bench_result``, ``Layout.serve_summary``), not this."""
    clients = []
    for c in cfg["bench"]["clients"]:
        clients.append({
            **{k: c[k] for k in ("name", "prompts", "max_new_tokens", "repeats", "warmup", "concurrency", "limit", "ttft_limit",
                                  "ignore_eos")},
            "out_json": result_path(c["name"], "json"),
            "out_csv": result_path(c["name"], "csv"),
        })
    return {
        "version": PLAN_VERSION,
        "experiment": cfg["experiment"],
        "variant": variant,
        "spec_id": spec_id,
        "server": server.to_dict(),
        "argv": server.command(),
        "fingerprint": server_fingerprint(server),
        "api": "vllm" if server.backend == "vllm" else "sglang",
        "require_speculation": server.drafter is not None,
        "gate": gate,
        "train_dir": train_dir,
        "clients": clients,
        "server_log": server_log,
        "summary": summary,
    }
