"""Contract: draftlab's aux-layer rule and context derivation against SGLang 0.5.23's own code.

The pinned wheel is installed without its GPU requirements; its model modules cannot be imported
here (they pull in CUDA kernels), so the test compiles the real ``set_eagle3_layers_to_capture``
methods and ``get_context_length`` out of the installed source files and runs them on
transformers 5.19 configs (the version the wheel pins), then compares with draftlab.
"""

from __future__ import annotations

import pytest

from draftlab.formats import aux_layers

from draftlab.formats import context_length
from factories import kimi_k25_config, qwen3_config, target_config
from toolenv import run_in, tool_python

pytestmark = pytest.mark.contract

SGLANG = "sglang==0.5.23"

RUN = r'''
import ast, functools, importlib.util, json, sys, types, typing
from pathlib import Path

root = Path(importlib.util.find_spec("sglang").submodule_search_locations[0]) / "srt"

def compiled(path, name, cls=None):
    """A function (or a class's method) compiled alone out of SGLang's source file."""
    tree = ast.parse((root / path).read_text())
    body = tree.body
    if cls is not None:
        body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls).body
    nodes = [n for n in body if isinstance(n, ast.FunctionDef) and n.name == name]
    if name == "get_context_length":  # and the key list it reads
        nodes = [n for n in tree.body if isinstance(n, ast.Assign)
                 and any(getattr(t, "id", "") == "CONTEXT_LENGTH_KEYS" for t in n.targets)] + nodes
    ns = {"Optional": typing.Optional, "List": typing.List}
    exec(compile(ast.Module(body=nodes, type_ignores=[]), str(root / path), "exec"), ns)
    return ns[name]

CLASSES = {  # the class SGLang dispatches the architecture to, and where its method lives
    "LlamaForCausalLM": ("models/llama.py", "LlamaForCausalLM"),
    "Qwen3ForCausalLM": ("models/qwen3.py", "Qwen3ForCausalLM"),
    "Qwen2ForCausalLM": ("models/qwen2.py", "Qwen2ForCausalLM"),
    "Qwen3MoeForCausalLM": ("models/qwen3_moe.py", "Qwen3MoeForCausalLM"),
    "DeepseekV3ForCausalLM": ("models/deepseek_v2.py", "DeepseekV2ForCausalLM"),  # inherited
    "GptOssForCausalLM": ("models/gpt_oss.py", "GptOssForCausalLM"),
}

def fake(arch, n_layers):
    inner = types.SimpleNamespace(layers_to_capture=[])
    inner.set_eagle3_layers_to_capture = lambda ids: setattr(inner, "layers_to_capture", list(ids))
    obj = types.SimpleNamespace(pp_group=types.SimpleNamespace(is_last_rank=True), model=inner,
                                config=types.SimpleNamespace(num_hidden_layers=n_layers))
    path, cls = CLASSES[arch]
    return obj, functools.partial(compiled(path, "set_eagle3_layers_to_capture", cls), obj)

def capture(arch, n_layers, ids):
    if arch == "KimiK25ForConditionalGeneration":  # delegates to its DeepseekV3ForCausalLM
        lm, set_lm = fake("DeepseekV3ForCausalLM", n_layers)
        lm.set_eagle3_layers_to_capture = set_lm
        wrapper = types.SimpleNamespace(language_model=lm)
        compiled("models/kimi_k25.py", "set_eagle3_layers_to_capture", "KimiK25ForConditionalGeneration")(wrapper, ids)
        return lm.model.layers_to_capture
    obj, method = fake(arch, n_layers)
    method(ids)
    return obj.model.layers_to_capture

payload = json.load(sys.stdin)
out = {"capture": [capture(c["arch"], c["n"], c["ids"]) for c in payload["capture"]]}
get_context_length = compiled("utils/hf_transformers/common.py", "get_context_length")
from transformers import LlamaConfig
out["context"] = [get_context_length(LlamaConfig(**cfg)) for cfg in payload["context"]]
print(json.dumps(out))
'''

N = 61
TARGETS = {"KimiK25ForConditionalGeneration": kimi_k25_config(num_hidden_layers=N),
           "DeepseekV3ForCausalLM": kimi_k25_config(num_hidden_layers=N)["text_config"],
           "LlamaForCausalLM": target_config(num_hidden_layers=N),
           "Qwen3ForCausalLM": qwen3_config(num_hidden_layers=N),
           "Qwen2ForCausalLM": target_config(num_hidden_layers=N, architectures=["Qwen2ForCausalLM"]),
           "Qwen3MoeForCausalLM": target_config(num_hidden_layers=N, architectures=["Qwen3MoeForCausalLM"]),
           "GptOssForCausalLM": target_config(num_hidden_layers=N, architectures=["GptOssForCausalLM"])}
IDS = [None, [2, 30, 58], [1, 29, 57], [0, 30, 58], [3, 31, 59], [30, 2, 58], [1, 30, 61], [5, 40, 60]]
CONTEXTS = [
    {"max_position_embeddings": 131072},
    {"max_position_embeddings": 4096, "rope_scaling": {"rope_type": "linear", "factor": 4.0}},
    {"max_position_embeddings": 4096, "rope_scaling": {"type": "dynamic", "factor": 2.0}},
    {"max_position_embeddings": 262144, "rope_scaling": {"type": "yarn", "factor": 64.0,
                                                         "original_max_position_embeddings": 4096}},
    {"max_position_embeddings": 32768, "rope_scaling": {"type": "yarn", "factor": 4.0}},
    {"max_position_embeddings": 131072, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                                                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                         "original_max_position_embeddings": 8192}},
    {"max_position_embeddings": 8192, "seq_length": 2048},
]


@pytest.fixture(scope="module")
def sglang_says():
    python = tool_python("sglang-drafter", ["transformers==5.19.0"], no_deps=[SGLANG])
    payload = {"capture": [{"arch": a, "n": N, "ids": ids} for a in TARGETS for ids in IDS], "context": CONTEXTS}
    return run_in(python, RUN, payload)


def test_aux_capture_matches_sglang_per_architecture(sglang_says):
    cases = [(a, ids) for a in TARGETS for ids in IDS]
    ours = [aux_layers.capture_layers(ids, TARGETS[a]) for a, ids in cases]
    assert [(a, ids, got) for (a, ids), got in zip(cases, ours)] == \
           [(a, ids, got) for (a, ids), got in zip(cases, sglang_says["capture"])]


def test_context_length_matches_sglang(sglang_says):
    assert [context_length.derive(c).value for c in CONTEXTS] == sglang_says["context"]
