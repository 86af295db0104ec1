"""Which starts of the target an experiment spends (issue 35): the launch list, the swap groups per backend,
and the plan a launch job runs, from the same functions the workflow calls."""

from __future__ import annotations

from pathlib import Path

import pytest

from draftlab.experiment import jobs, launches
from draftlab.experiment.layout import Layout
from draftlab.settings.config import experiment_layers

ROOT = Path(__file__).resolve().parents[1]


def _settings(configfiles=(), **overrides):
    return jobs.load_settings(*experiment_layers(ROOT / "config" / "config.yaml", [ROOT / f for f in configfiles],
                                                 overrides))


ARMS = ("finetune-keep", "finetune-remap", "finetune-regenerate", "scratch")


def test_the_smoke_run_starts_the_target_five_times_plain_and_arms_replicated_in_alternating_order():
    s = _settings(size="smoke")
    got = [(x.id, x.stage, x.variants, x.generate, x.replicate) for x in launches.launches(s)]
    assert got == [("probe-s2-k1-d3", "probe", ("probe",), False, 1),
                   ("plain", "plain", ("baseline",), True, 1),
                   ("arms-s2-k1-d3", "arms", ARMS, False, 1),
                   # replicate 2 in the other order (plain, arms | arms, plain): a linear drift cancels; no data again
                   ("arms-s2-k1-d3-r2", "arms", ARMS, False, 2),
                   ("plain-r2", "plain", ("baseline",), False, 2)]
    assert launches.launch_count(s) == 5 and launches.launch_count(s, gate_open=False) == 2
    by = {x.id: x for x in launches.launches(s)}
    assert [x.id for x in launches.replicate_after(s, by["arms-s2-k1-d3-r2"])] == ["plain", "arms-s2-k1-d3"]
    assert [x.id for x in launches.replicate_after(s, by["plain-r2"])] == ["plain", "arms-s2-k1-d3", "arms-s2-k1-d3-r2"]
    assert launches.launch_of(s, "baseline", "plain").id == "plain"  # records read the first launch's results
    # a replicate writes under its own launch folder, never over its original's results
    layout = Layout("x")
    outs = launches.launch_outputs(layout, by["plain-r2"], s.clients)
    assert outs["results"] == [layout.replicate_result("plain-r2", "baseline", "short")]
    assert layout.bench_result("baseline", "plain", "short") not in outs["results"]
    plan = jobs.launch_plan(s, layout, "arms-s2-k1-d3-r2")
    assert plan["replicate"] == 2 and plan["of"] == "arms-s2-k1-d3" and plan["launch_check"] is not None
    assert {r["path"] for r in plan["results"]} == {layout.replicate_result("arms-s2-k1-d3-r2", v, "short") for v in ARMS}
    assert "replicate 2 of arms-s2-k1-d3" in launches.describe(by["arms-s2-k1-d3-r2"], s)


def test_the_default_sweep_shares_one_launch_per_setting_and_stage():
    s = _settings()
    assert [x.id for x in launches.launches(s)] == ["probe-s2-k1-d3", "probe-s4-k1-d5", "plain", "arms-s2-k1-d3",
                                                    "arms-s4-k1-d5"]


def test_sglang_groups_drafters_by_the_d2t_map_their_kind_carries():
    s = _settings(["config/kimi-k25.yaml"])
    arms = [x for x in launches.launches(s) if x.stage == "arms" and x.replicate == 1]
    assert [(x.id, x.variants) for x in arms] == [("drafter-map-s2-k1-d3", ("finetune-keep",)),
                                                  ("corpus-map-s2-k1-d3", ("finetune-regenerate", "scratch"))]
    r = s.bench.launch_replicates  # the plain and both arms launches, each replicated; the reference's own map:
    assert launches.launch_count(s) == 2 + len(s.specs) + (r - 1) + len(s.specs) * 2 * r  # a launch of its own
    assert launches.map_group("probe") == launches.map_group("finetune-keep") == "drafter-map"
    assert {launches.map_group(v) for v in ("finetune-remap", "finetune-regenerate", "scratch")} == {"corpus-map"}
    note = launches.describe(arms[1], s)
    assert "sglang/srt/models/llama_eagle3.py" in note and "eagle_worker_v2.py" in note
    # a reference drafter carries a map of its own: a probe launch of its own on SGLang, swapped in on the builtin
    ref = {"reference": {"source": "hf:draftlab-demo/drafter-v1", "revision": "main"}}
    with_ref = _settings(["config/kimi-k25.yaml"], **ref)
    assert [x.variants for x in launches.launches(with_ref) if x.stage == "probe"] == [("probe",), ("reference",)]
    assert [x.variants for x in launches.launches(_settings(**ref, size="smoke")) if x.stage == "probe"] == [
        ("probe", "reference")]


def test_vllm_keeps_one_launch_per_drafter():
    s = _settings(serve={"backend": "vllm"}, size="smoke")
    arms = [x for x in launches.launches(s) if x.stage == "arms" and x.replicate == 1]
    assert [x.variants for x in arms] == [("finetune-keep",), ("finetune-remap",), ("finetune-regenerate",),
                                          ("scratch",)]
    assert "api_router.py" in launches.swap_rule(s)["decided_by"]


@pytest.mark.parametrize("launch_id", ["arms-s2-k1-d3", "plain"])
def test_a_launch_plan_holds_every_bench_in_order_and_its_checks(launch_id):
    s = _settings(size="smoke")
    layout = Layout(s.experiment)
    plan = jobs.launch_plan(s, layout, launch_id)
    assert plan["argv"] == plan["benches"][0]["argv"] and plan["server"] == plan["benches"][0]["server"]
    assert plan["summary"] == layout.launch_summary(launch_id) and plan["cache"] == layout.launch_cache(launch_id)
    if launch_id == "plain":
        assert plan["fresh_check"] is None and plan["plain_outputs"] == []
        assert plan["launch_check"] is None
        gen = plan["generate"]["argv"]
        assert gen[:2] == ["draftlab", "generate-data"] and gen[-2:] == ["--url", "{url}"] and "--server" not in gen
        assert "--max-batch-size" in plan["argv"]  # the builtin plain server batches the data's requests
    else:
        assert [b["variant"] for b in plan["benches"]] == ["finetune-keep", "finetune-remap", "finetune-regenerate",
                                                           "scratch"]
        assert plan["fresh_check"] == {"variant": "finetune-keep", "client": "short"}
        # issue 38: the probe swapped in last, benched as its own launch benched it, paired with that result
        check = plan["launch_check"]
        assert {k: check[k] for k in ("variant", "client", "own_launch", "own_result")} == {
            "variant": "probe", "client": "short", "own_launch": "probe-s2-k1-d3",
            "own_result": layout.bench_result("probe", "s2-k1-d3", "short")}
        assert check["bench"] == jobs.plan(s, layout, "probe", "s2-k1-d3")
        assert plan["plain_outputs"] == [layout.bench_result("baseline", "plain", "short")]
        assert plan["generate"] is None


def test_the_launch_check_is_planned_only_where_an_arms_launch_can_serve_the_probe():
    """Issue 38: SGLang swaps the probe only into the launch of its own d2t map (the keep arms'); vLLM into
    none; the builtin server into its one arms launch. The note of `-n -p` says so."""
    layout = Layout("x")
    sglang = _settings(["config/kimi-k25.yaml"])
    got = {x.id: jobs.launch_plan(sglang, layout, x.id)["launch_check"] for x in launches.launches(sglang)}
    assert [k for k, v in got.items() if v] == [f"drafter-map-{spec}{r}" for r in ("", "-r2") for spec in sglang.specs]
    first = next(x for x in launches.launches(sglang) if x.id.startswith("drafter-map-"))
    assert got[first.id]["own_launch"] == f"probe-{first.spec}" and got[first.id]["bench"]["variant"] == "probe"
    assert "launch check: probe swapped in last" in launches.describe(first, sglang)
    vllm = _settings(serve={"backend": "vllm"}, size="smoke")
    assert not any(jobs.launch_plan(vllm, layout, x.id)["launch_check"] for x in launches.launches(vllm))
    assert not any(launches.checks_launch_noise(vllm, x) for x in launches.launches(vllm))
    smoke = _settings(size="smoke")
    assert [x.id for x in launches.launches(smoke) if launches.checks_launch_noise(smoke, x)] == [
        "arms-s2-k1-d3", "arms-s2-k1-d3-r2"]
    arms = next(x for x in launches.launches(smoke) if x.id == "arms-s2-k1-d3")
    assert launches.launch_check_result(smoke, layout, arms, "short") == \
        layout.bench_result("probe", "s2-k1-d3", "short")
    # the probe's result in the arms launch is a declared output of that launch (the report pairs it there),
    # and the plan names it; a launch that does not check declares none
    again = layout.probe_again_result("arms-s2-k1-d3", "short")
    assert launches.launch_outputs(layout, arms, smoke.clients, launches.check_client(smoke, arms))["check"] == [again]
    assert jobs.launch_plan(smoke, layout, arms.id)["launch_check"]["result"] == again
    plain = launches.launches(smoke)[0]
    assert launches.check_client(smoke, plain) is None
    assert "check" not in launches.launch_outputs(layout, plain, smoke.clients, launches.check_client(smoke, plain))


def test_the_default_bench_plan_streams_a_sample_of_its_prompts(monkeypatch):
    """The CPU default's client streams 8 of its 32 prompts (bench.clients[].ttft_limit), and every bench plan
    of a launch carries that to the bench (the launch check streams none: test_e2e)."""
    from draftlab.benchmark import serve_bench
    from draftlab.serving.server_spec import ServerSpec

    s = _settings()
    assert [c.ttft_limit for c in s.bench.clients] == [8] and s.bench.clients[0].limit == 32
    layout = jobs.Layout(s.experiment)
    arms = launches.launches(s)[-1]
    plan = jobs.launch_plan(s, layout, arms.id)
    assert {c["ttft_limit"] for b in plan["benches"] for c in b["clients"]} == {8}
    seen = []

    class Sent(Exception):
        pass

    def run_benchmark(*args, **kwargs):  # what the bench is asked to do, without a server
        seen.append(kwargs)
        raise Sent

    monkeypatch.setattr(serve_bench, "run_benchmark", run_benchmark)
    bench = plan["benches"][0]
    with pytest.raises(Sent):
        serve_bench.run_clients("http://127.0.0.1:9", bench, ServerSpec.from_dict(bench["server"], source="t"),
                                {"clients": []}, False)
    assert seen[-1]["ttft_limit"] == 8 and seen[-1]["measure_ttft"] is True
