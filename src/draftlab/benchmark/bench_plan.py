"""What one server job runs (rule ``bench_plan``): the server config and every client variant.

A launch is the expensive step (~10 minutes for a 1T MoE on 8 GPUs), so the workflow groups every
client-side variant (prompt set, max new tokens, concurrency, repeats) that needs the same server
into one *plan*; ``draftlab serve-bench`` (:mod:`draftlab.benchmark.serve_bench`) runs it.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

PLAN_VERSION = 1


def server_dict(cfg: Mapping[str, Any], target: str, drafter: str | None, spec: Mapping[str, Any] | None) -> dict[str, Any]:
    """The ``launch.ServerSpec`` mapping for one server of the experiment ``cfg``."""
    s = cfg["serve"]
    d: dict[str, Any] = {
        "backend": s["backend"],
        "target": target,
        "tp": s["tp"],
        "trust_remote_code": bool(cfg["target"]["trust_remote_code"]),
        "host": s["host"],
        "port": s["port"],
        "algorithm": cfg["doctor"]["algorithm"],
        "health_interval_s": float(s["health_interval_s"]),
        "health_deadline_s": float(s["health_interval_s"]) * int(s["health_tries"]),
        "extra_args": list(s["extra_args"]),
    }
    for key in ("mem_fraction_static", "cuda_graph_max_bs", "dtype"):
        if s.get(key) is not None:
            d[key] = s[key]
    if s["backend"] == "builtin":
        d["device"] = s["device"]
    else:
        # `python` from PATH: inside a conda job that is the serving env's interpreter, which has
        # SGLang; it is also exactly what the printed command says.
        d["python"] = "python"
    if drafter is not None:
        d["drafter"] = drafter
        if spec is not None:
            d.update(num_steps=spec["num_steps"], topk=spec["topk"], num_draft_tokens=spec["num_draft_tokens"])
    return d


def server_argv(server: Mapping[str, Any]) -> list[str]:
    """The launch command for a server mapping; ``python`` shown as ``python`` so the line is portable."""
    from draftlab.serving.launch import ServerSpec

    return ServerSpec.from_dict({**server, "python": "python"}).argv()


def check_launch_argv(server: Mapping[str, Any], argv: list[str] | None, command: str) -> None:
    """The command a rule prints after ``--`` must be the one its server config launches, so that what
    Snakemake shows (``-n -p``) is exactly what runs; ``argv`` None or empty skips the check."""
    if not argv:
        return
    from draftlab.errors import DraftlabError

    expected = server_argv(server)
    if list(argv) != expected:
        raise DraftlabError(
            f"{command}: the command after -- differs from the server config;\n"
            f"  given:    {' '.join(argv)}\n  expected: {' '.join(expected)}"
        )


def fingerprint(server: Mapping[str, Any]) -> str:
    from draftlab.serving.launch import ServerSpec, server_fingerprint

    return server_fingerprint(ServerSpec.from_dict(dict(server)))


def build_plan(
    cfg: Mapping[str, Any],
    *,
    variant: str,
    spec_id: str,
    server: Mapping[str, Any],
    result_path: Callable[[str, str], str],
    summary: str,
    server_log: str,
    gate: str | None = None,
    train_dir: str | None = None,
) -> dict[str, Any]:
    """Everything ``draftlab serve-bench`` needs for one server: the server and its client runs.

    ``result_path(client, ext)`` names a client's result (``json``/``csv``) and ``summary`` the server's
    own: the caller's Layout spells them (``Layout.bench_result``, ``Layout.serve_summary``), not this."""
    clients = []
    for c in cfg["bench"]["clients"]:
        clients.append({
            **{k: c[k] for k in ("name", "prompts", "max_new_tokens", "repeats", "warmup", "concurrency", "limit", "ignore_eos")},
            "out_json": result_path(c["name"], "json"),
            "out_csv": result_path(c["name"], "csv"),
        })
    return {
        "version": PLAN_VERSION,
        "experiment": cfg["experiment"],
        "variant": variant,
        "spec_id": spec_id,
        "server": dict(server),
        "fingerprint": fingerprint(server),
        "api": "vllm" if server["backend"] == "vllm" else "sglang",
        "require_speculation": server.get("drafter") is not None,
        "gate": gate,
        "train_dir": train_dir,
        "clients": clients,
        "server_log": server_log,
        "summary": summary,
    }
