"""The capture's readers give one line and lose nothing.

Each case was found by attacking the one-host capture's features folder: a target with new weights under the
same ``config.json`` was taken for the same target; unreadable feature files (one ending in a zip record) passed
the preflight and crashed ``capture-record`` (exit 70); a file of another hidden size was counted; a sample
that is a symlink out of the folder was counted and the train job's check accepted it; a full disk crashed
``specforge-features`` with torch's enforce-fail traceback; a damaged identity JSON or mapping crashed too.
Each entry point (``capture-preflight``, ``capture-record``, the train job's check, ``specforge-features``)
is run on the real folder the capture's shell line wrote (the stand-in script of tests/test_capture.py).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from helpers import cli, one_error_line
from safetensors.torch import save_file
from test_capture import _checkout, _experiment, _shell, here  # noqa: F401 - here: the fixture
from test_specforge import _fake_dump

from draftlab.errors import DraftlabError
from draftlab.experiment import jobs
from draftlab.training.specforge import local_capture as oc

EOCD = b"PK\x05\x06" + b"\0" * 18  # a zip end record: the file does not look torn


def _weights(layout, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    save_file({"model.embed_tokens.weight": torch.randn(16, 8, generator=g)},
              str(Path(layout.target_model) / "model.safetensors"))


def _capture(s, layout) -> None:
    proc = _shell(s, layout)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out + Path(layout.log("capture.log")).read_text()


@pytest.fixture
def captured(here):  # noqa: F811
    """Three samples captured from a target with weights; the record written."""
    s, layout = _experiment(here, n=3)
    _weights(layout, seed=0)
    _checkout(here / "SpecForge")
    _capture(s, layout)
    return s, layout


def _pre(s, layout):
    return cli(*jobs.capture_commands(s, layout)[0][1:])


def _rec(s, layout):
    return cli(*jobs.capture_commands(s, layout)[-1][1:])


def _snapshot(folder) -> dict:
    return {p: p.read_bytes() for p in oc.feature_files(folder)}


def test_new_weights_under_the_same_config_are_another_target(captured):
    s, layout = captured
    before = _snapshot(layout.features)
    _weights(layout, seed=1)  # same names, shapes and config.json; other values
    one_error_line(_pre(s, layout), "features of another target", "target_weights_sha256")
    with pytest.raises(DraftlabError, match="features of another target's weights .* holds other weights"):
        oc.check_capture_for(layout.capture_record, layout.target_model, layout.patched)
    assert _snapshot(layout.features) == before  # nothing moved, nothing lost
    _weights(layout, seed=0)  # the same weights again: the same target
    oc.check_capture_for(layout.capture_record, layout.target_model, layout.patched)


def _foreign(path: Path, hidden: int) -> None:
    """A feature file of another target (another hidden size), well formed."""
    t = 3
    torch.save({"input_ids": torch.arange(t), "loss_mask": torch.ones(t, dtype=torch.int64),
                "hidden_state": torch.zeros(1, t, hidden, dtype=torch.bfloat16),
                "aux_hidden_state": torch.zeros(1, t, 3 * hidden, dtype=torch.bfloat16)}, path)


@pytest.mark.parametrize("kind", ["unreadable", "zip-tail", "foreign"])
def test_an_unreadable_or_foreign_feature_file_is_never_counted_and_is_moved_aside_kept(captured, kind):
    s, layout = captured
    record = Path(layout.capture_record)
    recorded = record.read_bytes()
    bad = Path(layout.features) / "rows_0-2000" / "data_1.ckpt"
    hidden = json.loads(Path(layout.target_model, "config.json").read_text())["hidden_size"]
    if kind == "unreadable":
        bad.write_bytes(b"\0" * 64 + bad.read_bytes()[64:])  # its zip end record intact, its start not
    elif kind == "zip-tail":
        bad.write_bytes(os.urandom(300) + EOCD)
    else:
        _foreign(bad, 2 * hidden)
    content = bad.read_bytes()
    # capture-record: one line naming the file, nothing recorded
    why = {"unreadable": "unreadable", "zip-tail": "unreadable", "foreign": f"expected [1, 3, {hidden}]"}[kind]
    one_error_line(_rec(s, layout), "data_1.ckpt", why, "not recorded")
    assert record.read_bytes() == recorded
    # the preflight moves it aside (kept) and says so; the rerun captures the sample again and records 3
    proc = _pre(s, layout)
    assert proc.returncode == 0, proc.stderr
    assert "1 feature file(s) not of this capture (first" in proc.stderr and "rejected-" in proc.stderr
    moved = list(Path(layout.capture_state).glob("rejected-*/rows_0-2000/data_1.ckpt"))
    assert len(moved) == 1 and moved[0].read_bytes() == content
    _capture(s, layout)
    rec = json.loads(record.read_text())
    assert rec["samples"] == 3 and rec["tokens"] == sum(2 + i % 5 for i in range(3))


@pytest.mark.parametrize("what", ["file", "folder"])
def test_a_sample_that_leaves_the_features_folder_is_refused_by_every_reader(captured, tmp_path, what):
    s, layout = captured
    sample = Path(layout.features) / "rows_0-2000" / "data_2.ckpt"
    if what == "folder":  # the whole rows folder moved out and linked back: every sample read from elsewhere
        sample, outside = sample.parent, tmp_path / "rows-elsewhere"
        os.replace(sample, outside)
    else:
        outside = tmp_path / "elsewhere.ckpt"
        outside.write_bytes(sample.read_bytes())  # the same size: the listing's digest does not move
        sample.unlink()
    sample.symlink_to(outside)
    for proc in (_pre(s, layout), _rec(s, layout)):
        one_error_line(proc, str(sample), f"leads to {outside}", "outside the features folder")
    with pytest.raises(DraftlabError, match=f"leads to {outside}, outside the features folder .* not trained on"):
        oc.check_capture_for(layout.capture_record, layout.target_model, layout.patched)
    assert sample.is_symlink() and outside.exists()  # nothing deleted


def test_a_damaged_identity_record_or_mapping_is_one_line(captured):
    s, layout = captured
    ident = Path(layout.capture_state) / oc.IDENTITY_FILE
    good = ident.read_text()
    ident.write_text(json.dumps({**json.loads(good), "attempts": 5}))
    one_error_line(_rec(s, layout), str(ident), "key 'attempts'")
    one_error_line(_pre(s, layout), str(ident), "key 'attempts'")  # the features depend on it: refused
    ident.write_text(json.dumps({**json.loads(good), "estimate": {"bytes_per_token": "x"}}))
    one_error_line(_rec(s, layout), str(ident), "key 'estimate'")
    ident.write_text(good)
    mapping = Path(layout.features) / oc.SPECFORGE_MAPPING
    mapping.write_bytes(os.urandom(200) + EOCD)
    one_error_line(_rec(s, layout), str(mapping), "unreadable")
    record = Path(layout.capture_record)
    rec = json.loads(record.read_text())
    record.write_text(json.dumps({k: v for k, v in rec.items() if k != "features"}))
    with pytest.raises(DraftlabError, match=r"key 'features': expected a folder path"):
        oc.check_capture_for(record, layout.target_model, layout.patched)
    # with no feature file left, a damaged identity is draftlab's own to replace
    ident.write_text("[1, 2]")
    for p in oc.feature_files(layout.features):
        p.unlink()
    proc = _pre(s, layout)
    assert proc.returncode == 0, proc.stderr


# --- a full disk while specforge-features writes --------------------------------------------------------


def _tmpfs(mnt: Path, size: str) -> bool:
    cmd = ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)]
    if os.geteuid() != 0:
        return False
    return subprocess.run(cmd, capture_output=True).returncode == 0


@pytest.fixture
def small_disk(tmp_path):
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if not _tmpfs(mnt, "96k"):
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def _full_disk_then_rerun(dump: Path, out: Path, free) -> None:
    proc = cli("specforge-features", "--dump", dump, "--out", out)
    line = one_error_line(proc, "No space left on device", "finished feature files are kept in",
                          "the rerun writes only the rest")
    assert "internal error" not in proc.stderr and not out.exists()
    work = out.with_name(f".{out.name}.partial")
    done = sorted(work.glob("data_*.ckpt"))
    assert 0 < len(done) < 12 and f"the {len(done)} finished" in line, line
    kept = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in done}
    free()
    proc = cli("specforge-features", "--dump", dump, "--out", out, "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["kept_from_earlier_attempt"] == len(done)
    files = sorted(out.glob("data_*.ckpt"))
    assert len(files) == 12 and not work.exists()
    assert {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in files if p.name in kept} == kept  # not rewritten
    assert all(torch.load(p, weights_only=True)["hidden_state"].shape[-1] == 256 for p in files)


def test_a_disk_that_fills_up_in_specforge_features_is_one_line_and_keeps_the_finished_files(small_disk, tmp_path):
    """A real full disk: a 96 KiB tmpfs, remounted larger for the rerun."""
    dump = _fake_dump(tmp_path / "dump", n=12, hidden=256)
    _full_disk_then_rerun(dump, small_disk / "features", lambda: subprocess.run(
        ["mount", "-o", "remount,size=2m", str(small_disk)], check=True))


def test_torchs_writer_failing_mid_file_is_read_as_a_full_disk(tmp_path, monkeypatch):
    """Where no tmpfs can be mounted: torch's own writer error (its message on a full tmpfs), after 5 files."""
    dump = _fake_dump(tmp_path / "dump", n=12, hidden=256)
    real, calls = torch.save, []

    def save(obj, f, *a, **k):
        calls.append(f)
        if len(calls) > 5:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")
        return real(obj, f, *a, **k)

    monkeypatch.setattr(torch, "save", save)
    _full_disk_then_rerun(dump, tmp_path / "features", monkeypatch.undo)
