"""Break-even arithmetic: formulas, K-step chain inversion, CLI keys, standing of measured drafters."""

from __future__ import annotations

import json
import math

import pytest

from draftlab.benchmark.breakeven import (
    break_even_accept_length,
    breakeven_table,
    drafter_standing,
    expected_accept_length,
    expected_tps,
    min_num_steps,
    required_accept_length,
    required_step_acceptance,
    required_step_acceptance_at_num_steps,
)
from draftlab.cli import main
from draftlab.errors import DraftlabError


def test_break_even_and_required_lengths():
    # 100 tok/s plain decoding, 20 ms per speculative cycle: a cycle must emit 2 tokens to tie
    assert break_even_accept_length(100, 20) == pytest.approx(2.0)
    assert required_accept_length(150, 20) == pytest.approx(3.0)
    assert required_accept_length(200, 20) == pytest.approx(4.0)
    assert expected_tps(3.0, 20) == pytest.approx(150.0)


def test_unbounded_chain_step_acceptance():
    assert required_step_acceptance(2.0) == pytest.approx(0.5)
    assert required_step_acceptance(4.0) == pytest.approx(0.75)
    assert required_step_acceptance(1.0) == 0.0
    assert required_step_acceptance(0.5) == 0.0
    assert expected_accept_length(0.75, None) == pytest.approx(4.0)


def test_k2_chain_examples():
    # K = 2 draft steps: E = 1 + p + p^2
    assert expected_accept_length(0.5, 2) == pytest.approx(1.75)
    assert expected_accept_length(0.0, 2) == 1.0
    assert expected_accept_length(1.0, 2) == 3.0
    # L = 2 with K = 2: p^2 + p - 1 = 0 -> p = (sqrt(5) - 1) / 2 (the golden ratio conjugate)
    assert required_step_acceptance_at_num_steps(2.0, 2) == pytest.approx((math.sqrt(5) - 1) / 2, abs=1e-12)
    assert required_step_acceptance_at_num_steps(3.0, 2) == 1.0  # only perfect acceptance
    assert required_step_acceptance_at_num_steps(3.01, 2) is None  # unreachable with 2 drafts
    assert required_step_acceptance_at_num_steps(4.0, 2) is None
    assert required_step_acceptance_at_num_steps(1.0, 2) == 0.0
    assert required_step_acceptance_at_num_steps(0.7, 2) == 0.0


@pytest.mark.parametrize("k", [1, 2, 3, 5, 7])
@pytest.mark.parametrize("p", [0.05, 0.3, 0.6, 0.8, 0.95, 0.999])
def test_inversion_round_trips(k, p):
    length = expected_accept_length(p, k)
    assert required_step_acceptance_at_num_steps(length, k) == pytest.approx(p, abs=1e-9)


def test_min_num_steps_needs_strictly_more_room_than_l():
    assert min_num_steps(2.0) == 2  # K=1 reaches 2.0 only with p=1
    assert min_num_steps(2.5) == 2
    assert min_num_steps(3.2) == 3
    assert min_num_steps(1.0) == 1 and min_num_steps(0.4) == 1
    for length in (1.3, 2.0, 2.9, 4.0, 6.5):
        k = min_num_steps(length)
        p = required_step_acceptance_at_num_steps(length, k)
        assert p is not None and p < 1.0
        if k > 1:
            p_less = required_step_acceptance_at_num_steps(length, k - 1)
            assert p_less is None or p_less == 1.0


def test_table_keys_and_values():
    t = breakeven_table(100, 20, [150, 200], num_steps=2, step_acceptance=0.5)
    assert t["break_even_accept_length"] == pytest.approx(2.0)
    assert [r["target_tps"] for r in t["rows"]] == [150.0, 200.0]
    r150, r200 = t["rows"]
    assert set(r150) == {
        "target_tps", "required_accept_length", "required_step_acceptance",
        "required_step_acceptance_at_num_steps", "min_num_steps",
    }
    assert r150["required_accept_length"] == pytest.approx(3.0)
    assert r150["required_step_acceptance"] == pytest.approx(2 / 3)
    assert r150["required_step_acceptance_at_num_steps"] == 1.0
    assert r150["min_num_steps"] == 3
    assert r200["required_step_acceptance_at_num_steps"] is None  # L = 4 > K + 1 = 3
    assert t["expected_accept_length"] == pytest.approx(1.75)
    assert t["expected_tps"] == pytest.approx(87.5)  # below the 100 tok/s baseline


def test_table_without_num_steps():
    t = breakeven_table(100, 20, [150])
    assert t["num_steps"] is None
    assert t["rows"][0]["required_step_acceptance_at_num_steps"] is None
    assert "expected_tps" not in t


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(baseline_tps=0, cycle_ms=20, target_tps=[1]), "--baseline-tps"),
        (dict(baseline_tps=100, cycle_ms=-1, target_tps=[1]), "--cycle-ms"),
        (dict(baseline_tps=100, cycle_ms=20, target_tps=[]), "--target-tps"),
        (dict(baseline_tps=100, cycle_ms=20, target_tps=[0]), "--target-tps"),
        (dict(baseline_tps=100, cycle_ms=20, target_tps=[1], num_steps=0), "--num-steps"),
        (dict(baseline_tps=100, cycle_ms=20, target_tps=[1], step_acceptance=1.5), "--step-acceptance"),
    ],
)
def test_bad_inputs_name_the_flag(kwargs, message):
    with pytest.raises(DraftlabError, match=message):
        breakeven_table(**kwargs)


def test_cli_json(capsys):
    code = main(
        ["breakeven", "--baseline-tps", "100", "--cycle-ms", "20", "--num-steps", "3",
         "--target-tps", "150", "200", "--step-acceptance", "0.7", "--json"]
    )
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["break_even_accept_length"] == pytest.approx(2.0)
    assert out["rows"][1]["required_accept_length"] == pytest.approx(4.0)
    assert out["rows"][1]["required_step_acceptance_at_num_steps"] == 1.0
    assert out["rows"][0]["required_step_acceptance_at_num_steps"] == pytest.approx(
        required_step_acceptance_at_num_steps(3.0, 3)
    )
    assert out["expected_accept_length"] == pytest.approx(1 + 0.7 + 0.49 + 0.343)
    assert out["expected_tps"] == pytest.approx((1 + 0.7 + 0.49 + 0.343) / 20 * 1000)


def test_cli_human_and_error(capsys):
    assert main(["breakeven", "--baseline-tps", "100", "--cycle-ms", "20", "--target-tps", "150"]) == 0
    assert "break-even accept length 2.000" in capsys.readouterr().out
    assert main(["breakeven", "--baseline-tps", "100", "--cycle-ms", "0", "--target-tps", "150"]) == 2
    assert "--cycle-ms: expected a positive number" in capsys.readouterr().err


def _bench(tps, accept=None, cycle=None):
    return {"summary": {"output_tps_median": tps, "accept_length": accept, "cycle_ms": cycle}}


def test_standing_from_bench_files(tmp_path, capsys):
    base = tmp_path / "baseline.json"
    base.write_text(json.dumps(_bench(100.0)))
    good = tmp_path / "good.json"
    good.write_text(json.dumps(_bench(160.0, accept=3.3, cycle=20.0)))
    weak = tmp_path / "weak.json"
    weak.write_text(json.dumps(_bench(90.0, accept=1.8, cycle=20.0)))
    s = drafter_standing(base, {"good": good, "weak": weak}, [150, 200], num_steps=3)
    g, w = s["drafters"]
    assert s["baseline_tps"] == 100.0
    assert g["break_even_accept_length"] == pytest.approx(2.0)
    assert g["above_break_even"] and not w["above_break_even"]
    assert g["accept_length_margin"] == pytest.approx(1.3)
    assert g["speedup"] == pytest.approx(1.6)
    assert g["modelled_tps"] == pytest.approx(165.0)
    assert [x["meets_by_accept_length"] for x in g["goals"]] == [True, False]
    assert [x["meets_measured"] for x in g["goals"]] == [True, False]
    assert g["goals"][1]["accept_length_gap"] == pytest.approx(3.3 - 4.0)
    assert g["implied_step_acceptance"] == pytest.approx(required_step_acceptance_at_num_steps(3.3, 3))

    out = tmp_path / "standing.json"
    code = main(["standing", "--baseline", str(base), "--drafter", f"good={good}", "--drafter", f"weak={weak}",
                 "--target-tps", "150", "--out", str(out)])
    assert code == 0
    assert "weak: accept 1.800 vs break-even 2.000 (BELOW)" in capsys.readouterr().out
    assert json.loads(out.read_text())["drafters"][0]["name"] == "good"


def test_standing_refuses_a_drafter_run_without_speculation(tmp_path, capsys):
    base = tmp_path / "b.json"
    base.write_text(json.dumps(_bench(100.0)))
    off = tmp_path / "off.json"
    off.write_text(json.dumps(_bench(99.0)))
    assert main(["standing", "--baseline", str(base), "--drafter", f"x={off}", "--target-tps", "150"]) == 2
    err = capsys.readouterr().err
    assert "off.json: key 'summary.accept_length'" in err and "speculation active" in err


def test_standing_reports_a_skipped_arm_without_numbers(tmp_path):
    """A gated arm that never ran (probe gate closed) is listed as skipped, not as a failure or a zero."""
    import json

    from draftlab.benchmark.breakeven import drafter_standing

    base = tmp_path / "baseline.json"
    base.write_text(json.dumps({"summary": {"output_tps_median": 100.0}}))
    probe = tmp_path / "probe.json"
    probe.write_text(json.dumps({"summary": {"accept_length": 1.6, "cycle_ms": 12.0, "output_tps_median": 130.0}}))
    arm = tmp_path / "arm.json"
    arm.write_text(json.dumps({"skipped": True, "reason": "probe accept length 1.02 < 1.1"}))
    s = drafter_standing(base, {"probe": probe, "finetune-keep": arm}, [150])
    rows = {d["name"]: d for d in s["drafters"]}
    assert rows["probe"]["break_even_accept_length"] == 1.2 and rows["probe"]["above_break_even"]
    assert rows["finetune-keep"] == {"name": "finetune-keep", "source": str(arm), "skipped": True,
                                     "reason": "probe accept length 1.02 < 1.1"}
