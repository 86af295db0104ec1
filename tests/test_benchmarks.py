"""benchmarks/ by capability (benchmarks/README.md): tools named by what they measure, one GPU runner
taking a job name, no script named after an issue, no import cycle, and every path the docs cite exists."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
RUNNER = BENCH / "gpu" / "run.sh"
SHARED = {"decode_timing.py"}  # a module the tools import, not a tool


def _scripts() -> list[Path]:
    return sorted(p for p in BENCH.rglob("*") if p.suffix in (".py", ".sh") and "results" not in p.parts)


def test_no_script_is_named_after_an_issue():
    assert [p.relative_to(ROOT).as_posix() for p in _scripts() if re.search(r"issue|gpu\d", p.name)] == []


def _sibling_imports(path: Path) -> set[str]:
    siblings = {p.stem for p in path.parent.glob("*.py")}
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
            [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
        found |= {n.split(".")[0] for n in names} & siblings
    return found - {path.stem}


def test_the_benchmarks_import_no_cycle():
    """A tool may import a shared module of its folder; nothing imports a tool back (no cycle, e.g. the
    old drafter_levers.py <-> static_decode_gpu.py)."""
    edges = {p.stem: _sibling_imports(p) for p in BENCH.glob("*.py")}

    def reaches(start: str) -> set[str]:
        seen, todo = set(), list(edges.get(start, ()))
        while todo:
            m = todo.pop()
            if m not in seen:
                seen.add(m)
                todo.extend(edges.get(m, ()))
        return seen

    assert [m for m in edges if m in reaches(m)] == []
    assert edges["drafter_levers"] == edges["static_decode_gpu"] == {"decode_timing"}


def _readme_rows(section: str) -> list[str]:
    text = (BENCH / "README.md").read_text()
    body = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    return [m.group(1) for m in re.finditer(r"^\| `([^`]+)` \|", body, re.M)]


def test_every_tool_and_job_is_in_the_readme_and_every_row_exists():
    tools = sorted(p.name for p in BENCH.glob("*") if p.suffix in (".py", ".sh") and p.name not in SHARED)
    assert sorted(_readme_rows("Tools")) == tools
    jobs = sorted(p.stem for p in (BENCH / "gpu" / "jobs").glob("*.sh"))
    assert sorted(_readme_rows("GPU jobs")) == jobs and jobs


def test_every_cited_benchmark_path_exists_or_is_named_retired():
    """README, docs, RESULTS, tests, src and configs cite only paths under benchmarks/ that exist; a retired
    script is cited on a line that says so (and RESULTS.md names the commit that last had it)."""
    sources = [ROOT / "README.md", *ROOT.glob("docs/*.md"), *BENCH.glob("*.md"), *ROOT.glob("tests/*.py"),
               *ROOT.glob("src/draftlab/**/*.py"), *ROOT.glob("config/*.yaml"), *_scripts()]
    missing = []
    for path in sources:
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for ref in re.findall(r"benchmarks/([\w./-]+\.(?:py|sh|md|json))", line):
                if not (BENCH / ref).exists() and "retired" not in line:
                    missing.append(f"{path.relative_to(ROOT)}:{n}: benchmarks/{ref}")
    assert missing == []
    retired = [r for r in re.findall(r"^\| `([^`|]+)`", (BENCH / "README.md").read_text().split("## Retired", 1)[1], re.M)]
    assert retired and all(not (BENCH / name).exists() for row in retired for name in row.split("`, `"))
    assert "353378b" in (BENCH / "README.md").read_text().split("## Retired", 1)[1]


def test_every_gpu_script_parses():
    for path in [RUNNER, BENCH / "gpu" / "env.sh", *sorted((BENCH / "gpu" / "jobs").glob("*.sh"))]:
        subprocess.run(["bash", "-n", str(path)], check=True)


def test_the_runner_refuses_an_unknown_job_naming_the_known_ones():
    for args in ([], ["no-such-job", "run"], ["gpu-checks", "sideways"]):
        out = subprocess.run(["bash", str(RUNNER), *args], capture_output=True, text=True, timeout=30)
        assert out.returncode == 2 and out.stdout == ""
        assert out.stderr.count("\n") == 1 and out.stderr.startswith("error: usage: bash benchmarks/gpu/run.sh JOB")
        assert "demo-gpu-loop" in out.stderr and "specforge-keep-arm" in out.stderr


def test_the_runner_runs_a_job_in_the_background_and_packs_what_it_wrote(tmp_path):
    """start: the job runs from a copy of gpu/ in its own session; wait: its steps.log is printed and
    its folder packed into $OUT/JOB.tar.gz (a job here that only writes, so nothing GPU-shaped runs)."""
    gpu = tmp_path / "gpu"
    shutil.copytree(BENCH / "gpu", gpu)
    (gpu / "jobs" / "probe.sh").write_text('echo "[$GPU_JOB] step one in $WORK" >> "$WORK/steps.log"\n'
                                         'echo 42 > "$WORK/answer.txt"\n')
    env = {**os.environ, "WORK": str(tmp_path / "work"), "OUT": str(tmp_path / "out")}
    start = subprocess.run(["bash", str(gpu / "run.sh"), "probe", "start"], capture_output=True, text=True,
                           env=env, cwd=tmp_path, timeout=30)
    assert start.returncode == 0 and start.stdout.startswith("started probe"), start.stderr
    done = subprocess.run(["bash", str(gpu / "run.sh"), "probe", "wait", "30"], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=60)
    assert done.returncode == 0 and done.stdout.splitlines()[0] == "finished", done.stdout + done.stderr
    assert f"[probe] step one in {tmp_path / 'work'}" in done.stdout and "[probe] done: rc 0" in done.stdout
    listing = subprocess.run(["tar", "tzf", str(tmp_path / "out" / "probe.tar.gz")], capture_output=True, text=True,
                             check=True).stdout.split()
    assert "./answer.txt" in listing and "./steps.log" in listing
