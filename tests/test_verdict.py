"""The report's decision names a winner only where the measurements separate (issue 18)."""

from __future__ import annotations

from draftlab.benchmark.bench import mean_ci95, summarize
from draftlab.experiment.report import decision_text
from draftlab.benchmark.verdict import compare_tps, decide


def row(variant, tps, ci, accept=None, val=None, spec="s2-k1-d3", status="ok"):
    """One records.csv row as csv.DictReader gives it (strings, empty for missing)."""
    s = lambda v: "" if v is None else str(v)  # noqa: E731
    return {"variant": variant, "spec_id": "plain" if variant == "baseline" else spec, "client": "default",
            "status": status, "tps_median": s(tps), "tps_ci_low": s(ci[0] if ci else None),
            "tps_ci_high": s(ci[1] if ci else None), "accept_length": s(accept), "val_acc_mean": s(val),
            "speedup": s(tps / 260.0 if tps else None), "cycle_ms": "14.0", "repeats": "3", "max_new_tokens": "48"}


# The README run of issue 18: baseline [221.7, 300.3], keep [235.1, 303.2] -> 1.03x on overlap.
OVERLAP = [
    row("baseline", 261.0, (221.7, 300.3)),
    row("probe", 250.0, (230.0, 270.0), accept=1.47),
    row("finetune-keep", 269.0, (235.1, 303.2), accept=1.49, val=0.31),
    row("finetune-remap", 262.0, (230.0, 295.0), accept=1.51, val=0.33),
    row("finetune-regenerate", 252.0, (-4.6, 508.6), accept=1.25, val=0.0),
    row("scratch", 240.0, (220.0, 260.0), accept=1.27, val=0.2),
]


def test_overlapping_intervals_give_no_winner_and_say_what_would_tell():
    d = decide(OVERLAP, "default")
    assert d["verdict"] == "cannot-tell" and d["winner"] is None
    text = " ".join(d["lines"])
    assert "cannot tell" in text and "more repeats" in text and "longer answers" in text
    assert "not run concurrently" in text
    assert "**Decision:** serve" not in text
    # the deterministic number still points somewhere, said as such
    assert "By accept length (deterministic), the best candidate is `finetune-remap` at s2-k1-d3 at 1.51" in text


def test_arms_that_learnt_nothing_or_draft_worse_than_the_probe_are_never_the_decision():
    rows = [r.copy() for r in OVERLAP]
    # regenerate now has the highest median and an interval clear of the baseline's: still excluded
    rows[4].update(tps_median="400.0", tps_ci_low="390.0", tps_ci_high="410.0")
    d = decide(rows, "default")
    assert d["winner"] is None or d["winner"]["variant"] != "finetune-regenerate"
    text = " ".join(d["lines"])
    assert "`finetune-regenerate` at s2-k1-d3 is not a candidate: validation accuracy 0" in text
    assert "`scratch` at s2-k1-d3 is not a candidate: accept length 1.27 below the probe's 1.47" in text


def test_separated_intervals_name_the_winner():
    rows = [row("baseline", 100.0, (98.0, 102.0)), row("probe", 120.0, (118.0, 121.0), accept=1.6),
            row("finetune-keep", 160.0, (158.0, 162.0), accept=2.1, val=0.45),
            row("scratch", 130.0, (129.0, 131.0), accept=1.7, val=0.3)]
    d = decide(rows, "default")
    assert d["verdict"] == "serve" and d["winner"]["variant"] == "finetune-keep"
    assert "the intervals do not overlap" in d["lines"][-1]


def test_two_winners_that_do_not_separate_are_split_by_accept_length():
    rows = [row("baseline", 100.0, (98.0, 102.0)), row("probe", 150.0, (140.0, 170.0), accept=1.6),
            row("finetune-keep", 160.0, (150.0, 168.0), accept=2.1, val=0.45)]
    d = decide(rows, "default")
    assert d["verdict"] == "serve" and d["winner"]["variant"] == "finetune-keep"
    assert "not each other" in d["lines"][-1]


def test_every_drafter_clearly_slower_keeps_plain_decoding():
    rows = [row("baseline", 100.0, (98.0, 102.0)), row("probe", 80.0, (78.0, 82.0), accept=1.2)]
    assert decide(rows, "default")["verdict"] == "plain"


def test_accept_length_ties_are_said_as_ties():
    rows = [row("baseline", 100.0, (90.0, 110.0)), row("probe", 101.0, (95.0, 105.0), accept=1.161),
            row("finetune-keep", 99.0, (90.0, 108.0), accept=1.163, val=0.3)]
    text = decide(rows, "default")["lines"][-1]
    assert "`probe` at s2-k1-d3, `finetune-keep` at s2-k1-d3 tie at 1.16" in text


def test_one_repeat_has_no_interval_so_the_run_cannot_tell():
    rows = [row("baseline", 100.0, None), row("probe", 130.0, None, accept=1.6)]
    assert compare_tps(rows[1], rows[0]) is None
    d = decide(rows, "default")
    assert d["verdict"] == "cannot-tell" and "no interval (1 repeat)" in d["lines"][-1]


def test_transfer_vs_scratch_agrees_with_the_table():
    """Issue 18: 'does not beat ... 1.25 vs 1.27' beside a table with keep/remap at 1.49/1.51."""
    text = " ".join(decision_text(OVERLAP, {"pass": True, "reason": "ok"}))
    assert "Transfer beats training from scratch on the same data: best fine-tuned `finetune-remap` at " \
           "s2-k1-d3 reaches accept length 1.51 vs 1.27" in text


def test_throughput_interval_never_goes_negative():
    low, high = mean_ci95([0.5, 500.0, 10.0], floor=0.0)
    assert low == 0.0 and high > 0
    rows = [{"phase": "measure", "repeat": i, "completion_tokens": c, "prompt_tokens": 4, "latency_s": 0.1} for i, c in enumerate([1, 400, 9])]
    s = summarize(rows, [1.0, 1.0, 1.0], api="sglang")
    assert s["output_tps_ci95"][0] == 0.0 and "clamped at 0" in s["output_tps_ci_method"]
