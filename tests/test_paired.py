"""Paired throughput and chain predictions on synthetic results with a known answer (issue 22)."""

from __future__ import annotations

import math

import pytest

from draftlab.benchmark import paired
from draftlab.benchmark.bench_client import at_least_counts, parse_sglang_meta
from draftlab.benchmark.chain import predict_chain


def result(times: dict[str, list[float]], *, tokens: int = 50, categories: dict[str, str] | None = None,
           sha: str = "ab", max_new: int = 50, verify: int | None = None, tps=None, rates=None,
           latency_extra: float = 0.0) -> dict:
    """A bench result: ``times[prompt] = decode seconds per repeat``."""
    rows = []
    for pid, per_rep in times.items():
        for rep, t in enumerate(per_rep):
            rows.append({"phase": "measure", "repeat": rep, "prompt_id": pid,
                         "category": (categories or {}).get(pid, "misc"), "completion_tokens": tokens,
                         "decode_time_s": t, "decode_time_source": "draft_time+verify_time",
                         "latency_s": t + latency_extra, "verify_ct": verify})
    return {"rows": rows, "config": {"max_new_tokens": max_new, "ignore_eos": True, "limit": None},
            "prompt_set": {"sha256": sha}, "summary": {"output_tps_per_repeat": tps or [],
                                                       "accepted_per_position_rate": rates,
                                                       "output_tps_median": None}}


def test_speedup_is_the_geometric_mean_of_per_prompt_ratios():
    # per-prompt speedups 2, 0.5, 1 and 4: geometric mean = (2 * 0.5 * 1 * 4) ** (1/4) = sqrt(2)
    base = result({"a": [2.0], "b": [1.0], "c": [3.0], "d": [4.0]})
    var = result({"a": [1.0], "b": [2.0], "c": [3.0], "d": [1.0]})
    p = paired.paired_speedup(base, var)
    assert p["paired"] and p["prompts"] == 4
    assert p["speedup"] == pytest.approx(math.sqrt(2))
    lo, hi = p["ci95"]
    assert 0.5 <= lo < math.sqrt(2) < hi <= 4.0  # the bootstrap stays within the per-prompt ratios


def test_repeats_collapse_to_the_median_per_prompt_so_one_stall_does_not_move_the_estimate():
    base = result({p: [2.0, 2.0, 2.0] for p in "abcdef"})
    var = result({p: [1.0, 1.0, 9.0 if p == "a" else 1.0] for p in "abcdef"})  # one stalled request
    p = paired.paired_speedup(base, var)
    assert p["speedup"] == pytest.approx(2.0) and p["ci95"] == pytest.approx([2.0, 2.0])
    assert p["excludes_one"]


def test_the_interval_is_seeded_and_narrows_with_more_prompts():
    import random

    rng = random.Random(7)
    few = {f"p{i}": rng.uniform(0.8, 1.6) for i in range(8)}
    many = {f"p{i}": rng.uniform(0.8, 1.6) for i in range(200)}

    def pair(ratios):
        return paired.paired_speedup(result({k: [1.0] for k in ratios}), result({k: [1.0 / r] for k, r in ratios.items()}))

    a, b = pair(few), pair(few)
    assert a["ci95"] == b["ci95"]  # same seed, same interval
    width = lambda p: math.log(p["ci95"][1] / p["ci95"][0])  # noqa: E731
    assert width(pair(many)) < width(a) / 2.5  # ~1/sqrt(n): 5x the prompts' ratio is sqrt(25) = 5


def test_prompts_needed_follows_the_square_root_law():
    # estimate 1.1, interval [0.9, 1.344]: log half-width 0.2006 vs effect log 1.1 = 0.0953 -> (2.105)^2 * 10
    n = paired.prompts_needed(10, 1.1, 0.9, 1.1 * 1.1 / 0.9)
    assert n == math.ceil(10 * ((math.log(1.1 * 1.1 / 0.9) - math.log(0.9)) / 2 / math.log(1.1)) ** 2)
    assert paired.prompts_needed(10, 1.0, 0.9, 1.1) is None


@pytest.mark.parametrize("change, why", [
    ({"sha": "cd"}, "prompt sets"), ({"max_new": 64}, "max_new_tokens"),
])
def test_results_on_other_prompts_or_budget_are_not_paired(change, why):
    base = result({"a": [1.0], "b": [1.0]})
    var = result({"a": [0.5], "b": [0.5]}, **change)
    p = paired.paired_speedup(base, var)
    assert not p["paired"] and why in p["reason"] and p["speedup"] is None
    other = paired.paired_speedup(base, result({"a": [0.5], "c": [0.5]}))
    assert not other["paired"] and "different prompts" in other["reason"]


def test_per_category_speedup_and_accept_length():
    cats = {"a": "code", "b": "code", "c": "chat", "d": "chat"}
    base = result({p: [2.0] for p in cats}, categories=cats)
    var = result({"a": [0.5], "b": [0.5], "c": [2.0], "d": [2.0]}, categories=cats, verify=20)
    p = paired.paired_speedup(base, var)
    assert p["categories"]["code"]["speedup"] == pytest.approx(4.0)
    assert p["categories"]["chat"]["speedup"] == pytest.approx(1.0)
    assert p["categories"]["code"]["accept_length"] == pytest.approx(50 / 20)
    assert p["speedup"] == pytest.approx(2.0)


def test_a_noisy_host_is_flagged_from_its_repeats():
    calm = result({p: [1.0, 1.02, 0.99] for p in "abcd"}, tps=[100.0, 98.0, 101.0])
    noisy = result({p: [1.0, 1.4, 0.8] for p in "abcd"}, tps=[100.0, 72.0, 125.0])
    assert not paired.host_stability(calm)["noisy"]
    h = paired.host_stability(noisy)
    assert h["noisy"] and h["prompt_spread"] == pytest.approx(0.6) and h["pass_spread"] == pytest.approx(0.53)


def test_sglang_histogram_becomes_accepts_per_position():
    # SGLang 0.5.23: entry j = verify cycles with exactly j correct drafts; 2 + 3 + 1 + 4 = 10 cycles
    assert at_least_counts([2, 3, 1, 4]) == [8, 5, 4]
    assert at_least_counts([[2, 3, 1, 4]]) == [8, 5, 4]
    assert at_least_counts([1]) is None and at_least_counts([1, -1]) is None and at_least_counts("x") is None
    meta = {"completion_tokens": 29, "spec_verify_ct": 10, "spec_num_correct_drafts": 17,
            "spec_num_proposed_drafts": 30, "spec_correct_drafts_histogram": [2, 3, 1, 4]}
    row = parse_sglang_meta(meta)
    assert row["accept_by_position"] == [8, 5, 4] and sum(row["accept_by_position"]) == 17


def test_chain_prediction_recovers_a_known_chain():
    """A drafter at K = 3 with P(at least i accepted) = 0.8, 0.5, 0.2; plain decoding 10 ms per step;
    a draft step 2 ms, so a cycle at K = 3 takes 16 ms. Each request: 101 tokens, the first from prefill."""
    rates = [0.8, 0.5, 0.2]
    per_cycle = {k: 1 + sum(rates[:k]) for k in (1, 2, 3)}
    cycles = 100 / per_cycle[3]
    base = result({p: [0.010 * 100] for p in "abcd"}, tokens=101)
    run = result({p: [0.016 * cycles] for p in "abcd"}, tokens=101, verify=round(cycles), rates=rates)
    run["summary"]["output_tps_median"] = 101 / (0.016 * cycles)
    base["summary"]["output_tps_median"] = 101 / 1.0
    pred = predict_chain(run, base)
    assert pred["t_verify_ms"] == pytest.approx(10.0) and pred["t_draft_ms"] == pytest.approx(2.0)
    for p in pred["predictions"]:
        k = p["k"]
        assert p["tokens_per_cycle"] == pytest.approx(per_cycle[k])
        assert p["accept_length"] == pytest.approx(101 / (100 / per_cycle[k]))
        assert p["cycle_ms"] == pytest.approx(10 + 2 * k)
        assert p["tps"] == pytest.approx(101 / ((100 / per_cycle[k]) * (0.010 + 0.002 * k)))
    # tokens per ms at k = 1, 2, 3: 1.8/12 = 0.150, 2.3/14 = 0.164, 2.5/16 = 0.156 -> k = 2 is fastest
    assert pred["recommended_k"] == 2
    assert predict_chain(result({"a": [1.0]}), base) is None  # no acceptance by position: nothing to predict



def test_chain_prediction_fits_the_cycle_through_every_measured_chain_length():
    """A cycle with a fixed cost plain decoding does not have (7 ms + 0.3 ms per draft against a 2.6 ms
    plain step): from one launch the line goes through the plain step and over-predicts short chains;
    with the sweep's other chain lengths measured it goes through them, and k = 1 is predicted right."""
    rates = [0.4, 0.1, 0.05, 0.01]

    def run_at(k):
        per_cycle = 1 + sum(rates[:k])
        cycles = round(100 / per_cycle)
        return result({p: [(0.007 + 0.0003 * k) * cycles] for p in "abcd"}, tokens=101, verify=cycles,
                      rates=rates[:k])

    base = result({p: [0.0026 * 100] for p in "abcd"}, tokens=101)
    one_launch = predict_chain(run_at(4), base)
    swept = predict_chain(run_at(4), base, {2: run_at(2)})
    assert one_launch["fit_points"] == [4] and swept["fit_points"] == [2, 4]
    assert swept["t_verify_ms"] == pytest.approx(7.0, rel=0.02) and swept["t_draft_ms"] == pytest.approx(0.3, rel=0.1)
    assert swept["predictions"][0]["cycle_ms"] == pytest.approx(7.3, rel=0.02)
    assert one_launch["predictions"][0]["cycle_ms"] < 5.0  # the plain step at k = 0: short chains look cheap
    assert "least squares through the measured cycles at k = 2, 4" in swept["method"]
    # the report warns about short chains only where one launch is all the line has
    from draftlab.experiment.report import chain_section

    warning = "measure a recommended k below the one launched"
    assert warning in " ".join(chain_section({("keep", "s4-k1-d5"): one_launch}, [], "default"))
    assert warning not in " ".join(chain_section({("keep", "s4-k1-d5"): swept}, [], "default"))


def test_chain_prediction_from_vllm_totals():
    """vLLM counts drafts server-wide (no verify count per request): the run's totals serve."""
    rates = [0.8, 0.5, 0.2]
    base = result({p: [0.010 * 100] for p in "abcd"}, tokens=101)
    run = result({p: [0.016 * 40] for p in "abcd"}, tokens=101, rates=rates)  # rows without verify_ct
    run["summary"].update(total_verify_ct=160, total_completion_tokens=404, requests=4,
                          output_tps_median=101 / (0.016 * 40))
    base["summary"]["output_tps_median"] = 101.0
    pred = predict_chain(run, base)
    assert pred["t_draft_ms"] == pytest.approx(2.0)
    assert [p["cycle_ms"] for p in pred["predictions"]] == pytest.approx([12.0, 14.0, 16.0])
