"""The report's decision: paired per prompt, like for like, a winner only where the data separate (issues 18, 22)."""

from __future__ import annotations

import math

from draftlab.benchmark.recommend import recommendation
from draftlab.benchmark.verdict import decide
from draftlab.experiment.report import decision_text

PROMPTS = [f"p{i}" for i in range(24)]


def row(variant, spec="s2-k1-d3", accept=None, val=None, tps=100.0, status="ok"):
    """One records.csv row as csv.DictReader gives it (strings, empty for missing)."""
    s = lambda v: "" if v is None else str(v)  # noqa: E731
    steps = "" if variant == "baseline" else spec.split("-")[0][1:]
    return {"variant": variant, "spec_id": "plain" if variant == "baseline" else spec, "client": "default",
            "status": status, "tps_median": s(tps), "tps_ci_low": "", "tps_ci_high": "", "accept_length": s(accept),
            "val_acc_mean": s(val), "speedup": "", "cycle_ms": "14.0", "repeats": "3", "max_new_tokens": "48",
            "num_steps": steps, "topk": "" if variant == "baseline" else "1",
            "num_draft_tokens": "" if variant == "baseline" else str(int(steps) + 1)}


def bench(speed: float, spread: float = 0.02, phase: float = 0.0, max_new: int = 48) -> dict:
    """Per-request rows: prompt i takes (1 + i/10) s per 48 tokens on the baseline; this arm is ``speed``
    times faster on each prompt, wobbling by ``spread`` (deterministic, shifted by ``phase``)."""
    rows = []
    for i, p in enumerate(PROMPTS):
        ratio = speed * (1 + spread * math.sin(2.0 * i + phase))
        for rep in range(3):
            rows.append({"phase": "measure", "repeat": rep, "prompt_id": p, "category": "chat",
                         "completion_tokens": 48, "decode_time_s": (1 + i / 10) / ratio,
                         "decode_time_source": "draft_time+verify_time", "latency_s": (1 + i / 10) / ratio})
    return {"rows": rows, "config": {"max_new_tokens": max_new, "ignore_eos": False, "limit": None},
            "prompt_set": {"sha256": "ab"}, "summary": {"output_tps_per_repeat": [100.0, 100.0, 100.0]}}


def case(*arms):
    """``arms``: (records row, speed or a bench result); the baseline is added at speed 1."""
    rows = [row("baseline")] + [r for r, _ in arms]
    results = {("baseline", "plain"): bench(1.0, spread=0.0)}
    for r, b in arms:
        results[(r["variant"], r["spec_id"])] = b if isinstance(b, dict) else bench(b, phase=len(results))
    return rows, results


def test_the_best_setting_is_chosen_by_paired_throughput_not_accept_length():
    """Issue 22 on CPU: keep at s4 had the highest accept length (1.66) and ran 0.67x plain decoding;
    keep at s2 ran 1.17x. Scratch at s2 compared on like terms."""
    rows, results = case((row("probe", accept=1.40), 1.05),
                         (row("finetune-keep", "s4-k1-d5", accept=1.66, val=0.4), 0.67),
                         (row("finetune-keep", accept=1.50, val=0.4), 1.17),
                         (row("scratch", accept=1.30, val=0.3), 0.98),
                         (row("scratch", "s4-k1-d5", accept=1.35, val=0.3), 0.60))
    d = decide(rows, "default", results)
    assert d["verdict"] == "serve"
    assert (d["winner"]["variant"], d["winner"]["spec_id"]) == ("finetune-keep", "s2-k1-d3")
    assert [(a["row"]["variant"], a["row"]["spec_id"]) for a in d["arms"]][0] == ("finetune-keep", "s2-k1-d3")
    text = " ".join(d["lines"])
    assert "Transfer vs training from scratch on the same data, both at s2-k1-d3: `finetune-keep` is faster than " \
           "`scratch`" in text
    assert "Fine-tuning vs the transferred drafter as is, both at s2-k1-d3" in text
    assert "s4-k1-d5" not in d["lines"][-1]
    rec = recommendation(d, rows[0], None)
    assert rec["winner"] == "finetune-keep" and rec["setting"] == "s2-k1-d3" and rec["num_steps"] == 2
    assert 1.1 < rec["speedup_ci95"][0] < rec["speedup"] < rec["speedup_ci95"][1] < 1.25
    assert rec["expected_tps"] == rec["speedup"] * 100.0
    # the launch command is the winner's plan's own argv (a plan written before it had one: its server's)
    from draftlab.serving.server_spec import ServerSpec

    spec = ServerSpec(backend="sglang", target="/m/t", drafter="/m/d", num_steps=2, tp=8, python="python")
    plan = {"server": spec.to_dict(), "argv": spec.command()}
    assert recommendation(d, rows[0], plan)["launch_argv"] == spec.command()
    old = {"server": {k: v for k, v in spec.to_dict().items() if v is not None}}
    assert recommendation(d, rows[0], old)["launch_command"] == " ".join(spec.command())


def test_no_winner_while_the_runner_up_is_not_separated():
    rows, results = case((row("probe", accept=1.4), bench(1.50, spread=0.1, phase=1)),
                         (row("finetune-keep", accept=1.6, val=0.4), bench(1.52, spread=0.1, phase=2)))
    d = decide(rows, "default", results)
    assert d["verdict"] == "cannot-tell" and d["winner"] is None
    last = d["lines"][-1]
    assert "speculation beats plain decoding" in last and "cannot tell `finetune-keep` at s2-k1-d3 from the " \
           "runner-up `probe` at s2-k1-d3" in last and "head to head" in last and "What would tell: about" in last
    rec = recommendation(d, rows[0], None)
    assert {k: rec[k] for k in ("winner", "verdict", "reason")} == {
        "winner": None, "verdict": "cannot-tell", "reason": last.replace("**", "").replace("`", "")}
    # issue 38: the deploy block is new, and the launch noise it was decided with (null: unmeasured)
    assert set(rec) == {"winner", "verdict", "reason", "deploy", "launch_noise", "launch_margin", "launch_pairs",
                        "launch_margin_scale", "launch_check_se", "launch_check",
                        # what the design could tell (draftlab.benchmark.power): null where unmeasured
                        "launch_sigma", "launch_df", "launch_replicates", "smallest_speedup", "replicates_needed"}
    assert rec["smallest_speedup"] is None and rec["replicates_needed"] is None
    assert rec["launch_noise"] is None and rec["launch_margin"] is None and rec["launch_check"] is None
    assert rec["launch_margin_scale"] is None and rec["launch_check_se"] is None


def test_an_interval_that_holds_one_cannot_tell_and_says_how_many_prompts_would():
    rows, results = case((row("probe", accept=1.2), bench(1.03, spread=0.2)))
    d = decide(rows, "default", results)
    assert d["verdict"] == "cannot-tell"
    last = d["lines"][-1]
    assert "cannot tell whether speculation beats plain decoding" in last and "holds 1.0" in last
    n = d["paired"]["prompts_needed"]
    assert n > len(PROMPTS) and f"about {n} prompts (now {len(PROMPTS)})" in last


def test_every_arm_clearly_slower_keeps_plain_decoding():
    rows, results = case((row("probe", accept=1.1), 0.8), (row("finetune-keep", accept=1.2, val=0.3), 0.9))
    assert decide(rows, "default", results)["verdict"] == "plain"


def test_results_on_another_budget_are_not_paired_and_not_decided_on():
    rows, results = case((row("probe", accept=1.4), bench(2.0, max_new=64)),
                         (row("finetune-keep", accept=1.5, val=0.4), 1.3))
    d = decide(rows, "default", results)
    text = " ".join(d["lines"])
    assert "`probe` at s2-k1-d3 is not compared: different max_new_tokens (48 vs 64)" in text
    assert d["verdict"] == "serve" and d["winner"]["variant"] == "finetune-keep"


def test_an_arm_that_learnt_nothing_is_never_the_decision():
    rows, results = case((row("probe", accept=1.4), 1.2), (row("finetune-regenerate", accept=1.1, val=0.0), 3.0))
    d = decide(rows, "default", results)
    assert d["winner"]["variant"] == "probe"
    assert "`finetune-regenerate` at s2-k1-d3 is not a candidate: validation accuracy 0" in " ".join(d["lines"])


def test_without_per_request_results_nothing_is_decided():
    rows, _ = case((row("probe", accept=1.4), 1.2))
    d = decide(rows, "default", {})
    assert d["verdict"] == "cannot-tell" and "no drafter result pairs with the baseline" in d["lines"][-1]


def test_decision_text_puts_the_decision_first():
    rows, results = case((row("probe", accept=1.4), 1.2), (row("finetune-keep", accept=1.5, val=0.4), 1.6))
    text = decision_text(rows, {"pass": True, "reason": "ok"}, {(v, s, "default"): r for (v, s), r in results.items()})
    assert text[0].startswith("**Decision:** serve `finetune-keep` at s2-k1-d3: 1.60x")
    assert any(t.startswith("Best fine-tuned drafter by paired throughput: `finetune-keep` at s2-k1-d3") for t in text)


def test_a_noisy_host_is_said_beside_the_decision():
    rows, results = case((row("probe", accept=1.4), 1.2))
    calm = decision_text(rows, None, {(v, s, "default"): r for (v, s), r in results.items()})
    assert not any("Noisy host" in t for t in calm)
    shaky = results[("probe", "s2-k1-d3")]
    for r in shaky["rows"]:
        r["decode_time_s"] *= (1.0, 1.3, 0.8)[r["repeat"]]
    text = decision_text(rows, None, {(v, s, "default"): r for (v, s), r in results.items()})
    assert any(t.startswith("**Noisy host:** the repeats of `probe` at s2-k1-d3 disagree") for t in text)
