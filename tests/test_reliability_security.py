"""Static audit of the library for the two ways a model file can run code on load.

Pickle: no ``torch.load`` without ``weights_only=True``, no ``pickle.load(s)``, no ``np.load`` without
``allow_pickle=False``. Remote code: no literal ``trust_remote_code=True``; the value always comes
from the caller (ultimately ``target.trust_remote_code`` in the experiment config, default false).
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "draftlab"


def _kw(call: ast.Call, name: str):
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value
    return None


def _is_const(node, value) -> bool:
    return isinstance(node, ast.Constant) and node.value is value


def _problems(source: str, where: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        owner = f.value.id if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) else None
        name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
        line = f"{where}:{node.lineno}: {ast.unparse(node)[:90]}"
        if owner == "torch" and name == "load" and not _is_const(_kw(node, "weights_only"), True):
            found.append(line + "  (torch.load without weights_only=True)")
        if owner in ("pickle", "cPickle", "dill") and name in ("load", "loads"):
            found.append(line + "  (unpickling)")
        if owner in ("np", "numpy") and name == "load" and not _is_const(_kw(node, "allow_pickle"), False):
            found.append(line + "  (np.load without allow_pickle=False)")
        if _is_const(_kw(node, "trust_remote_code"), True):
            found.append(line + "  (trust_remote_code hard-wired on)")
    return found


def test_no_pickle_loading_and_no_hardwired_remote_code_in_the_library():
    problems = [p for path in sorted(SRC.rglob("*.py"))
                for p in _problems(path.read_text(encoding="utf-8"), str(path.relative_to(SRC.parent)))]
    assert problems == [], "\n".join(problems)


def test_the_audit_flags_each_pattern():
    bad = textwrap.dedent("""
        import pickle, torch, numpy as np
        from transformers import AutoModel
        torch.load("w.pt")
        torch.load("w.pt", weights_only=False)
        pickle.loads(b"")
        np.load("a.npy")
        AutoModel.from_pretrained("m", trust_remote_code=True)
        torch.load("w.pt", weights_only=True)          # fine
        np.load("a.npy", allow_pickle=False)           # fine
        AutoModel.from_pretrained("m", trust_remote_code=flag)  # fine: configured
    """)
    assert [p.split(":")[1] for p in _problems(bad, "probe")] == ["4", "5", "6", "7", "8"]
