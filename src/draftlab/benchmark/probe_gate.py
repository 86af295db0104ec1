"""The probe gate (checkpoint ``probe_gate``, ``draftlab probe-gate``) and the gated-job wrapper (``draftlab gated``).

Fine-tune only when the transferred drafter already drafts something on the new target. In the
workflow the gate is a Snakemake checkpoint: :func:`gate_open` on its decision file decides whether
the trained arms exist in the DAG at all. ``draftlab gated`` stays for running a command by hand
behind a gate: with the gate closed it writes explicit ``skipped`` outputs (a ``SKIPPED.json``
marker) instead of running.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Sequence

from draftlab.errors import DraftlabError
from draftlab.fsutil import read_json, write_json, write_text

SKIP_MARKER = "SKIPPED.json"


def gate_decision(probe_results: Sequence[str | os.PathLike], min_accept_length: float) -> dict[str, Any]:
    """Pass when the best probe accept length (bonus token included) reaches ``min_accept_length``."""
    if isinstance(min_accept_length, bool) or not isinstance(min_accept_length, (int, float)) \
            or not math.isfinite(min_accept_length) or min_accept_length < 1:
        raise DraftlabError(f"--min-accept-length: expected a finite number >= 1, got {min_accept_length!r}")
    measured = []
    for path in probe_results:
        measured.append({"result": str(path), "accept_length": _accept_length(path)})
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


def _accept_length(path: str | os.PathLike) -> float | None:
    """A probe result's ``summary.accept_length``: null (nothing verified) or a finite number >= 1."""
    summary = read_json(path, "probe benchmark result").get("summary")
    if not isinstance(summary, dict):
        raise DraftlabError(f"{path}: key 'summary': expected an object (a draftlab bench result), got {summary!r:.60}")
    length = summary.get("accept_length")
    if length is None:
        return None
    if isinstance(length, bool) or not isinstance(length, (int, float)) or not math.isfinite(length) or length < 1:
        raise DraftlabError(f"{path}: key 'summary.accept_length': expected a finite number >= 1 (the bonus token "
                            f"included) or null, got {length!r:.60}")
    return float(length)


def read_decision(gate: str | os.PathLike) -> dict[str, Any]:
    """A ``probe-gate`` decision file: ``pass`` (true/false) and, when closed, its ``reason``."""
    decision = read_json(gate, "probe gate decision")
    if not isinstance(decision.get("pass"), bool):
        raise DraftlabError(f"{gate}: key 'pass': expected true or false (a decision written by draftlab "
                            f"probe-gate), got {decision.get('pass', 'nothing')!r:.60}")
    if not decision["pass"] and not isinstance(decision.get("reason"), str):
        raise DraftlabError(f"{gate}: key 'reason': expected the text of why the gate is closed, got "
                            f"{decision.get('reason', 'nothing')!r:.60}")
    return decision


def gate_open(gate: str | os.PathLike) -> bool:
    """Whether the decision file of ``probe-gate`` lets the trained arms exist."""
    return read_decision(gate)["pass"]


# --- gated jobs --------------------------------------------------------------------------------


def gate_closed(gate: str | None = None, unless_skipped: str | None = None) -> str | None:
    """The reason a gated job must not run, or None: a closed gate, or an upstream job that skipped."""
    if gate:
        decision = read_decision(gate)
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
