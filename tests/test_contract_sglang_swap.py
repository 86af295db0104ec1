"""Contract: the drafter swap's requests are SGLang 0.5.23's, judged by the pinned wheel's own code (issue 35).

The swap client's bodies are validated as SGLang's HTTP routes validate them (pydantic over the
``sglang.srt.managers.io_struct`` request structs: ``BeginWeightUpdateReqInput``,
``UpdateWeightsFromTensorReqInput``, ``EndWeightUpdateReqInput``, ``CheckWeightsReqInput``); the tensor
payload (ForkingPickler's, and the in-band one the builtin server reads) is read back with SGLang's own
``MultiprocessingSerializer.deserialize`` (its ``SafeUnpickler``)
in the SGLang venv, a process of its own as SGLang's scheduler is; SGLang's ``tensor_hash`` and
``overall_checksum`` give the checksums the builtin server reports; and the builtin server's
``/weights_checker`` ranks convert to SGLang's ``ChecksumInfo``.
"""

from __future__ import annotations

import json
import threading

import pytest
import torch

from draftlab.benchmark import drafter_swap
from draftlab.serving import weight_payload
from draftlab.serving.server import load_state, make_server
from draftlab.models.target import read_config
from factories import tiny_drafter_config, write_drafter
from test_contract_sglang import LINKED, NO_DEPS, PARSER_DEPS
from tiny_models import tiny_target
from toolenv import run_in, tool_python

pytestmark = pytest.mark.contract

# io_struct imports schedule_batch and mm_schedule only for request structs other than the four judged here:
# those two modules (which pull in transformers, torchvision and the model zoo) are stand-ins whose every
# name is a placeholder class. The checksum functions are SGLang's own source (``tensor_hash`` from
# managers/mm_utils.py, ``overall_checksum`` and ``_hash_tensor`` from utils/weight_checker.py), cut out of
# the wheel's files by name and run as they are: their modules import the whole model zoo.
JUDGE = r"""
import ast, hashlib, json, pathlib, sys, types
import torch


def _placeholder(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return type(name, (), {})


for mod in ("sglang.srt.managers.schedule_batch", "sglang.srt.managers.mm_schedule"):
    stand_in = types.ModuleType(mod)
    stand_in.__getattr__ = _placeholder
    sys.modules[mod] = stand_in

import msgspec, pydantic
import sglang
from sglang.srt.managers.io_struct import (BeginWeightUpdateReqInput, CheckWeightsReqInput, ChecksumInfo,
                                           EndWeightUpdateReqInput, UpdateWeightsFromTensorReqInput)
from sglang.srt.utils.common import MultiprocessingSerializer

root = pathlib.Path(sglang.__file__).parent / "srt"
ns = {"hashlib": hashlib, "torch": torch, "Dict": dict}
for rel, names in (("managers/mm_utils.py", ("tensor_hash",)),
                   ("utils/weight_checker.py", ("overall_checksum", "_hash_tensor"))):
    text = (root / rel).read_text()
    for node in ast.parse(text).body:
        if isinstance(node, ast.FunctionDef) and node.name in names:
            exec(compile(ast.get_source_segment(text, node), rel, "exec"), ns)

job = json.load(sys.stdin)
out = {}
for key, cls in (("begin", BeginWeightUpdateReqInput), ("update", UpdateWeightsFromTensorReqInput),
                 ("end", EndWeightUpdateReqInput), ("check", CheckWeightsReqInput)):
    obj = pydantic.TypeAdapter(cls).validate_python(job[key])  # what FastAPI's Body() does with the JSON
    out[key] = {f: getattr(obj, f) for f in cls.__struct_fields__ if f != "serialized_named_tensors"}
upd = pydantic.TypeAdapter(UpdateWeightsFromTensorReqInput).validate_python(job["update"])
named = MultiprocessingSerializer.deserialize(upd.serialized_named_tensors[0])
sums = {"draft." + n: ns["_hash_tensor"](t) for n, t in named}
out["tensors"] = {n: list(t.shape) for n, t in named}
out["checksums"] = sums
out["overall"] = ns["overall_checksum"](sums)
# the in-band payload the builtin server reads: SGLang's own deserializer must read it the same
in_band = pydantic.TypeAdapter(UpdateWeightsFromTensorReqInput).validate_python(job["update_in_band"])
out["in_band_checksums"] = {"draft." + n: ns["_hash_tensor"](t)
                            for n, t in MultiprocessingSerializer.deserialize(in_band.serialized_named_tensors[0])}
out["ranks"] = [msgspec.to_builtins(msgspec.convert(r, ChecksumInfo)) for r in job["ranks"]]
print(json.dumps(out, default=str))
"""


@pytest.fixture(scope="module")
def sglang_python():
    return tool_python("sglang", packages=PARSER_DEPS, no_deps=NO_DEPS, link=LINKED)


def test_swap_requests_and_payload_are_read_by_sglangs_own_code(sglang_python, tmp_path):
    torch.set_num_threads(1)
    target = tiny_target(tmp_path / "target", seed=0)
    cfg = tiny_drafter_config(read_config(target))
    drafter = write_drafter(tmp_path / "drafter", cfg, seed=1)
    other = write_drafter(tmp_path / "other", cfg, seed=2)
    state = load_state(target, drafter, num_steps=2)
    httpd = make_server(state, "127.0.0.1", 0)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        drafter_swap.swap(url, other, "builtin")
        ranks = json.loads(json.dumps(drafter_swap._post(url, "/weights_checker", {"action": "checksum",
                                                                                   "selector": "draft"}, 60)["ranks"]))
    finally:
        httpd.shutdown()
        httpd.server_close()
    named = drafter_swap.drafter_tensors(other, "builtin")  # kept alive: SGLang reads the shared storages
    job = {"begin": {"selector": "draft"}, "update": drafter_swap.update_body(named),
           "update_in_band": drafter_swap.update_body(named, in_band=True), "end": {},
           "check": {"action": "checksum", "selector": "draft"}, "ranks": ranks}
    verdict = run_in(sglang_python, JUDGE, job)
    assert verdict["begin"]["selector"] == verdict["update"]["selector"] == verdict["check"]["selector"] == "draft"
    assert verdict["update"]["load_format"] is None and verdict["update"]["flush_cache"] is True
    assert verdict["tensors"] == {n: list(t.shape) for n, t in named}
    assert "embed_tokens.weight" not in verdict["tensors"] and "d2t" in verdict["tensors"]
    # SGLang's own checksum of what it read == draftlab's of the file == what the builtin server holds
    assert verdict["checksums"] == weight_payload.checksums_of(named, prefix="draft.")
    assert verdict["in_band_checksums"] == verdict["checksums"]  # one payload format, read by both servers
    held = {n: c for n, c in ranks[0]["checksums"].items() if n in verdict["checksums"]}
    assert held == verdict["checksums"] and verdict["ranks"][0]["per_gpu_checksum"] == ranks[0]["per_gpu_checksum"]
    assert weight_payload.overall_checksum(verdict["checksums"]) == verdict["overall"]
    # to SGLang the client sends no map: SGLang reads d2t at launch only
    assert {n for n, _ in drafter_swap.drafter_tensors(other, "sglang")}.isdisjoint({"d2t", "t2d", "embed_tokens.weight"})
