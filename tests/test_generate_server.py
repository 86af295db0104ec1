"""generate-data through a server: a real builtin server on 127.0.0.1 (or a scripted OpenAI-shaped one for
failures), N requests in flight, answers stored by prompt id, killed runs resumed exactly."""

from __future__ import annotations

import fcntl
import json
import os
import random
import signal
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Callable

import pytest
from helpers import DRAFTLAB
from httpcall import ScriptedHTTPServer, call, send_json
from tiny_models import WORDS, tiny_target

from draftlab.errors import DraftlabError
from draftlab import http_client
from draftlab.serving.launch import ServerSpec, running_server
from draftlab.datagen import answerers
from draftlab.datagen.answer_shards import stored_ids
from draftlab.datagen.generate_data import generate

N_PROMPTS = 48
MAX_NEW = 24


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    return tiny_target(tmp_path_factory.mktemp("gen-server") / "target")


@pytest.fixture(scope="module")
def prompts(tmp_path_factory) -> Path:
    """Every format users bring, mixed: ShareGPT (with ids, a system turn, a trailing answer to drop),
    OpenAI messages, {"prompt"} and {"text"}."""
    rng = random.Random(3)
    rows = []
    for i in range(N_PROMPTS):
        words = " ".join(rng.choices(WORDS, k=4 + i % 5))
        kind = i % 4
        if kind == 0:
            rows.append({"id": f"sg-{i}", "conversations": [{"from": "system", "value": "be brief"},
                                                            {"from": "human", "value": words},
                                                            {"from": "gpt", "value": "an old answer, dropped"}]})
        elif kind == 1:
            rows.append({"messages": [{"role": "user", "content": words}]})
        elif kind == 2:
            rows.append({"prompt": words})
        else:
            rows.append({"text": words})
    path = tmp_path_factory.mktemp("gen-prompts") / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _spec(target: Path, **kw) -> dict:
    return {"backend": "builtin", "target": str(target), "device": "cpu", "port": 0, "max_batch_size": 8,
            "health_interval_s": 0.1, "health_deadline_s": 120.0, **kw}


@pytest.fixture(scope="module")
def server(target, tmp_path_factory):
    """One builtin server for the module (batching 8 requests), torn down at the end."""
    log = tmp_path_factory.mktemp("gen-server-log") / "server.log"
    with running_server(ServerSpec.from_dict(_spec(target)), log, progress=lambda m: None) as srv:
        yield srv.url


@pytest.fixture(scope="module")
def reference(target, prompts, tmp_path_factory) -> Path:
    """The uninterrupted answers: transformers in this process, one prompt at a time."""
    out = tmp_path_factory.mktemp("gen-ref") / "ref.jsonl"
    generate(target, prompts, out, max_new_tokens=MAX_NEW, progress=False)
    return out


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_server_answers_are_the_in_process_greedy_answers_in_prompt_order(server, target, prompts, reference, tmp_path):
    out, stats = tmp_path / "gen.jsonl", tmp_path / "stats.json"
    r = generate(target, prompts, out, url=server, concurrency=8, max_new_tokens=MAX_NEW, stats=stats,
                 progress=False)
    assert out.read_bytes() == reference.read_bytes()  # same chat template, same greedy tokens, same order
    rows = _rows(out)
    assert len(rows) == N_PROMPTS == r["answers"] == r["prompts"] and r["failed"] == 0
    # ShareGPT: the record's own id travels, the trailing answer is gone, the system turn stays
    assert rows[0]["id"] == "sg-0" and [m["role"] for m in rows[0]["messages"]] == ["system", "user", "assistant"]
    assert "an old answer" not in json.dumps(rows[0])
    assert [m["role"] for m in rows[1]["messages"]] == ["user", "assistant"] and "id" not in rows[1]
    written = json.loads(stats.read_text())
    assert written == r and r["generated_tokens"] > 0 and r["engine"] == "server" and r["concurrency"] == 8
    assert r["server"]["url"] == server and r["server"]["info"]["model_path"] == str(target)
    assert r["tokens_per_s"] > 0 and r["prompts_per_s"] > 0
    assert not (tmp_path / "gen.jsonl.parts").exists()  # the state folder goes once the file is written


def test_multi_turn_through_the_server_is_the_in_process_turn_by_turn_answer(server, target, tmp_path):
    rng = random.Random(5)
    rows = [{"messages": [m for t in range(1 + i % 3) for m in (
        {"role": "user", "content": " ".join(rng.choices(WORDS, k=4))},
        {"role": "assistant", "content": "the data's answer"})]} for i in range(9)]
    p = tmp_path / "multi.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    via = generate(target, p, tmp_path / "via.jsonl", url=server, concurrency=4, max_new_tokens=12, progress=False)
    here = generate(target, p, tmp_path / "here.jsonl", max_new_tokens=12, progress=False)
    assert (tmp_path / "via.jsonl").read_bytes() == (tmp_path / "here.jsonl").read_bytes()
    assert via["answered_turns"] == here["answered_turns"] == sum(1 + i % 3 for i in range(9))
    assert "the data's answer" not in (tmp_path / "via.jsonl").read_text()


def test_a_launched_server_is_torn_down_and_its_launch_is_recorded(target, prompts, reference, tmp_path):
    out = tmp_path / "gen.jsonl"
    r = generate(target, prompts, out, server=_spec(target), server_log=tmp_path / "server.log", concurrency=4,
                 max_new_tokens=MAX_NEW, limit=12, progress=False)
    assert _rows(out) == _rows(reference)[:12]
    srv = r["server"]
    assert srv["backend"] == "builtin" and srv["argv"][1:4] == ["-m", "draftlab.cli", "serve"]
    assert "--max-batch-size" in srv["argv"] and len(srv["fingerprint"]) == 16
    assert not _alive(srv["pid"]), "the server outlived the job"
    assert "draftlab-serve listening" in (tmp_path / "server.log").read_text()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(")")[-1].split()[0] != "Z"


def _cli(target, prompts, out, url, *extra) -> list[str]:
    return [*DRAFTLAB, "generate-data", "--target", str(target), "--prompts", str(prompts),
            "--out", str(out), "--url", url, "--concurrency", "4", "--max-new-tokens", str(MAX_NEW), *extra]


def test_sigkilled_runs_resume_with_nothing_lost_or_duplicated(server, target, prompts, reference, tmp_path):
    """Kill the job at random moments (after 1-6 new answers each time), then let it finish: the file is
    the uninterrupted one, no prompt was answered twice, and the last run only answered the rest."""
    out, state = tmp_path / "gen.jsonl", tmp_path / "state"
    rng = random.Random(11)
    # the launch's own key, as serve-launch hands it to its generate-data child: through the environment
    env = dict(os.environ, OMP_NUM_THREADS="1", DRAFTLAB_API_KEY=http_client.key_for(server))
    kills = 0
    while kills < 6:
        before = len(stored_ids(state))
        if before >= N_PROMPTS - 6:
            break
        want = before + rng.randint(1, 6)
        proc = subprocess.Popen(_cli(target, prompts, out, server, "--state-dir", str(state), "--no-progress"),
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            if len(stored_ids(state)) >= want:
                break
            time.sleep(0.005)
        assert proc.poll() is None, f"the run ended before it could be killed: {proc.stderr.read()[-2000:]}"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        kills += 1
        ids = stored_ids(state)
        assert len(ids) == len(set(ids)), f"a prompt was stored twice: {sorted(ids)}"
        assert not out.exists(), "a killed run left a final file"
    assert kills >= 5
    stored = len(stored_ids(state))
    done = subprocess.run(_cli(target, prompts, out, server, "--state-dir", str(state), "--json"), env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    r = json.loads(done.stdout)
    assert out.read_bytes() == reference.read_bytes()
    assert r["resumed_answers"] == stored and r["answered_now"] == N_PROMPTS - stored and r["answers"] == N_PROMPTS
    assert r["duplicate_lines"] == 0
    assert "resuming" in done.stderr and not state.exists()


def test_a_torn_last_line_is_answered_again(server, target, prompts, reference, tmp_path):
    """A run stored two answers and was killed in the middle of writing the third line."""
    from draftlab.datagen.answer_shards import AnswerShards
    from draftlab.datagen.answerers import Sampling
    from draftlab.datagen.generate_data import _identity
    from draftlab.formats.prompt_file import iter_prompts

    out, state = tmp_path / "gen.jsonl", tmp_path / "state"
    ref, plist = _rows(reference), list(iter_prompts(prompts))
    with AnswerShards(state, _identity(target, None, str(target), Sampling(MAX_NEW), False, "all")) as shards:
        for p in plist[:2]:
            shards.append(p.id, p.digest, ref[p.id], 1, 1, "stop")
    with open(state / "shard-00000.jsonl", "ab") as fh:
        fh.write(b'{"id": 2, "digest": "' + plist[2].digest.encode() + b'", "row": {"messa')
    r = generate(target, prompts, out, url=server, max_new_tokens=MAX_NEW, state_dir=state, progress=False)
    assert out.read_bytes() == reference.read_bytes()
    assert r["resumed_answers"] == 2 and r["torn_lines"] == 1 and r["answered_now"] == N_PROMPTS - 2


# --- a scripted OpenAI-shaped server: failures on demand ------------------------------------------------


class Scripted(BaseHTTPRequestHandler):
    """/v1/models and /v1/chat/completions answering ``echo: <content>``; content decides failures:
    ALWAYS -> 500 every time, FLAKY -> 503 twice then fine, LONG -> 400 (the server's context refusal).
    Answers no server can give: OVERBUDGET (a million completion tokens), NEGATIVE (prompt_tokens -5),
    SHAPE (``choices`` an object), ENDLESS (a body without a length that never ends)."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def _send(self, status, obj):
        send_json(self, status, obj)

    def do_GET(self):
        self._send(200, {"object": "list", "data": [{"id": "scripted", "object": "model"}]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        content = body["messages"][-1]["content"]
        srv = self.server
        with srv.lock:
            srv.bodies.append(body)
            srv.seen[content] = srv.seen.get(content, 0) + 1
            n = srv.seen[content]
        if srv.healed is False and "ALWAYS" in content:
            return self._send(500, {"message": "internal error"})
        if "FLAKY" in content and n <= 2:
            return self._send(503, {"message": "busy"})
        if srv.healed is False and "LONG" in content:
            return self._send(400, {"message": "The input (9999 tokens) is longer than the model's context length"})
        if "ENDLESS" in content:
            return self._endless()
        usage = {"prompt_tokens": -5 if "NEGATIVE" in content else 3,
                 "completion_tokens": 10**6 if "OVERBUDGET" in content else 2, "total_tokens": 5}
        choice = {"index": 0, "message": {"role": "assistant", "content": f"echo: {content}"}, "finish_reason": "stop"}
        self._send(200, {"id": "c", "object": "chat.completion", "created": 0, "model": body["model"],
                         "choices": choice if "SHAPE" in content else [choice], "usage": usage})

    def _endless(self):
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.close_connection = True
        try:
            self.wfile.write(b'{"choices": [{"message": {"content": "')
            while True:
                self.wfile.write(b"a" * 65536)
        except OSError:
            pass


@pytest.fixture
def scripted():
    httpd = ScriptedHTTPServer(("127.0.0.1", 0), Scripted)
    httpd.daemon_threads = True
    httpd.seen, httpd.lock, httpd.healed, httpd.bodies = {}, threading.Lock(), False, []
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def _scripted_prompts(tmp_path: Path, n: int = 20) -> Path:
    texts = [f"prompt {i}" for i in range(n)]
    texts[3], texts[7], texts[11] = "ALWAYS fails", "FLAKY at first", "LONG beyond the context"
    path = tmp_path / "p.txt"
    path.write_text("\n".join(texts) + "\n")
    return path


def test_failing_prompts_are_retried_then_listed_and_the_run_goes_on(scripted, target, tmp_path, monkeypatch):
    monkeypatch.setattr(answerers, "BACKOFF_S", (0.01,))
    url = f"http://127.0.0.1:{scripted.server_address[1]}"
    p, out, stats = _scripted_prompts(tmp_path), tmp_path / "gen.jsonl", tmp_path / "stats.json"
    r = generate(target, p, out, url=url, retries=2, concurrency=4, max_failed_fraction=0.2, stats=stats,
                 progress=False)
    rows = _rows(out)
    assert len(rows) == 18 and r["answers"] == 18 and r["failed"] == 2
    assert [row["messages"][0]["content"] for row in rows][:4] == ["prompt 0", "prompt 1", "prompt 2", "prompt 4"]
    fails = {f["id"]: f for f in r["failures"]}
    assert fails[3]["attempts"] == 3 and "HTTP 500" in fails[3]["error"]  # retried twice, then listed
    assert fails[11]["attempts"] == 1 and "context length" in fails[11]["error"]  # a 400 is not retried
    assert scripted.seen["FLAKY at first"] == 3 and 7 not in fails  # two 503s, then answered
    assert json.loads(stats.read_text())["failures"] == r["failures"]


def test_lying_or_endless_answers_fail_their_prompt_and_are_never_counted(scripted, target, tmp_path):
    url = f"http://127.0.0.1:{scripted.server_address[1]}"
    p, out = tmp_path / "p.txt", tmp_path / "gen.jsonl"
    p.write_text("prompt 0\nOVERBUDGET answer\nNEGATIVE count\nENDLESS answer\nSHAPE wrong\nprompt 5\n")
    r = generate(target, p, out, url=url, retries=0, max_failed_fraction=0.9, max_new_tokens=16, progress=False)
    fails = {f["id"]: f["error"] for f in r["failures"]}
    assert sorted(fails) == [1, 2, 3, 4], fails
    assert "usage.completion_tokens 1000000 is above the max_completion_tokens 16" in fails[1]
    assert "usage.prompt_tokens is -5; a token count cannot be negative" in fails[2]
    assert f"{url}/v1/chat/completions: response body larger than the cap of 16 MiB" in fails[3]
    assert "field 'choices': expected a list, got {" in fails[4]
    assert r["answers"] == 2 and r["generated_tokens"] == 4 and r["prompt_tokens"] == 6  # the honest two only
    assert [row["messages"][0]["content"] for row in _rows(out)] == ["prompt 0", "prompt 5"]


def test_multi_turn_prompts_are_answered_turn_by_turn_and_a_failed_turn_fails_its_prompt(scripted, target, tmp_path,
                                                                                         monkeypatch):
    monkeypatch.setattr(answerers, "BACKOFF_S", (0.01,))
    url = f"http://127.0.0.1:{scripted.server_address[1]}"
    p = tmp_path / "multi.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in [
        {"conversations": [{"from": "system", "value": "be brief"}, {"from": "human", "value": "first question"},
                           {"from": "gpt", "value": "the data's old answer"}, {"from": "human", "value": "second"}]},
        {"messages": [{"role": "user", "content": "fine turn"}, {"role": "assistant", "content": "old"},
                      {"role": "user", "content": "ALWAYS fails"}]},
    ]))
    r = generate(target, p, tmp_path / "all.jsonl", url=url, retries=1, max_failed_fraction=0.5, progress=False)
    rows = _rows(tmp_path / "all.jsonl")
    assert len(rows) == 1 and r["answered_turns"] == 2 and r["turns"] == "all"
    assert rows[0]["messages"] == [
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "first question"},
        {"role": "assistant", "content": "echo: first question"}, {"role": "user", "content": "second"},
        {"role": "assistant", "content": "echo: second"}]
    # the second turn was asked with the target's own first answer in its context, not the data's
    assert rows[0]["messages"][:4] in [b["messages"] for b in scripted.bodies]
    assert not any("old answer" in json.dumps(b) for b in scripted.bodies)
    assert r["failed"] == 1 and r["failures"][0]["id"] == 1
    assert r["failures"][0]["error"].startswith("turn 2 of 2: ") and "HTTP 500" in r["failures"][0]["error"]

    # turns "last": one request per prompt, after the data's own earlier answer
    scripted.bodies.clear()
    r = generate(target, p, tmp_path / "last.jsonl", url=url, turns="last", limit=1, progress=False)
    assert [b["messages"][2]["content"] for b in scripted.bodies] == ["the data's old answer"]
    assert _rows(tmp_path / "last.jsonl")[0]["messages"][-1] == {"role": "assistant", "content": "echo: second"}
    assert r["answered_turns"] == 1


def test_too_many_failures_fail_the_job_and_a_rerun_asks_only_for_the_rest(scripted, target, tmp_path, monkeypatch):
    monkeypatch.setattr(answerers, "BACKOFF_S", (0.01,))
    url = f"http://127.0.0.1:{scripted.server_address[1]}"
    p, out, stats, state = _scripted_prompts(tmp_path), tmp_path / "gen.jsonl", tmp_path / "s.json", tmp_path / "st"
    with pytest.raises(DraftlabError, match=r"3 of 20 prompts failed \(retried up to 1 times\), more than "
                                            r"--max-failed-fraction 0.05 allows \(first: prompt 3: .*HTTP 500"):
        generate(target, p, out, url=url, retries=1, state_dir=state, stats=stats, progress=False)
    assert not out.exists() and json.loads(stats.read_text())["failed"] == 3 and state.is_dir()
    asked = dict(scripted.seen)
    scripted.healed = True
    r = generate(target, p, out, url=url, retries=1, state_dir=state, stats=stats, progress=False)
    assert r["answers"] == 20 and r["resumed_answers"] == 17 and r["answered_now"] == 3
    again = {k: v - asked.get(k, 0) for k, v in scripted.seen.items() if v != asked.get(k, 0)}
    assert again == {"ALWAYS fails": 1, "FLAKY at first": 1, "LONG beyond the context": 1}


def test_a_server_that_goes_away_stops_the_run_and_a_rerun_resumes(target, prompts, reference, tmp_path):
    """The launched server dies mid-run: the job stops with one error instead of failing every prompt."""
    spec = ServerSpec.from_dict(_spec(target))
    out, state = tmp_path / "gen.jsonl", tmp_path / "state"
    with running_server(spec, tmp_path / "s1.log", progress=lambda m: None) as srv:
        killer = threading.Thread(target=_kill_when, args=(lambda: len(stored_ids(state)) >= 10, srv.pid),
                                  daemon=True)
        killer.start()
        with pytest.raises(DraftlabError, match="stopped answering"):
            generate(target, prompts, out, url=srv.url, concurrency=4, retries=1, max_new_tokens=MAX_NEW,
                     state_dir=state, progress=False)
    kept = stored_ids(state)
    assert len(kept) >= 10 and len(kept) == len(set(kept)) and not out.exists()
    with running_server(spec, tmp_path / "s2.log", progress=lambda m: None) as srv:
        r = generate(target, prompts, out, url=srv.url, concurrency=4, max_new_tokens=MAX_NEW, state_dir=state,
                     progress=False)
    assert out.read_bytes() == reference.read_bytes() and r["resumed_answers"] == len(kept)


def test_several_servers_share_the_prompts_and_one_dying_leaves_the_rest(server, target, prompts, reference,
                                                                        tmp_path, monkeypatch):
    """Two servers of one model: requests go to the one with fewer in flight; when one dies mid-run its
    requests are retried on the other and the run ends complete."""
    monkeypatch.setattr(answerers, "BACKOFF_S", (0.01,))
    out, state = tmp_path / "gen.jsonl", tmp_path / "state"
    before = call(server + "/get_server_info")[1]["internal_states"][0]["num_requests"]
    with running_server(ServerSpec.from_dict(_spec(target)), tmp_path / "b.log", progress=lambda m: None) as b:
        # B dies mid-run once it has answered a few itself (on a loaded host a cold B can be slower than A
        # to answer its first: killed by a count of stored answers alone, it had once answered none)
        stored_at_kill: list[int] = []

        def b_has_served():
            n = len(stored_ids(state))
            if n >= 12 and _answered(b.url) >= 3:
                stored_at_kill.append(n)
                return True
            return False

        killer = threading.Thread(target=_kill_when, args=(b_has_served, b.pid), daemon=True)
        killer.start()
        r = generate(target, prompts, out, url=[server, b.url], concurrency=3, retries=2, max_new_tokens=MAX_NEW,
                     state_dir=state, progress=False)
        killer.join()
    assert stored_at_kill and stored_at_kill[0] < N_PROMPTS  # B died with prompts still to answer
    assert out.read_bytes() == reference.read_bytes() and r["failed"] == 0 and r["concurrency"] == 6
    served_by_a = call(server + "/get_server_info")[1]["internal_states"][0]["num_requests"] - before
    assert 0 < served_by_a < N_PROMPTS  # both answered some: B its share until it died, A the rest
    assert r["server"]["urls"] == [server, b.url]


def _kill_when(ready: Callable[[], bool], pid: int) -> None:
    """SIGKILL the server's process group as soon as ``ready()`` (polled) holds."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if ready():
            os.killpg(pid, signal.SIGKILL)
            return
        time.sleep(0.005)


def _answered(url: str) -> int:
    """Requests the server at ``url`` has answered (its /get_server_info count)."""
    return call(url + "/get_server_info")[1]["internal_states"][0]["num_requests"]


# --- the state folder ----------------------------------------------------------------------------------


def test_state_of_other_settings_is_moved_aside_and_foreign_folders_are_refused(server, target, prompts, tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    (state / "notes.txt").write_text("mine")
    with pytest.raises(DraftlabError, match="not a generate-data state folder"):
        generate(target, prompts, tmp_path / "a.jsonl", url=server, state_dir=state, progress=False)
    assert (state / "notes.txt").read_text() == "mine"  # nothing of the user's is touched

    state2 = tmp_path / "state2"
    from draftlab.datagen.answer_shards import AnswerShards

    with AnswerShards(state2, {"max_new_tokens": 999}) as shards:
        shards.append(0, "0" * 16, {"messages": []}, 1, 1, "stop")
    r = generate(target, prompts, tmp_path / "b.jsonl", url=server, max_new_tokens=8, limit=3, state_dir=state2,
                 progress=False)
    assert r["resumed_answers"] == 0 and r["answers"] == 3
    aside = list(tmp_path.glob("state2.stale-*"))
    assert len(aside) == 1 and (aside[0] / "shard-00000.jsonl").is_file()  # moved, never deleted

    state3 = tmp_path / "state3"
    state3.mkdir()
    with open(state3 / ".lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(DraftlabError, match="another generate-data run is writing here"):
            generate(target, prompts, tmp_path / "c.jsonl", url=server, state_dir=state3, progress=False)


# --- the builtin server's chat endpoint and the command line ---------------------------------------------


def test_builtin_chat_endpoint_refuses_what_it_cannot_do(server):
    msgs = [{"role": "user", "content": "the quick brown fox"}]
    ok, body = call(server + "/v1/chat/completions", {"messages": msgs, "max_tokens": 4})
    assert ok == 200 and body["object"] == "chat.completion" and body["usage"]["completion_tokens"] >= 1
    assert body["choices"][0]["message"]["role"] == "assistant" and body["choices"][0]["finish_reason"] in ("stop", "length")
    # issue 40: a stream is served now (tests/test_streaming.py); what it cannot honour is refused instead
    for payload, phrase in [({"messages": msgs, "stream": True, "stream_options": {"usage_every": 2}},
                             "stream_options.usage_every"),
                            ({"messages": msgs, "logprobs": True}, "logprobs"),
                            ({"messages": msgs, "temperature": 0.7}, "greedily"),
                            ({"messages": []}, "messages"),
                            ({"messages": [{"role": "user", "content": "fox " * 400}]}, "context length")]:
        status, err = call(server + "/v1/chat/completions", payload)
        assert status == 400 and phrase in err["message"], (payload, err)


def test_cli_checks_the_launch_command_against_the_spec(target, prompts, tmp_path):
    spec = tmp_path / "server.json"
    spec.write_text(json.dumps(_spec(target)))
    base = [*DRAFTLAB, "generate-data", "--target", str(target), "--prompts", str(prompts),
            "--out", str(tmp_path / "o.jsonl")]
    wrong = subprocess.run(base + ["--server", str(spec), "--", "python", "-m", "draftlab.cli", "serve", "--target", "x"],
                           capture_output=True, text=True, timeout=120)
    assert wrong.returncode == 2 and "differs from the server config" in wrong.stderr
    orphan = subprocess.run(base + ["--", "python", "-m", "sglang.launch_server"], capture_output=True, text=True,
                            timeout=120)
    assert orphan.returncode == 2 and "needs --server" in orphan.stderr
    sampled = subprocess.run(base + ["--server", str(spec), "--temperature", "0.8"], capture_output=True, text=True,
                             timeout=120)
    assert sampled.returncode == 2 and "decodes greedily only" in sampled.stderr
    assert not (tmp_path / "o.jsonl").exists()
