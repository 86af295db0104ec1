"""The vLLM launch draftlab builds, against vLLM 0.34.0's documented CLI and SpeculativeConfig schema.

vLLM's own parser is not installed here (docs/serving.md, "Contract tests": the wheel is 239 MB and its
argument parser, ``vllm/engine/arg_utils.py``, imports the whole config tree with transformers and
torch), so this checks the argv against the schema read from that wheel's source: option strings from
``EngineArgs.add_cli_args`` and ``FrontendArgs``, and the fields of ``SpeculativeConfig``
(``vllm/config/speculative.py``, a pydantic config with ``extra="forbid"``: an unknown key fails).
"""

from __future__ import annotations

import json

from draftlab.serving.launch import ServerSpec

VLLM_VERSION = "0.34.0"
OPTIONS = {  # option -> takes a value (file in the vllm 0.34.0 wheel that defines it)
    "--tensor-parallel-size": True,   # engine/arg_utils.py (ParallelConfig.tensor_parallel_size)
    "--speculative-config": True,     # engine/arg_utils.py (JSON parsed into SpeculativeConfig)
    "--gpu-memory-utilization": True,  # engine/arg_utils.py (CacheConfig.gpu_memory_utilization)
    "--dtype": True,                  # engine/arg_utils.py (ModelConfig.dtype)
    "--trust-remote-code": False,     # engine/arg_utils.py (ModelConfig.trust_remote_code)
    "--host": True,                   # entrypoints/common/cli_args.py (FrontendArgs.host)
    "--port": True,                   # entrypoints/common/cli_args.py (FrontendArgs.port)
}
SPECULATIVE_FIELDS = {"method", "model", "num_speculative_tokens"}  # a subset of SpeculativeConfig's
EAGLE_METHODS = {"eagle", "eagle3"}  # EagleModelTypes in config/speculative.py


def parse(argv: list[str]) -> dict:
    assert argv[:2] == ["vllm", "serve"]
    model, rest, out = argv[2], argv[3:], {}
    while rest:
        flag = rest.pop(0)
        assert flag in OPTIONS, f"{flag} is not an option draftlab checked against vLLM {VLLM_VERSION}"
        out[flag] = rest.pop(0) if OPTIONS[flag] else True
    return {"model": model, **out}


def test_vllm_argv_fits_the_schema():
    spec = ServerSpec(backend="vllm", target="/m/K2.5", drafter="/m/eagle3", num_steps=3, tp=8, dtype="bfloat16",
                      mem_fraction_static=0.9, trust_remote_code=True, port=8000)
    got = parse(spec.argv())
    assert got["model"] == "/m/K2.5" and got["--tensor-parallel-size"] == "8"
    assert got["--gpu-memory-utilization"] == "0.9" and got["--dtype"] == "bfloat16"
    assert (got["--host"], got["--port"], got["--trust-remote-code"]) == ("127.0.0.1", "8000", True)
    conf = json.loads(got["--speculative-config"])
    assert set(conf) <= SPECULATIVE_FIELDS
    assert conf == {"method": "eagle3", "model": "/m/eagle3", "num_speculative_tokens": 3}
    assert conf["method"] in EAGLE_METHODS and conf["num_speculative_tokens"] > 0


def test_plain_vllm_has_no_speculative_config():
    got = parse(ServerSpec(backend="vllm", target="/m/t", port=8000).argv())
    assert "--speculative-config" not in got and got["--tensor-parallel-size"] == "1"
