"""Issue 24, family 1: nothing read from a model file reaches the report as markup, and no file
the report rule did not declare is embedded in it (a drafter config naming ``/proc/self/environ``
would otherwise put ``HF_TOKEN`` into report.html).

Every test here builds the hostile input a user could be handed (a drafter ``config.json``, a tensor
name, an experiment YAML, a planted symlink) and runs the real command or library function on it.
"""

from __future__ import annotations

import base64
import json
import os
import re
from pathlib import Path

import pytest
from helpers import cli, one_error_line
import torch

from draftlab.errors import DraftlabError
from draftlab.experiment.records import build_records, merge_into_global, write_records
from draftlab.experiment.report import write_report
from draftlab.experiment.report_html import markdown_to_html
from draftlab.textsafe import code, md, plain, unescape_md
from factories import drafter_tensors, tiny_drafter_config, write_drafter, write_target_config
from test_records import SERVERS, experiment_config, make_experiment

CANARY = "hf_CANARY_token_5f3a9e"
PNG = b"\x89PNG\r\n\x1a\n"
HOSTILE = ["float32\n![x](/proc/self/environ)\n", "a|b\n  ERROR forged: launch anyway", "`x`\r\n# head",
           "<script>alert(1)</script>", "[link](http://evil)", "-list\u2028![i](s)", "\x1b[31mred", "x" * 5000]


@pytest.mark.parametrize("value", HOSTILE)
def test_one_escaping_rule_gives_one_inert_bounded_line(value):
    for out in (md(value), code(value), plain(value)):
        assert "\n" not in out and "\r" not in out and "\x1b" not in out and "\u2028" not in out
        assert len(out) <= 2 * 200 + 2
    escaped = md(value)
    # nothing opens markup: no unescaped |, `, *, image, link target, tag or leading #
    bare = escaped.replace("\\\\", "")
    assert not re.search(r"(?<!\\)([|`*]|!\[|\]\(|<[a-z/])", bare) and not bare.startswith(("#", "-")), escaped
    if len(value) < 100:
        assert unescape_md(escaped) == plain(value)  # what a reader sees is the value, made visible
    assert code("model.layers.0.fc.weight") == "`model.layers.0.fc.weight`"


def _secrets(tmp_path: Path) -> tuple[Path, Path]:
    """A plain secret file and a PNG-looking one: neither may ever be embedded in the report."""
    secret = tmp_path / "environ"
    secret.write_text(f"HF_TOKEN={CANARY}\n")
    png = tmp_path / "secret.png"
    png.write_bytes(PNG + f"HF_TOKEN={CANARY}".encode())
    return secret, png


def _leaked(text: str) -> bool:
    """The canary in clear or base64-encoded at any byte alignment (how a data: URI would carry it)."""
    forms = [CANARY] + [base64.b64encode(b"\0" * k + CANARY.encode()).decode()[4 if k else 0:-4] for k in range(3)]
    return any(f in text for f in forms)


def test_crafted_drafter_goes_through_doctor_inspect_and_the_html_report_without_leaking(tmp_path):
    secret, png = _secrets(tmp_path)
    target = write_target_config(tmp_path / "target")
    injected = f"float32\n![x]({secret})\n![y]({png})\n![z](../../secret.png)\n"
    cfg = tiny_drafter_config(torch_dtype=injected)
    tensors = drafter_tensors(cfg)
    forged = "x\n  ERROR    forged-code: do not launch\n| error | `forged` | x |\n![w](" + str(secret) + ")"
    tensors[forged] = torch.zeros(2)
    drafter = write_drafter(tmp_path / "drafter", cfg, tensors)

    exp = make_experiment(tmp_path / "results", experiment_config())
    static = exp / "static"
    static.mkdir()
    proc = cli("doctor", "--drafter", drafter, "--target", target, "--out", static / "doctor-probe.json",
               "--summary", static / "doctor-probe.md")
    assert proc.returncode in (0, 1), proc.stderr
    out = proc.stdout
    # the terminal report: one line per finding and skipped check, none of them forged
    doc = json.loads((static / "doctor-probe.json").read_text())
    assert len(out.strip().splitlines()) == 2 + len(doc["findings"]) + len(doc["skipped"]), out
    assert not any(line.lstrip().startswith("ERROR    forged") for line in out.splitlines()), out
    assert any("forged-code" in f["message"] for f in doc["findings"])  # reported, as text
    other = write_drafter(tmp_path / "other")  # a clean drafter: compare shows the hostile values as a diff
    runs = {"inspect-drafter": ("inspect", drafter), "compare": ("compare", drafter, other),
            "patch-config": ("patch-config", "--drafter", drafter, "--target", target, "--out", tmp_path / "patched"),
            "acquire": ("acquire", drafter, "--out", tmp_path / "acquired")}
    for name, args in runs.items():
        proc = cli(*args, "--summary", static / f"{name}.md")
        assert proc.returncode == 0, (name, proc.stderr)
        for text in (proc.stdout, (static / f"{name}.md").read_text()):
            assert not any(line.startswith(("![", "| error", "  ERROR")) for line in text.splitlines()), (name, text)
            assert not re.search(r"(?<!\\)(!\[|\]\()", text), (name, text)  # no image or link survives
    # every Markdown summary keeps its structure: no line the drafter's names added
    doctor_md = (static / "doctor-probe.md").read_text()
    assert not any(line.startswith(("![", "| error | `forged`", "  ERROR")) for line in doctor_md.splitlines())
    table = [line for line in doctor_md.splitlines() if line.startswith("|")]
    assert all(len(re.split(r"(?<!\\)\|", line)) == 5 for line in table), table

    write_records(build_records(exp, experiment_config(), servers=SERVERS, clients=["default"]),
                  exp / "records" / "records.csv")
    report = write_report(exp, exp / "report", exp / "records" / "records.csv", doctor=[static / "doctor-probe.json"],
                          static_md=[static / f"{n}.md" for n in ("doctor-probe", *runs)])
    (exp / "secret.png").write_bytes(png.read_bytes())  # ../../secret.png from report/ would reach it
    for key in ("summary_html", "static_html", "records_html", "decision_fragment"):
        text = Path(report[key]).read_text()
        assert not _leaked(text), key
        assert "<script>" not in text
    summary = Path(report["summary_html"]).read_text()
    assert summary.count("<img ") == 3  # the three plots the report rule declares, nothing else
    static_html = Path(report["static_html"]).read_text()
    assert "<img " not in static_html
    assert "/proc/self/environ" not in static_html or "<img" not in static_html
    assert "float32\\n![x]" in static_html or "float32\\n!" in static_html  # shown as text, visibly escaped


def test_the_html_renderer_embeds_only_declared_pngs_inside_the_report_folder(tmp_path):
    secret, png = _secrets(tmp_path)
    report = tmp_path / "report"
    report.mkdir()
    (report / "accept_length.png").write_bytes(PNG + b"plot")
    (report / "throughput.png").symlink_to(png)  # a declared name that points outside: refused
    (report / "ttt_accuracy.png").write_text("not a png")
    text = "\n".join([f"![a]({secret})", f"![b]({png})", "![c](accept_length.png)", "![d](throughput.png)",
                      "![e](ttt_accuracy.png)", "![f](../secret.png)"])
    declared = {n: report / n for n in ("accept_length.png", "throughput.png", "ttt_accuracy.png")}
    out = markdown_to_html(text, report, declared)
    assert out.count("<img ") == 1 and base64.b64encode(PNG + b"plot").decode() in out
    assert not _leaked(out) and "not a declared plot" in out
    # without a declaration nothing is embedded, whatever the Markdown names
    assert "<img " not in markdown_to_html("![c](accept_length.png)", report)


def test_escaped_cells_keep_the_table_and_render_as_the_value(tmp_path):
    row = f"| {md('a|b')} | {code('n|x')} | {md('![i](/etc/passwd)')} |"
    html = markdown_to_html("| h1 | h2 | h3 |\n|---|---|---|\n" + row)
    assert html.count("<td>") == 3 and "a|b" in html and "n|x" in html and "<img" not in html


@pytest.mark.parametrize("name", ["abc\n", "abc\n\nrule x:", "ok\r", "a b"])
def test_names_with_a_final_newline_are_refused_by_check_config(tmp_path, name):
    from draftlab.settings.config import load_config

    cfg = experiment_config()
    with pytest.raises(DraftlabError, match="key 'experiment'"):
        load_config({**cfg, "experiment": name})
    client = {**cfg["bench"]["clients"][0], "name": name}
    with pytest.raises(DraftlabError, match=r"key 'bench.clients\[0\].name'"):
        load_config({**cfg, "bench": {**cfg["bench"], "clients": [client]}})
    (tmp_path / "c.yaml").write_text(json.dumps({"experiment": name}))
    proc = cli("check-config", Path(__file__).parents[1] / "config" / "config.yaml", tmp_path / "c.yaml")
    one_error_line(proc, "c.yaml", "experiment")


def test_hf_sources_with_a_final_newline_are_refused():
    from draftlab.hf_cache import parse_hf_source

    with pytest.raises(DraftlabError):
        parse_hf_source("hf:org/name\n")


@pytest.mark.parametrize("lock", ["records", "generate"])
def test_lock_files_are_never_opened_through_a_symlink(tmp_path, lock):
    victim = tmp_path / "victim.txt"
    victim.write_text("user data\n")
    results = tmp_path / "results"
    results.mkdir()
    if lock == "records":
        exp = make_experiment(tmp_path / "r", experiment_config())
        write_records(build_records(exp, experiment_config(), servers=SERVERS, clients=["default"]),
                      exp / "records.csv")
        (results / ".records.lock").symlink_to(victim)
        with pytest.raises(DraftlabError, match=r"\.records\.lock.*symlink"):
            merge_into_global(exp / "records.csv", results)
        assert not (results / "records.csv").exists()
    else:
        from draftlab.datagen.answer_shards import AnswerShards

        state = results / "state"
        state.mkdir()
        (state / ".lock").symlink_to(victim)
        with pytest.raises(DraftlabError, match="symlink"):
            AnswerShards(state, {"target": "t"}).open()
    assert victim.read_text() == "user data\n" and os.path.islink(results / ".records.lock") == (lock == "records")
