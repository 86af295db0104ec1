"""An output folder is replaced only when it is draftlab's own earlier output of the same stage.

Issue 16 item 1: ``patch-config --out`` naming the folder that holds the drafter, or ``acquire --out``
naming a user's folder, used to delete it. Every folder-replacing stage goes through
``fsutil.check_replaceable`` (via ``atomic_dir``/``claim_dir``/``remove_own``): a folder without the
marker of that stage, or one that is or contains the input, is refused with one line and left as it was.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from factories import tiny_drafter_config, write_drafter, write_target_config
from helpers import cli, one_error_line

from draftlab.errors import DraftlabError
from draftlab.fsutil import MARKER, atomic_dir, check_replaceable, claim_dir, remove_own


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def project(tmp_path) -> Path:
    proj = tmp_path / "w" / "proj"
    write_drafter(proj / "drafter", cfg=tiny_drafter_config(max_position_embeddings=512))
    (proj / "notes.txt").write_text("my notes")
    write_target_config(tmp_path / "target")
    return proj


def test_patch_config_into_the_folder_holding_the_drafter_is_refused_and_deletes_nothing(tmp_path, project):
    before = snapshot(project)
    proc = cli("patch-config", "--drafter", project / "drafter", "--target", tmp_path / "target", "--out", project)
    one_error_line(proc, str(project), "contains the input")
    assert snapshot(project) == before
    proc = cli("patch-config", "--drafter", project / "drafter", "--target", tmp_path / "target",
               "--out", project / "drafter")
    one_error_line(proc, "must differ from the drafter folder")
    assert snapshot(project) == before


def test_patch_config_into_a_foreign_folder_is_refused_but_its_own_output_is_replaced(tmp_path, project):
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("years of work")
    proc = cli("patch-config", "--drafter", project / "drafter", "--target", tmp_path / "target", "--out", foreign)
    one_error_line(proc, str(foreign), "not draftlab's output", MARKER)
    assert (foreign / "thesis.tex").read_text() == "years of work" and len(list(foreign.iterdir())) == 1

    out = tmp_path / "patched"
    assert cli("patch-config", "--drafter", project / "drafter", "--target", tmp_path / "target", "--out", out).returncode == 0
    assert json.loads((out / MARKER).read_text()) == {"stage": "patch-config"}
    # the same stage again, with another target: its own earlier output is replaced
    write_target_config(tmp_path / "target2", max_position_embeddings=2048)
    proc = cli("patch-config", "--drafter", project / "drafter", "--target", tmp_path / "target2", "--out", out)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((out / "config.json").read_text())["max_position_embeddings"] == 2048
    # another stage may not replace it
    proc = cli("acquire", project / "drafter", "--out", out)
    one_error_line(proc, "'patch-config' output", "acquire replaces only its own")
    assert json.loads((out / "config.json").read_text())["max_position_embeddings"] == 2048


def test_acquire_into_an_existing_user_folder_is_refused_and_reruns_replace_their_own(tmp_path, project):
    dest = tmp_path / "downloads"
    dest.mkdir()
    (dest / "other-model.safetensors").write_bytes(b"not mine to delete")
    proc = cli("acquire", project / "drafter", "--out", dest)
    one_error_line(proc, str(dest), "not draftlab's output")
    assert (dest / "other-model.safetensors").read_bytes() == b"not mine to delete"
    proc = cli("acquire", project / "drafter", "--out", project)
    one_error_line(proc, "contains the input")
    assert (project / "notes.txt").read_text() == "my notes"

    empty = tmp_path / "empty"
    empty.mkdir()  # an empty folder (what Snakemake makes for an output's parent) holds nothing to lose
    assert cli("acquire", project / "drafter", "--out", empty).returncode == 0
    (project / "drafter" / "config.json").write_text(json.dumps(tiny_drafter_config(max_position_embeddings=4096)))
    proc = cli("acquire", project / "drafter", "--out", empty)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((empty / "config.json").read_text())["max_position_embeddings"] == 4096


def test_train_refuses_an_out_that_holds_its_inputs_before_any_work(tmp_path, project):
    proc = cli("train", "--target", tmp_path / "target", "--tokens", project / "notes.txt", "--out", project,
               "--init", "checkpoint", "--checkpoint", project / "drafter")
    one_error_line(proc, "contains the input")
    assert (project / "notes.txt").read_text() == "my notes" and (project / "drafter" / "model.safetensors").is_file()


def test_the_helper_rules(tmp_path):
    # a file, a symlink, a foreign folder, another stage's folder: refused; absent/empty/own: allowed
    (tmp_path / "f").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "f")
    for bad in ("f", "link"):
        with pytest.raises(DraftlabError, match="not a folder draftlab wrote"):
            check_replaceable(tmp_path / bad, "s")
    check_replaceable(tmp_path / "absent", "s")
    with atomic_dir(tmp_path / "a", stage="s") as tmp:
        (tmp / "x").write_text("1")
    with atomic_dir(tmp_path / "a", stage="s") as tmp:
        (tmp / "x").write_text("2")
    assert (tmp_path / "a" / "x").read_text() == "2"
    with pytest.raises(DraftlabError, match="'s' output"):
        with atomic_dir(tmp_path / "a", stage="other"):
            pass
    with pytest.raises(DraftlabError, match="'s' output"):
        remove_own(tmp_path / "a", "other")
    remove_own(tmp_path / "a", "s")
    assert not (tmp_path / "a").exists()
    claimed = claim_dir(tmp_path / "c", "train")
    (claimed / "metrics.csv").write_text("step\n")
    assert claim_dir(tmp_path / "c", "train") == claimed and (claimed / "metrics.csv").is_file()
    # the swap re-checks: a foreign file appearing in an empty folder during the block stops it
    (tmp_path / "e").mkdir()
    with pytest.raises(DraftlabError, match="not draftlab's output"):
        with atomic_dir(tmp_path / "e", stage="s") as tmp:
            (tmp_path / "e" / "user.txt").write_text("arrived meanwhile")
    assert (tmp_path / "e" / "user.txt").is_file()


def test_outputs_of_a_draftlab_without_markers_are_still_its_own(tmp_path, project):
    """A patch-config folder written before markers existed (it holds patch.json) is replaced."""
    old = tmp_path / "patched"
    assert cli("patch-config", "--drafter", project / "drafter", "--target", tmp_path / "target", "--out", old).returncode == 0
    (old / MARKER).unlink()
    proc = cli("patch-config", "--drafter", project / "drafter", "--target", tmp_path / "target2", "--out", old)
    assert proc.returncode == 2  # no such target: nothing changes
    write_target_config(tmp_path / "target2", max_position_embeddings=8192)
    proc = cli("patch-config", "--drafter", project / "drafter", "--target", tmp_path / "target2", "--out", old)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((old / "config.json").read_text())["max_position_embeddings"] == 8192


def test_resolve_model_link_never_replaces_a_real_file(tmp_path):
    from draftlab.models.resolve_target import _link

    (tmp_path / "important").write_text("keep")
    with pytest.raises(DraftlabError, match="not a symlink"):
        _link(tmp_path, tmp_path / "important")
    assert (tmp_path / "important").read_text() == "keep"
