"""Seeded, time-bounded fuzz of the static commands on broken drafters and configs (issue 16), of the
server answers draftlab's clients parse and of the request bodies and headers the builtin server reads
(issue 24).

Mutants of real safetensors files and config files (``tests/mutants.py``) go through inspect,
compare, patch-config, doctor and check-config. For every mutant, every command must end in one of:
a result (exit 0, or 1 for the doctor's findings) or one ``error:`` line (exit 2); never a crash
(exit 70 / a traceback), never a hang (an alarm per command), and never a complete-looking output
from a broken input: a weight file ``safetensors.safe_open`` refuses fails every command, and
patch-config leaves no folder behind when it fails. Where a weight file is valid, inspect must
report exactly the tensors, dtypes and shapes the safetensors library reads.

Server answers (``test_fuzz_server_responses``): mutants of valid SGLang, vLLM and OpenAI answers
(JSON tree edits, broken status lines, lengths, chunking and bodies) from a real TCP server on
127.0.0.1 go through the functions bench and generate-data read them with. Each must give a result
within the physical bounds or one ``DraftlabError`` line, never another exception. Requests
(``test_fuzz_server_requests``): mutants of valid ``/generate``, ``/v1/completions`` and
``/v1/chat/completions`` requests (bodies, request lines, headers) against a real builtin server:
never a 500 (501/505 only for an unknown method or HTTP version), and the server keeps answering. Both print their case counts per family.

``DRAFTLAB_FUZZ_SECONDS`` (default 40) bounds the run; the seed is fixed, so a failure replays.
"""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml
from factories import write_drafter, write_target_config
from helpers import cli, one_error_line
from rawserver import Raw
from mutants import config_bytes, http_request, http_response, mutant_safetensors, mutate_config, mutate_json, sse_body


ROOT = Path(__file__).resolve().parents[1]
SECONDS = float(os.environ.get("DRAFTLAB_FUZZ_SECONDS", "40"))
PER_COMMAND_S = 20


def run(*args) -> tuple[int, str, str]:
    """``draftlab ARGS`` in process; a hang (PER_COMMAND_S) fails the test with the command."""
    proc = cli(*args, hang_s=PER_COMMAND_S)
    return proc.returncode, proc.stdout, proc.stderr


def check_outcome(args, rc: int, out: str, err: str, allowed=(0, 1, 2)) -> None:
    what = f"draftlab {' '.join(map(str, args))}"
    assert "Traceback" not in err and rc != 70, f"{what} crashed: {err[-2000:]}"
    assert rc in allowed, f"{what}: exit {rc}: {err[-1000:]}"
    if rc == 2:
        one_error_line(subprocess.CompletedProcess(args, rc, out, err))
    else:
        assert out.strip(), f"{what}: exit {rc} without a result"


def library_view(path: Path) -> dict | None:
    """Tensor name -> (dtype, shape) as safetensors reads them, or None when it refuses the file."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="np") as fh:
            return {k: (fh.get_slice(k).get_dtype(), list(fh.get_slice(k).get_shape())) for k in fh.keys()}
    except Exception:
        return None


def static_commands(drafter: Path, target: Path, out: Path) -> list[list]:
    return [["inspect", drafter, "--json"], ["compare", drafter, target, "--json"],
            ["doctor", "--drafter", drafter, "--target", target, "--json"],
            ["patch-config", "--drafter", drafter, "--target", target, "--out", out, "--json"]]


def _deadline(share: float) -> float:
    return time.monotonic() + SECONDS * share


def test_fuzz_safetensors_headers(tmp_path):
    rng = random.Random(16)
    target = write_target_config(tmp_path / "target")
    n = broken = 0
    deadline = _deadline(0.35)
    while time.monotonic() < deadline or n < 30:
        d = write_drafter(tmp_path / f"d{n}")
        weights = d / "model.safetensors"
        weights.write_bytes(mutant_safetensors(rng))
        view = library_view(weights)
        out = tmp_path / f"out{n}"
        for args in static_commands(d, target, out):
            rc, stdout, err = run(*args)
            check_outcome(args, rc, stdout, err)
            if view is None:  # safetensors refuses the file: so does every command, naming it
                assert rc == 2 and str(weights) in err, f"{args[0]} accepted a file safetensors refuses: {err}"
            elif args[0] == "inspect":
                got = {k: (v["dtype"], v["shape"]) for k, v in json.loads(stdout)["tensors"].items()}
                assert got == {k: (dt, sh) for k, (dt, sh) in view.items()}
        if view is None:
            broken += 1
            assert not out.exists()
        n += 1
    assert broken >= n // 4 and n - broken >= 5, (n, broken)


def test_fuzz_config_files(tmp_path):
    rng = random.Random(61)
    base_drafter = json.loads((write_drafter(tmp_path / "base") / "config.json").read_text())
    base_target = json.loads((write_target_config(tmp_path / "base-target") / "config.json").read_text())
    n = refused = 0
    deadline = _deadline(0.25)
    while time.monotonic() < deadline or n < 30:
        d = write_drafter(tmp_path / f"d{n}")
        target = write_target_config(tmp_path / f"t{n}")
        which = rng.choice(["drafter", "target"])
        blob = config_bytes(mutate_config(base_drafter if which == "drafter" else base_target, rng))
        cfg = (d if which == "drafter" else target) / "config.json"
        cfg.write_bytes(blob)
        out = tmp_path / f"out{n}"
        for args in static_commands(d, target / "config.json", out):
            rc, stdout, err = run(*args)
            check_outcome(args, rc, stdout, err)
            if rc == 2:
                refused += 1
                assert str(cfg) in err or str(d) in err or str(target) in err, err
            if args[0] == "patch-config":
                if rc == 0:  # a complete output: its config parses and carries the marker
                    assert isinstance(json.loads((out / "config.json").read_text()), dict)
                    assert (out / ".draftlab-output.json").is_file()
                else:
                    assert not out.exists()
        n += 1
    assert refused >= n  # most mutants are refused by at least one command each


def test_fuzz_experiment_config(tmp_path):
    rng = random.Random(7)
    base = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    leaves = []

    def walk(node, path):
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, path + [k])
        else:
            leaves.append(path)

    walk(base, [])
    n = 0
    deadline = _deadline(0.1)
    while time.monotonic() < deadline or n < 30:
        kind = rng.randrange(5)
        path = tmp_path / f"c{n}.yaml"
        if kind <= 2:  # a leaf gets a value of another type (or a valid one)
            cfg = json.loads(json.dumps(base))
            node = cfg
            leaf = rng.choice(leaves)
            for k in leaf[:-1]:
                node = node[k]
            node[leaf[-1]] = rng.choice([None, True, -1, 0, 10**30, 1.5, "x", [], {}, {"bogus": 1}, [1, "a"],
                                         "../../etc/passwd", "\u0000", 2**63])
            path.write_text(yaml.safe_dump(cfg))
        elif kind == 3:
            text = (ROOT / "config" / "config.yaml").read_bytes()
            path.write_bytes(text[: rng.randrange(len(text))] + rng.choice([b"", b"\xff\xfe", b": : :", b"\t- [", b"&a *a"]))
        else:
            levels = rng.randint(3, 9)
            doc = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
                f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, levels))
            path.write_text(doc)
        args = ["check-config", path, "--json"]
        rc, stdout, err = run(*args)  # an alias bomb expanded would hang: run fails it
        check_outcome(args, rc, stdout, err, allowed=(0, 2))
        n += 1


# --- issue 24: server answers the clients parse ---------------------------------------------------


INFO = {"model_path": "m", "speculative_algorithm": "EAGLE3", "speculative_num_steps": 3, "speculative_eagle_topk": 1,
        "speculative_num_draft_tokens": 4, "internal_states": [{"avg_spec_accept_length": 2.5}]}
META = {"prompt_tokens": 3, "completion_tokens": 8, "spec_verify_ct": 3, "spec_accept_token_num": 4,
        "spec_draft_token_num": 9, "e2e_latency": 0.001, "draft_time": 0.0002, "verify_time": 0.0005,
        "spec_accept_by_position": [2, 1, 1]}
USAGE = {"prompt_tokens": 3, "completion_tokens": 8, "total_tokens": 11}
CHAT = {"id": "c", "object": "chat.completion", "model": "m", "usage": USAGE,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}]}
MAX_NEW = 16


def _check_row(row: dict) -> None:
    """A recorded row is within the physical bounds (bench_checks)."""
    c, v = row["completion_tokens"], row.get("verify_ct")
    assert isinstance(c, int) and 0 <= c <= MAX_NEW, row
    assert v is None or 0 <= v <= c and c <= 4 * v + 1, row
    for key in ("decode_time_s", "latency_s", "server_latency_s"):
        assert row.get(key) is None or row[key] >= 0, row


def _response_families():
    from draftlab.benchmark import bench_client as bench
    from draftlab.benchmark.bench_checks import Plausibility
    from draftlab import http_client
    from draftlab.serving.server_info import served_model, server_info
    from draftlab.datagen.answerers import _answer
    from draftlab.formats.prompt_file import Prompt as DataPrompt

    prompt = bench.Prompt("p0", "chat", "hello")
    checks = Plausibility(MAX_NEW, 3, 4)

    def client(url, api):
        return bench._Client(url, api, MAX_NEW, False, 2.0, "m", checks)

    def read_info(url):
        info = server_info(url, 2.0)
        assert isinstance(info, dict)
        checks.check_server_info(info, url)

    def chat(url):
        reply = http_client.json_call(url + "/v1/chat/completions", {"x": 1}, 2.0, dict)
        a = _answer(DataPrompt(0, ({"role": "user", "content": "hi"},), "0" * 16), reply, url, MAX_NEW)
        assert isinstance(a.text, str) and 0 <= a.completion_tokens <= MAX_NEW and a.prompt_tokens >= 0

    def metrics(url):
        assert isinstance(bench._vllm_metrics(url, 2.0), dict)

    def sse(*events):
        return lambda value, rng: sse_body(value, rng), list(events)

    plain = lambda value, rng: json.dumps(value).encode()  # noqa: E731
    return {
        "/server_info": (plain, INFO, b"application/json", read_info),
        "/v1/models": (plain, {"object": "list", "data": [{"id": "m", "object": "model"}]}, b"application/json",
                       lambda url: isinstance(served_model(url, 2.0), str) or pytest.fail("not a name")),
        "/generate": (plain, {"text": "abc", "meta_info": META}, b"application/json",
                      lambda url: _check_row(client(url, "sglang").generate(prompt))),
        "/generate (SSE)": (*sse({"text": "a", "meta_info": {"completion_tokens": 1}}, {"text": "abc", "meta_info": META}),
                            b"text/event-stream", lambda url: _check_row(client(url, "sglang").generate(prompt, True))),
        "/v1/completions": (plain, {"choices": [{"index": 0, "text": "xyz"}], "usage": USAGE}, b"application/json",
                            lambda url: _check_row(client(url, "vllm").generate(prompt))),
        "/v1/completions (SSE)": (*sse({"choices": [{"index": 0, "text": "x"}]}, {"choices": [], "usage": USAGE}),
                                  b"text/event-stream", lambda url: _check_row(client(url, "vllm").generate(prompt, True))),
        "/v1/chat/completions": (plain, CHAT, b"application/json", chat),
        "/metrics": (lambda value, rng: value.encode(), "vllm:spec_decode_num_drafts_total{engine=\"0\"} 4.0\n"
                     "vllm:spec_decode_num_accepted_tokens_per_pos_total{position=\"0\"} 2\n", b"text/plain", metrics),
    }


def test_fuzz_server_responses():
    from draftlab.errors import DraftlabError

    rng = random.Random(24)
    families = _response_families()
    counts: Counter = Counter()
    refused: Counter = Counter()
    deadline = _deadline(0.15)
    n = 0
    with Raw(b"") as srv:
        while time.monotonic() < deadline or n < 200:
            name = rng.choice(sorted(families))
            encode, valid, ctype, read = families[name]
            value = valid if rng.random() < 0.2 or isinstance(valid, str) else mutate_json(valid, rng, rng.choice([1, 1, 2]))
            try:
                body = encode(value, rng)
            except (ValueError, RecursionError):
                body = b"[" * 3000
            srv.head = http_response(body, rng, ctype)
            try:
                read(srv.url)
            except DraftlabError as exc:
                message = str(exc)
                assert "\n" not in message and len(message) < 1000, (name, srv.head[:500], message)
                refused[name] += 1
            except Exception as exc:  # noqa: BLE001 - the point: nothing else may escape
                pytest.fail(f"{name}: {type(exc).__name__}: {exc} on {srv.head[:500]!r}")
            counts[name] += 1
            n += 1
    print("server responses fuzzed (cases / refused with one line):",
          ", ".join(f"{k} {counts[k]}/{refused[k]}" for k in sorted(counts)))
    assert set(counts) == set(families) and sum(refused.values()) >= n // 3 and sum(refused.values()) < n


# --- issue 24: request bodies and headers the builtin server reads ----------------------------------

REQUESTS = {
    "/generate": {"text": "hello there", "sampling_params": {"max_new_tokens": 4, "temperature": 0,
                                                             "ignore_eos": False, "stop_token_ids": [3]}},
    "/generate (ids)": {"input_ids": [[5, 6, 7], [8, 9]], "sampling_params": {"max_new_tokens": 3}},
    "/v1/completions": {"prompt": "hello", "max_tokens": 4, "temperature": 0.0},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 4,
                             "chat_template_kwargs": {"enable_thinking": False}},
}


def _exchange(port: int, raw: bytes) -> int | None:
    """Send raw request bytes; the response's status code (None: the server closed without one)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        try:
            sock.sendall(raw)
        except OSError:
            pass
        data = b""
        try:
            while b"\r\n" not in data:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
        except ConnectionResetError:
            return None
    parts = data.split(b" ", 2)
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None


@pytest.fixture(scope="module")
def builtin_server(tmp_path_factory):
    import torch
    from tiny_models import tiny_target

    from draftlab.serving.server import load_state, make_server

    torch.set_num_threads(1)
    target = tiny_target(tmp_path_factory.mktemp("fuzz-serve") / "target", max_position_embeddings=128)
    state = load_state(target, None, read_timeout_s=0.3, max_prompts=8)  # short: a short body waits it out
    httpd = make_server(state, "127.0.0.1", 0)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield httpd.server_address[1]
    httpd.shutdown()
    httpd.server_close()


def test_fuzz_server_requests(builtin_server, capfd):
    rng = random.Random(42)
    port = builtin_server
    counts: Counter = Counter()
    statuses: Counter = Counter()
    deadline = _deadline(0.15)
    n = 0
    while time.monotonic() < deadline or n < 120:
        name = rng.choice(sorted(REQUESTS))
        path = name.split(" ")[0]
        value = REQUESTS[name] if rng.random() < 0.15 else mutate_json(REQUESTS[name], rng, rng.choice([1, 1, 2]))
        try:
            body = json.dumps(value).encode()
        except (ValueError, RecursionError):
            body = b"{"
        if rng.random() < 0.1:
            body = rng.choice([b"[" * 5000, b"{\"text\": \"\xff\"}", b'{"text": 1' + b"0" * 5000 + b"}", body[:-1]])
        raw = http_request(path, body, rng)
        status = _exchange(port, raw)
        # 501/505: http.server's own answers to an unknown method or HTTP version (the protocol's codes)
        assert status is None or status < 500 or status in (501, 505), f"{name}: HTTP {status} on {raw[:600]!r}"
        counts[name] += 1
        statuses["none" if status is None else f"{status // 100}xx"] += 1
        n += 1
        if n % 25 == 0:  # still serving
            assert _exchange(port, b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n") == 200
    assert _exchange(port, http_request("/generate", json.dumps(REQUESTS["/generate"]).encode(),
                                        random.Random(3))) in (200, 400, 408, 411, 413)
    err = capfd.readouterr().err
    with capfd.disabled():
        print("server requests fuzzed:", ", ".join(f"{k} {counts[k]}" for k in sorted(counts)),
              "| statuses:", dict(sorted(statuses.items())))
    assert statuses["2xx"] and statuses["4xx"]
    assert "Traceback" not in err, err[err.index("Traceback") - 300:][:3000]  # no handler crashed
