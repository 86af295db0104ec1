"""The report, the probe gate and the gate wrapper: what a person reads and what decides fine-tuning."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from helpers import cli
from draftlab.errors import DraftlabError
from draftlab.benchmark.probe_gate import SKIP_MARKER, gate_decision, run_gated
from draftlab.benchmark.serve_bench import skip_reason
from draftlab.experiment.records import build_records, write_records
from draftlab.benchmark.breakeven import break_even_accept_length as break_even
from draftlab.benchmark.breakeven import drafter_standing
from draftlab.fsutil import write_json
from draftlab.experiment.report import write_report
from test_records import SERVERS, experiment_config, make_experiment

PNG = b"\x89PNG\r\n\x1a\n"


def _report(tmp_path, **kw):
    cfg = experiment_config()
    exp = make_experiment(tmp_path, cfg, **kw)
    (exp / "static").mkdir()
    (exp / "static" / "doctor-probe.json").write_text(json.dumps({"findings": [
        {"code": "aux-layers-unusual", "severity": "warning", "message": "ids [2, 30, 58] differ from [1, 29, 57]"}]}))
    (exp / "static" / "d2t-diff.json").write_text(json.dumps(
        {"draft_vocab_size": 64, "differing": [3, 9, 12], "shared_target_ids": 61, "only_in_a": [5, 6, 7],
         "only_in_b": [8, 9, 10]}))
    (exp / "static" / "d2t-coverage.json").write_text(json.dumps({"coverage": 0.8731}))
    write_records(build_records(exp, cfg, servers=SERVERS, clients=["default"]), exp / "records" / "records.csv")
    standing = exp / "report" / "breakeven" / "s2-k1-d3" / "default.json"
    bench = exp / "bench"
    write_json(standing, drafter_standing(bench / "baseline" / "plain" / "default.json",
                                          {v: bench / v / "s2-k1-d3" / "default.json"
                                           for v in ("probe", "finetune-keep", "scratch")}, [50, 150, 200]))
    (exp / "static" / "doctor-probe.md").write_text(
        "# doctor: probe\n\n| severity | code |\n|---|---|\n| warning | aux-layers-unusual |\n")
    out = write_report(exp, exp / "report", exp / "records" / "records.csv", target_tps=[50, 150, 200],
                       standing=[standing], static_md=[exp / "static" / "doctor-probe.md"])
    return exp, out, (exp / "report" / "summary.md").read_text()


def test_summary_has_every_section_and_the_decision(tmp_path):
    exp, out, md = _report(tmp_path)
    for heading in ("## Decision", "## Comparison", "## Accept length by variant",
                    "## Throughput against baseline and break-even", "## TTT per-step validation accuracy",
                    "## d2t: transferred mapping vs the fine-tune data's", "## Doctor findings", "## Probe gate"):
        assert heading in md, heading
    # decision in words: best drafter, transfer vs scratch, what to serve
    assert "Best fine-tuned drafter by paired throughput: `finetune-keep` at s2-k1-d3, 1.60x" in md
    assert "Transfer vs training from scratch on the same data, both at s2-k1-d3: `finetune-keep` is faster than " \
           "`scratch`" in md and "accept length 2.10 vs 1.70" in md
    assert "**Decision:** serve `finetune-keep` at s2-k1-d3: 1.60x [" in md
    # the recommendation comes first, and as a file
    assert md.split("## Decision\n\n")[1].startswith("**Deploy:** `finetune-keep` at s2-k1-d3: expected 1.60x")
    rec = json.loads(Path(out["recommendation"]).read_text())
    assert rec["winner"] == "finetune-keep" and rec["setting"] == "s2-k1-d3"
    assert rec["speedup_ci95"][0] > 1.0 and rec["expected_tps"] == pytest.approx(100.0 * rec["speedup"])
    for heading in ("## Paired speedup against plain decoding", "### Host stability", "## Results per category",
                    "## Every shorter chain, predicted from one launch"):
        assert heading in md, heading
    # comparison table row: variant, tok/s [CI], accept length, val acc, speedup
    assert "| finetune-keep | s2-k1-d3 | default | 160.0 [158.0, 162.0] | 2.10 | 14.0 | 0.450 | 1.60 |" in md
    # issue 40: latency as users measure it, per arm, beside tok/s and accept length (milliseconds)
    assert "## Latency as users measure it (streamed)" in md
    assert "| finetune-keep | s2-k1-d3 | default | 160.0 | 2.10 | 50.0 / 80.0 / 120.0 | 6.2 / 9.4 / 18.8 |" in md
    # break-even from the breakeven rule's standing file: 100 tok/s x 14 ms / 1000 = 1.40; 50 tok/s needs
    # 0.70 < 1 (reached without speculation); 150 needs 2.10 and 160 tok/s were measured (met); 200 not met
    assert ("| finetune-keep | s2-k1-d3 | default | 2.10 | 1.40 | above | reached without speculation (needs 0.70 "
            "< 1); met: 160.0 tok/s measured | 2.10 (met: 160.0 tok/s measured) | 2.80 (not met: 160.0 tok/s "
            "measured) |") in md
    assert "| step 0 | step 1 | step 2 |" in md and "| finetune-keep | 0.600 | 0.450 | 0.300 |" in md
    assert "| 64 | 3 | 61 | 3 | 3 |" in md and "87.3%" in md
    assert "aux-layers-unusual" in md and "decision: **fine-tune**" in md
    for key in ("accept", "tps", "ttt"):
        data = Path(out[key]).read_bytes()
        assert data.startswith(PNG) and len(data) > 5000, key
        assert f"]({Path(out[key]).name})" in md


def test_fine_tune_data_section_says_where_the_data_came_from(tmp_path):
    from draftlab.experiment.report import data_section

    assert "nothing was generated" in data_section(None)[0]
    stats = tmp_path / "generate-stats.json"
    write_json(stats, {"prompts": 1000, "answers": 997, "mode": "greedy", "max_new_tokens": 2048,
                       "generated_tokens": 812345, "empty": 2, "tokens_per_s": 4321.5, "prompts_per_s": 5.3,
                       "answering_seconds": 188.0, "seconds": 800.2, "resumed_answers": 400, "failed": 3,
                       "failures": [{"id": 17}, {"id": 512}, {"id": 900}], "skipped_long": 0, "concurrency": 128,
                       "engine": "server", "server": {"backend": "sglang", "fingerprint": "abcd1234abcd1234"}})
    text = "\n".join(data_section(stats))
    assert ("997 of 1000 prompts answered by the target through its sglang server (128 requests in flight), "
            "greedy, at most 2048 new tokens: 812345 answer tokens (2 blank answers)") in text
    assert "4,322 tok/s" in text and "400 answers were kept from earlier, interrupted runs" in text
    assert "3 prompts failed after retries and are not in the data (ids 17, 512, 900)" in text
    assert "`abcd1234abcd1234`" in text
    assert "multi-turn" not in text  # no stats of turns (an older run), or one answer per prompt: no line

    st = json.loads(stats.read_text())
    write_json(stats, {**st, "turns": "all", "answered_now": 597, "answered_turns": 1480})
    assert ("- multi-turn prompts: every user turn answered by the target, in order (1480 answers for 597 prompts "
            "in this run)") in data_section(stats)


def test_cycle_from_end_to_end_latency_is_never_shown_as_the_verify_cycle(tmp_path):
    # SGLang 0.5.23 without --enable-metrics: the only timing is e2e_latency (prefill, queueing)
    exp, _, md = _report(tmp_path, cycle_source="e2e_latency")
    rows = (exp / "records" / "records.csv").read_text().splitlines()
    assert "cycle_ms_source" in rows[0].split(",") and "e2e_latency" in rows[2]
    assert "| finetune-keep | s2-k1-d3 | default | 160.0 [158.0, 162.0] | 2.10 | 14.0† | 0.450 | 1.60 |" in md
    assert "| finetune-keep | s2-k1-d3 | default | 2.10 | 1.40† | above |" in md
    assert "prefill and queueing included, so an upper bound, not the verify cycle" in md
    _, _, measured = _report(tmp_path / "measured", cycle_source="e2e_latency-first_token_latency")
    assert "†" not in measured and "| 2.10 | 14.0 | 0.450 |" in measured


def test_report_says_why_fine_tuning_was_skipped(tmp_path):
    _, out, md = _report(tmp_path, gate_pass=False, probe_accept=1.0)
    assert "Probe gate failed: probe accept length 1.000 < 1.1" in md
    assert "Fine-tuning and the from-scratch control arm were not trained" in md
    assert "| finetune-keep (skipped) |" in md and "No trained drafter" in md
    assert "| finetune-keep | s2-k1-d3 | default | – | – | skipped: " in md
    assert "decision: **skip**" in md
    assert Path(out["ttt"]).read_bytes().startswith(PNG)


def test_an_arm_no_longer_configured_is_not_reported(tmp_path):
    """Issue 14: with train.scratch: false, summary.md listed a "scratch" arm (the report globbed train/*
    and static/doctor-*.json, and an earlier run had left scratch's folders) while records.csv had no
    scratch rows. The report reads the files it is handed, or those of the variants records.csv holds."""
    cfg = experiment_config(train={"scratch": False})
    exp = make_experiment(tmp_path, cfg)  # leaves train/scratch and its bench result, as a run with scratch did
    (exp / "static").mkdir()
    for variant in ("probe", "finetune-keep", "scratch"):
        write_json(exp / "static" / f"doctor-{variant}.json", {"findings": [
            {"code": f"note-{variant}", "severity": "info", "message": f"a finding of {variant}"}]})
    servers = [s for s in SERVERS if s[0] != "scratch"]
    write_records(build_records(exp, cfg, servers=servers, clients=["default"]), exp / "records" / "records.csv")
    assert "scratch" not in (exp / "records" / "records.csv").read_text().split("\n", 1)[1]
    # the command line without the file flags (a hand-typed report) ...
    done = cli("report", "--exp-dir", exp, "--out-dir", exp / "report", "--records", exp / "records" / "records.csv")
    assert done.returncode == 0, done.stderr
    implied = (exp / "report" / "summary.md").read_text()
    # ... and the files the report rule declares, as it passes them
    write_report(exp, exp / "report2", exp / "records" / "records.csv", gate=exp / "gate" / "gate.json",
                 doctor=[exp / "static" / f"doctor-{v}.json" for v in ("probe", "finetune-keep")],
                 train=[exp / "train" / "finetune-keep"])
    declared = (exp / "report2" / "summary.md").read_text()
    for md in (implied, declared):
        assert "| finetune-keep | 0.600 | 0.450 | 0.300 |" in md and "note-finetune-keep" in md
        assert "scratch" not in md.lower(), [line for line in md.splitlines() if "scratch" in line.lower()]


def test_met_means_measured_not_assumed():
    """Issue 18: '1.22 (met)' for a probe measuring 99.2 tok/s against a 100 tok/s goal."""
    from draftlab.experiment.report import goal_cell

    goal = {"target_tps": 100.0, "required_accept_length": 1.22}
    assert goal_cell(goal, 99.2) == "1.22 (not met: 99.2 tok/s measured)"
    assert goal_cell({"target_tps": 100.0, "required_accept_length": 0.52}, 99.2).startswith(
        "reached without speculation (needs 0.52 < 1)")
    assert break_even(100.0, 14.0) == pytest.approx(1.4)


def _result(path: Path, accept):
    path.write_text(json.dumps({"summary": {"accept_length": accept}}))
    return path


def test_gate_passes_on_the_best_setting_and_fails_below_threshold(tmp_path):
    a, b = _result(tmp_path / "a.json", 1.05), _result(tmp_path / "b.json", 1.3)
    ok = gate_decision([a, b], 1.1)
    assert ok["pass"] and ok["best_accept_length"] == 1.3 and ok["decision"] == "fine-tune"
    no = gate_decision([a], 1.1)
    assert not no["pass"] and "1.050 < 1.1" in no["reason"] and "fine-tuning skipped" in no["reason"]
    none = gate_decision([_result(tmp_path / "c.json", None)], 1.1)
    assert not none["pass"] and "no accept length" in none["reason"]


def test_gated_command_runs_when_open_and_writes_skips_when_closed(tmp_path):
    gate = tmp_path / "gate.json"
    marker = tmp_path / "ran.txt"
    cmd = [sys.executable, "-c", f"open({str(marker)!r}, 'w').write('x')"]
    gate.write_text(json.dumps({"pass": True, "reason": "ok"}))
    assert run_gated(cmd, gate=str(gate), unless_skipped=None) == 0 and marker.exists()
    marker.unlink()
    gate.write_text(json.dumps({"pass": False, "reason": "probe accept length 1.000 < 1.1"}))
    run = tmp_path / "train" / "scratch"
    assert run_gated(cmd, gate=str(gate), unless_skipped=None, skip_dirs=[str(run)],
                     skip_files=[str(tmp_path / "doctor.json")]) == 0
    assert not marker.exists()
    skipped = json.loads((run / SKIP_MARKER).read_text())
    assert skipped["skipped"] and "1.000 < 1.1" in skipped["reason"] and skipped["command"] == cmd
    # a later gated step of the same job sees the skip marker and does not run either
    gate.write_text(json.dumps({"pass": True, "reason": "ok"}))
    assert run_gated(cmd, gate=None, unless_skipped=str(run)) == 0 and not marker.exists()
    # the command's failure is the job's failure
    assert run_gated([sys.executable, "-c", "raise SystemExit(3)"], gate=str(gate), unless_skipped=None) == 3


def test_gate_cli_writes_the_decision(tmp_path):
    res = _result(tmp_path / "probe.json", 1.02)
    out = cli("gate", res, "--min-accept-length", "1.1", "--out", tmp_path / "gate.json")
    assert out.returncode == 0
    assert "probe gate: SKIP" in out.stderr
    assert json.loads((tmp_path / "gate.json").read_text())["pass"] is False


def test_serve_bench_refuses_a_drafter_whose_gate_flipped(tmp_path):
    gate = tmp_path / "gate.json"
    run = tmp_path / "train" / "finetune-keep"
    (run / "drafter").mkdir(parents=True)
    plan = {"gate": str(gate), "train_dir": str(run)}
    gate.write_text(json.dumps({"pass": False, "reason": "closed"}))
    with pytest.raises(DraftlabError, match="gate is now closed"):
        skip_reason(plan)
    gate.write_text(json.dumps({"pass": True, "reason": "open"}))
    assert skip_reason(plan) is None
    (run / SKIP_MARKER).write_text(json.dumps({"skipped": True, "reason": "closed"}))
    with pytest.raises(DraftlabError, match="gate is now open"):
        skip_reason(plan)
    gate.write_text(json.dumps({"pass": False, "reason": "closed"}))
    assert skip_reason(plan) == "closed"


def _figures(monkeypatch):
    """Keep the figures the report closes, to read their axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kept = []
    monkeypatch.setattr(plt, "close", lambda fig=None: kept.append(fig))
    return kept


def test_plots_are_scaled_labelled_and_marked(tmp_path, monkeypatch):
    """Issue 18: labels overlapped, accept length started at 0, TTT ticks at 0.5, no CIs or break-even."""
    kept = _figures(monkeypatch)
    exp, out, _ = _report(tmp_path)
    plt_accept, plt_tps, plt_ttt = (f.axes[0] for f in kept[-3:])
    lo, hi = plt_accept.get_ylim()
    assert 1.0 < lo < 1.3 and 2.1 < hi < 2.4  # probe 1.60 .. keep 2.10, break-even 1.30/1.40: not from 0
    for ax in (plt_accept, plt_tps):
        assert all(t.get_rotation() == 30 for t in ax.get_xticklabels())
        assert ax.get_legend() is not None
    legend = [t.get_text() for t in plt_accept.get_legend().get_texts()]
    assert any("break-even" in t for t in legend) and any("probe" in t for t in legend)
    assert any("baseline" in t.get_text() for t in plt_tps.get_legend().get_texts())
    assert plt_tps.containers, "error bars drawn"
    assert 80 < plt_tps.get_ylim()[0] < 98  # tok/s 98..162: not from 0 either
    ticks = [t for t in plt_ttt.get_xticks() if 0 <= t <= 2]
    assert ticks == [0, 1, 2]


def test_html_views_show_the_decision_in_a_real_browser(tmp_path):
    """Issue 18: the HTML report hid the decision behind data: links that opened nothing."""
    from browser import visible_text

    exp, out, md = _report(tmp_path)
    text = visible_text(Path(out["summary_html"]))
    assert "Decision: serve finetune-keep at s2-k1-d3" in text
    assert "Transfer vs training from scratch" in text and "tok/s median [95% CI]" in text
    assert "`" not in text  # code spans are code, not backticks (issue 22)
    html = Path(out["summary_html"]).read_text()
    assert html.count('src="data:image/png;base64,') == 3  # the plots travel inside the page
    frag = Path(out["decision_fragment"]).read_text()
    assert "<strong>Decision:</strong>" in frag and "paired speedup [95% CI]</th>" in frag and "<html>" not in frag
    assert "<code>" not in frag  # Snakemake's page draws backticks around <code>: monospace spans instead
    assert frag.index("<strong>Deploy:</strong>") < frag.index("<strong>Decision:</strong>")
    records = visible_text(Path(out["records_html"]))
    assert "finetune-keep" in records and "train_settings_sha256" in records
    static = visible_text(Path(out["static_html"]))
    assert "doctor: probe" in static and "aux-layers-unusual" in static


def test_code_spans_render_as_code_without_backticks():
    """Issue 22: literal backticks showed in the HTML (a double-backtick span, a pipe inside code in a table)."""
    from draftlab.experiment.report_html import _inline, markdown_to_html, rounded

    assert _inline("serve `keep` with ``--flag `x` y``") == "serve <code>keep</code> with <code>--flag `x` y</code>"
    assert _inline("`**not bold**` **bold** `<b>`") == "<code>**not bold**</code> <strong>bold</strong> <code>&lt;b&gt;</code>"
    table = markdown_to_html("| a | b |\n|---|---|\n| `x | y` | z |")
    assert "<td><code>x | y</code></td><td>z</td>" in table and "`" not in table
    assert [rounded(c) for c in ("161.23456", "1.565217391", "0.5", "2", "abc.def", "3.0")] == \
        ["161.2", "1.565", "0.5", "2", "abc.def", "3"]


def test_landing_table_keeps_its_width_inside_the_report_page():
    from draftlab.experiment.report_html import decision_fragment

    frag = decision_fragment(["**Deploy:** `keep`"], ["| variant | tok/s [95% CI] |", "|---|---|", "| keep | 1.0 |"])
    assert "width:max-content" in frag and "white-space:nowrap" in frag and "overflow-x:auto" in frag


def test_serving_acceptance_by_position_is_taken_at_each_drafters_longest_chain():
    from draftlab.experiment.report import acceptance_by_position

    res = lambda rates: {"summary": {"accepted_per_position_rate": rates}, "rows": []}  # noqa: E731
    bench = {("probe", "s2-k1-d3", "default"): res([0.5, 0.2]), ("probe", "s4-k1-d5", "default"): res([0.5, 0.2, 0.1, 0.0]),
             ("finetune-keep", "s2-k1-d3", "other"): res([0.9, 0.8]), ("baseline", "plain", "default"): res(None)}
    assert acceptance_by_position([], bench, "default") == {"probe": [0.5, 0.2, 0.1, 0.0]}
