"""What a plan of launches can tell, before it runs: the smallest speed-up it separates from 1.0.

A trained arm is compared with plain decoding across launches, so its decision must clear the launch margin
``t(0.975, df) * sigma * sqrt(1/m + 1/n)`` (:mod:`draftlab.benchmark.launch_noise`) on top of its paired interval
over prompts (``1.96 * se``). The design fixes m = n = ``bench.launch_replicates`` and the degrees of freedom
(:func:`design`); sigma, the per-launch effect, and se, the paired prompt-level standard error, come from earlier
runs of the same experiment on this host where the report recorded them (:func:`prior`, the history file the
report appends to), else from a stated assumption. The smallest speed-up told with 90% power (a false deploy at
most 2.5% one-sided) is then about ``exp((t(0.975, df) + t(0.90, df)) * sigma * sqrt(2 / R) + (1.96 + 1.28) *
se)`` (:func:`smallest_speedup`): the t quantiles carry that sigma is itself estimated from df contrasts (the
noncentral-t sample size formula), and benchmarks/decision_power.py measures the real decision code's rate.
The prior predicts; the decision uses only its own run's estimate, so a host that got noisier cannot lend the
verdict a quietness it no longer has.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import platform
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from draftlab.benchmark.bench_summary import Z_975, t_quantile_975
from draftlab.fsutil import atomic_path

Z_90 = 1.281552  # the standard normal's 0.90 quantile: 90% power
# t(0.90, df) for df = 1..30 (a table: the Cornish-Fisher series is poor below ~5 degrees)
_T90 = (3.078, 1.886, 1.638, 1.533, 1.476, 1.440, 1.415, 1.397, 1.383, 1.372, 1.363, 1.356, 1.350, 1.345, 1.341,
        1.337, 1.333, 1.330, 1.328, 1.325, 1.323, 1.321, 1.319, 1.318, 1.316, 1.315, 1.314, 1.313, 1.311, 1.310)
# without an earlier run on this host: a 3% launch effect per launch (the middle of what the launch checks and
# relaunches have read on one H100: relaunches 0.2-1.2%, checks 1.4-10.6%) and a 1% prompt-level standard error
# (49-81 prompts paired per prompt on a GPU: intervals about +-2%)
ASSUMED_SIGMA, ASSUMED_SE = 0.03, 0.01
POWER = 0.90
MAX_REPLICATES = 8  # the setting's schema maximum


def t_quantile_90(df: int) -> float:
    """t(0.90, df): the table up to 30 degrees, the normal's beyond (within 0.01)."""
    return _T90[df - 1] if df <= len(_T90) else Z_90 + (Z_90 ** 3 + Z_90) / (4 * df)


@dataclasses.dataclass(frozen=True)
class Design:
    """What a plan of launches measures: ``replicates`` (R = m = n: each arm and plain decoding benched in that
    many launches), ``checking`` (arms launches that swap the probe in: R contrasts each, the probe's own launch
    against each replicate), ``unchecked`` (the plain launch and the arms launches that cannot check: R - 1
    contrasts each, among their replicates) and ``launches`` (target starts behind an open gate)."""

    replicates: int
    checking: int
    unchecked: int
    launches: int = 0

    @property
    def df(self) -> int:
        """Degrees of freedom of the launch noise: the contrasts (:mod:`draftlab.benchmark.replicated`)."""
        return self.checking * self.replicates + self.unchecked * (self.replicates - 1)

    def at(self, replicates: int) -> "Design":
        """The same plan with ``replicates``: the launches grow by the replicated ones."""
        per = self.checking + self.unchecked
        return dataclasses.replace(self, replicates=replicates,
                                   launches=self.launches + (replicates - self.replicates) * per)

    def margin_log(self, sigma: float) -> float:
        """The launch margin of an arm against plain decoding at this design, log scale (inf: unmeasured)."""
        return t_quantile_975(self.df) * sigma * math.sqrt(2.0 / self.replicates) if self.df else math.inf


def smallest_speedup(d: Design, sigma: float, se: float) -> float:
    """The smallest true speed-up the design deploys with 90% power: inf where no launch noise is measured."""
    if not d.df:
        return math.inf
    launch = (t_quantile_975(d.df) + t_quantile_90(d.df)) * sigma * math.sqrt(2.0 / d.replicates)
    return math.exp(launch + (Z_975 + Z_90) * se)


# --- the launch noise earlier runs of this experiment measured on this host --------------------------------


def history_path(exp_dir: str | Path) -> Path:
    """Where the report records each run's launch noise (one JSON line a run, per experiment folder)."""
    return Path(exp_dir) / "launch-noise-history.jsonl"


def record(exp_dir: str | Path, launch: Mapping[str, Any], se: float | None, summaries_key: str,
           host: str | None = None) -> bool:
    """Append this run's measured launch noise (``sigma``, ``df``, the prompt-level ``se``, the ``host`` its
    launches ran on: default this one) to the history, once per set of launches (``summaries_key``: a rerun
    report adds nothing); False where unmeasured."""
    if not launch.get("measured") or launch.get("sigma") is None:
        return False
    path = history_path(exp_dir)
    old = path.read_text() if path.exists() else ""
    if any(json.loads(line).get("key") == summaries_key for line in old.splitlines() if line.strip()):
        return False
    entry = {"key": summaries_key, "host": host or platform.node(), "at": time.time(), "sigma": launch["sigma"],
             "sigma_drift": launch.get("sigma_drift"), "df": launch["df"], "se": se,
             "replicates": launch.get("replicates") or 1}
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        Path(tmp).write_text(old + json.dumps(entry) + "\n")
    return True


def launch_host(summaries: Sequence[Mapping[str, Any]]) -> str | None:
    """The host every launch of a run ran on (``launch.json`` ``host``), or None where they differ or say none
    (a cluster's report job runs elsewhere: the launches' host is the one whose noise was measured)."""
    hosts = {s.get("host") for s in summaries}
    return hosts.pop() if len(hosts) == 1 and None not in hosts else None


def summaries_key(summaries: Sequence[Mapping[str, Any]]) -> str:
    """One run's launches, named by their ids and start times."""
    ids = sorted(f"{s.get('launch')}@{s.get('started_at')}" for s in summaries)
    return hashlib.sha256("\n".join(ids).encode()).hexdigest()[:16]


def prior(exp_dir: str | Path, host: str | None = None) -> dict[str, Any] | None:
    """The launch noise earlier runs of this experiment measured on this host: sigma pooled over their degrees of
    freedom (sum df_i sigma_i^2 / sum df_i), their prompt-level se (root mean square), ``runs`` and ``df``; None
    where the history holds none for this host."""
    path = history_path(exp_dir)
    host = host or platform.node()
    if not path.exists():
        return None
    runs = []
    for line in path.read_text().splitlines():
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if isinstance(e, dict) and e.get("host") == host and e.get("sigma") is not None and e.get("df"):
            runs.append(e)
    if not runs:
        return None
    df = sum(int(e["df"]) for e in runs)
    ses = [float(e["se"]) for e in runs if e.get("se") is not None]
    return {"sigma": math.sqrt(sum(int(e["df"]) * float(e["sigma"]) ** 2 for e in runs) / df), "df": df,
            "runs": len(runs), "se": math.sqrt(sum(x * x for x in ses) / len(ses)) if ses else None, "host": host}


def plan_lines(d: Design, p: Mapping[str, Any] | None) -> list[str]:
    """What the plan ``d`` can tell, in words: the smallest speed-up it separates from 1.0 and from what noise
    (``p``: :func:`prior`, or None: the stated assumption), and the setting that would lower it
    (``bench.launch_replicates`` one higher)."""
    sigma = p["sigma"] if p else ASSUMED_SIGMA
    se = (p or {}).get("se") or ASSUMED_SE
    came = (f"the launch noise {p['runs']} earlier run(s) of this experiment measured on this host ({p['host']}): "
            f"sigma {sigma:.2%} a launch over {p['df']} contrasts" if p else
            f"no earlier run of this experiment on this host recorded one: sigma {sigma:.0%} a launch assumed")
    prompts = f"prompt-level standard error {se:.1%}" + ("" if p and p.get("se") else " assumed")
    if not d.df:
        return [f"power: this plan ({d.launches} launches, bench.launch_replicates {d.replicates}) measures no launch "
                "noise (no arms launch can swap the probe in and nothing is replicated): set bench.launch_replicates: 2 "
                "to measure it"]
    s = smallest_speedup(d, sigma, se)
    lines = [f"power: this plan ({d.launches} launches in all once the gate opens, bench.launch_replicates {d.replicates}, "
             f"{d.df} degree(s) of freedom for the launch noise: t(0.975, {d.df}) = {t_quantile_975(d.df):.2f}) tells a "
             f"speed-up of {s:.2f}x or more from 1.0 with 90% power, false deploys at most 2.5% ({came}; {prompts})"]
    if d.replicates < MAX_REPLICATES:
        more = d.at(d.replicates + 1)
        lines.append(f"power: bench.launch_replicates: {more.replicates} ({more.launches} launches, {more.df} degrees of "
                     f"freedom) would tell {smallest_speedup(more, sigma, se):.2f}x")
    return lines


def replicates_needed(d: Design, sigma: float, lo: float) -> int | None:
    """The fewest replicates whose launch margin an interval with lower end ``lo`` would have cleared at the
    measured ``sigma`` (the estimate held where it is); None where even :data:`MAX_REPLICATES` would not."""
    if lo <= 1.0:
        return None
    return next((r for r in range(1, MAX_REPLICATES + 1) if math.log(lo) > d.at(r).margin_log(sigma)), None)


def run_design(launch: Mapping[str, Any]) -> Design | None:
    """The design a run measured its launch noise with (``launch["design"]``: :mod:`draftlab.benchmark.
    replicated`), or None where it measured none."""
    d = launch.get("design") if launch and launch.get("measured") and launch.get("sigma") is not None else None
    return Design(int(d["replicates"]), int(d["checking"]), int(d["unchecked"])) if d else None


def interval_se(p: Mapping[str, Any] | None) -> float | None:
    """A paired comparison's prompt-level standard error on a log scale, from its 95% interval."""
    ci = (p or {}).get("ci95")
    return math.log(ci[1] / ci[0]) / (2 * Z_975) if ci and ci[0] and ci[1] and ci[1] > ci[0] > 0 else None


def report_lines(decision: Mapping[str, Any]) -> list[str]:
    """The decision section's power paragraph: the smallest speed-up this run's design tells at the launch noise
    it measured, the setting that would lower it, and for a cannot-tell against plain decoding the replicates
    that would have told it (the estimate held where it is)."""
    launch = decision.get("launch") or {}
    d = run_design(launch)
    if d is None:
        return []
    sigma, se = float(launch["sigma"]), interval_se(decision.get("paired")) or ASSUMED_SE
    s = smallest_speedup(d, sigma, se)
    line = (f"**Power:** at the launch noise this run measured (sigma {sigma:.2%} a launch, {d.df} degree(s) of "
            f"freedom) and the fastest arm's prompt-level standard error ({se:.1%}), this design "
            f"(bench.launch_replicates {d.replicates}) tells {s:.2f}x or more from 1.0 with 90% power")
    if d.replicates < MAX_REPLICATES:
        line += (f"; bench.launch_replicates: {d.replicates + 1} ({d.at(d.replicates + 1).df} degrees of freedom) "
                 f"would tell {smallest_speedup(d.at(d.replicates + 1), sigma, se):.2f}x")
    versus = decision.get("versus") or {}
    if decision.get("verdict") == "cannot-tell" and versus.get("margin_source") == "launch" and versus.get("ci95"):
        need = replicates_needed(d, sigma, versus["ci95"][0])
        line += (f". This cannot-tell would have been told by bench.launch_replicates: {need} (its interval's low end "
                 f"{versus['ci95'][0]:.2f} cleared against that margin)" if need else
                 f". Its interval's low end ({versus['ci95'][0]:.2f}) clears no launch margin up to "
                 f"bench.launch_replicates {MAX_REPLICATES} at this noise: a host whose launches agree would tell "
                 "(more prompts narrow the interval, not the launch margin)")
    return [line + "."]


def keys(decision: Mapping[str, Any]) -> dict[str, Any]:
    """recommendation.json's power keys: ``launch_sigma`` (per launch, log), ``launch_df``,
    ``launch_replicates``, ``smallest_speedup`` (90% power at this design and noise) and ``replicates_needed``
    (a cannot-tell's: None where none up to the schema's maximum, or not a launch-margin cannot-tell)."""
    launch = decision.get("launch") or {}
    d = run_design(launch)
    if d is None:
        return {"launch_sigma": None, "launch_df": None, "launch_replicates": None, "smallest_speedup": None,
                "replicates_needed": None}
    se = interval_se(decision.get("paired")) or ASSUMED_SE
    versus = decision.get("versus") or {}
    need = (replicates_needed(d, float(launch["sigma"]), versus["ci95"][0])
            if decision.get("verdict") == "cannot-tell" and versus.get("margin_source") == "launch" and versus.get("ci95")
            else None)
    return {"launch_sigma": launch["sigma"], "launch_df": d.df, "launch_replicates": d.replicates,
            "smallest_speedup": smallest_speedup(d, float(launch["sigma"]), se), "replicates_needed": need}
