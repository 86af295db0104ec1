"""acquire / fetch-config through real huggingface_hub code against a pre-populated HF cache (offline).

publish_to_cache is checked against huggingface_hub's own cache readers first, so every later test
exercises the same code path a user's real cache would.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from factories import tiny_drafter_config, write_drafter, write_target_config
from helpers import cli_process

from draftlab.models.acquire import acquire, fetch_config
from draftlab.errors import DraftlabError
from draftlab.fsutil import MARKER
from draftlab.hf_cache import publish_to_cache

REPO = "draftlab-demo/drafter-v1"
CANARY = "hf_CANARYtokenDoNotLeak0123456789"


@pytest.fixture
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture
def repo_folder(tmp_path) -> Path:
    """A drafter repo as it might sit on the Hub: plus files acquire must NOT take."""
    folder = write_drafter(tmp_path / "repo")
    (folder / "README.md").write_text("# a drafter\n")
    (folder / "training_state.pt").write_bytes(b"\x80\x04not really a pickle")
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x04nor this")
    return folder


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_published_cache_is_read_by_real_huggingface_hub(tmp_path, repo_folder, offline):
    from huggingface_hub import hf_hub_download, scan_cache_dir, snapshot_download, try_to_load_from_cache

    cache = tmp_path / "cache"
    commit = publish_to_cache(repo_folder, REPO, cache)
    assert publish_to_cache(repo_folder, REPO, cache) == commit  # deterministic, idempotent
    assert publish_to_cache(repo_folder, REPO, tmp_path / "other") == commit  # content decides the commit
    cached = try_to_load_from_cache(REPO, "config.json", cache_dir=cache)
    assert cached and Path(cached).read_bytes() == (repo_folder / "config.json").read_bytes()
    report = scan_cache_dir(cache)
    assert report.warnings == []
    (repo,) = report.repos
    (rev,) = repo.revisions
    assert repo.repo_id == REPO and rev.commit_hash == commit and rev.refs == frozenset({"main"})
    assert {f.file_name for f in rev.files} == {p.name for p in repo_folder.iterdir()}
    snap = Path(snapshot_download(REPO, cache_dir=cache, local_files_only=True))
    assert snap.name == commit
    weights = hf_hub_download(REPO, "model.safetensors", revision=commit, cache_dir=cache, local_files_only=True)
    assert _sha256(Path(weights)) == _sha256(repo_folder / "model.safetensors")
    # a changed file publishes a new commit; refs/main moves, the old snapshot stays
    (repo_folder / "README.md").write_text("# changed\n")
    assert publish_to_cache(repo_folder, REPO, cache) != commit
    assert len(next(iter(scan_cache_dir(cache).repos)).revisions) == 2


def test_acquire_from_hf_cache_takes_only_config_and_safetensors(tmp_path, repo_folder, offline):
    cache = tmp_path / "cache"
    commit = publish_to_cache(repo_folder, REPO, cache)
    out = tmp_path / "acquired"
    record = acquire(f"hf:{REPO}", out, cache_dir=cache)
    assert sorted(p.name for p in out.iterdir() if p.name != MARKER) == ["acquire.json", "config.json", "model.safetensors"]
    on_disk = json.loads((out / "acquire.json").read_text())
    assert on_disk["source"] == f"hf:{REPO}" and on_disk["repo_id"] == REPO
    assert on_disk["requested_revision"] is None and on_disk["resolved_commit"] == commit
    files = {f["name"]: f for f in on_disk["files"]}
    assert files["model.safetensors"]["sha256"] == _sha256(repo_folder / "model.safetensors")
    assert files["model.safetensors"]["size"] == (repo_folder / "model.safetensors").stat().st_size
    assert "sha256" not in files["config.json"]
    assert record["skipped"] is False
    # linked from the cache blob, not copied
    blob = (cache / f"models--{REPO.replace('/', '--')}" / "snapshots" / commit / "model.safetensors").resolve()
    assert os.path.samefile(out / "model.safetensors", blob)


def test_acquire_skips_what_is_present(tmp_path, repo_folder, offline):
    cache = tmp_path / "cache"
    publish_to_cache(repo_folder, REPO, cache)
    out = tmp_path / "acquired"
    acquire(f"hf:{REPO}", out, cache_dir=cache)
    stamps = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    again = acquire(f"hf:{REPO}", out, cache_dir=cache)
    assert again["skipped"] is True
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == stamps


def test_revision_is_pinned_and_resolved(tmp_path, offline):
    cache = tmp_path / "cache"
    v1 = write_drafter(tmp_path / "v1", seed=1)
    v1_commit = publish_to_cache(v1, REPO, cache, revision_name="v1.0")
    publish_to_cache(v1, REPO, cache)  # main == v1 for now
    v2 = write_drafter(tmp_path / "v2", cfg=tiny_drafter_config(max_position_embeddings=2048), seed=2)
    v2_commit = publish_to_cache(v2, REPO, cache)  # main moves on
    assert v1_commit != v2_commit
    main = acquire(f"hf:{REPO}", tmp_path / "main", cache_dir=cache)
    assert main["resolved_commit"] == v2_commit
    tag = acquire(f"hf:{REPO}", tmp_path / "tag", revision="v1.0", cache_dir=cache)
    assert (tag["requested_revision"], tag["resolved_commit"]) == ("v1.0", v1_commit)
    assert _sha256(tmp_path / "tag" / "model.safetensors") == _sha256(v1 / "model.safetensors")
    pinned = acquire(f"hf:{REPO}@{v1_commit}", tmp_path / "pinned", cache_dir=cache)
    assert pinned["resolved_commit"] == v1_commit
    # re-acquiring into the same folder at another revision replaces it
    acquire(f"hf:{REPO}", tmp_path / "tag", cache_dir=cache)
    assert json.loads((tmp_path / "tag" / "acquire.json").read_text())["resolved_commit"] == v2_commit
    with pytest.raises(DraftlabError, match="contradicts"):
        acquire(f"hf:{REPO}@v1.0", tmp_path / "x", revision="main", cache_dir=cache)


def test_local_folder_is_accepted(tmp_path, repo_folder):
    out = tmp_path / "acquired"
    record = acquire(str(repo_folder), out)
    assert record["repo_id"] is None and record["resolved_commit"] is None
    assert sorted(p.name for p in out.iterdir() if p.name != MARKER) == ["acquire.json", "config.json", "model.safetensors"]
    assert os.path.samefile(out / "model.safetensors", repo_folder / "model.safetensors")
    with pytest.raises(DraftlabError, match="--revision applies to hf:ORG/NAME sources only"):
        acquire(str(repo_folder), tmp_path / "x", revision="main")


@pytest.mark.parametrize("case", ["no-repo", "no-revision", "incomplete", "no-config", "truncated", "no-folder"])
def test_bad_sources_fail_clearly_and_leave_nothing(tmp_path, repo_folder, offline, case):
    cache = tmp_path / "cache"
    source = f"hf:{REPO}"
    if case == "no-repo":
        source, expected = "hf:draftlab-demo/nope", "hf:draftlab-demo/nope: config.json \\+ \\*.safetensors is not in the local HF cache"
    elif case == "no-revision":
        publish_to_cache(repo_folder, REPO, cache)
        source, expected = f"hf:{REPO}@v9", "not in the local HF cache and HF_HUB_OFFLINE is set"
    elif case == "incomplete":
        commit = publish_to_cache(repo_folder, REPO, cache)
        (cache / f"models--{REPO.replace('/', '--')}" / "snapshots" / commit / "model.safetensors").unlink()
        expected = "cached snapshot is incomplete"
    elif case == "no-config":
        (repo_folder / "config.json").unlink()
        publish_to_cache(repo_folder, REPO, cache)
        expected = "no config.json"
    elif case == "truncated":
        data = (repo_folder / "model.safetensors").read_bytes()
        (repo_folder / "model.safetensors").write_bytes(data[:4000])
        publish_to_cache(repo_folder, REPO, cache)
        expected = "beyond the data region"
    else:
        source, expected = str(tmp_path / "missing"), "no such folder"
    out = tmp_path / "acquired"
    with pytest.raises(DraftlabError, match=expected):
        acquire(source, out, cache_dir=cache)
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".acquired")]


def test_fetch_config_needs_only_the_config(tmp_path, offline):
    target = write_target_config(tmp_path / "target", max_position_embeddings=4096)
    cache = tmp_path / "cache"
    commit = publish_to_cache(target, "draftlab-demo/target-v2", cache)  # no weights anywhere
    out = tmp_path / "cfg" / "config.json"
    info = fetch_config("hf:draftlab-demo/target-v2@main", out, cache_dir=cache)
    assert json.loads(out.read_text()) == json.loads((target / "config.json").read_text())
    assert info["resolved_commit"] == commit and info["requested_revision"] == "main"
    assert fetch_config(str(target), tmp_path / "local.json")["resolved_commit"] is None
    with pytest.raises(DraftlabError, match="not in the local HF cache"):
        fetch_config("hf:draftlab-demo/target-v9", tmp_path / "none.json", cache_dir=cache)
    assert not (tmp_path / "none.json").exists()


def test_cli_never_writes_the_token(tmp_path, repo_folder):
    """A canary token in every place huggingface_hub reads one; it must appear in no output or log."""
    hf_home = tmp_path / "hf_home"
    commit = publish_to_cache(repo_folder, REPO, hf_home / "hub")
    (hf_home / "token").write_text(CANARY)
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1", "HF_TOKEN": CANARY}
    env.pop("HF_HUB_CACHE", None)
    logs = tmp_path / "logs"
    logs.mkdir()
    runs = [
        ["acquire", f"hf:{REPO}", "--out", str(tmp_path / "out"), "--json", "--summary", str(tmp_path / "acquire.md")],
        ["acquire", f"hf:{REPO}", "--out", str(tmp_path / "out"), "--summary", str(tmp_path / "again.md")],
        ["fetch-config", f"hf:{REPO}", "--out", str(tmp_path / "cfg.json"), "--json"],
        ["inspect", f"hf:{REPO}", "--json"],
        ["acquire", "hf:draftlab-demo/missing", "--out", str(tmp_path / "missing")],
    ]
    codes = []
    for i, args in enumerate(runs):
        proc = cli_process(*args, env=env)
        (logs / f"{i}.log").write_text(proc.stdout + proc.stderr)
        codes.append(proc.returncode)
    assert codes == [0, 0, 0, 0, 2]
    assert json.loads((tmp_path / "out" / "acquire.json").read_text())["resolved_commit"] == commit
    leaks = [
        str(p) for p in tmp_path.rglob("*")
        if p.is_file() and not p.is_relative_to(hf_home) and CANARY.encode() in p.read_bytes()
    ]
    assert leaks == []
    assert "already present, skipped" in (tmp_path / "again.md").read_text()


# ------------------------------------------------------------------------------ online path, real HTTP


class _FakeHub:
    """The slice of the Hub HTTP API huggingface_hub uses here, served from local folders on 127.0.0.1.

    Endpoints: repo info (``/api/models/R/revision/REV``), tree listing, and ``/R/resolve/REV/FILE``
    (HEAD + GET with Range, the headers hf_hub_download reads). Every request is logged with its
    Authorization header and Range so tests can see what was fetched and that the token was sent.
    """

    def __init__(self, repos: dict[str, Path]):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        from draftlab.hf_cache import git_blob_sha1

        self.log: list[dict] = []
        self.files: dict[str, dict[str, dict]] = {}
        self.commits: dict[str, str] = {}
        for repo, folder in repos.items():
            entries = {}
            for p in sorted(folder.iterdir()):
                data = p.read_bytes()
                lfs = p.suffix in (".safetensors", ".bin", ".pt")
                entries[p.name] = {"data": data, "oid": git_blob_sha1(data),
                                   "sha256": hashlib.sha256(data).hexdigest() if lfs else None}
            self.files[repo] = entries
            self.commits[repo] = hashlib.sha1(repo.encode() + b"".join(e["oid"].encode() for e in entries.values())).hexdigest()
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep pytest output clean
                pass

            def do_HEAD(self):
                self._serve(body=False)

            def do_GET(self):
                self._serve(body=True)

            def _send(self, status, headers, payload=b"", body=True):
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                if body:
                    self.wfile.write(payload)

            def _error(self, code, body):
                self._send(404, {"X-Error-Code": code, "Content-Type": "application/json"}, b'{"error": "%s"}' % code.encode(), body)

            def _serve(self, body):
                from urllib.parse import unquote, urlparse

                path = unquote(urlparse(self.path).path)
                hub.log.append({"method": self.command, "path": path, "auth": self.headers.get("Authorization"),
                                "range": self.headers.get("Range")})
                parts = path.strip("/").split("/")
                if parts[:2] == ["api", "models"]:
                    repo, kind, rev = "/".join(parts[2:4]), parts[4], parts[5]
                    if repo not in hub.files:
                        return self._error("RepoNotFound", body)
                    if rev not in ("main", hub.commits[repo]):
                        return self._error("RevisionNotFound", body)
                    commit = hub.commits[repo]
                    if kind == "revision":
                        doc = {"id": repo, "sha": commit, "siblings": [{"rfilename": f} for f in hub.files[repo]]}
                    else:
                        doc = [
                            {"type": "file", "path": f, "size": len(e["data"]), "oid": e["oid"],
                             **({"lfs": {"oid": e["sha256"], "size": len(e["data"]), "pointerSize": 130}} if e["sha256"] else {})}
                            for f, e in hub.files[repo].items()
                        ]
                    return self._send(200, {"Content-Type": "application/json"}, json.dumps(doc).encode(), body)
                repo, rev, name = "/".join(parts[:2]), parts[3], "/".join(parts[4:])
                if repo not in hub.files:
                    return self._error("RepoNotFound", body)
                if rev not in ("main", hub.commits[repo]):
                    return self._error("RevisionNotFound", body)
                entry = hub.files[repo].get(name)
                if entry is None:
                    return self._error("EntryNotFound", body)
                data, status, extra = entry["data"], 200, {}
                rng = self.headers.get("Range")
                if rng and body:
                    start, _, end = rng.split("=")[1].partition("-")
                    end_i = min(int(end) if end else len(data) - 1, len(data) - 1)
                    extra["Content-Range"] = f"bytes {start}-{end_i}/{len(data)}"
                    data, status = data[int(start): end_i + 1], 206
                headers = {"X-Repo-Commit": hub.commits[repo], "ETag": f'"{entry["oid"]}"', "Accept-Ranges": "bytes", **extra}
                if entry["sha256"]:
                    headers["X-Linked-Etag"] = f'"{entry["sha256"]}"'
                    headers["X-Linked-Size"] = str(len(entry["data"]))
                if not body:  # HEAD: announce the full size without sending it
                    self.send_response(200)
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.send_header("Content-Length", str(len(entry["data"])))
                    self.end_headers()
                    return
                self._send(status, headers, data, body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    def weight_bytes_sent(self, repo: str) -> list:
        return [r for r in self.log if r["path"].endswith(".safetensors") and r["method"] == "GET" and r["path"].startswith(f"/{repo}/")]


@pytest.fixture
def fake_hub(repo_folder):
    hub = _FakeHub({REPO: repo_folder})
    yield hub
    hub.close()


def _online_env(tmp_path, hub) -> dict:
    env = {k: v for k, v in os.environ.items() if "PROXY" not in k.upper() and k not in ("HF_HUB_OFFLINE", "HF_HUB_CACHE")}
    return {**env, "HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf_home"), "HF_TOKEN": CANARY,
            "NO_PROXY": "127.0.0.1,localhost", "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_ETAG_TIMEOUT": "5"}


def test_online_inspect_reads_headers_without_downloading_weights(tmp_path, fake_hub, repo_folder):
    env = _online_env(tmp_path, fake_hub)
    proc = cli_process("inspect", f"hf:{REPO}", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    from draftlab.static.inspect import inspect_checkpoint

    assert json.loads(proc.stdout) == inspect_checkpoint(repo_folder)
    weight_gets = fake_hub.weight_bytes_sent(REPO)
    assert weight_gets and all(r["range"] and r["range"].startswith("bytes=") for r in weight_gets)
    assert not list((tmp_path / "hf_home").rglob("*.safetensors"))  # nothing but config.json was cached
    assert all(r["auth"] == f"Bearer {CANARY}" for r in fake_hub.log)  # the token is used...
    assert CANARY not in proc.stdout + proc.stderr  # ...and never shown


def test_online_acquire_downloads_only_config_and_safetensors(tmp_path, fake_hub, repo_folder):
    env = _online_env(tmp_path, fake_hub)
    out = tmp_path / "acquired"
    proc = cli_process("acquire", f"hf:{REPO}@main", "--out", out, "--json", "--summary", tmp_path / "a.md", env=env)
    assert proc.returncode == 0, proc.stderr
    record = json.loads((out / "acquire.json").read_text())
    assert record["resolved_commit"] == fake_hub.commits[REPO] and record["requested_revision"] == "main"
    assert sorted(p.name for p in out.iterdir() if p.name != MARKER) == ["acquire.json", "config.json", "model.safetensors"]
    fetched = {r["path"].rsplit("/", 1)[-1] for r in fake_hub.log if "/resolve/" in r["path"]}
    assert fetched == {"config.json", "model.safetensors"}  # README, .bin, .pt never requested
    assert {f["name"]: f.get("sha256") for f in record["files"]}["model.safetensors"] == _sha256(repo_folder / "model.safetensors")
    # the second run finds everything present: no file is downloaded again
    n = len(fake_hub.log)
    proc = cli_process("acquire", f"hf:{REPO}@main", "--out", str(out), "--json", env=env)
    assert proc.returncode == 0 and json.loads(proc.stdout)["skipped"] is True
    assert not [r for r in fake_hub.log[n:] if r["method"] == "GET" and "/resolve/" in r["path"]]
    proc = cli_process("acquire", "hf:draftlab-demo/nope", "--out", str(tmp_path / "nope"), env=env)
    assert proc.returncode == 2 and "repository 'draftlab-demo/nope' not found" in proc.stderr
    assert not (tmp_path / "nope").exists()
    leaks = [str(p) for p in tmp_path.rglob("*") if p.is_file() and CANARY.encode() in p.read_bytes()]
    assert leaks == [] and CANARY not in proc.stdout + proc.stderr
