"""Contract: SGLang 0.5.23's own ``python -m sglang.bench_serving`` (from the pinned wheel, in a venv of its
own) benchmarks the builtin server with ``--backend sglang``, ``sglang-oai`` and ``sglang-oai-chat``,
offline (a local ShareGPT-style ``--dataset-path``, the smoke demo target's tokenizer).

What must hold (issue 40): every request completes; its token counts and, on the two text routes, its
accept length (the server's ``avg_spec_accept_length``, as bench_serving reads it) agree with
draftlab's own bench on the same prompts; its TTFT is below its end-to-end latency and its
inter-token latency is not zero (a server that answers a stream with one body fails both).
"""

from __future__ import annotations

import json
import os
import subprocess
import threading

import pytest
from test_contract_sglang import LINKED, NO_DEPS, PARSER_DEPS
from toolenv import tool_python

from draftlab.benchmark.bench import run_benchmark
from draftlab.serving.server import load_state, make_server

pytestmark = pytest.mark.contract

# What `sglang.bench_serving` imports beyond `sglang.srt.server_args` (read in the wheel:
# benchmark/serving.py, benchmark/utils.py, benchmark/datasets/*): transformers for the tokenizer,
# linked from draftlab's venv like torch, and `datasets` (datasets/mmmu.py imports it at module level).
# `partial-json-parser` for `sglang.srt.parser.reasoning_parser` (its function_call imports), which the K2.5
# template contract (test_contract_kimi_k25_template.py) runs in this same venv: one build for both.
BENCH_LINKED = [*LINKED, "transformers"]
BENCH_PACKAGES = [*PARSER_DEPS, "datasets", "partial-json-parser"]

# bench_serving runs as `python -m sglang.bench_serving` would, with one module replaced: serving.py
# imports a single constant, FAKE_BOOTSTRAP_HOST, from sglang.srt.disaggregation.utils, whose own
# imports reach every model config of SGLang (srt/configs/__init__) and, through the multimodal ones,
# torchvision, which PyPI ships only as CUDA builds that do not load against the CPU torch. The
# constant is read from the wheel's own source; every line bench_serving runs is the wheel's.
RUNNER = r"""
import ast, importlib.util, runpy, sys, types
src = importlib.util.find_spec("sglang").submodule_search_locations[0] + "/srt/disaggregation/utils.py"
consts = {t.id: ast.literal_eval(n.value) for n in ast.parse(open(src).read()).body if isinstance(n, ast.Assign)
          for t in n.targets if isinstance(t, ast.Name) and t.id == "FAKE_BOOTSTRAP_HOST"}
assert consts, "FAKE_BOOTSTRAP_HOST not found in " + src
mod = types.ModuleType("sglang.srt.disaggregation.utils")
mod.__dict__.update(consts)
sys.modules[mod.__name__] = mod
sys.argv = ["sglang.bench_serving", *sys.argv[1:]]
runpy.run_module("sglang.bench_serving", run_name="__main__")
"""
OUTPUT_LEN = 12
PROMPTS = ["Write a haiku about the sea.", "def fibonacci(n):", "What is 17 times 23?",
           "List three colours of the rainbow.", "Explain a hash map in one sentence.", "Once upon a time"]


@pytest.fixture(scope="module")
def bench_python():
    return tool_python("sglang", packages=BENCH_PACKAGES, no_deps=NO_DEPS, link=BENCH_LINKED)


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory):
    """One file both clients read: ShareGPT conversations (bench_serving's ``custom`` dataset takes the
    first turn as the prompt; draftlab's bench sends the first user turn)."""
    path = tmp_path_factory.mktemp("bench-serving") / "prompts.jsonl"
    rows = [{"id": str(i), "conversations": [{"from": "human", "value": p}, {"from": "gpt", "value": "x " * 8}]}
            for i, p in enumerate(PROMPTS)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _serve(demo):
    state = load_state(demo["target_v1"], demo["drafter_v1"], num_steps=3)
    httpd = make_server(state, "127.0.0.1", 0)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}"


def _bench_serving(python, url: str, backend: str, target: str, dataset, out) -> dict:
    cmd = [str(python), "-c", RUNNER, "--backend", backend, "--base-url", url,
           "--dataset-name", "custom", "--dataset-path", str(dataset), "--num-prompts", str(len(PROMPTS)),
           "--sharegpt-output-len", str(OUTPUT_LEN), "--tokenizer", target, "--model", target,
           "--max-concurrency", "3", "--warmup-requests", "0", "--disable-tqdm", "--output-file", str(out)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "NO_PROXY": "127.0.0.1,localhost"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = [ln for ln in out.read_text().splitlines() if ln.strip()]
    return json.loads(lines[-1])


@pytest.mark.slow  # the session's smoke demo pair (conftest smoke_demo)
@pytest.mark.parametrize("backend", ["sglang", "sglang-oai", "sglang-oai-chat"])
def test_sglang_bench_serving_measures_the_builtin_server(bench_python, smoke_demo, prompts_file, tmp_path,
                                                          backend):
    demo = smoke_demo["result"]
    target = demo["target_v1"]
    httpd, url = _serve(demo)  # a fresh server: its cumulative accept length is bench_serving's run alone
    try:
        got = _bench_serving(bench_python, url, backend, target, prompts_file, tmp_path / "out.jsonl")
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert got["completed"] == len(PROMPTS)
    assert got["total_output_tokens"] == OUTPUT_LEN * len(PROMPTS)
    assert 0 < got["mean_ttft_ms"] < got["mean_e2e_latency_ms"]
    assert got["median_itl_ms"] > 0 and got["mean_tpot_ms"] > 0
    if backend == "sglang-oai-chat":
        assert got["accept_length"] >= 1.0  # its prompts are the chat template's, not the bench's text
        return
    # draftlab's bench on the same prompts, against another fresh server
    httpd, url = _serve(demo)
    try:
        own = run_benchmark(url, prompts_file, max_new_tokens=OUTPUT_LEN, repeats=1, warmup=0, concurrency=3,
                            ignore_eos=True, progress=False, measure_ttft=True)
    finally:
        httpd.shutdown()
        httpd.server_close()
    rows = [r for r in own.rows if r["phase"] == "measure"]
    assert len(rows) == got["completed"]
    assert own.summary["total_completion_tokens"] == got["total_output_tokens"]
    assert own.summary["total_prompt_tokens"] == got["total_input_tokens"]
    # SGLang's server-wide figure counts the tokens of verify steps: (completion - the prefill's one) / verifies
    server_rule = sum(r["completion_tokens"] - 1 for r in rows) / sum(r["verify_ct"] for r in rows)
    assert got["accept_length"] == pytest.approx(server_rule)
    assert own.summary["ttft_s_p50"] is not None and own.summary["itl_s_p50"] > 0
