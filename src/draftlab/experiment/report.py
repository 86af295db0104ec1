"""The experiment report: a Markdown summary a person reads, and the plots beside it.

Everything comes from files the pipeline already wrote under ``results/<experiment>/`` (records,
gate decision, doctor reports, d2t diff and coverage, training metrics and validation, the
``breakeven`` rule's standing files), so the report can be regenerated at any time and never
measures or recomputes anything itself. It reads the files it is handed (the report rule's inputs)
and nothing else: an arm no longer configured (``train.scratch: false`` after a run with it) has
no row in records.csv and no table row here, whatever its old folder still holds. Sections: the decision in words (draftlab.benchmark.verdict: only
what the measurements separate), the comparison table, accept length by variant, tok/s against
baseline with the break-even table, TTT per-step accuracy of every trained drafter, the d2t diff,
doctor findings, the gate. HTML views of the same for ``snakemake --report``: draftlab.experiment.report_html.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

from draftlab.benchmark import chain as chains
from draftlab.benchmark import launch_noise, power, replicated
from draftlab.benchmark import paired as pairing
from draftlab.benchmark import recommend
from draftlab.benchmark.bench import is_verify_cycle
from draftlab.benchmark.verdict import (
    arm_table,
    baseline_row,
    decide,
    fmt,
    label,
    num,
    speedup_text,
)
from draftlab.benchmark.leak_check import markdown as leak_markdown
from draftlab.experiment import report_html as html_view
from draftlab.experiment.report_categories import category_section
from draftlab.experiment.layout import REPORT_FILES
from draftlab.experiment.latency_table import latency_table
from draftlab.experiment.records import LATENCY_COLUMNS
from draftlab.experiment.report_inputs import (Bench, for_client, input_files, load_bench,  # noqa: F401 - load_rows, report_inputs: the report's API
                                               load_plans, load_rows, load_standing, report_inputs, ttt_curves)
from draftlab.experiment.report_inputs import read_json_or_none as _read_json
from draftlab.experiment.report_plots import ok as _ok
from draftlab.experiment.report_plots import plot_accept, plot_tps, plot_ttt
from draftlab.fsutil import to_json, write_text
from draftlab.textsafe import code, md_table
from draftlab.textsafe import md as esc

PLOTS = ("accept", "tps", "ttt")  # keys of Layout's REPORT_FILES: the three PNGs


_num, _fmt = num, fmt


def decision_text(rows: list[dict[str, Any]], gate: dict[str, Any] | None, bench: Bench | None = None,
                  decision: dict[str, Any] | None = None) -> list[str]:
    """The outcome in plain sentences, the decision first, from the main (first) client's numbers,
    compared per prompt (see draftlab.benchmark.verdict); one paragraph each."""
    if not rows:
        return ["No benchmark results were recorded."]
    client = rows[0]["client"]
    d = decision or decide(rows, client, for_client(bench or {}, client))
    out = []
    arms = {a["row"]["variant"]: a for a in d.get("arms", [])}
    if "probe" in arms:
        probe = arms["probe"]["row"]
        out.append(f"The transferred drafter, served as is (config patched), runs at {speedup_text(arms['probe']['paired'])} "
                   f"the speed of plain decoding at its best setting {esc(probe['spec_id'])} (accept length {_fmt(probe['accept_length'])}).")
    if gate:
        verdict = "passed" if gate.get("pass") else "failed"
        out.append(f"Probe gate {verdict}: {esc(gate.get('reason'), 500)}.")
    if gate and not gate.get("pass"):
        out.append("Fine-tuning and the from-scratch control arm were not trained (the gate decides which arms "
                   "exist), so no trained arm has a row.")
    tuned = [a for a in d.get("arms", []) if a["row"]["variant"].startswith("finetune-")]
    if tuned:
        ft = tuned[0]
        out.append(f"Best fine-tuned drafter by paired throughput: {label(ft['row'])}, {speedup_text(ft['paired'])} "
                   f"the speed of plain decoding (accept length {_fmt(ft['row']['accept_length'])}).")
    noisy = [f"{code(v)} at {esc(sp)}" for (v, sp, c), res in sorted((bench or {}).items())
             if c == client and pairing.host_stability(res)["noisy"]]
    if noisy:
        out.append(f"**Noisy host:** the repeats of {', '.join(noisy)} disagree by more than "
                   f"{pairing.NOISY_SPREAD:.0%} per prompt on identical greedy answers (see Host stability); the "
                   "paired intervals are over prompts, so rerun on an idle machine before trusting a close call.")
    out.append("Speedups are paired: per prompt, the baseline's seconds per output token over the drafter's on the same "
               "prompt, geometric mean over prompts with a seeded bootstrap 95% interval (prompts resampled); each arm "
               "stands at its best setting by that number, never by accept length.")
    lines = d["lines"]
    # the decision first, the launch check it carries, then what it rests on
    return [lines[-1]] + launch_noise.report_lines(d.get("launch")) + power.report_lines(d) + out + lines[:-1]


_table = md_table  # every body cell escaped (draftlab.textsafe): cells carry names and messages read from files


E2E_MARK = "†"
E2E_NOTE = (f"{E2E_MARK} timed from the server's end-to-end latency per verify step (`cycle_ms_source` "
            "`e2e_latency` or `client_latency`): prefill and queueing included, so an upper bound, not the "
            "verify cycle; SGLang 0.5.23 reports no draft/verify times (add `--enable-metrics` to "
            "`serve.extra_args` for `first_token_latency`, which draftlab then subtracts).")


def _cycle(r: dict[str, Any]) -> tuple[float | None, str]:
    """The row's cycle time and the mark it carries when it is not a verify-cycle timing."""
    c = _num(r.get("cycle_ms"))
    source = r.get("cycle_ms_source") or None
    return c, "" if c is None or is_verify_cycle(source) else E2E_MARK


def _e2e_note(rows: list[dict[str, Any]]) -> list[str]:
    return ["", E2E_NOTE] if any(_cycle(r)[1] for r in rows) else []


def comparison_table(rows: list[dict[str, Any]], compact: bool = False) -> list[str]:
    """Every row; ``compact`` keeps the columns the decision uses (the HTML report's landing page)."""
    body = []
    for r in rows:
        ci = ""
        if _num(r["tps_ci_low"]) is not None:
            ci = f" [{_fmt(r['tps_ci_low'], '{:.1f}')}, {_fmt(r['tps_ci_high'], '{:.1f}')}]"
        val = _fmt(r["val_acc_mean"], "{:.3f}")
        status = "" if r["status"] == "ok" else " (skipped)"
        tps = _fmt(r["tps_median"], "{:.1f}") + ci
        if compact:
            body.append([r["variant"] + status, r["spec_id"], tps, _fmt(r["accept_length"]), val, _fmt(r["speedup"])])
            continue
        body.append([r["variant"] + status, r["spec_id"], r["client"], tps, _fmt(r["accept_length"]),
                     _fmt(r["cycle_ms"], "{:.1f}") + _cycle(r)[1], val, _fmt(r["speedup"])])
    if compact:
        return _table(["variant", "spec", "tok/s [95% CI]", "accept length", "val. acc", "speedup"], body)
    return _table(["variant", "spec", "client", "tok/s median [95% CI]", "accept length", "cycle ms",
                   "val. acc (mean over TTT steps)", "speedup"], body) + _e2e_note(rows)


def _ci(ci: Sequence[float] | None, spec: str = "{:.2f}") -> str:
    return "–" if not ci else f"[{spec.format(ci[0])}, {spec.format(ci[1])}]"


def paired_section(rows: list[dict[str, Any]], bench: Bench, client: str) -> list[str]:
    """Every drafter row's paired speedup against the baseline (same client, same prompts)."""
    base = bench.get(("baseline", "plain", client))
    body = []
    for r in _ok(rows):
        if r["client"] != client or r["variant"] == "baseline":
            continue
        res = bench.get((r["variant"], r["spec_id"], client))
        if base is None or res is None:
            body.append([r["variant"], r["spec_id"], _fmt(r["accept_length"]), "–", "–", "no per-request results"])
            continue
        p = pairing.paired_speedup(base, res, by_category=False)
        if not p["paired"]:
            body.append([r["variant"], r["spec_id"], _fmt(r["accept_length"]), "–", "–", f"not paired: {p['reason']}"])
            continue
        note = "excludes 1.0" if p["excludes_one"] else (
            f"holds 1.0; about {p['prompts_needed']} prompts would tell" if p.get("prompts_needed") else "holds 1.0")
        body.append([r["variant"], r["spec_id"], _fmt(r["accept_length"]), f"{p['speedup']:.2f}", _ci(p["ci95"]),
                     f"{p['prompts']} prompts, {p['time_field']}; {note}"])
    if not body:
        return ["(no drafter results)"]
    return _table(["variant", "spec", "accept length", "paired speedup", "95% CI (bootstrap over prompts)", "note"],
                  body)


def stability_section(bench: Bench, client: str) -> list[str]:
    """How much each server's repeats disagree; a noisy host is flagged here, not folded into intervals."""
    body, noisy = [], []
    for (v, s, c), res in sorted(bench.items()):
        if c != client:
            continue
        h = pairing.host_stability(res)
        spread = lambda x: "–" if x is None else f"{x:.1%}"  # noqa: E731
        body.append([v, s, str(h["repeats"]), spread(h["pass_spread"]), spread(h["prompt_spread"]),
                     "**noisy**" if h["noisy"] else "ok"])
        if h["noisy"]:
            noisy.append(f"`{v}` at {s}")
    if not body:
        return ["(no per-request results)"]
    lines = _table(["variant", "spec", "repeats", "pass tok/s range / median",
                    "per-prompt s/token range / median (median over prompts)", "host"], body)
    if noisy:
        lines += ["", f"**Noisy host:** the repeats of {', '.join(noisy)} disagree by more than "
                      f"{pairing.NOISY_SPREAD:.0%} on the same greedy answers; rerun on an idle machine before "
                      "trusting small differences."]
    return lines


def chain_predictions(rows: list[dict[str, Any]], bench: Bench, client: str) -> dict[tuple[str, str], dict[str, Any]]:
    """Per drafter, from its chain setting (topk 1) with the most steps: every shorter chain predicted,
    its cycle line fitted through every chain length the sweep measured for that drafter."""
    base = bench.get(("baseline", "plain", client))
    if base is None:
        return {}
    chains_of: dict[str, dict[int, dict[str, Any]]] = {}
    for r in _ok(rows):
        if r["client"] != client or r["variant"] == "baseline" or _num(r.get("topk")) != 1:
            continue
        chains_of.setdefault(r["variant"], {})[int(_num(r["num_steps"]) or 0)] = r
    out = {}
    for v, by_k in chains_of.items():
        r = by_k[max(by_k)]
        res = bench.get((v, r["spec_id"], client))
        measured = {k: run for k, other in by_k.items() if k != max(by_k)
                    if (run := bench.get((v, other["spec_id"], client))) is not None}
        pred = chains.predict_chain(res, base, measured) if res else None
        if pred:
            out[(v, r["spec_id"])] = pred
    return out


def chain_section(preds: dict[tuple[str, str], dict[str, Any]], rows: list[dict[str, Any]], client: str) -> list[str]:
    if not preds:
        return ["(no chain setting with acceptance by position and decode timings)"]
    measured = {(r["variant"], _num(r["num_steps"])): r for r in _ok(rows) if r["client"] == client}
    body = []
    for (v, spec), pred in preds.items():
        for p in pred["predictions"]:
            m = measured.get((v, float(p["k"])))
            body.append([v, f"{p['k']}{' (recommended)' if p['k'] == pred.get('recommended_k') else ''}",
                         f"{p['accept_length']:.2f}", f"{p['tps']:.1f}", _fmt(p["speedup"]),
                         _fmt(m["accept_length"]) if m else "–", _fmt(m["tps_median"], "{:.1f}") if m else "–"])
    fits = "; ".join(f"`{v}` from {spec}: t_verify {p['t_verify_ms']:.2f} ms, t_draft {p['t_draft_ms']:.2f} ms"
                     + (f" (fitted through the cycles measured at k = {', '.join(map(str, p['fit_points']))})"
                        if len(p.get("fit_points") or ()) > 1 else " (t_verify: plain decoding's step)")
                     + (f" — {p['unusable']}" if p.get("unusable") else "")
                     for (v, spec), p in preds.items())
    return (["Predicted from one launch per drafter (its chain setting with the most steps): accept length from "
             "the acceptance by position, E_k = 1 + sum_{i<=k} P(at least i drafts accepted); cycle t(k) = t_verify + "
             f"k * t_draft ({fits}). With one launch per drafter, t_verify is plain decoding's step and the slope "
             "comes from the cycle at K; where the sweep measured more chain lengths, the line goes through all "
             "of them. Measured columns where that k was run."
             + ("" if all(len(p.get("fit_points") or ()) > 1 for p in preds.values()) else
                " A one-launch line puts what every cycle costs beyond a plain step, whatever k, into the "
                "slope, so it over-predicts short chains where that cost dominates (on an H200's CUDA graphs, "
                "+23% tok/s at k = 1, +12% at k = 2; benchmarks/RESULTS.md): measure a recommended k below the "
                "one launched (add it to `speculative`) before deploying it."), ""]
            + _table(["variant", "k (draft steps)", "accept length (predicted)", "tok/s (predicted)",
                      "speedup (predicted)", "accept length (measured)", "tok/s (measured)"], body))


def acceptance_by_position(rows: list[dict[str, Any]], bench: Bench, client: str) -> dict[str, list[float]]:
    """Serving acceptance by draft position per drafter, at its chain setting with the most steps."""
    out: dict[str, list[float]] = {}
    for (v, spec, c), res in bench.items():
        rates = (res.get("summary") or {}).get("accepted_per_position_rate")
        if c == client and v != "baseline" and rates and len(rates) > len(out.get(v, [])):
            out[v] = [float(x) for x in rates]
    return dict(sorted(out.items()))


def landing_table(rows: list[dict[str, Any]], bench: Bench, client: str) -> list[str]:
    """The landing page's table: what the decision uses, narrow enough for the column Snakemake's report
    gives the workflow description beside its DAG (about 450 px at a 1400 px window)."""
    paired = {(a["row"]["variant"], a["row"]["spec_id"]): a["paired"]
              for a in arm_table(rows, client, for_client(bench, client))}
    body = []
    for r in rows:
        if r["client"] != client:
            continue
        p = paired.get((r["variant"], r["spec_id"])) or {}
        if r["variant"] == "baseline":
            speed = "1 (reference)"
        elif p.get("paired"):
            speed = f"{p['speedup']:.2f}x {_ci(p.get('ci95'))}"
        else:
            speed = "–"
        status = "" if r["status"] == "ok" else " (skipped)"
        body.append([r["variant"] + status, r["spec_id"], speed, _fmt(r["tps_median"], "{:.1f}"),
                     _fmt(r["accept_length"])])
    return _table(["variant", "spec", "paired speedup [95% CI]", "tok/s", "accept"], body)


def goal_cell(goal: dict[str, Any], measured: float | None) -> str:
    """A requirement and whether it was *measured* as met (never assumed from the accept length)."""
    need = float(goal["required_accept_length"])
    ran = "no tok/s measured" if measured is None else (
        f"{'met' if measured >= goal['target_tps'] else 'not met'}: {measured:.1f} tok/s measured")
    if need < 1.0:
        return f"reached without speculation (needs {need:.2f} < 1); {ran}"
    return f"{need:.2f} ({ran})"


def breakeven_table(standing: Sequence[tuple[str, str, dict[str, Any]]]) -> list[str]:
    """The ``breakeven`` rule's standing files as one table (nothing recomputed here)."""
    if not standing:
        return ["(no break-even standing files)"]
    goals = sorted({float(t) for _, _, s in standing for t in s.get("target_tps", [])})
    body = []
    marked = False
    for spec, client, st in standing:
        for d in st.get("drafters", []):
            if d.get("skipped"):
                body.append([d["name"], spec, client, "–", "–", f"skipped: {d.get('reason')}"] + ["–"] * len(goals))
                continue
            by_t = {float(g["target_tps"]): g for g in d.get("goals", [])}
            cells = [goal_cell(by_t[t], d.get("measured_tps")) if t in by_t else "–" for t in goals]
            verdict = "above" if d["above_break_even"] else "below"
            mark = _cycle({"cycle_ms": d.get("cycle_ms"), "cycle_ms_source": d.get("cycle_ms_source")})[1]
            marked = marked or bool(mark)
            body.append([d["name"], spec, client, f"{d['accept_length']:.2f}",
                         f"{d['break_even_accept_length']:.2f}{mark}", verdict] + cells)
    return _table(["variant", "spec", "client", "accept length", "break-even accept length", "vs break-even"]
                  + [f"needed for {t:g} tok/s" for t in goals], body) + (["", E2E_NOTE] if marked else [])


def _count(v: Any) -> str:
    if isinstance(v, list):
        return str(len(v))
    return "–" if v is None else str(v)


def d2t_section(diff_path: str | os.PathLike | None, coverage_path: str | os.PathLike | None) -> list[str]:
    diff = _read_json(Path(diff_path)) if diff_path else None
    cov = _read_json(Path(coverage_path)) if coverage_path else None
    if not diff and not cov:
        return ["(no d2t analysis)"]
    lines = []
    if diff:
        lines += _table(["draft vocab", "draft ids mapped differently", "shared target ids", "only in drafter",
                         "only in data mapping"],
                        [[_count(diff.get("draft_vocab_size")), _count(diff.get("differing")),
                          _count(diff.get("shared_target_ids")), _count(diff.get("only_in_a")),
                          _count(diff.get("only_in_b"))]])
    if cov and cov.get("coverage") is not None:
        lines += ["", f"Coverage of the fine-tune tokens by the transferred drafter's vocabulary: "
                      f"{float(cov['coverage']):.1%} (an upper bound on acceptance)."]
    return lines


def doctor_section(paths: Sequence[str | os.PathLike]) -> list[str]:
    """Findings of each given doctor report (``static/doctor-<variant>.json``), in the order given."""
    body = []
    for path in map(Path, paths):
        rep = _read_json(path) or {}
        name = path.stem.removeprefix("doctor-")
        if rep.get("skipped"):
            body.append([name, "–", "–", f"skipped: {rep.get('reason')}"])
            continue
        for f in rep.get("findings", []) or [{"code": "ok", "severity": "–", "message": "no findings"}]:
            body.append([name, f.get("severity", ""), f.get("code", ""), str(f.get("message", ""))])
    return _table(["drafter", "severity", "code", "message"], body) if body else ["(no doctor reports)"]


def data_section(stats_path: str | os.PathLike | None) -> list[str]:
    """Where the fine-tune data came from: the target's own answers (generate_data's stats) or a file."""
    if not stats_path:
        return ["The fine-tune data is a file the experiment names (`data.path`); nothing was generated."]
    st = _read_json(Path(stats_path))
    if not st:
        return [f"(no generation stats at {stats_path})"]
    server = st.get("server") or {}
    via = (f"through its {esc(server.get('backend'))} server ({esc(st.get('concurrency'))} requests in flight)"
           if server else f"with {esc(st.get('engine'))} in the job's process")
    lines = [f"- {_count(st.get('answers'))} of {_count(st.get('prompts'))} prompts answered by the target {via}, "
             f"{esc(st.get('mode'))}, at most {esc(st.get('max_new_tokens'))} new tokens: {_count(st.get('generated_tokens'))} "
             f"answer tokens ({_count(st.get('empty'))} blank answers)"]
    if st.get("turns") and (st.get("answered_turns") or 0) > (st.get("answered_now") or 0):
        how = ("every user turn answered by the target, in order" if st["turns"] == "all"
               else "the last turn answered, after the data's own earlier answers")
        lines.append(f"- multi-turn prompts: {how} ({_count(st['answered_turns'])} answers for "
                     f"{_count(st.get('answered_now'))} prompts in this run)")
    if st.get("tokens_per_s"):
        lines.append(f"- {st['tokens_per_s']:,.0f} tok/s and {st.get('prompts_per_s')} prompts/s over "
                     f"{st.get('answering_seconds')} s of answering ({st.get('seconds')} s for the job)")
    if st.get("resumed_answers"):
        lines.append(f"- {_count(st['resumed_answers'])} answers were kept from earlier, interrupted runs")
    if st.get("failed"):
        ids = ", ".join(esc(f.get("id"), 40) for f in st.get("failures", [])[:10])
        lines.append(f"- {_count(st['failed'])} prompts failed after retries and are not in the data (ids {ids}"
                     f"{', ...' if st['failed'] > 10 else ''})")
    if st.get("skipped_long"):
        lines.append(f"- {_count(st['skipped_long'])} prompts longer than {st.get('max_prompt_chars')} characters "
                     "were skipped")
    if server.get("fingerprint"):
        lines.append(f"- server fingerprint {code(server['fingerprint'])}")
    return lines


def write_report(exp_dir: str | os.PathLike, out_dir: str | os.PathLike, records_csv: str | os.PathLike,
                 target_tps: Sequence[float] = (), standing: Sequence[str | os.PathLike] = (),
                 static_md: Sequence[str | os.PathLike] = (), *, gate: str | os.PathLike | None = None,
                 doctor: Sequence[str | os.PathLike] | None = None, train: Sequence[str | os.PathLike] | None = None,
                 d2t_diff: str | os.PathLike | None = None,
                 d2t_coverage: str | os.PathLike | None = None,
                 data_stats: str | os.PathLike | None = None,
                 bench: Sequence[str | os.PathLike] | None = None,
                 plans: Sequence[str | os.PathLike] | None = None,
                 leak_check: str | os.PathLike | None = None,
                 launches: Sequence[str | os.PathLike] | None = None) -> dict[str, str]:
    """Write ``summary.md``, ``recommendation.json``, the three plots and the HTML views under ``out_dir``.

    HTML views (for ``snakemake --report``, see draftlab.experiment.report_html): ``summary.html`` (plots
    embedded), ``decision-fragment.html`` (recommendation, decision + comparison table, a fragment captions
    include), ``records.html``, ``static.html`` (the ``static_md`` summaries of inspect, compare, patch,
    doctor and d2t).

    ``standing`` are the ``breakeven`` rule's JSON files; ``target_tps`` is kept for the command
    line's sake (the goals shown are the ones the standing files were computed for). ``gate``,
    ``doctor`` (one JSON per drafter), ``train`` (one folder per arm), ``d2t_diff``, ``d2t_coverage``,
    ``bench`` (the bench results with per-request rows: paired speedups, chain predictions) and
    ``plans`` (the servers' plans: the recommendation's launch command, the baseline's for a plain verdict)
    and ``leak_check`` (rule leak_check's record) are the files the rule declares; left out, they are those of
    the variants in ``records_csv`` (:func:`report_inputs`). ``launches``: the arms launches' ``launch.json``,
    whose ``launch_check`` sets the launch noise comparisons across launches carry (left out: unmeasured).
    ``data_stats`` is generate_data's stats JSON (None: the experiment brought its own data).
    """
    exp_dir, out_dir = Path(exp_dir), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = load_rows(records_csv)
    files = input_files(exp_dir, rows, gate=gate, doctor=doctor, train=train, d2t_diff=d2t_diff,
                        d2t_coverage=d2t_coverage, bench=bench, plans=plans, leak_check=leak_check)
    results = load_bench(files["bench"])
    server_plans = load_plans(files["plans"])
    gate = _read_json(Path(files["gate"]))
    client = rows[0]["client"] if rows else None
    decided, launch = load_launch_noise(launches, results, client)
    decision, rec_path, deploy = _write_recommendation(out_dir, rows, results, client, server_plans, launch, decided)
    _record_launch_noise(exp_dir, launches, launch, decision)
    paths, standing_rows, curves = _write_plots(out_dir, rows, results, client, files["train"], standing)
    experiment = rows[0]["experiment"] if rows else exp_dir.name
    decision_lines = decision_text(rows, gate, results, decision) if rows else decision_text(rows, gate)
    md = (_results_markdown(experiment, deploy + decision_lines, rows, results, decision, client, standing_rows, curves)
          + _inputs_markdown(files, data_stats, gate))
    write_text(summary := out_dir / REPORT_FILES["summary"], "\n".join(md) + "\n")
    views = write_views(out_dir, experiment, md, paths, deploy + decision_lines[:1],
                        landing_table(rows, results, client) if rows else [], records_csv, static_md)
    return {"summary": str(summary), "recommendation": str(rec_path),
            **{k: str(v) for k, v in paths.items()}, **views}


def _record_launch_noise(exp_dir: Path, launches: Sequence[str | os.PathLike] | None, launch, decision) -> None:
    """This run's launch noise, kept for the next plan's power line (power.prior, this host only)."""
    if launches:
        summaries = [s for s in (_read_json(Path(p)) for p in launches) if isinstance(s, dict)]
        power.record(exp_dir, launch, power.interval_se(decision.get("paired")), power.summaries_key(summaries),
                     power.launch_host(summaries))


def load_launch_noise(paths: Sequence[str | os.PathLike] | None, results: Bench | None = None,
                      client: str | None = None) -> tuple[dict[tuple[str, str], Any] | None, dict[str, Any]]:
    """The decision's results on ``client`` (replicated launches merged: draftlab.benchmark.replicated; None
    without results) and the run's launch noise, from the arms launches' and replicates' summaries handed."""
    bench = for_client(results, client) if results is not None and client else {}
    if paths is None:
        return (bench or None), {"measured": False, "noise": None, "check": None, "checks": [],
                                 "reason": "no launch summary was handed to the report (`--launches`)"}
    summaries = [s for s in map(lambda p: _read_json(Path(p)), paths) if isinstance(s, dict)]
    decided, launch = replicated.assemble(bench, summaries, client, lambda p: _read_json(Path(p)))
    return (decided or None), launch


def _write_recommendation(out_dir: Path, rows: list[dict[str, Any]], results: Bench, client: str | None,
                          server_plans: dict[tuple[str, str], dict[str, Any]],
                          launch: dict[str, Any] | None = None,
                          decided: dict[tuple[str, str], Any] | None = None) -> tuple[dict[str, Any], Path, list[str]]:
    """Decide (draftlab.benchmark.verdict) and write ``recommendation.json``, what to launch on that decision
    (``decided``: the results it pairs, replicated launches merged; default the client's results); returns the
    decision, the file and the recommendation in words."""
    decision = (decide(rows, client, decided if decided is not None else for_client(results, client), launch) if rows
                else {"lines": [], "verdict": "none", "launch": launch})
    win = decision.get("winner")
    rec = recommend.recommendation(decision, baseline_row(rows, client) if rows else None,
                                   server_plans.get((win["variant"], win["spec_id"])) if win else None,
                                   plans=server_plans)
    rec_path = out_dir / REPORT_FILES["recommendation"]
    write_text(rec_path, to_json(rec, str(rec_path)))
    return decision, rec_path, recommend.markdown(rec)


def _write_plots(out_dir: Path, rows: list[dict[str, Any]], results: Bench, client: str | None,
                 train: Sequence[str | os.PathLike], standing: Sequence[str | os.PathLike]):
    """The three plots (accept length, throughput, TTT accuracy); returns their paths and the standing rows
    and TTT curves the summary's tables show beside them."""
    curves = ttt_curves(train)
    paths = {k: out_dir / REPORT_FILES[k] for k in PLOTS}
    standing_rows = load_standing(standing)
    plot_accept(rows, paths["accept"], standing_rows)
    plot_tps(rows, paths["tps"])
    plot_ttt(curves, paths["ttt"], acceptance_by_position(rows, results, client) if rows else {})
    return paths, standing_rows, curves


def _results_markdown(experiment: str, decision_lines: list[str], rows: list[dict[str, Any]], results: Bench,
                      decision: dict[str, Any], client: str | None, standing_rows, curves) -> list[str]:
    """The summary's first half, what the run measured: the decision, the tables, each client's paired
    results and the plots."""
    md = [f"# draftlab report: {esc(experiment)}", ""]
    md += ["## Decision", ""] + [p for line in decision_lines for p in (line, "")]
    md += ["## Comparison", ""] + comparison_table(rows) + [""]
    md += ["## Latency as users measure it (streamed)", ""] + latency_table(rows) + [""]
    if client is not None:
        md += client_sections(rows, results, decision, client)
    return md + plot_sections(standing_rows, curves)


def _inputs_markdown(files: dict[str, Any], data_stats: str | os.PathLike | None,
                     gate: dict[str, Any] | None) -> list[str]:
    """The summary's second half, what went into the drafters: the fine-tune data, the leak check, the
    d2t mapping, the doctor's findings and the probe gate."""
    md = ["## Fine-tune data", ""] + data_section(data_stats)
    md += leak_markdown(_read_json(Path(files["leak_check"]))) + [""]
    md += ["## d2t: transferred mapping vs the fine-tune data's", ""]
    md += d2t_section(files["d2t_diff"], files["d2t_coverage"]) + [""]
    md += ["## Doctor findings", ""] + doctor_section(files["doctor"]) + [""]
    return md + ["## Probe gate", ""] + gate_section(gate)


def client_sections(rows: list[dict[str, Any]], results: Bench, decision: dict[str, Any], client: str) -> list[str]:
    """The sections of one client's per-request results: paired speedups, stability, categories, chains."""
    md = [f"## Paired speedup against plain decoding (client `{client}`)", ""] + paired_section(rows, results, client)
    md += ["", "### Host stability (repeats of one server)", ""] + stability_section(results, client) + [""]
    md += ["## Results per category", ""] + category_section(decision, client) + [""]
    md += ["## Every shorter chain, predicted from one launch", ""]
    return md + chain_section(chain_predictions(rows, results, client), rows, client) + [""]


def plot_sections(standing_rows, curves: dict[str, list[float]]) -> list[str]:
    """The sections around the three plots: accept length, throughput and break-even, TTT accuracy."""
    md = ["## Accept length by variant", "", f"![accept length]({REPORT_FILES['accept']})", ""]
    md += ["## Throughput against baseline and break-even", "",
           "Break-even accept length = baseline tok/s x cycle ms / 1000 (the drafter's own measured cycle).", ""]
    md += breakeven_table(standing_rows) + ["", f"![throughput]({REPORT_FILES['tps']})", ""]
    md += ["## TTT per-step validation accuracy and serving acceptance by position", ""]
    if curves:
        k = max(len(a) for a in curves.values())
        md += _table(["drafter"] + [f"step {i}" for i in range(k)],
                     [[n] + [f"{a[i]:.3f}" if i < len(a) else "–" for i in range(k)] for n, a in curves.items()])
    else:
        md += ["No trained drafter (fine-tuning skipped or not configured)."]
    return md + ["", f"![TTT accuracy]({REPORT_FILES['ttt']})", ""]


def gate_section(gate: dict[str, Any] | None) -> list[str]:
    """The probe gate's decision and why: the report's word on whether the arms were trained."""
    if not gate:
        return ["(no gate decision)"]
    return [f"- decision: **{esc(gate.get('decision'))}** (min accept length {esc(gate.get('min_accept_length'))}, "
            f"best probe {_fmt(gate.get('best_accept_length'), '{:.3f}')})", f"- {esc(gate.get('reason'), 500)}"]


def write_views(out_dir: Path, experiment: str, md: list[str], plots: dict[str, Path], decision: list[str],
                landing: list[str], records_csv, static_md) -> dict[str, str]:
    """The HTML views ``snakemake --report`` shows (draftlab.experiment.report_html), named by Layout."""
    def out(key: str) -> Path:
        return out_dir / REPORT_FILES[key]

    return {
        "summary_html": html_view.write_page(out("summary_html"), f"draftlab report: {experiment}",
                                             html_view.markdown_to_html(
                                                 "\n".join(md), out_dir, {REPORT_FILES[k]: p for k, p in plots.items()})),
        "decision_fragment": _write(out("decision_fragment"), html_view.decision_fragment(decision, landing)),
        "records_html": html_view.write_page(out("records_html"), "records",
                                             html_view.records_html(records_csv, RECORD_VIEW_COLUMNS)),
        "static_html": html_view.write_page(out("static_html"), "static analysis", html_view.static_html(static_md)),
    }


def _write(path: Path, text: str) -> str:
    write_text(path, text)
    return str(path)


RECORD_VIEW_COLUMNS = ("variant", "spec_id", "client", "status", "accept_length", "tps_median", "tps_ci_low",
                       "tps_ci_high", "speedup", "cycle_ms", "val_acc_mean", "ttft_s", *LATENCY_COLUMNS, "ttft_note",
                       "repeats",
                       "max_new_tokens", "drafter_source", "drafter_commit", "config_hash", "train_data_sha256",
                       "train_settings_sha256", "created_at")
