"""No config value runs as a shell command (issue 36, family 1).

Every value a rule splices into its ``shell:`` line is quoted (``{x:q}``) or built with ``shlex``.
The tests give the real Snakefile hostile values (a space, both quotes, ``$(...)``, backticks, ``;``,
a line break where a value may hold one) in every config key that reaches a shell line, then:

- print every rule's shell line with ``snakemake -n -p`` (past the probe gate, so the training, records
  and report rules are planned too) and run each line in bash with a recording ``draftlab`` first on
  PATH: the sentinel file the values would create never appears, and each value reaches the command as
  one argument, unchanged;
- run the first jobs for real (demo build, target, data generation through the builtin server,
  tokenize; and acquire and tokenize of local folders and a data file with hostile names): the
  sentinel never appears and the jobs read the right files.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from gate_seed import SEEDED_DRY_RUN, seed_past_gate
from helpers import REPO_ROOT, snakemake

RULES = REPO_ROOT / "workflow" / "rules"
# params that are shell text already (built with shlex.quote / shlex.join in common.smk, jobs.py and the
# rule files), spliced as they are; every other field of a shell line must carry `:q`
SHELL_TEXT_PARAMS = {"params.source", "params.args", "params.command", "params.capture", "params.drafters",
                     "params.target_tps", "params.inputs", "params.note"}  # note: comment lines (jobs._comment_lines)


def _sentinel(tmp_path: Path) -> Path:
    return tmp_path / f"PWNED_{uuid.uuid4().hex}"


def _hostile(name: str, sentinel: Path) -> str:
    """A name that runs ``touch sentinel`` three ways when a shell line splices it unquoted."""
    return f"{name} x'y\"$(touch {sentinel})`touch {sentinel}`;touch {sentinel};"


def _shell_rules() -> dict[str, str]:
    """Every rule of workflow/rules with a ``shell:`` line, and the text of its shell section."""
    out = {}
    for path in sorted(RULES.glob("*.smk")):
        # the launch rules are generated per launch (`rule:` with `name: _launch.rule_name`): serve_launch here
        text = re.sub(r"^( *)rule:\s*\n\s*name:\s*\n\s*_launch\.rule_name\s*$", r"\1rule serve_launch:",
                      path.read_text(), flags=re.M)
        blocks = re.split(r"^\s*(?:rule|checkpoint) (\w+):\s*$", text, flags=re.M)
        for name, body in zip(blocks[1::2], blocks[2::2]):
            if re.search(r"^\s+shell:", body, re.M):
                out[name] = body[re.search(r"^\s+shell:", body, re.M).end():]
    return out


def test_every_field_of_every_shell_line_is_quoted_or_built_by_shlex():
    rules = _shell_rules()
    assert {"tokenize", "demo_models", "serve_launch", "train", "report"} <= set(rules), sorted(rules)
    bare = []
    for rule, text in rules.items():
        for field in re.findall(r"(?<!\{)\{([^{}]+)\}(?!\})", text):
            name, _, spec = field.partition(":")
            if spec.endswith("q") or name in SHELL_TEXT_PARAMS or name == "threads":
                continue
            bare.append(f"{rule}: {{{field}}}")
    assert not bare, f"shell fields spliced unquoted: {bare}"


# --- every rule's shell line, printed by Snakemake and run by bash with a recording draftlab ----------

STUB = """#!{python}
import json, os, sys
with open(os.environ["ARGV_LOG"], "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
if "--json" in sys.argv:
    print("{{}}")
"""


CHECKPOINT_NOTE = "DAG of jobs will be updated after completion."  # -n -p prints it after a checkpoint's line


def _jobs(text: str) -> list[dict]:
    """(rule, outputs, logs, shell command) of every job a ``-n -p`` run printed."""
    jobs = []
    for block in re.split(r"^\[\w{3} \w{3} .*\]$", text, flags=re.M)[1:]:
        rule = re.search(r"^\s*(?:localrule|rule|localcheckpoint|checkpoint) (\w+):", block, re.M)
        cmd = block.split("Shell command: ", 1)
        if not rule or len(cmd) < 2 or cmd[1].startswith("None"):
            continue
        files = []
        for key in ("output", "log"):
            m = re.search(rf"^\s+{key}: (.+)$", block, re.M)
            files += [f.strip() for f in m.group(1).split(", ")] if m else []
        text = cmd[1].split("\n\n", 1)[0].rstrip("\n").removesuffix("\n" + CHECKPOINT_NOTE)
        jobs.append({"rule": rule.group(1), "files": files, "cmd": text})
    return jobs


def _dry_runs(workdir: Path, override: Path) -> list[dict]:
    """The jobs of a fresh folder's dry run, then (past a passed probe gate) of the rest of the DAG."""
    configs = (REPO_ROOT / "config" / "config.yaml", override)
    first = snakemake(workdir, "-n", "-p", "-c2", snakefile=REPO_ROOT / "Snakefile", configfiles=configs)
    seed_past_gate(workdir, first.stdout, passed=True)
    second = snakemake(workdir, "-n", "-p", "-c2", *SEEDED_DRY_RUN, snakefile=REPO_ROOT / "Snakefile",
                       configfiles=configs)
    return _jobs(first.stdout) + _jobs(second.stdout)


def _run_lines(workdir: Path, jobs: list[dict], tmp_path: Path) -> list[list[str]]:
    """Run every job's shell line in bash, ``draftlab`` a recorder; returns the argv each call got."""
    stub_dir = tmp_path / "stub-bin"
    stub_dir.mkdir(exist_ok=True)
    stub = stub_dir / "draftlab"
    stub.write_text(STUB.format(python=sys.executable))
    stub.chmod(stub.stat().st_mode | stat.S_IXUSR)
    for tool in ("torchrun", "specforge"):  # a SpecForge arm's capture launcher and trainer, recorded by name
        other = stub_dir / tool
        other.write_text(STUB.format(python=sys.executable).replace("sys.argv[1:]", f"[{tool!r}] + sys.argv[1:]"))
        other.chmod(other.stat().st_mode | stat.S_IXUSR)
    log = tmp_path / "argv.jsonl"
    env = {**os.environ, "PATH": f"{stub_dir}{os.pathsep}{os.environ['PATH']}", "ARGV_LOG": str(log)}
    for job in jobs:
        for name in job["files"]:
            (workdir / name).parent.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(["bash", "-c", "set -euo pipefail; " + job["cmd"]], cwd=workdir, env=env,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, (job["rule"], job["cmd"], proc.stderr[-2000:])
    return [json.loads(line) for line in log.read_text().splitlines()]


def _after(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def _calls(argvs: list[list[str]], command: str) -> list[list[str]]:
    found = [a for a in argvs if a and a[0] == command]
    assert found, f"no `draftlab {command}` was run; ran: {sorted({a[0] for a in argvs if a})}"
    return found


@pytest.mark.slow  # four dry runs and ~40 bash lines: ~40 s on 2 shared cores
def test_every_rules_shell_line_passes_hostile_values_as_one_argument_and_runs_none(tmp_path):
    sentinel = _sentinel(tmp_path)
    demo_out = _hostile("demo", sentinel)
    prompts = _hostile("prompts", sentinel) + ".jsonl"
    data = _hostile("data", sentinel) + ".jsonl"
    target, drafter, reference = (_hostile(n, sentinel) for n in ("target", "drafter", "reference"))
    model_path = _hostile("model", sentinel)
    checkout = _hostile("specforge", sentinel)
    serve_arg = f"$(touch {sentinel})\nnext line;touch {sentinel}"  # a line break inside one argument
    train_arg = f"`touch {sentinel}`"
    kwargs_value = f"'; touch {sentinel}; echo '"
    common = (f"experiment: hostile\nsize: smoke\n"
              f"serve: {{extra_args: [--threads, '1', {json.dumps(serve_arg)}]}}\n"
              f"train: {{extra_args: [--log-every, {json.dumps(train_arg)}]}}\n")
    configs = {
        # the demo pair in a hostile folder, data generated from a hostile prompt file
        "generated": common + (f"demo: {{enabled: true, out: {json.dumps(demo_out)}}}\n"
                               f"data: {{prompts: {json.dumps(prompts)}, "
                               f"chat_template_kwargs: {{note: {json.dumps(kwargs_value)}}}}}\n"),
        # the same prompts answered by transformers in the job (rule generate_data: no plain launch answers them)
        "transformers": common + (f"demo: {{enabled: true, out: {json.dumps(demo_out)}}}\n"
                                  f"data: {{prompts: {json.dumps(prompts)}, engine: transformers, "
                                  f"chat_template_kwargs: {{note: {json.dumps(kwargs_value)}}}}}\n"),
        # a SpecForge arm captured on this host (rule capture) from a hostile checkout path
        "specforge": (f"experiment: hostile\nsize: smoke\n"
                      f"serve: {{extra_args: [--threads, '1', {json.dumps(serve_arg)}]}}\n"
                      f"train: {{extra_args: [--log-every, {json.dumps(train_arg)}], specforge: {{arms: [keep], "
                      f"capture: specforge, checkout: {json.dumps(checkout)}}}}}\n"
                      f"demo: {{enabled: true, out: {json.dumps(demo_out)}}}\n"),
        # local model folders, a model path, a reference and a data file with hostile names
        "local": common + (f"demo: {{enabled: false}}\ndata: {{path: {json.dumps(data)}}}\n"
                           f"target: {{source: {json.dumps(target)}, revision: null, "
                           f"model_path: {json.dumps(model_path)}}}\n"
                           f"drafter: {{source: {json.dumps(drafter)}, revision: null}}\n"
                           f"reference: {{source: {json.dumps(reference)}, revision: null}}\n"),
    }
    argvs, rules, plain_notes = [], set(), []
    for name, text in configs.items():
        workdir = tmp_path / name
        workdir.mkdir()
        (workdir / "override.yaml").write_text(text)
        jobs = _dry_runs(workdir, workdir / "override.yaml")
        rules |= {"serve_launch" if j["rule"].startswith("launch_") and j["rule"] != "launch_plan" else j["rule"]
                  for j in jobs}
        plain_notes += [j["cmd"] for j in jobs if j["rule"] == "launch_plain"]
        argvs += _run_lines(workdir, jobs, tmp_path)

    assert set(_shell_rules()) <= rules, f"rules whose shell line no job printed: {set(_shell_rules()) - rules}"
    assert not sentinel.exists(), "a config value ran as a shell command"
    # each value arrived as one argument, unchanged
    assert _after(_calls(argvs, "demo-models")[0], "--out") == f"{demo_out}/smoke"
    # the data is answered by the plain launch (serve-launch runs generate-data from its plan, an argv list,
    # no shell); the shell line only shows that command, on comment lines that never run
    generate = _calls(argvs, "generate-data")[0]
    assert _after(generate, "--prompts") == prompts
    assert json.loads(_after(generate, "--chat-template-kwargs")) == {"note": kwargs_value}
    launches = _calls(argvs, "serve-launch")
    assert all(serve_arg in a[a.index("--"):] for a in launches)
    note = next(c for c in plain_notes if "generate-data" in c)
    shown = [line for line in note.splitlines() if "generate-data" in line]
    assert len(shown) == 1 and shown[0].startswith("# ") and shlex.quote(prompts) in shown[0]
    assert all(train_arg in a for a in _calls(argvs, "train"))
    script = [x for a in argvs for x in a if x.endswith("prepare_hidden_states.py")]
    assert script and set(script) == {f"{checkout}/scripts/prepare_hidden_states.py"}  # the hostile checkout, one argument
    assert model_path in {a[1] for a in _calls(argvs, "resolve-target")}
    assert {a[1] for a in _calls(argvs, "acquire")} >= {drafter, reference}
    assert data in {_after(a, "--data") for a in _calls(argvs, "tokenize")}


@pytest.mark.parametrize("key, text", [
    ("data.path", "data: {path: \"a\\nb.jsonl\"}"),
    ("demo.out", "demo: {out: \"resources/demo\\n; touch x\"}"),
    ("bench.clients[0].prompts", "bench: {clients: [{name: a, prompts: \"p\\tq.jsonl\"}]}"),
    ("target.revision", "target: {revision: \"main\\nx\"}"),
])
def test_check_config_refuses_a_line_break_in_a_path_in_one_line(tmp_path, key, text):
    from helpers import one_error_line

    override = tmp_path / "override.yaml"
    override.write_text(f"experiment: x\n{text}\n")
    proc = subprocess.run([sys.executable, "-m", "draftlab.cli", "check-config",
                           str(REPO_ROOT / "config" / "config.yaml"), str(override)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    one_error_line(proc, str(override), repr(key), "control character")


# --- the jobs themselves, run for real on hostile names ---------------------------------------------


def _copy_demo(smoke_demo: dict, workdir: Path, demo_dir: str) -> None:
    """The shared smoke build copied to ``workdir/demo_dir``, its manifest naming the copy as the rule
    names it (so the real ``draftlab demo-models`` the rule runs reuses it instead of training again)."""
    shutil.copytree(smoke_demo["dir"], workdir / demo_dir, symlinks=True)
    (workdir / demo_dir / "demo.json").unlink()
    manifest = workdir / demo_dir / "manifest.json"
    text = json.loads(manifest.read_text())
    text["result"] = {k: v.replace(str(smoke_demo["dir"]), str(workdir / demo_dir)) if isinstance(v, str) else v
                      for k, v in text["result"].items()}
    manifest.write_text(json.dumps(text))


@pytest.mark.slow  # a real run to tokenize: demo reuse, a builtin server answering 2 prompts (~60 s)
def test_demo_build_data_generation_and_tokenize_run_on_hostile_names(smoke_demo, tmp_path):
    sentinel = _sentinel(tmp_path)
    workdir = tmp_path / "run"
    workdir.mkdir()
    demo_out = _hostile("demo", sentinel)
    _copy_demo(smoke_demo, workdir, f"{demo_out}/smoke")
    prompts = workdir / (_hostile("prompts", sentinel) + ".jsonl")  # its `/`s make folders too
    prompts.parent.mkdir(parents=True)
    prompts.write_text("".join(json.dumps({"text": f"Tell me about the number {i}."}) + "\n" for i in range(2)))
    (workdir / "override.yaml").write_text(
        f"experiment: hostile\nsize: smoke\ndemo: {{enabled: true, out: {json.dumps(demo_out)}}}\n"
        f"data: {{prompts: {json.dumps(str(prompts.relative_to(workdir)))}, limit: 2, max_new_tokens: 4}}\n")
    snakemake(workdir, "-c2", "--until", "tokenize", snakefile=REPO_ROOT / "Snakefile", timeout=600,
              configfiles=(REPO_ROOT / "config" / "config.yaml", workdir / "override.yaml"))

    assert not sentinel.exists(), "a config value ran as a shell command"
    assert json.loads((workdir / demo_out / "smoke" / "demo.json").read_text())["reused"] is True
    data = workdir / "results" / "hostile-smoke" / "data"
    generated = (data / "generated.jsonl").read_text().splitlines()  # the hostile prompt file's two prompts
    assert len(generated) == 2 and all("Tell me about the number" in line for line in generated), generated
    assert len((data / "tokens.jsonl").read_text().splitlines()) == 2


@pytest.mark.slow  # a real run of acquire, resolve-target and tokenize on local folders (~40 s)
def test_local_folders_and_data_file_with_hostile_names_are_read(tmp_path):
    from tiny_models import tiny_pair

    sentinel = _sentinel(tmp_path)
    workdir = tmp_path / "run"
    hostile = workdir / "in"
    hostile.mkdir(parents=True)
    target, drafter = tiny_pair(hostile / _hostile("target", sentinel), hostile / _hostile("drafter", sentinel))
    data = hostile / (_hostile("data", sentinel) + ".jsonl")
    data.parent.mkdir(parents=True, exist_ok=True)
    data.write_text("".join(json.dumps({"conversations": [{"role": "user", "content": f"question {i}"},
                                                          {"role": "assistant", "content": f"answer {i} " * 4}]})
                            + "\n" for i in range(3)))
    (workdir / "override.yaml").write_text(
        f"experiment: hostile\nsize: smoke\ndemo: {{enabled: false}}\nhub: {{offline: true}}\n"
        f"target: {{source: {json.dumps(str(target))}, revision: null}}\n"
        f"drafter: {{source: {json.dumps(str(drafter))}, revision: null}}\n"
        f"data: {{path: {json.dumps(str(data))}}}\n")
    results = workdir / "results" / "hostile-smoke"
    snakemake(workdir, "-c1", "results/hostile-smoke/models/drafter/acquire.json", "results/hostile-smoke/data/tokens.jsonl",
              snakefile=REPO_ROOT / "Snakefile", timeout=600,
              configfiles=(REPO_ROOT / "config" / "config.yaml", workdir / "override.yaml"))

    assert not sentinel.exists(), "a config value ran as a shell command"
    assert json.loads((results / "models" / "drafter" / "acquire.json").read_text())
    assert (results / "models" / "target" / "model").resolve() == target.resolve()
    assert len((results / "data" / "tokens.jsonl").read_text().splitlines()) == 3  # the hostile data file's rows
