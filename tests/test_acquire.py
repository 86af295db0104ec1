"""acquire / fetch-config through real huggingface_hub code against a pre-populated HF cache (offline).

publish_to_cache is checked against huggingface_hub's own cache readers first, so every later test
exercises the same code path a user's real cache would.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from factories import tiny_drafter_config, write_drafter, write_target_config

from draftlab.acquire import acquire, fetch_config
from draftlab.errors import DraftlabError
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
    assert sorted(p.name for p in out.iterdir()) == ["acquire.json", "config.json", "model.safetensors"]
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
    assert sorted(p.name for p in out.iterdir()) == ["acquire.json", "config.json", "model.safetensors"]
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
        proc = subprocess.run([sys.executable, "-m", "draftlab.cli", *args], capture_output=True, text=True, env=env)
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
