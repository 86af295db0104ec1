"""Contract: guidellm 0.8.1 (``guidellm run``, from its pinned wheel in a venv of its own, with the CPU
torch it requires) load-tests the builtin server on the smoke demo pair, offline, with its default
request: streamed chat completions whose ``stream_options`` ask for ``include_usage`` and
``continuous_usage_stats`` (usage on every chunk), ``ignore_eos`` and an exact ``max_completion_tokens``.

What must hold: every request succeeds (a server that refuses ``continuous_usage_stats`` fails all
of them, and guidellm still exits 0), each gets its requested output length, and each one's time to
first token is below its request latency (a stream, not one body).
"""

from __future__ import annotations

import json
import os

import pytest
from test_contract_aiperf import API_KEY, builtin_server, run_tool
from toolenv import tool_python

pytestmark = [pytest.mark.contract, pytest.mark.slow]  # the smoke demo pair

GUIDELLM = "guidellm==0.8.1"
TORCH = "torch==2.13.0"  # guidellm requires torch: the CPU wheel, so that pip pulls no CUDA build
REQUESTS, PROMPT_TOKENS, OUTPUT_TOKENS = 8, 24, 12


@pytest.fixture(scope="module")
def guidellm_python():
    return tool_python("guidellm", packages=[TORCH, GUIDELLM])


@pytest.mark.parametrize("speculative", [True, False], ids=["spec", "plain"])
def test_guidellm_runs_against_the_builtin_server(guidellm_python, smoke_demo, tmp_path, speculative):
    demo = smoke_demo["result"]
    out = tmp_path / "guidellm.json"
    with builtin_server(demo, tmp_path / "server.log", speculative) as url:
        cmd = [str(guidellm_python.parent / "guidellm"), "run", "--backend", f"kind=openai_http,target={url},api_key={API_KEY}",
               "--profile", "kind=concurrent,streams=2", "--constraint", f"kind=max_requests,count={REQUESTS}",
               "--data", f"kind=synthetic_text,prompt_tokens={PROMPT_TOKENS},output_tokens={OUTPUT_TOKENS}",
               "--tokenizer", f"kind=huggingface_auto,model={demo['target_v1']}",
               "--output", f"kind=json,path={out}", "--disable-progress"]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "NO_PROXY": "127.0.0.1,localhost"}
        proc = run_tool(cmd, env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-5000:]
    bench = json.loads(out.read_text())["benchmarks"][0]
    totals = bench["metrics"]["request_totals"]
    assert (totals["successful"], totals["errored"], totals["incomplete"]) == (REQUESTS, 0, 0), proc.stdout[-3000:]
    done = bench["requests"]["successful"]
    assert len(done) == REQUESTS
    assert all(r["output_tokens"] == OUTPUT_TOKENS for r in done)  # from the server's usage
    assert all(0 < r["time_to_first_token_ms"] / 1000 < r["request_latency"] for r in done)
    assert all(r["info"]["timings"]["token_iterations"] > 1 for r in done)  # the answer came in several events
