"""The report's three plots (accept length, throughput against break-even, TTT accuracy).

Split from draftlab.experiment.report so that module holds the text and this one matplotlib: a
plot reads the same records rows and standing files the summary does and writes one PNG atomically.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from draftlab.benchmark.verdict import baseline_row, best_by_accept, fmt as _fmt, num as _num
from draftlab.fsutil import atomic_path


def ok(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows that measured something (``status`` ok)."""
    return [r for r in rows if r["status"] == "ok"]


_ok = ok


def _plot(path: Path, draw, n: int = 4) -> None:
    import matplotlib  # deferred: matplotlib (~1 s), only when a plot is drawn

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # deferred: matplotlib (~1 s), only when a plot is drawn

    fig, ax = plt.subplots(figsize=(max(7.0, 1.3 * n + 2), 4.6), dpi=100)
    draw(ax)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", metadata={"Software": None})
    plt.close(fig)


def _xlabels(ax, rows) -> None:
    """One tick per arm, 'variant' over 'spec', turned so long names never run into each other."""
    ax.set_xticks(range(len(rows)), [f"{r['variant']}\n{r['spec_id']}" for r in rows], fontsize=8,
                  rotation=30, ha="right", rotation_mode="anchor")
    ax.set_xlim(-0.6, len(rows) - 0.4)


def _span(values: Sequence[float], pad: float = 0.15) -> tuple[float, float]:
    lo, hi = min(values), max(values)
    margin = max((hi - lo) * pad, abs(hi) * 0.02, 1e-3)
    return lo - margin, hi + margin


def _breakeven_by_arm(standing) -> dict[tuple[str, str, str], float]:
    return {(d["name"], spec, client): float(d["break_even_accept_length"])
            for spec, client, st in standing for d in st.get("drafters", []) if not d.get("skipped")}


def plot_accept(rows: list[dict[str, Any]], path: Path, standing=()) -> None:
    """Accept length per arm, axis scaled to the data, with the probe's level and each arm's break-even."""
    client = rows[0]["client"] if rows else None
    sel = [r for r in _ok(rows) if r["client"] == client and r["variant"] != "baseline" and _num(r["accept_length"])]
    be = _breakeven_by_arm(standing)
    probe = best_by_accept(rows, ["probe"], client) if rows else None

    def draw(ax):
        if not sel:
            ax.text(0.5, 0.5, "no accept length measured", ha="center", va="center", transform=ax.transAxes)
            return
        vals = [_num(r["accept_length"]) for r in sel]
        marks = [be.get((r["variant"], r["spec_id"], client)) for r in sel]
        ax.plot(range(len(sel)), vals, "o", color="#4c72b0", ms=8, label="accept length (bonus token included)")
        for x, v in enumerate(vals):
            ax.annotate(f"{v:.2f}", (x, v), textcoords="offset points", xytext=(0, 7), ha="center", fontsize=8)
        if any(m is not None for m in marks):
            ax.plot([x for x, m in enumerate(marks) if m is not None], [m for m in marks if m is not None], "_",
                    color="#c44e52", ms=22, mew=2, label="break-even (baseline tok/s x own cycle)")
        if probe is not None:
            ax.axhline(_num(probe["accept_length"]), color="grey", lw=1, ls="--",
                       label=f"probe (transferred as is): {_fmt(probe['accept_length'])}")
        lo, hi = _span(vals + [m for m in marks if m is not None])
        ax.set_ylim(lo, hi)
        _xlabels(ax, sel)
        ax.set_ylabel("accept length (tokens per verify cycle)")
        ax.set_title(f"Accept length by variant (client {client}; axis not from 0)")
        ax.legend(fontsize=7, loc="best")

    _plot(path, draw, len(sel))


def plot_tps(rows: list[dict[str, Any]], path: Path) -> None:
    """Median tok/s per arm with its 95% interval, the baseline's median and interval as a band."""
    client = rows[0]["client"] if rows else None
    sel = [r for r in _ok(rows) if r["client"] == client and _num(r["tps_median"]) is not None]
    base = baseline_row(rows, client) if rows else None

    def draw(ax):
        if not sel:
            ax.text(0.5, 0.5, "no throughput measured", ha="center", va="center", transform=ax.transAxes)
            return
        vals = [_num(r["tps_median"]) for r in sel]
        lows = [_num(r["tps_ci_low"]) if _num(r["tps_ci_low"]) is not None else v for v, r in zip(vals, sel)]
        highs = [_num(r["tps_ci_high"]) if _num(r["tps_ci_high"]) is not None else v for v, r in zip(vals, sel)]
        err = [[max(0.0, v - lo) for v, lo in zip(vals, lows)], [max(0.0, hi - v) for v, hi in zip(vals, highs)]]
        colors = ["#8c8c8c" if r["variant"] == "baseline" else "#55a868" for r in sel]
        for x, (v, c) in enumerate(zip(vals, colors)):
            ax.errorbar(x, v, yerr=[[err[0][x]], [err[1][x]]], fmt="o", color=c, ms=7, capsize=4)
        if base is not None and _num(base["tps_median"]):
            b = _num(base["tps_median"])
            ax.axhline(b, color="#c44e52", lw=1.5, ls="--", label=f"baseline = break-even ({b:.1f} tok/s)")
            iv = (_num(base["tps_ci_low"]), _num(base["tps_ci_high"]))
            if None not in iv:
                ax.axhspan(iv[0], iv[1], color="#c44e52", alpha=0.12, label="baseline 95% interval")
            ax.legend(fontsize=7, loc="best")
        lo, hi = _span(lows + highs)
        ax.set_ylim(max(0.0, lo), hi)  # scaled to the data, never below 0 tok/s
        _xlabels(ax, sel)
        ax.set_ylabel("output tok/s (median, 95% interval)")
        ax.set_title(f"Throughput against plain decoding (client {client})")

    _plot(path, draw, len(sel))


def plot_ttt(curves: dict[str, list[float]], path: Path, serving: dict[str, list[float]] | None = None) -> None:
    """TTT per-step validation accuracy (solid) beside serving acceptance by draft position (dashed).

    Serving position i is the share of verify cycles with at least i+1 drafts accepted, so it is the
    product of per-step acceptances up to i and sits below a per-step accuracy curve that holds steady.
    """
    serving = serving or {}

    def draw(ax):
        from matplotlib.ticker import MaxNLocator  # deferred: matplotlib (~1 s), only when a plot is drawn

        colors = {}
        for name, acc in curves.items():
            line, = ax.plot(range(len(acc)), acc, marker="o", label=f"{name}: TTT validation accuracy")
            colors[name] = line.get_color()
        for name, rates in serving.items():
            ax.plot(range(len(rates)), rates, marker="s", ls="--", color=colors.get(name),
                    label=f"{name}: served, P(draft i accepted)")
        if not curves and not serving:
            ax.text(0.5, 0.5, "no trained drafters (fine-tuning skipped)", ha="center", va="center",
                    transform=ax.transAxes)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("TTT step / draft position (0 = first drafted token)")
        ax.set_ylabel("validation accuracy (solid)\nserving acceptance (dashed)")
        ax.set_ylim(0, 1)
        ax.set_title("TTT accuracy per step (solid), served acceptance by position (dashed)", fontsize=10)
        if curves or serving:
            ax.legend(fontsize=7)

    _plot(path, draw)
