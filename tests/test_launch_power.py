"""Replicated launches and the power of the decision: the pooled launch noise, the margin for averaged results,
the plan's smallest tellable speed-up, and the report's assembly of replicates, on synthetic inputs whose truth
is known (launch effects drawn from a known sigma; per-prompt times built from known speed-ups)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from draftlab.benchmark import launch_noise, paired, power, replicated
from draftlab.benchmark.bench_summary import t_quantile_975
from draftlab.benchmark.chain import contradicted, impossible_fit
from draftlab.benchmark.serve_launch import compare_speed
from draftlab.benchmark import verdict
from draftlab.benchmark.verdict import decide
from draftlab.experiment import jobs, launches
from draftlab.experiment.layout import Layout
from draftlab.settings.config import experiment_layers

ROOT = Path(__file__).resolve().parents[1]
N = 40


def _settings(configfiles=(), **overrides):
    return jobs.load_settings(*experiment_layers(ROOT / "config" / "config.yaml", [ROOT / f for f in configfiles],
                                                 overrides))


def _result(per_token: np.ndarray, launch: str, variant: str, repeats: int = 1) -> dict:
    rows = [{"phase": "measure", "repeat": r, "prompt_id": f"p{i}", "category": "all", "completion_tokens": 10,
             "latency_s": 10 * float(t), "verify_ct": 5} for r in range(repeats) for i, t in enumerate(per_token)]
    return {"rows": rows, "config": {"max_new_tokens": 10, "ignore_eos": True, "limit": None},
            "prompt_set": {"sha256": "x"}, "summary": {"output_tps_per_repeat": [1.0] * repeats},
            "server": {"launch": launch, "variant": variant, "client": "c"}}


def _contrast(speedup: float) -> dict:
    return {"speedup": speedup, "ci95": None, "noise": launch_noise.noise_of(speedup), "prompts": N}


# --- the pooled launch noise -----------------------------------------------------------------------


def test_pooled_sigma_recovers_the_launch_effect_it_was_drawn_with():
    rng = np.random.default_rng(1)
    sigma = 0.04
    groups = []
    for _ in range(400):  # 400 configurations, 3 launches each: 800 degrees of freedom
        e = rng.normal(0, sigma, 3)
        groups.append([_contrast(math.exp(e[i] - e[0])) for i in (1, 2)])
    est = launch_noise.pooled(groups)
    assert est["df"] == 800
    assert est["sigma"] == pytest.approx(sigma, rel=0.08)


def test_one_pair_gives_the_old_bound_exactly():
    """One check: the margin is t(0.975, 1) times its drift, as before replicated launches."""
    check = dict(_contrast(1.03), own_launch="probe-s2", arms_launch="arms-s2", variant="probe")
    launch = launch_noise.from_summaries([{"launch": "arms-s2", "launch_check": check}])
    assert launch["pairs"] == launch["df"] == 1
    assert launch["margin"] == pytest.approx(launch_noise.bound([1.03])[0])
    assert launch["margin"] == pytest.approx(math.expm1(12.706 * math.log(1.03)), rel=1e-3)


def test_the_margin_shrinks_with_replicates_as_sigma_times_root_of_one_over_m_plus_one_over_n():
    launch = {"t": 3.0, "sigma": 0.02, "margin": None, "replicates": 2}
    launch["margin"] = launch_noise.margin(launch, 2, 2)
    assert launch["margin"] == pytest.approx(math.expm1(3.0 * 0.02 * 1.0))
    assert launch_noise.margin(launch, 1, 2) == pytest.approx(math.expm1(3.0 * 0.02 * math.sqrt(1.5)))
    assert launch_noise.margin(launch, 1, 1) > launch_noise.margin(launch, 1, 2) > launch["margin"]


@pytest.mark.parametrize("m,n,checks", [(1, 1, 1), (2, 2, 1), (3, 3, 1), (2, 2, 0)])
def test_the_margin_holds_the_launch_part_of_an_averaged_difference_95_percent_of_the_time(m, n, checks):
    """Launch effects N(0, sigma^2): the baseline in m launches, the arms in n (a probe checked in each where
    ``checks``), the arms' launches compared with the probe's own. The t bound from the pooled contrasts holds
    |mean(arms effects) - mean(plain effects)| at its 95% rate: t with the pooled degrees of freedom is exact."""
    rng = np.random.default_rng(m * 10 + n + checks)
    misses, draws = 0, 3000
    for _ in range(draws):
        plain, arms, probe = rng.normal(0, 0.03, m), rng.normal(0, 0.03, n), rng.normal(0, 0.03)
        groups = [[_contrast(math.exp(x - plain[0])) for x in plain[1:]]]
        if checks:
            groups.append([_contrast(math.exp(a - probe)) for a in arms])
        else:
            groups.append([_contrast(math.exp(a - arms[0])) for a in arms[1:]])
        groups = [g for g in groups if g]
        if not groups:
            continue
        est = launch_noise.pooled(groups)
        bound = t_quantile_975(est["df"]) * est["sigma"] * math.sqrt(1 / m + 1 / n)
        misses += abs(arms.mean() - plain.mean()) > bound
    assert 0.03 <= misses / draws <= 0.07


# --- the plan's power -------------------------------------------------------------------------------


def test_the_design_counts_every_pair_of_launches_of_one_server_configuration():
    demo, kimi = _settings(["config/demo-gpu.yaml"]), _settings(["config/kimi-k25.yaml"])
    d = launches.design(demo)
    assert (d.checking, d.unchecked) == (1, 1)
    assert [d.at(r).df for r in (1, 2, 3)] == [1, 3, 5]  # plain: r - 1; the probe: one per arms launch
    k = launches.design(kimi)
    assert (k.checking, k.unchecked) == (1, 2)  # the corpus-map launch cannot swap the probe in
    assert [k.at(r).df for r in (1, 2, 3)] == [1, 4, 7]


def test_more_replicates_tell_smaller_speedups_and_the_plan_names_the_setting(tmp_path):
    s = _settings(["config/demo-gpu.yaml"])
    d = launches.design(s)
    told = [power.smallest_speedup(d.at(r), 0.03, 0.01) for r in (1, 2, 3, 4)]
    assert told == sorted(told, reverse=True) and told[0] > 1.5 > told[1] > 1.0
    layout = Layout("x", str(tmp_path))
    lines = launches.plan_lines(s, layout)
    assert f"bench.launch_replicates {d.replicates}" in lines[0] and "assumed" in lines[0]
    assert f"bench.launch_replicates: {d.replicates + 1}" in lines[1]


def test_the_prior_pools_this_hosts_earlier_runs_by_degrees_of_freedom(tmp_path):
    one = {"measured": True, "sigma": 0.01, "df": 1, "replicates": 1}
    three = {"measured": True, "sigma": 0.03, "df": 3, "replicates": 2}
    assert power.prior(tmp_path) is None
    assert power.record(tmp_path, one, 0.01, "run-a") and power.record(tmp_path, three, 0.02, "run-b")
    assert not power.record(tmp_path, three, 0.02, "run-b")  # the same launches again: recorded once
    p = power.prior(tmp_path)
    assert p["df"] == 4 and p["runs"] == 2
    assert p["sigma"] == pytest.approx(math.sqrt((1 * 0.01 ** 2 + 3 * 0.03 ** 2) / 4))
    assert power.prior(tmp_path, host="another-host") is None
    # a run whose launches ran on another host (a cluster's GPU node) is that host's, not the report job's
    gpu = [{"launch": "arms", "host": "gpu-node-1"}, {"launch": "plain-r2", "host": "gpu-node-1"}]
    assert power.launch_host(gpu) == "gpu-node-1" and power.launch_host(gpu + [{"launch": "x"}]) is None
    assert power.record(tmp_path, one, 0.01, "run-c", power.launch_host(gpu))
    assert power.prior(tmp_path, host="gpu-node-1")["runs"] == 1 and power.prior(tmp_path)["runs"] == 2
    lines = power.plan_lines(power.Design(2, 1, 1, 5), p)
    assert "2 earlier run(s)" in lines[0] and "assumed" not in lines[0]


def test_a_cannot_tell_says_how_many_replicates_would_have_told_it():
    d = power.Design(1, 1, 1)
    need = power.replicates_needed(d, 0.02, 1.15)
    assert need is not None and need > 1
    assert math.log(1.15) > d.at(need).margin_log(0.02) and math.log(1.15) <= d.at(need - 1).margin_log(0.02)
    assert power.replicates_needed(d, 0.02, 0.99) is None


# --- replicated results through the real decision ---------------------------------------------------


def _run(arm_speedup: float, effects: dict[str, float], n: int = N):
    """A demo-like run with two replicates: baseline in plain and plain-r2, the arm in arms and arms-r2, the
    probe in its own launch and checked in both arms launches; per-prompt times x each launch's effect."""
    base = 0.01 * (1 + np.arange(n) / n)
    mk = lambda v, launch, speed: _result(base / speed * effects[launch], launch, v)  # noqa: E731
    first = {("baseline", "plain"): mk("baseline", "plain", 1.0),
             ("finetune-keep", "s2"): mk("finetune-keep", "arms", arm_speedup),
             ("probe", "s2"): mk("probe", "probe", 1.0)}
    files = {"plain-r2/baseline.json": mk("baseline", "plain-r2", 1.0),
             "arms-r2/finetune-keep.json": mk("finetune-keep", "arms-r2", arm_speedup),
             "arms/probe.json": mk("probe", "arms", 1.0), "arms-r2/probe.json": mk("probe", "arms-r2", 1.0)}
    summaries = []
    for lid, rep in (("arms", 1), ("arms-r2", 2)):
        check = launch_noise.measure(first[("probe", "s2")], files[f"{lid}/probe.json"], variant="probe",
                                     own_launch="probe", arms_launch=lid, client="c")
        summaries.append({"launch": lid, "stage": "arms", "spec_id": "s2", "replicate": rep,
                          "of": "arms" if rep == 2 else None, "benches": [{"variant": "finetune-keep"}],
                          "launch_check": dict(check, result=f"{lid}/probe.json", spec_id="s2"),
                          "results": [{"variant": "finetune-keep", "client": "c", "path": "arms-r2/finetune-keep.json"}]
                          if rep == 2 else []})
    summaries.append({"launch": "plain-r2", "stage": "plain", "spec_id": "plain", "replicate": 2, "of": "plain",
                      "benches": [{"variant": "baseline"}], "launch_check": None,
                      "results": [{"variant": "baseline", "client": "c", "path": "plain-r2/baseline.json"}]})
    rows = [{"variant": v, "spec_id": sp, "client": "c", "status": "ok", "tps_median": "1",
             "accept_length": "" if v == "baseline" else "2", "val_acc_mean": "" if v == "baseline" else "0.5"}
            for v, sp in first]
    return rows, replicated.assemble(first, summaries, "c", files.get)


def test_the_replicates_average_out_the_launch_effects_and_their_contrasts_estimate_them():
    effects = {"plain": 1.04, "plain-r2": 0.98, "arms": 1.0, "arms-r2": 1.02, "probe": 1.01}
    rows, (decided, launch) = _run(1.3, effects)
    arm = decided[("finetune-keep", "s2")]
    assert arm["replicated_launches"] == ["arms", "arms-r2"] and arm["server"]["launch"] == "arms+arms-r2"
    p = paired.paired_speedup(decided[("baseline", "plain")], arm, by_category=False)
    truth = 1.3 * math.sqrt(1.04 * 0.98) / math.sqrt(1.0 * 1.02)  # the averaged launches' effects, exactly
    assert p["speedup"] == pytest.approx(truth, rel=1e-9)
    # contrasts: the probe's own launch vs both arms launches (2), the baseline's replicate (1)
    assert launch["df"] == 3 and launch["design"] == {"replicates": 2, "checking": 1, "unchecked": 1}
    e = {k: math.log(v) for k, v in effects.items()}
    probe = [0.0, e["arms"] - e["probe"], e["arms-r2"] - e["probe"]]
    plain = [0.0, e["plain-r2"] - e["plain"]]
    ss = sum((x - np.mean(g)) ** 2 for g in (probe, plain) for x in g)
    assert launch["sigma"] == pytest.approx(math.sqrt(ss / 3), rel=1e-6)
    d = decide(rows, "c", decided, launch)
    assert d["verdict"] == "serve" and d["winner"]["variant"] == "finetune-keep"
    # the arm against plain decoding carries sigma * sqrt(1/2 + 1/2); the probe (one launch) sqrt(1 + 1/2)
    by = {a["row"]["variant"]: a["paired"] for a in d["arms"]}
    assert by["finetune-keep"]["margin"] == pytest.approx(math.expm1(launch["t"] * launch["sigma"]))
    assert by["probe"]["margin"] == pytest.approx(math.expm1(launch["t"] * launch["sigma"] * math.sqrt(1.5)))


def test_a_gain_inside_the_replicated_margin_is_cannot_tell_and_says_what_would_tell():
    effects = {"plain": 1.10, "plain-r2": 0.92, "arms": 1.0, "arms-r2": 1.0, "probe": 0.9}
    rows, (decided, launch) = _run(1.05, effects)
    d = decide(rows, "c", decided, launch)
    assert d["verdict"] == "cannot-tell"
    lines = power.report_lines(d)
    assert lines and "bench.launch_replicates" in lines[0]


# --- order inside a launch, and predictions a measurement contradicts -------------------------------


def test_the_fresh_check_compares_speed_paired_per_prompt():
    t = 0.01 * (1 + np.arange(N) / N)
    same = compare_speed(_result(t, "a", "keep", 2), _result(t, "a", "keep", 2))
    assert same["speedup"] == pytest.approx(1.0) and same["same_speed"] is True
    slower = compare_speed(_result(t, "a", "keep", 2), _result(t * 1.2, "a", "keep", 2))
    assert slower["speedup"] == pytest.approx(1 / 1.2) and slower["same_speed"] is False
    # the report reads it from the launch summaries: one line per launch that swapped
    summaries = [{"launch": "arms-s2", "fresh_check": {"variant": "keep", "ok": True, "speed": slower}},
                 {"launch": "plain-r2", "fresh_check": None}]
    line = launch_noise.order_line({"order_checks": replicated.order_checks(summaries)})
    assert len(line) == 1 and "`keep` in `arms-s2` 0.833x" in line[0] and "(not the same speed)" in line[0]


def test_an_impossible_fit_and_a_contradicted_prediction_are_not_recommended():
    assert "t_draft 0.00 ms is impossible" in impossible_fit(0.010, 0.0, 0.010)
    assert "t_verify 0.04 ms is impossible" in impossible_fit(0.00004, 0.002, 0.010)
    assert impossible_fit(0.011, 0.002, 0.010) is None
    preds = [{"k": k, "tps": tps} for k, tps in ((1, 500.0), (2, 550.0), (3, 580.0), (4, 600.0))]
    why = contradicted(preds, {2: 597.0, 4: 308.0})  # the CPU run: k = 4 predicted best, measured half of k = 2
    assert "k = 4 is predicted fastest" in why and "597.0" in why
    assert contradicted(preds, {2: 300.0, 4: 600.0}) is None
    unmeasured = [{"k": 1, "tps": 700.0}, {"k": 2, "tps": 650.0}, {"k": 4, "tps": 660.0}]
    assert "unmeasured k = 1" in contradicted(unmeasured, {2: 597.0, 4: 308.0})


def test_a_not_separable_line_states_the_margin_it_was_judged_against_and_where_it_came_from():
    t = 0.01 * (1 + np.arange(N) / N)
    quiet = _result(t, "arms-s2", "finetune-keep", 2)
    noisy = _result(t, "arms-s2", "probe", 2)
    for r in noisy["rows"]:  # the second repeat 39% slower on every prompt: the hosts' noise is 39%
        if r["repeat"] == 1:
            r["latency_s"] *= 1.39
    p = verdict.judged(paired.paired_speedup(noisy, quiet, by_category=False), noisy, quiet)
    assert p["margin"] == pytest.approx(0.39 / np.median([1.0, 1.39]), rel=1e-6) and not p["clears"]
    said = verdict.margin_basis(p)
    assert "`probe` in `arms-s2`" in said and f"{p['margin']:.1%}" in said
    # through the decision: fine-tuning vs the probe, both in the replicated arms launches, not separable
    rows, (decided, launch) = _run(1.0, {"plain": 1.0, "plain-r2": 1.0, "arms": 1.0, "arms-r2": 1.0, "probe": 1.0})
    line = next(x for x in decide(rows, "c", decided, launch)["lines"] if "not separable from `probe`" in x)
    assert "judged against" in line and "both in `arms+arms-r2`" in line


def test_the_simulation_runs_the_real_decision_over_a_shipped_plan(monkeypatch):
    """benchmarks/decision_power.py end to end on a few draws: a clear gain on a quiet host is deployed, no gain
    never is (its tables in docs/benchmark.md come from the same function at 30 draws a cell)."""
    import importlib.util

    monkeypatch.chdir(ROOT)  # the benchmark names the shipped configs by their paths in the checkout
    spec = importlib.util.spec_from_file_location("decision_power", ROOT / "benchmarks" / "decision_power.py")
    sim = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sim)
    assert sim.cell(("config/demo-gpu.yaml", 1.5, 0.01, 2, 3, 0))["p_deploy"] == 1.0
    none = sim.cell(("config/kimi-k25.yaml", 1.0, 0.03, 2, 3, 1))
    assert none["p_serve"] == 0.0 and sum(none["outcomes"].values()) == 3


def test_the_plain_launch_note_never_moves_with_the_history_the_printed_line_does(tmp_path):
    """The note after the plain launch is a rule parameter: it must not change when a run records its launch
    noise (Snakemake would rerun the launch); the line printed apart reads the history."""
    s = _settings(["config/demo-gpu.yaml"])
    layout = Layout("x", str(tmp_path))
    note = launches.plan_lines(s)
    assert launches.measured_plan_lines(s, layout) == []
    power.record(layout.root, {"measured": True, "sigma": 0.01, "df": 3, "replicates": 2}, 0.005, "run-a")
    assert launches.plan_lines(s) == note
    measured = launches.measured_plan_lines(s, layout)
    assert measured and "sigma 1.00% a launch over 3 contrasts" in measured[0] and measured != note
