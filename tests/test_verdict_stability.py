"""Issue 38: the verdict rests on intervals only (never on which point estimate came first), and every verdict
has a deploy block: the plain server to keep with the accept length a drafter would need, or the two candidates
and the prompts that would tell."""

from __future__ import annotations

from test_verdict import PROMPTS, bench, case, row

from draftlab.benchmark.paired import MIN_CATEGORY_PROMPTS, paired_speedup
from draftlab.benchmark.recommend import markdown, recommendation
from draftlab.benchmark.verdict import decide
from draftlab.experiment.report_categories import category_section
from draftlab.serving.server_spec import ServerSpec


def plans(*variants):
    """Server plans by (variant, spec): the baseline's plain server and one speculative server per variant."""
    out = {}
    plain = ServerSpec(backend="sglang", target="/m/t", tp=8, python="python")
    out[("baseline", "plain")] = {"server": plain.to_dict(), "argv": plain.command()}
    for v in variants:
        spec = ServerSpec(backend="sglang", target="/m/t", drafter=f"/m/{v}", num_steps=2, tp=8, python="python")
        out[(v, "s2-k1-d3")] = {"server": spec.to_dict(), "argv": spec.command()}
    return out


def test_a_winner_must_clear_every_arm_not_only_the_runner_up():
    """keep beats the runner-up (probe) head to head, but not remap, whose wider interval put it third by point
    estimate: the old rule compared keep with the runner-up only and served keep; this run cannot tell."""
    rows, results = case((row("finetune-keep", accept=1.6, val=0.4), bench(1.40, spread=0.01, phase=1)),
                         (row("probe", accept=1.4), bench(1.20, spread=0.01, phase=2)),
                         (row("finetune-remap", accept=1.6, val=0.4), bench(1.45, spread=0.8, phase=3)))
    d = decide(rows, "default", results)
    assert [a["row"]["variant"] for a in d["arms"]][:2] == ["finetune-keep", "probe"]
    assert d["verdict"] == "cannot-tell" and d["winner"] is None
    assert [r["variant"] for r in d["candidates"]] == ["finetune-keep", "finetune-remap"]
    assert "cannot tell `finetune-keep` at s2-k1-d3 from the runner-up `finetune-remap`" in d["lines"][-1]


def test_an_arm_clear_of_plain_is_a_candidate_even_below_a_wider_top():
    """The top point estimate holds 1.0 in its interval, a second arm clears it: the question is those two, not
    whether speculation beats plain decoding (the old rule looked at the top point estimate only)."""
    rows, results = case((row("probe", accept=1.4), bench(1.7, spread=0.9, phase=1)),
                         (row("finetune-keep", accept=1.6, val=0.4), bench(1.15, spread=0.01, phase=2)))
    d = decide(rows, "default", results)
    assert d["arms"][0]["row"]["variant"] == "probe" and d["arms"][0]["paired"]["ci95"][0] <= 1.0
    assert d["verdict"] == "cannot-tell" and "speculation beats plain decoding (`finetune-keep`" in d["lines"][-1]
    assert [r["variant"] for r in d["candidates"]] == ["finetune-keep", "probe"]


def test_the_verdict_does_not_follow_the_order_of_point_estimates():
    """Two runs whose arms trade places by a hair but whose intervals say the same: the same verdict."""
    first = case((row("finetune-keep", accept=1.6, val=0.4), bench(1.161, spread=0.1, phase=1)),
                 (row("finetune-remap", accept=1.6, val=0.4), bench(1.150, spread=0.1, phase=2)))
    second = case((row("finetune-keep", accept=1.6, val=0.4), bench(1.150, spread=0.1, phase=1)),
                  (row("finetune-remap", accept=1.6, val=0.4), bench(1.161, spread=0.1, phase=2)))
    verdicts = [decide(rows, "default", res) for rows, res in (first, second)]
    assert [d["verdict"] for d in verdicts] == ["cannot-tell", "cannot-tell"]
    assert [{r["variant"] for r in d["candidates"]} for d in verdicts] == [{"finetune-keep", "finetune-remap"}] * 2


def test_a_plain_verdict_names_the_server_to_keep_and_the_accept_length_a_drafter_would_need():
    rows, results = case((row("probe", accept=1.4), 0.8), (row("finetune-keep", accept=1.5, val=0.3), 0.9))
    d = decide(rows, "default", results)
    assert d["verdict"] == "plain"
    p = plans("probe", "finetune-keep")
    rec = recommendation(d, rows[0], None, plans=p)
    assert rec["winner"] is None and rec["verdict"] == "plain" and rec["reason"]  # the old keys stay
    assert rec["launch_argv"] == p[("baseline", "plain")]["argv"] and "--speculative" not in rec["launch_command"]
    block = rec["deploy"]
    assert block["action"] == "keep-plain" and block["launch_command"] == rec["launch_command"]
    best = block["best_arm"]
    assert best["variant"] == "finetune-keep" and abs(best["speedup"] - 0.9) < 0.01
    assert abs(best["accept_length_needed"] - 1.5 / best["speedup"]) < 1e-9  # L / S: break-even at its own cycle
    assert "would need an accept length of about 1.67" in block["why"]
    md = markdown(rec)
    assert md[0].startswith("**Deploy:** no drafter is recommended by this run (plain): no drafter is faster")
    assert md[-1] == f"Keep: `{rec['launch_command']}`"


def test_a_cannot_tell_verdict_names_two_candidates_their_commands_and_the_prompts_needed():
    rows, results = case((row("probe", accept=1.4), bench(1.50, spread=0.1, phase=1)),
                         (row("finetune-keep", accept=1.6, val=0.4), bench(1.52, spread=0.1, phase=2)))
    d = decide(rows, "default", results)
    p = plans("probe", "finetune-keep")
    rec = recommendation(d, rows[0], None, plans=p)
    block = rec["deploy"]
    assert rec["verdict"] == "cannot-tell" and block["action"] == "keep-plain"
    assert [c["variant"] for c in block["candidates"]] == ["finetune-keep", "probe"]
    assert block["candidates"][1]["launch_command"] == " ".join(p[("probe", "s2-k1-d3")]["argv"])
    assert block["prompts_needed"] > len(PROMPTS) and f"about {block['prompts_needed']} prompts" in block["why"]
    assert rec["launch_command"] == " ".join(p[("baseline", "plain")]["argv"])
    # against plain decoding: the candidates are the baseline and the fastest arm
    rows, results = case((row("probe", accept=1.2), bench(1.03, spread=0.2)))
    rec = recommendation(decide(rows, "default", results), rows[0], None, plans=plans("probe"))
    assert [c["variant"] for c in rec["deploy"]["candidates"]] == ["baseline", "probe"]
    assert rec["deploy"]["prompts_needed"] > len(PROMPTS)


def test_a_serve_verdict_keeps_its_keys_and_gains_a_deploy_block():
    rows, results = case((row("probe", accept=1.4), 1.2), (row("finetune-keep", accept=1.5, val=0.4), 1.6))
    p = plans("probe", "finetune-keep")
    d = decide(rows, "default", results)
    rec = recommendation(d, rows[0], p[("finetune-keep", "s2-k1-d3")], plans=p)
    assert rec["winner"] == "finetune-keep" and rec["launch_argv"] == p[("finetune-keep", "s2-k1-d3")]["argv"]
    assert rec["drafter_dir"] == "/m/finetune-keep"
    assert rec["deploy"]["action"] == "serve" and rec["deploy"]["launch_command"] == rec["launch_command"]


def _with_categories(result, sizes):
    cats = [c for c, n in sizes.items() for _ in range(n)]
    for r in result["rows"]:
        r["category"] = cats[PROMPTS.index(r["prompt_id"])]
    return result


def test_the_category_table_shows_only_categories_with_prompts_enough_for_an_interval():
    sizes = {"code-completion": 16, "math": 5, "short": 3}
    assert sum(sizes.values()) == len(PROMPTS) and MIN_CATEGORY_PROMPTS == 8
    rows, results = case((row("probe", accept=1.4), _with_categories(bench(1.2, phase=1), sizes)))
    d = decide(rows, "default", results)
    cats = paired_speedup(results[("baseline", "plain")], results[("probe", "s2-k1-d3")])["categories"]
    assert cats["math"]["too_few"] and cats["math"]["ci95"] is None and cats["code-completion"]["ci95"]
    text = "\n".join(category_section(d, "default"))
    assert "| probe | s2-k1-d3 | code-completion | 16 |" in text
    assert "| probe | s2-k1-d3 | math" not in text and "| probe | s2-k1-d3 | short" not in text
    assert "Too few prompts for a per-category interval (fewer than 8, paired): math (5), short (3)." in text


def _noisy(result, spread):
    """The same result with its three repeats disagreeing by ``spread`` per prompt, the median unmoved."""
    for r in result["rows"]:
        r["decode_time_s"] *= 1 + spread * (r["repeat"] - 1) / 2
        r["latency_s"] = r["decode_time_s"]
    return result


def test_a_host_whose_repeats_disagree_cannot_decide_inside_its_own_noise():
    """Two smoke runs on the loaded shared VM served finetune-remap at 1.34x [1.12, 1.79] and kept plain decoding
    at 0.57x: what moves a launch is not in an interval over prompts. With the repeats of the servers disagreeing
    by 30% per prompt, neither 1.15x nor 0.85x decides (the old rule served, then kept plain); a quiet host does."""
    quiet = case((row("finetune-keep", accept=1.6, val=0.4), bench(1.15, spread=0.01, phase=1)))
    assert decide(*quiet[:1], "default", quiet[1])["verdict"] == "serve"
    rows, results = case((row("finetune-keep", accept=1.6, val=0.4), _noisy(bench(1.15, spread=0.01, phase=1), 0.3)))
    d = decide(rows, "default", results)
    p = d["arms"][0]["paired"]
    assert p["ci95"][0] > 1.0 and abs(p["margin"] - 0.3) < 1e-9 and not p["clears"]
    assert d["verdict"] == "cannot-tell" and "a quieter host: 1.15x sits inside the 30%" in d["lines"][-1]
    assert p["prompts_needed"] is None  # more prompts do not shrink the host's noise
    rows, results = case((row("finetune-keep", accept=1.6, val=0.4), _noisy(bench(0.85, spread=0.01, phase=1), 0.3)))
    d = decide(rows, "default", results)
    assert d["arms"][0]["paired"]["ci95"][1] < 1.0 and d["verdict"] == "cannot-tell"
    # far enough outside the noise, the verdict stands
    rows, results = case((row("finetune-keep", accept=1.6, val=0.4), _noisy(bench(0.6, spread=0.01, phase=1), 0.3)))
    assert decide(rows, "default", results)["verdict"] == "plain"
