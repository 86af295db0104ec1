"""Run one plan (rule ``serve_bench``, ``draftlab serve-bench``): one server launch, many client runs.

:func:`run_plan` launches the plan's server once (``draftlab.serving.launch.running_server``), runs
each client with ``draftlab.benchmark.bench.run_benchmark``, writes each result atomically and
always tears the server down. A plan behind a closed probe gate writes explicit skipped results.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from draftlab.benchmark.bench import run_benchmark, write_results
from draftlab.benchmark.bench_plan import plan_argv
from draftlab.benchmark.probe_gate import SKIP_MARKER
from draftlab.errors import DraftlabError
from draftlab.fsutil import read_json, write_json, write_text
from draftlab.serving.launch import running_server
from draftlab.serving.server_spec import ServerSpec, check_command


def skip_reason(plan: Mapping[str, Any]) -> str | None:
    """Why a gated plan must not launch (gate closed or its drafter was skipped), or None."""
    if plan.get("gate"):
        gate = read_json(plan["gate"], "probe gate decision")
        train_dir = plan.get("train_dir")
        trained = train_dir is not None and not (Path(train_dir) / SKIP_MARKER).exists()
        if not gate["pass"]:
            if trained:
                raise DraftlabError(
                    f"{plan['gate']}: the gate is now closed but {train_dir} holds a drafter trained while it was open; "
                    "rerun its training job (snakemake -R train) so the result is not recorded"
                )
            return gate["reason"]
        if train_dir is not None and not trained:
            raise DraftlabError(
                f"{plan['gate']}: the gate is now open but {train_dir} was skipped while it was closed; "
                "rerun its training job (snakemake -R train)"
            )
    return None


def _skipped_result(plan: Mapping[str, Any], client: Mapping[str, Any], reason: str) -> dict[str, Any]:
    return {"skipped": True, "reason": reason, "variant": plan["variant"], "spec_id": plan["spec_id"],
            "client": client["name"], "summary": None, "rows": [], "server": {"fingerprint": plan["fingerprint"]}}


def run_plan(plan: Mapping[str, Any], argv: Sequence[str] | None = None, progress: bool = True) -> dict[str, Any]:
    """Launch the plan's server once, run every client against it, write each result; always tear down.

    The plan is the one server description: its ``server`` is launched, its ``argv`` is the command that
    runs. ``argv``, when given, is the command printed in the rule's shell line: it must be the plan's,
    so what Snakemake shows is exactly what runs.
    """
    spec = ServerSpec.from_dict(plan["server"], source=f"plan for {plan['variant']} {plan['spec_id']}")
    command = plan_argv(plan)
    check_command(command, list(argv) if argv else None, "serve-bench")
    summary: dict[str, Any] = {"variant": plan["variant"], "spec_id": plan["spec_id"], "fingerprint": plan["fingerprint"],
                               "argv": command, "launches": 0, "clients": [], "started_at": time.time()}
    reason = skip_reason(plan)
    if reason is not None:
        print(f"serve-bench: {plan['variant']} {plan['spec_id']}: skipped, no server launched: {reason}", file=sys.stderr)
        for c in plan["clients"]:
            write_json(c["out_json"], _skipped_result(plan, c, reason))
            _write_skipped_csv(c["out_csv"], reason)
        summary.update(skipped=True, reason=reason, finished_at=time.time())
        write_json(plan["summary"], summary)
        return summary
    for result, c in _measure(plan, spec, summary, progress):
        write_results(result, c["out_json"], c["out_csv"])
    summary.update(skipped=False, finished_at=time.time())
    write_json(plan["summary"], summary)
    return summary


def _measure(plan: Mapping[str, Any], spec: ServerSpec, summary: dict[str, Any], progress: bool) -> list:
    """One launch of ``spec``, every client of the plan against it; the results, written only once every
    client has run (a server dying mid-plan leaves no result)."""
    Path(plan["server_log"]).parent.mkdir(parents=True, exist_ok=True)
    print(f"serve-bench: launching {' '.join(summary['argv'])}", file=sys.stderr)
    with running_server(spec, plan["server_log"]) as srv:
        summary["launches"] = 1
        summary["url"] = srv.url
        summary["ready_s"] = time.time() - summary["started_at"]
        print(f"serve-bench: server ready at {srv.url} after {summary['ready_s']:.1f}s", file=sys.stderr)
        return run_clients(srv.url, plan, spec, summary, progress)


def run_clients(url: str, plan: Mapping[str, Any], spec: ServerSpec, summary: dict[str, Any], progress: bool,
                clients: Sequence[Mapping[str, Any]] | None = None, launched: ServerSpec | None = None,
                ttft: bool = True) -> list:
    """Every client of ``plan`` (or ``clients``) against the server at ``url``: ``[(result, client)]``, each
    result tagged with the plan's server (and ``summary["launch"]``, the launch it came from). ``launched``:
    the server as started, when ``spec``'s drafter was swapped into it (its ``/server_info`` still names the
    drafter it was launched with, as SGLang's does; the swap itself is proven by checksums). ``ttft=False``
    skips the streamed pass: a check that reads only the timed pass (a launch's checks) need not pay for it."""
    measured = []
    for c in plan["clients"] if clients is None else clients:
        t0 = time.time()
        result = run_benchmark(
            url, client_prompts(c), api=plan["api"], max_new_tokens=c["max_new_tokens"],
            repeats=c["repeats"], warmup=c["warmup"], concurrency=c["concurrency"], limit=c.get("limit"),
            ignore_eos=bool(c.get("ignore_eos")), require_speculation=plan["require_speculation"], progress=progress,
            **_launched_numbers(spec), expect_server=planned_server_info(launched or spec),
            category=c["name"],  # a prompt whose record has no category is the client's
            measure_ttft=ttft, ttft_limit=c.get("ttft_limit"),
        )
        result.server = {**(result.server or {}), "fingerprint": plan["fingerprint"], "variant": plan["variant"],
                         "spec_id": plan["spec_id"], "client": c["name"], "argv": summary["argv"],
                         "launch": summary.get("launch")}
        measured.append((result, c))
        summary["clients"].append({"name": c["name"], "seconds": time.time() - t0,
                                   "accept_length": result.summary.get("accept_length"),
                                   "output_tps_median": result.summary.get("output_tps_median")})
    return measured


def client_prompts(client: Mapping[str, Any]) -> str | list[str]:
    """What a client benches: its prompt file (null: the shipped set), and its ``in_domain`` file beside it."""
    prompts = client.get("prompts") or "default"
    return [prompts, client["in_domain"]] if client.get("in_domain") else prompts


def _launched_numbers(spec) -> dict[str, int | None]:
    """The speculative numbers the server was launched with: they bound its answers (bench_checks)."""
    nums = spec.speculative_numbers() if spec.drafter else None
    return {"num_steps": nums[0], "num_draft_tokens": nums[2]} if nums else {}


def planned_server_info(spec: ServerSpec) -> dict[str, Any]:
    """What ``/server_info`` must say of the server ``spec`` launches: its target, its drafter (none for a
    baseline) and the speculative numbers SGLang keeps as given (a chain's draft-token count it may
    round to num_steps + 1, so that one is compared before and after the run only)."""
    if spec.backend == "vllm":
        return {}  # no /server_info
    out: dict[str, Any] = {"model_path": str(spec.target),
                           "speculative_draft_model_path": str(spec.drafter) if spec.drafter else None}
    nums = spec.speculative_numbers() if spec.drafter else None
    if nums is not None:
        out.update(speculative_num_steps=nums[0], speculative_eagle_topk=nums[1])
        if nums[1] > 1:
            out["speculative_num_draft_tokens"] = nums[2]
    return out


def _write_skipped_csv(path: str, reason: str) -> None:
    write_text(path, f"# skipped: {reason}\n")
