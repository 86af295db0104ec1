"""The package's shape, as docs/layout.md states it: layers that import only layers above them, no
package cycles, no module over 600 lines and no function over 80 (AST only: nothing is imported).

Imports inside functions count: a deferred import is still a dependency."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "src" / "draftlab"

# The layer order of docs/layout.md: a layer imports only the layers before it here (and helpers).
LAYERS = ["settings", "formats", "models", "static", "engine", "training", "serving", "datagen", "benchmark",
          "experiment"]
# Top-level helpers: any layer may import them; they import only each other.
HELPERS = {"errors", "fsutil", "textsafe", "deadline_io", "http_client", "hf_cache", "draftlab"}
# The entry points: they may import everything, nothing imports them but themselves.
ENTRY = {"cli", "commands"}
# Module cycles allowed inside one layer: none (an exception would be named here, with its reason).
ALLOWED_MODULE_CYCLES: list[set[str]] = []

# Files exempt from the '# deferred' rule: none.
UNMARKED_DEFERRALS: set[str] = set()

MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80
# Modules and functions allowed over the limits: none.
OVERSIZED_MODULES: set[str] = set()
OVERSIZED_FUNCTIONS: set[str] = set()


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def imports(path: Path, known: set[str]) -> list[tuple[str, int]]:
    """Every draftlab module ``path`` imports, with its line; ``from pkg import mod`` names the module."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            for a in node.names:
                sub = f"{base}.{a.name}"
                found.append((sub if sub in known else base, node.lineno))
    return [(m, line) for m, line in found if m == "draftlab" or m.startswith("draftlab.")]


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "draftlab"


@functools.cache
def graph() -> dict[str, list[tuple[str, int]]]:
    mods = _modules()
    known = set(mods)
    return {m: [(t, line) for t, line in imports(p, known) if t != m] for m, p in mods.items()}


def layer_breaks(edges: dict[str, list[tuple[str, int]]]) -> list[str]:
    """Each import that goes against the layer order, as ``module:line -> module``."""
    bad = []
    for src, targets in edges.items():
        a = layer(src)
        for dst, line in targets:
            b = layer(dst)
            if a == b or a in ENTRY:
                continue
            ok = b in HELPERS if a in HELPERS else (
                b in HELPERS or (a in LAYERS and b in LAYERS and LAYERS.index(b) < LAYERS.index(a)))
            if not ok:
                bad.append(f"{src}:{line} -> {dst}")
    return bad


def cycles(nodes: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in nodes.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(comp)

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return found


def test_each_layer_imports_only_the_layers_above_it():
    assert layer_breaks(graph()) == []


def test_every_package_is_a_layer_a_helper_or_an_entry_point():
    assert {layer(m) for m in graph()} <= set(LAYERS) | HELPERS | ENTRY


def test_no_package_imports_another_that_imports_it_back():
    package_edges: dict[str, set[str]] = {}
    for src, targets in graph().items():
        package_edges.setdefault(layer(src), set()).update(layer(t) for t, _ in targets if layer(t) != layer(src))
    assert cycles(package_edges) == []


def test_no_module_cycles_but_the_listed_ones():
    module_edges = {src: {t for t, _ in targets} for src, targets in graph().items()}
    assert [c for c in cycles(module_edges) if c not in ALLOWED_MODULE_CYCLES] == []


def test_the_contract_sees_a_break_and_a_cycle():
    """The checks above would fail on the shapes they forbid (so their passing means something)."""
    edges = {"draftlab.formats.x": [("draftlab.training.loss", 3)], "draftlab.errors": [("draftlab.fsutil", 1)],
             "draftlab.fsutil": [("draftlab.models.acquire", 2)], "draftlab.commands.x": [("draftlab.cli", 1)]}
    assert layer_breaks(edges) == ["draftlab.formats.x:3 -> draftlab.training.loss",
                                   "draftlab.fsutil:2 -> draftlab.models.acquire"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    here = imports(ROOT / "models" / "acquire.py", set(_modules()))
    assert any(m == "draftlab.fsutil" for m, _ in here)


def test_the_engine_knows_nothing_of_servers_or_training():
    """The decode engine is its own room (docs/layout.md): ``serving/`` may import it, it imports neither
    ``serving/`` nor ``training/`` (the draft module it decodes with lives in ``models/``)."""
    edges = graph()
    reaches = {f"{src}:{line} -> {dst}" for src, targets in edges.items() if layer(src) == "engine"
               for dst, line in targets if layer(dst) in ("serving", "training")}
    assert reaches == set()
    assert any(layer(src) == "serving" and layer(dst) == "engine" for src, targets in edges.items() for dst, _ in targets)


SPECFORGE = "draftlab.training.specforge"


def specforge_side_doors(edges: dict[str, list[tuple[str, int]]]) -> list[str]:
    """Each import of a module inside the SpecForge subpackage from outside it: the face is the only door."""
    return sorted(f"{src}:{line} -> {dst}" for src, targets in edges.items()
                  if src != SPECFORGE and not src.startswith(SPECFORGE + ".")
                  for dst, line in targets if dst.startswith(SPECFORGE + "."))


def test_specforge_is_reached_only_through_its_face():
    assert (ROOT / "training" / "specforge" / "__init__.py").is_file()  # a subpackage, with its face
    assert specforge_side_doors(graph()) == []
    assert any(dst == SPECFORGE for targets in graph().values() for dst, _ in targets)
    assert specforge_side_doors({"draftlab.commands.x": [(SPECFORGE + ".capture", 4)],
                                 SPECFORGE + ".capture": [(SPECFORGE + ".run_config", 2)]}) == [
        f"draftlab.commands.x:4 -> {SPECFORGE}.capture"]


def test_a_library_import_inside_a_function_says_why():
    """Inside the library a draftlab import sits in a function only to keep a heavy dependency off a
    light path, and says so (``# deferred: ...``); any other goes to the top of the module. The
    ``commands/`` handlers import their library inside by rule (docs/layout.md), so they are exempt."""
    unmarked = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("commands/") or rel == "cli.py" or rel in UNMARKED_DEFERRALS:
            continue
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        for func in ast.walk(ast.parse(text)):
            if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                unmarked += [f"{rel}:{node.lineno}" for node in ast.walk(func)
                             if isinstance(node, (ast.Import, ast.ImportFrom)) and
                             any(m == "draftlab" or m.startswith("draftlab.") for m in _imported(node))
                             and "# deferred" not in lines[node.lineno - 1]]
    assert unmarked == []


def _imported(node: ast.Import | ast.ImportFrom) -> list[str]:
    return [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]


@functools.cache
def _sizes() -> tuple[dict[str, int], dict[str, int]]:
    modules, functions = {}, {}
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        text = path.read_text(encoding="utf-8")
        modules[rel] = len(text.splitlines())
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                functions[f"{rel}:{node.name}"] = node.end_lineno - first + 1
    return modules, functions


def test_no_module_over_600_lines():
    modules, _ = _sizes()
    assert {m: n for m, n in modules.items() if n > MAX_MODULE_LINES and m not in OVERSIZED_MODULES} == {}


def test_no_function_over_80_lines():
    _, functions = _sizes()
    assert {f: n for f, n in functions.items() if n > MAX_FUNCTION_LINES and f not in OVERSIZED_FUNCTIONS} == {}


def test_the_size_allow_lists_name_only_real_offenders():
    """An entry that no longer offends must go (so the lists only shrink)."""
    modules, functions = _sizes()
    assert {m for m in OVERSIZED_MODULES if modules.get(m, 0) <= MAX_MODULE_LINES} == set()
    assert {f for f in OVERSIZED_FUNCTIONS if functions.get(f, 0) <= MAX_FUNCTION_LINES} == set()


def test_the_inspect_path_never_loads_torch():
    """``draftlab inspect`` (the parser, its handler's module and the library it calls) stays light:
    the deferred imports that keep it so are the ones marked ``# deferred``."""
    import subprocess
    import sys

    code = ("import sys, draftlab.cli, draftlab.commands.static, draftlab.static.inspect; "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
