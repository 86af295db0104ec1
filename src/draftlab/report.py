"""The experiment report: a Markdown summary a person reads, and the plots beside it.

Everything comes from files the pipeline already wrote under ``results/<experiment>/`` (records,
gate decision, doctor reports, d2t diff and coverage, training metrics and validation), so the
report can be regenerated at any time and never measures anything itself. Sections: the decision in
words, the comparison table, accept length by variant, tok/s against baseline with the break-even
line, TTT per-step accuracy of every trained drafter, the d2t diff, doctor findings, the gate.
"""

from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path
from typing import Any, Sequence

from draftlab.fsutil import atomic_path, write_text

PLOTS = {"accept": "accept_length.png", "tps": "throughput.png", "ttt": "ttt_accuracy.png"}


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _num(v: Any) -> float | None:
    if v is None or v == "":
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def _fmt(v: Any, spec: str = "{:.2f}") -> str:
    f = _num(v)
    return "–" if f is None else spec.format(f)


def load_rows(records_csv: str | os.PathLike) -> list[dict[str, Any]]:
    with open(records_csv, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def break_even(baseline_tps: float | None, cycle_ms: float | None) -> float | None:
    """Accept length at which a drafter merely matches plain decoding: X * C / 1000."""
    if not baseline_tps or not cycle_ms:
        return None
    return baseline_tps * cycle_ms / 1000.0


def _baseline_tps(rows: list[dict[str, Any]], client: str) -> float | None:
    for r in rows:
        if r["variant"] == "baseline" and r["client"] == client:
            return _num(r["tps_median"])
    return None


def _ok(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r["status"] == "ok"]


def _best(rows: list[dict[str, Any]], variants: Sequence[str], client: str) -> dict[str, Any] | None:
    cands = [r for r in _ok(rows) if r["variant"] in variants and r["client"] == client and _num(r["accept_length"])]
    return max(cands, key=lambda r: (_num(r["speedup"]) or 0.0, _num(r["accept_length"]) or 0.0)) if cands else None


def decision_text(rows: list[dict[str, Any]], gate: dict[str, Any] | None) -> list[str]:
    """The outcome in plain sentences, from the main (first) client's numbers."""
    if not rows:
        return ["No benchmark results were recorded."]
    client = rows[0]["client"]
    out = []
    probe = _best(rows, ["probe"], client)
    if probe:
        out.append(
            f"The transferred drafter, served as is (config patched), reaches accept length "
            f"{_fmt(probe['accept_length'])} at {probe['spec_id']} ({_fmt(probe['tps_median'], '{:.1f}')} tok/s, "
            f"{_fmt(probe['speedup'])}x plain decoding)."
        )
    if gate:
        verdict = "passed" if gate.get("pass") else "failed"
        out.append(f"Probe gate {verdict}: {gate.get('reason')}.")
    trained = sorted({r["variant"] for r in rows if r["variant"].startswith("finetune-")})
    if gate and not gate.get("pass"):
        out.append("Fine-tuning and the from-scratch control arm were skipped, so their rows are marked `skipped`.")
    else:
        ft = _best(rows, trained, client)
        sc = _best(rows, ["scratch"], client)
        if ft:
            out.append(f"Best fine-tuned drafter: {ft['variant']} at {ft['spec_id']}: accept length "
                       f"{_fmt(ft['accept_length'])}, {_fmt(ft['speedup'])}x plain decoding.")
        if ft and sc:
            a, b = _num(ft["accept_length"]), _num(sc["accept_length"])
            better = "beats" if a > b else "does not beat"
            out.append(f"Transfer {better} training from scratch on the same data: accept length {a:.2f} vs "
                       f"{b:.2f} (control arm `scratch`, {_fmt(sc['speedup'])}x).")
    best = _best(rows, [r["variant"] for r in rows if r["variant"] != "baseline"], client)
    if best and (_num(best["speedup"]) or 0) > 1.0:
        out.append(f"**Decision:** serve `{best['variant']}` with {best['spec_id']}: "
                   f"{_fmt(best['speedup'])}x the baseline's {_fmt(_baseline_tps(rows, client), '{:.1f}')} tok/s "
                   f"(client `{client}`).")
    elif best:
        out.append(f"**Decision:** no drafter beats plain decoding here (best: `{best['variant']}`, "
                   f"{_fmt(best['speedup'])}x); keep serving without speculation.")
    return out


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return lines


E2E_MARK = "†"
E2E_NOTE = (f"{E2E_MARK} timed from the server's end-to-end latency per verify step (`cycle_ms_source` "
            "`e2e_latency` or `client_latency`): prefill and queueing included, so an upper bound, not the "
            "verify cycle; SGLang 0.5.23 reports no draft/verify times (add `--enable-metrics` to "
            "`serve.extra_args` for `first_token_latency`, which draftlab then subtracts).")


def _cycle(r: dict[str, Any]) -> tuple[float | None, str]:
    """The row's cycle time and the mark it carries when it is not a verify-cycle timing."""
    from draftlab.bench import is_verify_cycle

    c = _num(r.get("cycle_ms"))
    source = r.get("cycle_ms_source") or None
    return c, "" if c is None or is_verify_cycle(source) else E2E_MARK


def _e2e_note(rows: list[dict[str, Any]]) -> list[str]:
    return ["", E2E_NOTE] if any(_cycle(r)[1] for r in rows) else []


def comparison_table(rows: list[dict[str, Any]]) -> list[str]:
    body = []
    for r in rows:
        ci = ""
        if _num(r["tps_ci_low"]) is not None:
            ci = f" [{_fmt(r['tps_ci_low'], '{:.1f}')}, {_fmt(r['tps_ci_high'], '{:.1f}')}]"
        val = _fmt(r["val_acc_mean"], "{:.3f}")
        status = "" if r["status"] == "ok" else " (skipped)"
        body.append([r["variant"] + status, r["spec_id"], r["client"],
                     _fmt(r["tps_median"], "{:.1f}") + ci, _fmt(r["accept_length"]),
                     _fmt(r["cycle_ms"], "{:.1f}") + _cycle(r)[1], val, _fmt(r["speedup"])])
    return _table(["variant", "spec", "client", "tok/s median [95% CI]", "accept length", "cycle ms",
                   "val. acc (mean over TTT steps)", "speedup"], body) + _e2e_note(rows)


def breakeven_table(rows: list[dict[str, Any]], target_tps: Sequence[float]) -> list[str]:
    body = []
    for r in _ok(rows):
        if r["variant"] == "baseline":
            continue
        x = _baseline_tps(rows, r["client"])
        (c, mark), length = _cycle(r), _num(r["accept_length"])
        be = break_even(x, c)
        goals = []
        for t in target_tps:
            need = t * c / 1000.0 if c else None
            goals.append("–" if need is None else f"{need:.2f} ({'met' if length and length >= need else 'not met'})")
        verdict = "–" if be is None or length is None else ("above" if length >= be else "below")
        body.append([r["variant"], r["spec_id"], r["client"], _fmt(length), _fmt(be) + (mark if be else ""), verdict]
                    + goals)
    return _table(["variant", "spec", "client", "accept length", "break-even accept length", "vs break-even"]
                  + [f"needed for {t:g} tok/s" for t in target_tps], body) + _e2e_note(_ok(rows))


def ttt_curves(exp_dir: Path) -> dict[str, list[float]]:
    """Validation accuracy per TTT step of every trained drafter that was trained."""
    out = {}
    for d in sorted((exp_dir / "train").glob("*")):
        val = _read_json(d / "validation.json")
        if isinstance(val, dict) and val.get("acc"):
            out[d.name] = [float(a) for a in val["acc"]]
    return out


def _plot(path: Path, draw) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    draw(ax)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", metadata={"Software": None})
    plt.close(fig)


def _labels(rows):
    return [f"{r['variant']}\n{r['spec_id']}" for r in rows]


def plot_accept(rows: list[dict[str, Any]], path: Path) -> None:
    client = rows[0]["client"] if rows else None
    sel = [r for r in _ok(rows) if r["client"] == client and r["variant"] != "baseline"]

    def draw(ax):
        ax.bar(range(len(sel)), [_num(r["accept_length"]) or 0 for r in sel], color="#4c72b0")
        ax.axhline(1.0, color="grey", lw=1, ls=":", label="1.0 = nothing accepted")
        ax.set_xticks(range(len(sel)), _labels(sel), fontsize=7)
        ax.set_ylabel("accept length (bonus token included)")
        ax.set_title(f"Accept length by variant (client {client})")
        ax.legend(fontsize=7)

    _plot(path, draw)


def plot_tps(rows: list[dict[str, Any]], path: Path) -> None:
    client = rows[0]["client"] if rows else None
    sel = [r for r in _ok(rows) if r["client"] == client]
    base = _baseline_tps(rows, client)

    def draw(ax):
        vals = [_num(r["tps_median"]) or 0 for r in sel]
        err_lo = [max(0.0, v - (_num(r["tps_ci_low"]) or v)) for v, r in zip(vals, sel)]
        err_hi = [max(0.0, (_num(r["tps_ci_high"]) or v) - v) for v, r in zip(vals, sel)]
        ax.bar(range(len(sel)), vals, yerr=[err_lo, err_hi], color="#55a868", capsize=3)
        if base:
            ax.axhline(base, color="#c44e52", lw=1.5, ls="--", label=f"baseline = break-even ({base:.1f} tok/s)")
            ax.legend(fontsize=7)
        ax.set_xticks(range(len(sel)), _labels(sel), fontsize=7)
        ax.set_ylabel("output tok/s (median, 95% CI)")
        ax.set_title(f"Throughput against plain decoding (client {client})")

    _plot(path, draw)


def plot_ttt(curves: dict[str, list[float]], path: Path) -> None:
    def draw(ax):
        for name, acc in curves.items():
            ax.plot(range(len(acc)), acc, marker="o", label=name)
        if not curves:
            ax.text(0.5, 0.5, "no trained drafters (fine-tuning skipped)", ha="center", va="center",
                    transform=ax.transAxes)
        ax.set_xlabel("TTT step")
        ax.set_ylabel("validation accuracy (draft argmax == target argmax)")
        ax.set_ylim(0, 1)
        ax.set_title("Per-step accuracy of the trained drafters")
        if curves:
            ax.legend(fontsize=7)

    _plot(path, draw)


def _count(v: Any) -> str:
    if isinstance(v, list):
        return str(len(v))
    return "–" if v is None else str(v)


def d2t_section(exp_dir: Path) -> list[str]:
    diff = _read_json(exp_dir / "static" / "d2t-diff.json")
    cov = _read_json(exp_dir / "static" / "d2t-coverage.json")
    if not diff and not cov:
        return ["(no d2t analysis)"]
    lines = []
    if diff:
        lines += _table(["draft vocab", "draft ids mapped differently", "shared target ids", "only in drafter",
                         "only in data mapping"],
                        [[_count(diff.get("draft_vocab_size")), _count(diff.get("differing")),
                          _count(diff.get("shared_target_ids")), _count(diff.get("only_in_a")),
                          _count(diff.get("only_in_b"))]])
    if cov and cov.get("coverage") is not None:
        lines += ["", f"Coverage of the fine-tune tokens by the transferred drafter's vocabulary: "
                      f"{float(cov['coverage']):.1%} (an upper bound on acceptance)."]
    return lines


def doctor_section(exp_dir: Path) -> list[str]:
    body = []
    for path in sorted((exp_dir / "static").glob("doctor-*.json")):
        rep = _read_json(path) or {}
        name = path.stem.removeprefix("doctor-")
        if rep.get("skipped"):
            body.append([name, "–", "–", f"skipped: {rep.get('reason')}"])
            continue
        for f in rep.get("findings", []) or [{"code": "ok", "severity": "–", "message": "no findings"}]:
            body.append([name, f.get("severity", ""), f.get("code", ""), str(f.get("message", "")).replace("|", "/")])
    return _table(["drafter", "severity", "code", "message"], body) if body else ["(no doctor reports)"]


def write_report(exp_dir: str | os.PathLike, out_dir: str | os.PathLike, records_csv: str | os.PathLike,
                 target_tps: Sequence[float] = ()) -> dict[str, str]:
    """Write ``summary.md`` and the three plots under ``out_dir``; return their paths."""
    exp_dir, out_dir = Path(exp_dir), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = load_rows(records_csv)
    gate = _read_json(exp_dir / "gate" / "gate.json")
    curves = ttt_curves(exp_dir)
    paths = {k: out_dir / v for k, v in PLOTS.items()}
    plot_accept(rows, paths["accept"])
    plot_tps(rows, paths["tps"])
    plot_ttt(curves, paths["ttt"])
    experiment = rows[0]["experiment"] if rows else exp_dir.name
    md = [f"# draftlab report: {experiment}", ""]
    md += ["## Decision", ""] + decision_text(rows, gate) + [""]
    md += ["## Comparison", ""] + comparison_table(rows) + [""]
    md += ["## Accept length by variant", "", f"![accept length]({PLOTS['accept']})", ""]
    md += ["## Throughput against baseline and break-even", "",
           "Break-even accept length = baseline tok/s x cycle ms / 1000 (the drafter's own measured cycle).", ""]
    md += breakeven_table(rows, list(target_tps)) + ["", f"![throughput]({PLOTS['tps']})", ""]
    md += ["## TTT per-step validation accuracy", ""]
    if curves:
        k = max(len(a) for a in curves.values())
        md += _table(["drafter"] + [f"step {i}" for i in range(k)],
                     [[n] + [f"{a[i]:.3f}" if i < len(a) else "–" for i in range(k)] for n, a in curves.items()])
    else:
        md += ["No trained drafter (fine-tuning skipped or not configured)."]
    md += ["", f"![TTT accuracy]({PLOTS['ttt']})", ""]
    md += ["## d2t: transferred mapping vs the fine-tune data's", ""] + d2t_section(exp_dir) + [""]
    md += ["## Doctor findings", ""] + doctor_section(exp_dir) + [""]
    md += ["## Probe gate", ""]
    if gate:
        md += [f"- decision: **{gate.get('decision')}** (min accept length {gate.get('min_accept_length')}, "
               f"best probe {_fmt(gate.get('best_accept_length'), '{:.3f}')})", f"- {gate.get('reason')}"]
    else:
        md += ["(no gate decision)"]
    summary = out_dir / "summary.md"
    write_text(summary, "\n".join(md) + "\n")
    return {"summary": str(summary), **{k: str(v) for k, v in paths.items()}}
