"""Issue 16 items 7 and 8: bad input is one line naming file, key and expectation; a crash has its own status.

Each broken config goes through every static command a user runs on a drafter (inspect, compare,
patch-config, doctor) and must end with exit status 2 and one ``error:`` line, never a traceback and
never an output folder. A crash (a draftlab bug) exits 70 with one ``internal error:`` line, so it is
never read as the doctor's "found problems" (1).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from factories import tiny_drafter_config, write_drafter, write_target_config
from helpers import cli, cli_process, no_hang, one_error_line


def _cfg_text(edit) -> bytes:
    cfg = tiny_drafter_config()
    out = edit(cfg)
    return out if isinstance(out, bytes) else json.dumps(cfg).encode()


BAD_CONFIGS = {
    "not-utf8": (lambda c: json.dumps(c).encode().replace(b'"LlamaForCausalLMEagle3"', b'"Llama\xe9"'), "not UTF-8"),
    "eagle-config-list": (lambda c: c.update(eagle_config=[1, 2, 3]), "key 'eagle_config': expected an object"),
    "rope-theta-string": (lambda c: c.update(rope_theta="ten thousand"), "key 'rope_theta': expected a number"),
    "rope-factor-string": (lambda c: c.update(rope_scaling={"rope_type": "yarn", "factor": "big"}),
                           "key 'rope_scaling.factor': expected a number"),
    "rope-scaling-string": (lambda c: c.update(rope_scaling="yarn"), "key 'rope_scaling': expected an object"),
    "huge-integer": (lambda c: json.dumps(c).encode().replace(b'"vocab_size": 256', b'"vocab_size": ' + b"9" * 5000),
                     "config.json"),
    "big-but-parsable-integer": (lambda c: c.update(hidden_size=10**30), "key 'hidden_size': expected an integer in"),
    "vocab-2e9": (lambda c: c.update(vocab_size=2_000_000_000), "key 'vocab_size': expected an integer in 1..16777216"),
    "deeply-nested": (lambda c: b'{"hidden_size": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nests too deeply"),
    "top-level-list": (lambda c: b"[1, 2]", "expected a JSON object"),
}


@pytest.mark.parametrize("case", list(BAD_CONFIGS))
def test_broken_drafter_config_is_one_line_in_every_static_command(tmp_path, case):
    edit, phrase = BAD_CONFIGS[case]
    drafter = write_drafter(tmp_path / "drafter")
    (drafter / "config.json").write_bytes(_cfg_text(edit))
    target = write_target_config(tmp_path / "target")
    cfg = str(drafter / "config.json")
    for args in (["inspect", drafter], ["compare", drafter, target], ["doctor", "--drafter", drafter, "--target", target],
                 ["patch-config", "--drafter", drafter, "--target", target, "--out", tmp_path / "out"]):
        proc = cli(*args)
        one_error_line(proc, cfg, phrase)
    assert not (tmp_path / "out").exists()
    proc = cli("doctor", "--drafter", write_drafter(tmp_path / "ok"), "--target", drafter)  # as the target
    one_error_line(proc, cfg, phrase)


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_unreadable_config_is_one_line_and_never_blocks(tmp_path, kind):
    drafter = write_drafter(tmp_path / "drafter")
    target = tmp_path / "target"
    target.mkdir()
    if kind == "directory":
        (target / "config.json").mkdir()
    else:
        os.mkfifo(target / "config.json")
    proc = cli("doctor", "--drafter", drafter, "--target", target / "config.json")  # a blocked open() fails as a hang
    one_error_line(proc, "config.json", "folder has no config.json" if kind == "directory" else "special file")


def test_non_utf8_training_data_names_the_file_and_line(tmp_path):
    from draftlab.formats.data import read_records, read_tokens
    from draftlab.errors import DraftlabError

    data = tmp_path / "d.jsonl"
    data.write_bytes(b'{"text": "fine"}\n{"text": "caf\xe9"}\n')
    with pytest.raises(DraftlabError, match=r"d.jsonl:2: .*not UTF-8"):
        list(read_records(data))
    tokens = tmp_path / "t.jsonl"
    tokens.write_bytes(b'{"input_ids": [1, 2], "loss_mask": [1, 1]}\n\xff\n')
    with pytest.raises(DraftlabError, match=r"t.jsonl:2: .*not UTF-8"):
        read_tokens(tokens)
    proc = cli("d2t", "build", "--tokens", tokens, "--target-vocab-size", 8, "--draft-vocab-size", 2,
                     "--out", tmp_path / "m.safetensors")
    one_error_line(proc, "t.jsonl", "line 2")


def test_a_crash_exits_70_findings_exit_1(tmp_path):
    """A doctor crash used to be a traceback with exit 1, the status of "found problems"."""
    drafter = write_drafter(tmp_path / "drafter", cfg=tiny_drafter_config(max_position_embeddings=128))
    target = write_target_config(tmp_path / "target")
    findings = cli_process("doctor", "--drafter", drafter, "--target", target)
    assert findings.returncode == 1 and "context-shorter-than-target" in findings.stdout
    crash = ("import sys\nfrom draftlab.static import doctor\nfrom draftlab.cli import main\n"
             "def boom(s):\n    raise ZeroDivisionError('a bug in a check')\n"
             "doctor.CHECKS['rope-mismatch'] = boom\nsys.exit(main(sys.argv[1:]))\n")
    proc = subprocess.run([sys.executable, "-c", crash, "doctor", "--drafter", str(drafter), "--target", str(target)],
                          capture_output=True, text=True, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 70 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("internal error: draftlab doctor crashed: ZeroDivisionError: a bug in a check")
    env = dict(os.environ, DRAFTLAB_TRACEBACK="1")
    proc = subprocess.run([sys.executable, "-c", crash, "doctor", "--drafter", str(drafter), "--target", str(target)],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 70 and "Traceback" in proc.stderr


ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 10)}]\n" for i in range(8))


def test_yaml_alias_bomb_is_refused_quickly(tmp_path):
    """Nine levels of ten aliases: 10^9 values once expanded, from a 400-byte file."""
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(ALIAS_BOMB)
    proc = cli("check-config", bomb)  # expanded, it would run for hours: cli fails a hang
    one_error_line(proc, str(bomb), "alias")
    # the Snakefile's path: Snakemake has already loaded the YAML (aliases as shared objects)
    import yaml

    from draftlab.settings.config import load_config
    from draftlab.errors import DraftlabError

    loaded = yaml.safe_load(ALIAS_BOMB)
    with no_hang(30, "load_config on an alias bomb"), pytest.raises(DraftlabError, match="expands to more than"):
        load_config(loaded, source="config")
    # ordinary aliases (a shared block reused twice) are fine
    ok = tmp_path / "ok.yaml"
    ok.write_text("x: &d {a: 1}\ny: *d\n")
    from draftlab.settings.config import read_yaml

    assert read_yaml(ok) == {"x": {"a": 1}, "y": {"a": 1}}


def test_non_utf8_yaml_config_is_one_line(tmp_path):
    bad = tmp_path / "c.yaml"
    bad.write_bytes(b"experiment: caf\xe9\n")
    proc = cli("check-config", bad)
    one_error_line(proc, str(bad), "not UTF-8")
