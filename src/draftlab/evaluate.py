"""Serve + benchmark orchestration: one server launch per server configuration, many client runs.

A launch is the expensive step (~10 minutes for a 1T MoE on 8 GPUs), so the workflow groups every
client-side variant (prompt set, max new tokens, concurrency, repeats) that needs the same server
into one *plan* and :func:`run_plan` launches it once (``draftlab.launch.running_server``), runs each
client with ``draftlab.bench.run_benchmark``, writes each result atomically and always tears the
server down. Also here: the probe gate, the gate wrapper for gated jobs, and resolving the target
model folder the servers and data stages load.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from draftlab.errors import DraftlabError
from draftlab.fsutil import read_json, write_json, write_text

SKIP_MARKER = "SKIPPED.json"
PLAN_VERSION = 1

# --- the target model folder -------------------------------------------------------------------

# What a server and the data stages need from a target repo: config, weights, tokenizer, and the
# repo's own code for trust_remote_code models. Never pickles.
MODEL_PATTERNS = ["*.json", "*.safetensors", "*.model", "*.tiktoken", "*.txt", "*.py", "*.jinja"]
_HASH_LIMIT_BYTES = 2 << 30


def _link(target: Path, link: Path) -> None:
    """Point ``link`` at ``target`` (absolute), replacing an old link atomically."""
    if os.path.lexists(link) and not link.is_symlink():
        raise DraftlabError(f"{link}: --link exists and is not a symlink draftlab made; refusing to replace it")
    link.parent.mkdir(parents=True, exist_ok=True)
    tmp = link.with_name(f".{link.name}.tmp-{os.getpid()}")
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    os.symlink(os.path.abspath(target), tmp, target_is_directory=True)
    os.replace(tmp, link)


def _weights_digest(folder: Path) -> tuple[str | None, list[dict[str, Any]]]:
    """Per-file sha256 of the safetensors in ``folder`` and one digest over them.

    In an HF cache a weight file is a link to ``blobs/<sha256>``, so the name is the hash and a
    600 GB target costs nothing; other files are hashed when the folder is small enough.
    """
    import re

    files = []
    weights = sorted(p for p in folder.iterdir() if p.name.endswith(".safetensors"))
    total = sum(p.stat().st_size for p in weights)
    for p in weights:
        blob = p.resolve().name
        if re.fullmatch(r"[0-9a-f]{64}", blob):
            digest = blob
        elif total <= _HASH_LIMIT_BYTES:
            h = hashlib.sha256()
            with open(p, "rb") as fh:
                for chunk in iter(lambda: fh.read(8 << 20), b""):
                    h.update(chunk)
            digest = h.hexdigest()
        else:
            digest = None
        files.append({"name": p.name, "size": p.stat().st_size, "sha256": digest})
    if not files or any(f["sha256"] is None for f in files):
        return None, files
    combined = hashlib.sha256("".join(f"{f['name']}:{f['sha256']}\n" for f in files).encode()).hexdigest()
    return combined, files


def resolve_model(source: str, revision: str | None, link: str | os.PathLike, out: str | os.PathLike) -> dict[str, Any]:
    """Make ``link`` point at a local folder holding ``source`` (downloading hf: sources at ``revision``).

    The link gives every rule one fixed path to print in its command line (the SGLang
    ``--model-path`` included) while the weights stay in the HF cache. Writes ``out`` (JSON).
    """
    from draftlab.hf_cache import hub_call, is_hf_source, is_offline, parse_hf_source, snapshot_commit

    if is_hf_source(source):
        hub = parse_hf_source(source)
        hub = type(hub)(hub.repo_id, revision or hub.revision)
        from huggingface_hub import snapshot_download

        folder = Path(hub_call(hub, "model files", lambda: snapshot_download(
            hub.repo_id, revision=hub.revision, allow_patterns=MODEL_PATTERNS, local_files_only=is_offline())))
        record = {"source": str(hub), "repo_id": hub.repo_id, "requested_revision": hub.revision,
                  "resolved_commit": snapshot_commit(folder / "config.json") or folder.name}
    else:
        folder = Path(source)
        if not (folder / "config.json").is_file():
            raise DraftlabError(f"{folder}: expected a model folder with config.json (target.model_path / target.source)")
        record = {"source": str(source), "repo_id": None, "requested_revision": revision, "resolved_commit": None}
    digest, files = _weights_digest(folder)
    record.update(path=str(Path(link)), folder=str(folder.resolve()), weights_sha256=digest, files=files)
    _link(folder, Path(link))
    write_json(out, record)
    return record


# --- plans: one server, many clients -----------------------------------------------------------


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
    from draftlab.launch import ServerSpec

    return ServerSpec.from_dict({**server, "python": "python"}).argv()


def fingerprint(server: Mapping[str, Any]) -> str:
    from draftlab.launch import ServerSpec, server_fingerprint

    return server_fingerprint(ServerSpec.from_dict(dict(server)))


def build_plan(
    cfg: Mapping[str, Any],
    *,
    variant: str,
    spec_id: str,
    server: Mapping[str, Any],
    out_dir: str,
    server_log: str,
    gate: str | None = None,
    train_dir: str | None = None,
) -> dict[str, Any]:
    """Everything ``draftlab serve-bench`` needs for one server: the server and its client runs."""
    clients = []
    for c in cfg["bench"]["clients"]:
        clients.append({
            **{k: c[k] for k in ("name", "prompts", "max_new_tokens", "repeats", "warmup", "concurrency", "limit", "ignore_eos")},
            "out_json": f"{out_dir}/{c['name']}.json",
            "out_csv": f"{out_dir}/{c['name']}.csv",
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
        "summary": f"{out_dir}/serve.json",
    }


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

    ``argv``, when given, is the command printed in the rule's shell line: it must be the command the
    plan's server config produces, so what Snakemake shows is exactly what runs.
    """
    from draftlab.bench import run_benchmark, write_results
    from draftlab.launch import ServerSpec, running_server

    server = dict(plan["server"])
    if argv:
        expected = server_argv(server)
        if list(argv) != expected:
            raise DraftlabError(
                "serve-bench: the command after -- differs from the plan's server config;\n"
                f"  given:    {' '.join(argv)}\n  expected: {' '.join(expected)}"
            )
    started = time.time()
    summary: dict[str, Any] = {"variant": plan["variant"], "spec_id": plan["spec_id"], "fingerprint": plan["fingerprint"],
                               "argv": server_argv(server), "launches": 0, "clients": [], "started_at": started}
    reason = skip_reason(plan)
    if reason is not None:
        print(f"serve-bench: {plan['variant']} {plan['spec_id']}: skipped, no server launched: {reason}", file=sys.stderr)
        for c in plan["clients"]:
            write_json(c["out_json"], _skipped_result(plan, c, reason))
            _write_skipped_csv(c["out_csv"], reason)
        summary.update(skipped=True, reason=reason, finished_at=time.time())
        write_json(plan["summary"], summary)
        return summary
    spec = ServerSpec.from_dict(server, source=f"plan for {plan['variant']} {plan['spec_id']}")
    Path(plan["server_log"]).parent.mkdir(parents=True, exist_ok=True)
    print(f"serve-bench: launching {' '.join(summary['argv'])}", file=sys.stderr)
    measured = []  # written only once every client has run: a server dying mid-plan leaves no result
    with running_server(spec, plan["server_log"]) as srv:
        summary["launches"] = 1
        summary["url"] = srv.url
        summary["ready_s"] = time.time() - started
        print(f"serve-bench: server ready at {srv.url} after {summary['ready_s']:.1f}s", file=sys.stderr)
        for c in plan["clients"]:
            t0 = time.time()
            result = run_benchmark(
                srv.url, c["prompts"] or "default", api=plan["api"], max_new_tokens=c["max_new_tokens"],
                repeats=c["repeats"], warmup=c["warmup"], concurrency=c["concurrency"], limit=c.get("limit"),
                ignore_eos=bool(c.get("ignore_eos")), require_speculation=plan["require_speculation"], progress=progress,
            )
            result.server = {**(result.server or {}), "fingerprint": plan["fingerprint"], "variant": plan["variant"],
                             "spec_id": plan["spec_id"], "client": c["name"], "argv": summary["argv"]}
            measured.append((result, c))
            summary["clients"].append({"name": c["name"], "seconds": time.time() - t0,
                                       "accept_length": result.summary.get("accept_length"),
                                       "output_tps_median": result.summary.get("output_tps_median")})
    for result, c in measured:
        write_results(result, c["out_json"], c["out_csv"])
    summary.update(skipped=False, finished_at=time.time())
    write_json(plan["summary"], summary)
    return summary


def _write_skipped_csv(path: str, reason: str) -> None:
    write_text(path, f"# skipped: {reason}\n")


# --- SpecForge arms ---------------------------------------------------------------------------


def specforge_commands(cfg: Mapping[str, Any], arm: str, target: str, patched: str, data: str, mapping: str,
                       run: str, configfile: str, tokens: str, state_dir: str) -> list[list[str]]:
    """The three commands of a SpecForge arm: write its run config, ``specforge train``, import the checkpoint.

    ``configfile`` is the merged experiment config the pipeline wrote (every --configfile and --config),
    so SpecForge gets the trainer's max length and settings. keep: warm start, the drafter's own
    mapping pinned; regenerate: warm start, the new mapping pinned (rows kept by index, the known trap,
    on purpose); scratch: no warm start, the new mapping. SpecForge's output (checkpoints, run config,
    job file) lives in ``state_dir``, outside the rule's output, so a killed job can resume.
    """
    from draftlab.specforge import RUN_CONFIG

    mode = arm.removeprefix("finetune-") if arm != "scratch" else None
    if mode == "remap":
        raise DraftlabError(
            f"{configfile}: key 'train.finetune_modes': 'remap' is not available with train.backend "
            "specforge (SpecForge keeps lm_head rows by index); use keep or regenerate, or the builtin backend"
        )
    pinned = patched if mode == "keep" else mapping
    out = f"{state_dir}/specforge"
    draft_config = f"{patched}/config.json"
    prepare = ["draftlab", "specforge-command", "--config", configfile, "--target", target,
               "--draft-config", draft_config, "--data", data, "--tokens", tokens, "--mapping", pinned,
               "--output-dir", out]
    if mode:
        prepare += ["--ckpt-dir", patched]
    train = ["specforge", "train", "--config", f"{out}/{RUN_CONFIG}"]
    imp = ["draftlab", "import-specforge", out, "--out", f"{run}/drafter", "--expect-mapping", pinned,
           "--draft-config", draft_config, "--expect-steps", str(int(cfg["train"]["steps"]))]
    return [prepare, train, imp]


# --- the probe gate ----------------------------------------------------------------------------


def gate_decision(probe_results: Sequence[str | os.PathLike], min_accept_length: float) -> dict[str, Any]:
    """Pass when the best probe accept length (bonus token included) reaches ``min_accept_length``."""
    measured = []
    for path in probe_results:
        data = read_json(path, "probe benchmark result")
        length = (data.get("summary") or {}).get("accept_length")
        measured.append({"result": str(path), "accept_length": length})
    lengths = [m["accept_length"] for m in measured if m["accept_length"] is not None]
    best = max(lengths) if lengths else None
    ok = best is not None and best >= min_accept_length
    if best is None:
        reason = "the probe produced no accept length (no speculative verification was measured)"
    elif ok:
        reason = (f"probe accept length {best:.3f} >= {min_accept_length} (gate.min_accept_length): "
                  "the transferred drafter is worth fine-tuning")
    else:
        reason = (f"probe accept length {best:.3f} < {min_accept_length} (gate.min_accept_length): "
                  "the transferred drafter barely drafts anything on this target, fine-tuning skipped")
    return {"pass": ok, "decision": "fine-tune" if ok else "skip", "reason": reason,
            "min_accept_length": float(min_accept_length), "best_accept_length": best, "measured": measured}


# --- gated jobs --------------------------------------------------------------------------------


def gate_closed(gate: str | None = None, unless_skipped: str | None = None) -> str | None:
    """The reason a gated job must not run, or None: a closed gate, or an upstream job that skipped."""
    if gate:
        decision = read_json(gate, "probe gate decision")
        if not decision["pass"]:
            return decision["reason"]
    if unless_skipped:
        marker = Path(unless_skipped) / SKIP_MARKER
        if marker.exists():
            return read_json(marker, "skip marker").get("reason", f"{unless_skipped} was skipped")
    return None


def run_gated(cmd: Sequence[str], *, gate: str | None, unless_skipped: str | None,
              skip_dirs: Sequence[str] = (), skip_files: Sequence[str] = ()) -> int:
    """Run ``cmd`` unless the gate is closed; then write explicit ``skipped`` outputs instead."""
    reason = gate_closed(gate, unless_skipped)
    if reason is None:
        sys.stdout.flush()
        sys.stderr.flush()
        return subprocess.run(list(cmd)).returncode
    print(f"skipped (gate closed): {reason}\n  not run: {' '.join(cmd)}", file=sys.stderr)
    payload = {"skipped": True, "reason": reason, "command": list(cmd)}
    for d in skip_dirs:
        Path(d).mkdir(parents=True, exist_ok=True)
        write_json(Path(d) / SKIP_MARKER, payload)
    for f in skip_files:
        if str(f).endswith(".json"):
            write_json(f, payload)
        else:
            write_text(f, f"**skipped**: {reason}\n")
    return 0
