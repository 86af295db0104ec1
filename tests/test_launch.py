"""Launchers and server lifecycle: exact argv, health deadline, early exit, teardown, busy port, busy GPU.

Fake servers are small real Python programs (they start a grandchild, print lines, listen or not),
run through the same code path as SGLang: ``<python> -m sglang.launch_server ...`` with ``python``
pointing at the fake script.
"""

from __future__ import annotations

import json
import signal
import socket
import stat
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from helpers import no_hang

from draftlab.errors import DraftlabError
from draftlab import http_client
from draftlab.serving.launch import ServerSpec, check_gpus_free, running_server, server_fingerprint

GRANDCHILD_PIDS = "grandchild.pid"


def fake_server(tmp_path: Path, body: str) -> str:
    """An executable script standing in for the interpreter; it ignores its arguments."""
    path = tmp_path / "fake_server.py"
    path.write_text(f"#!{sys.executable}\n" + textwrap.dedent(body))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


SPAWN_GRANDCHILD = """
import subprocess, sys, time, os
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
open(os.environ["PID_FILE"], "w").write(str(child.pid))
"""


def _spec(tmp_path, script: str, **kw) -> ServerSpec:
    base = dict(backend="sglang", target="/models/t", python=script, check_gpus_free=False,
                health_interval_s=0.1, health_deadline_s=3.0, grace_s=2.0,
                env={"PID_FILE": str(tmp_path / GRANDCHILD_PIDS)})
    base.update(kw)
    return ServerSpec(**base)


def _assert_gone(*pids: int) -> None:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return
        time.sleep(0.05)
    raise AssertionError(f"processes still alive after teardown: {alive}")


# -- argv ------------------------------------------------------------------------------------------


def test_sglang_argv_matches_documented_flags():
    spec = ServerSpec(backend="sglang", target="/m/K2.5", drafter="/m/eagle3", num_steps=3, tp=8,
                      mem_fraction_static=0.85, cuda_graph_max_bs=32, host="127.0.0.1", port=30000,
                      python="python")
    assert spec.argv() == [
        "python", "-m", "sglang.launch_server", "--model-path", "/m/K2.5",
        "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "/m/eagle3",
        "--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4",
        "--tp-size", "8", "--mem-fraction-static", "0.85", "--cuda-graph-max-bs-decode", "32",
        "--host", "127.0.0.1", "--port", "30000",
    ]
    assert "--trust-remote-code" not in spec.argv()
    trusted = ServerSpec(backend="sglang", target="/m/K2.5", trust_remote_code=True, port=1, python="python")
    assert "--trust-remote-code" in trusted.argv()
    assert not any(a.startswith("--speculative") for a in trusted.argv())  # no drafter: plain


def test_sglang_speculative_numbers_all_or_none():
    free = ServerSpec(backend="sglang", target="t", drafter="d")
    assert not any(a in free.argv() for a in ("--speculative-num-steps", "--speculative-eagle-topk"))
    assert "--speculative-algorithm" in free.argv()
    with pytest.raises(DraftlabError, match="all three speculative numbers or none"):
        ServerSpec(backend="sglang", target="t", drafter="d", topk=1)
    with pytest.raises(DraftlabError, match="num_steps \\+ 1"):
        ServerSpec(backend="sglang", target="t", drafter="d", num_steps=3, topk=1, num_draft_tokens=6)
    tree = ServerSpec(backend="sglang", target="t", drafter="d", num_steps=3, topk=4, num_draft_tokens=8)
    argv = tree.argv()
    assert argv[argv.index("--speculative-eagle-topk") + 1] == "4"
    assert argv[argv.index("--speculative-num-draft-tokens") + 1] == "8"
    with pytest.raises(DraftlabError, match="no 'drafter'"):
        ServerSpec(backend="sglang", target="t", num_steps=3)


def test_cuda_graph_max_bs_is_refused_where_it_would_be_ignored():
    with pytest.raises(DraftlabError, match="'cuda_graph_max_bs': only the sglang and builtin backends"):
        ServerSpec(backend="vllm", target="t", cuda_graph_max_bs=16)


def test_cuda_graph_max_bs_reaches_the_builtin_server():
    argv = ServerSpec(backend="builtin", target="t", device="cuda", cuda_graph_max_bs=4).argv()
    assert argv[argv.index("--cuda-graph-max-bs") + 1] == "4"
    assert "--cuda-graph-max-bs" not in ServerSpec(backend="builtin", target="t").argv()
    from draftlab.cli import build_parser

    args = build_parser().parse_args(["serve", "--target", "t", "--cuda-graph-max-bs", "4"])
    assert args.cuda_graph_max_bs == 4


def test_vllm_argv_has_speculative_config_json():
    spec = ServerSpec(backend="vllm", target="/m/t", drafter="/m/d", num_steps=4, tp=8, port=8000)
    argv = spec.argv()
    assert argv[:5] == ["vllm", "serve", "/m/t", "--tensor-parallel-size", "8"]
    conf = json.loads(argv[argv.index("--speculative-config") + 1])
    assert conf == {"method": "eagle3", "model": "/m/d", "num_speculative_tokens": 4}
    assert argv[-4:] == ["--host", "127.0.0.1", "--port", "8000"]
    with pytest.raises(DraftlabError, match="num_steps"):
        ServerSpec(backend="vllm", target="t", drafter="d")


def test_builtin_argv_runs_draftlab_cli_with_this_python():
    spec = ServerSpec(backend="builtin", target="/m/t", drafter="/m/d", num_steps=2, dtype="bfloat16",
                      extra_args=("--threads", "1"))
    assert spec.argv() == [sys.executable, "-m", "draftlab.cli", "serve", "--target", "/m/t", "--drafter", "/m/d",
                           "--num-steps", "2", "--device", "cpu", "--dtype", "bfloat16",
                           "--host", "127.0.0.1", "--port", "0", "--threads", "1"]
    # a tree: SGLang's numbers under the builtin's flag names; beyond what the tree holds is refused
    tree = ServerSpec(backend="builtin", target="t", drafter="d", num_steps=2, topk=2, num_draft_tokens=5).argv()
    assert tree[tree.index("--num-steps"):tree.index("--device")] == [
        "--num-steps", "2", "--topk", "2", "--num-draft-tokens", "5"]
    with pytest.raises(DraftlabError, match="key 'num_draft_tokens': a tree of 2 steps x topk 2 verifies 2..7"):
        ServerSpec(backend="builtin", target="t", drafter="d", num_steps=2, topk=2, num_draft_tokens=8)


def test_from_dict_errors_name_the_key():
    with pytest.raises(DraftlabError, match="config.yaml: unknown key\\(s\\) 'tp_size'"):
        ServerSpec.from_dict({"backend": "sglang", "target": "t", "tp_size": 8}, source="config.yaml")
    with pytest.raises(DraftlabError, match="key 'num_steps': expected an integer"):
        ServerSpec.from_dict({"backend": "sglang", "target": "t", "drafter": "d", "num_steps": "3"})
    with pytest.raises(DraftlabError, match="key 'backend'"):
        ServerSpec.from_dict({"backend": "tgi", "target": "t"})
    with pytest.raises(DraftlabError, match="key 'target' is required"):
        ServerSpec.from_dict({"backend": "sglang"})
    spec = ServerSpec.from_dict({"backend": "sglang", "target": "t", "drafter": "d", "num_steps": 2,
                                 "extra_args": ["--dtype", "bfloat16"], "health_interval_s": 30, "health_tries": 60})
    assert spec.health_deadline_s == 1800 and spec.extra_args == ("--dtype", "bfloat16")


def test_a_written_description_reads_back_as_the_same_server():
    """The plan writes the description once (``to_dict``) and the launch reads it (``from_dict``): same
    server, same command; the printed command shows ``python`` where the interpreter is left to the launch."""
    spec = ServerSpec(backend="sglang", target="/m/t", drafter="/m/d", num_steps=3, topk=2, num_draft_tokens=6,
                      tp=8, mem_fraction_static=0.85, extra_args=("--x",), env={"A": "1"}, python="python",
                      health_interval_s=30, health_tries=60)
    written = json.loads(json.dumps(spec.to_dict()))
    assert ServerSpec.from_dict(written) == spec
    assert spec.command() == spec.argv() and spec.command()[0] == "python"
    builtin = ServerSpec(backend="builtin", target="/m/t")
    assert builtin.command()[0] == "python" and builtin.argv()[0] == sys.executable
    assert builtin.command()[1:] == builtin.argv()[1:]
    with pytest.raises(DraftlabError, match="plan: key 'extra_args': expected a list of strings"):
        ServerSpec.from_dict({**written, "extra_args": "--x"}, source="plan")


def test_fingerprint_ignores_host_port_deadlines_but_not_server_settings():
    a = ServerSpec(backend="sglang", target="t", drafter="d", num_steps=3, tp=8)
    same = ServerSpec(backend="sglang", target="t/", drafter="d", num_steps=3, tp=8, host="0.0.0.0", port=31000,
                      health_interval_s=30, health_deadline_s=1800)
    assert server_fingerprint(a) == server_fingerprint(same)
    for other in (
        ServerSpec(backend="sglang", target="t", drafter="d", num_steps=4, tp=8),
        ServerSpec(backend="sglang", target="t", drafter="d2", num_steps=3, tp=8),
        ServerSpec(backend="sglang", target="t", drafter="d", num_steps=3, tp=4),
        ServerSpec(backend="sglang", target="t", drafter="d", num_steps=3, tp=8, dtype="bfloat16"),
        ServerSpec(backend="vllm", target="t", drafter="d", num_steps=3, tp=8),
    ):
        assert server_fingerprint(other) != server_fingerprint(a)


# -- lifecycle -------------------------------------------------------------------------------------


def test_builtin_launch_serves_and_teardown_leaves_no_process(tmp_path):
    from draftlab.models.target import read_config
    from factories import tiny_drafter_config, write_drafter
    from tiny_models import tiny_target

    target = tiny_target(tmp_path / "t", tokenizer=False)
    drafter = write_drafter(tmp_path / "d", tiny_drafter_config(read_config(target)))
    spec = ServerSpec(backend="builtin", target=str(target), drafter=str(drafter), num_steps=2,
                      health_interval_s=0.2, health_deadline_s=120, extra_args=("--threads", "1"))
    log = tmp_path / "results" / "serve.log"
    with running_server(spec, log) as srv:
        assert srv.url.startswith("http://127.0.0.1:")
        proc = psutil.Process(srv.pid)
        group = [proc] + proc.children(recursive=True)
        answer = http_client.json_call(srv.url + "/generate", {"input_ids": [1, 2, 3],
                                                               "sampling_params": {"max_new_tokens": 4}}, 60)
        assert answer["meta_info"]["completion_tokens"] >= 1
    _assert_gone(*(p.pid for p in group))
    assert "draftlab-serve listening on" in log.read_text()


def test_never_healthy_hits_deadline_quotes_log_tail_and_kills_group(tmp_path):
    script = fake_server(tmp_path, SPAWN_GRANDCHILD + """
for i in range(80):
    print(f"loading shard {i}", flush=True)
time.sleep(300)
""")
    log = tmp_path / "results" / "sglang.log"
    # the event: the deadline's error while the server still sleeps (an exit would say "exited early")
    with no_hang(60, "a launch with a 2 s health deadline"), pytest.raises(DraftlabError) as err:
        with running_server(_spec(tmp_path, script, health_deadline_s=2.0), log):
            pytest.fail("must not become healthy")
    msg = str(err.value)
    assert "did not become healthy within 2s" in msg
    assert "loading shard 79" in msg and "loading shard 30" in msg and "loading shard 29\n" not in msg
    grandchild = int((tmp_path / GRANDCHILD_PIDS).read_text())
    _assert_gone(grandchild)


def test_process_exiting_early_fails_early(tmp_path):
    script = fake_server(tmp_path, """
import sys
print("RuntimeError: CUDA out of memory", flush=True)
sys.exit(3)
""")
    # noticed as an exit: waiting out the 600 s deadline would end in "did not become healthy" (or hang)
    with no_hang(60, "a launch whose server exited"), pytest.raises(
            DraftlabError, match="exited early with status 3(.|\\n)*CUDA out of memory"):
        with running_server(_spec(tmp_path, script, health_deadline_s=600), tmp_path / "x.log"):
            pass


HEALTHY = SPAWN_GRANDCHILD + """
import http.server, sys
port = int(sys.argv[sys.argv.index("--port") + 1])
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
    def log_message(self, *a): pass
print("ready", flush=True)
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def test_ctrl_c_inside_the_block_tears_down_the_group(tmp_path):
    script = fake_server(tmp_path, HEALTHY)
    with pytest.raises(KeyboardInterrupt):
        with running_server(_spec(tmp_path, script, health_deadline_s=30), tmp_path / "x.log") as srv:
            assert srv.url.startswith("http://127.0.0.1:")
            leader = srv.pid
            raise KeyboardInterrupt
    _assert_gone(leader, int((tmp_path / GRANDCHILD_PIDS).read_text()))


def test_server_ignoring_sigterm_is_killed_after_grace(tmp_path):
    script = fake_server(tmp_path, "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n" + HEALTHY)
    with no_hang(60, "teardown of a server ignoring SIGTERM"):
        with running_server(_spec(tmp_path, script, health_deadline_s=30, grace_s=1.0), tmp_path / "x.log") as srv:
            leader = srv.pid
    assert srv.proc.returncode == -signal.SIGKILL  # the event: SIGTERM ignored, SIGKILL after the grace
    _assert_gone(leader)


def test_port_held_by_foreign_listener_is_refused(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        log = tmp_path / "never.log"
        with pytest.raises(DraftlabError, match=f"port {port} on 127.0.0.1 is already held by .*did not start"):
            with running_server(_spec(tmp_path, "/bin/false", port=port), log):
                pass
        assert not log.exists()  # nothing was started


def _smi(apps: str):
    gpus = "0, GPU-aaa\n1, GPU-bbb\n2, GPU-ccc\n3, GPU-ddd\n"

    def run(args):
        return gpus if args[0].startswith("--query-gpu") else apps
    return run


def test_gpu_busy_check_lists_foreign_pids():
    spec = ServerSpec(backend="sglang", target="t", tp=2, env={"CUDA_VISIBLE_DEVICES": "2,3"})
    busy = _smi("4242, 70000 MiB, GPU-ddd\n777, 100 MiB, GPU-aaa\n")
    with pytest.raises(DraftlabError, match="pid 4242 holds 70000 MiB on GPU 3") as err:
        check_gpus_free(spec, busy, environ={})
    assert "777" not in str(err.value)  # GPU 0 is not one this launch uses
    check_gpus_free(spec, _smi("777, 100 MiB, GPU-aaa\n"), environ={})  # free: no error
    check_gpus_free(ServerSpec(backend="vllm", target="t", tp=1), _smi(""), environ={})
    with pytest.raises(DraftlabError, match="GPU 0"):
        check_gpus_free(ServerSpec(backend="vllm", target="t", tp=1), busy, environ={})
    with pytest.raises(DraftlabError, match="lists 2 GPU\\(s\\) but .* tp 4"):
        check_gpus_free(ServerSpec(backend="sglang", target="t", tp=4), busy, environ={"CUDA_VISIBLE_DEVICES": "0,1"})


def test_gpu_busy_refuses_before_starting_anything(tmp_path):
    spec = ServerSpec(backend="builtin", target="t", device="cuda:1")
    log = tmp_path / "never.log"
    with pytest.raises(DraftlabError, match="pid 99 holds"):
        with running_server(spec, log, nvidia_smi=_smi("99, 5 MiB, GPU-bbb\n")):
            pass
    assert not log.exists()


HEALTHY_ON_PORT = """
import http.server, sys
port = int(sys.argv[sys.argv.index("--port") + 1])
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", "2"); self.end_headers()
        self.wfile.write(b"ok")
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def test_health_probe_never_goes_through_a_proxy(tmp_path, monkeypatch):
    """A cluster node with http_proxy set: the probe of 127.0.0.1 must reach the server itself, not a
    proxy that swallows it (before: every launch waited out its deadline and failed)."""
    black_hole = socket.socket()
    black_hole.bind(("127.0.0.1", 0))
    black_hole.listen(16)  # accepts connections, never answers
    proxy = f"http://127.0.0.1:{black_hole.getsockname()[1]}"
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.setenv(var, proxy)
    for var in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(var, raising=False)
    script = fake_server(tmp_path, HEALTHY_ON_PORT)
    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    free = port.getsockname()[1]
    port.close()
    try:
        with running_server(_spec(tmp_path, script, port=free, health_deadline_s=20.0), tmp_path / "s.log") as srv:
            assert srv.url == f"http://127.0.0.1:{free}"
    finally:
        black_hole.close()
