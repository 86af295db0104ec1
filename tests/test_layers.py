"""The package's shape, as docs/layout.md states it: layers that import only layers above them, no
package cycles, no module over 600 lines and no function over 50 (AST only: nothing is imported).

Imports inside functions count: a deferred import is still a dependency."""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "src" / "draftlab"

# The layer order of docs/layout.md: a layer imports only the layers before it here (and helpers).
LAYERS = ["settings", "formats", "models", "static", "engine", "training", "serving", "datagen", "benchmark",
          "experiment"]
# Top-level helpers: any layer may import them; they import only each other.
HELPERS = {"errors", "fsutil", "textsafe", "csvcells", "deadline_io", "http_client", "hf_cache", "draftlab"}
# The entry points: they may import everything, nothing imports them but themselves.
ENTRY = {"cli", "commands"}
# Module cycles allowed inside one layer: none (an exception would be named here, with its reason).
ALLOWED_MODULE_CYCLES: list[set[str]] = []

# Files exempt from the '# deferred' rule: none.
UNMARKED_DEFERRALS: set[str] = set()

MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 50  # issue 37: a longer function is split where a reader would name the parts
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


# What a deferred import may keep off a path: the heavy dependencies (a second or more, or ~100 ms for
# tqdm and huggingface_hub, which `draftlab --help` would otherwise pay: docs/layout.md).
HEAVY = {"torch", "transformers", "numpy", "pandas", "matplotlib", "pyarrow", "snakemake", "tqdm", "huggingface_hub",
         "torch._dynamo", "safetensors.torch"}


def _import_names(node: ast.Import | ast.ImportFrom, package: str, known: set[str]) -> list[str]:
    """The modules one import statement loads (``from pkg import mod`` names pkg and pkg.mod)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:
        up = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join(up + ([base] if base else []))
    return [base] + [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known]


@functools.cache
def _split_imports(name: str) -> tuple[tuple[str, ...], tuple[tuple[int, tuple[str, ...]], ...]]:
    """(the modules ``name`` imports at module level, (line, modules) of each import inside a function);
    ``if TYPE_CHECKING:`` blocks import nothing."""
    mods = _modules()
    path = mods[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    top: list[str] = []
    inner: list[tuple[int, tuple[str, ...]]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                visit(child, True)
            elif isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            elif isinstance(child, (ast.Import, ast.ImportFrom)):
                names = _import_names(child, package, set(mods))
                if in_function:
                    inner.append((child.lineno, tuple(names)))
                else:
                    top.extend(names)
            else:
                visit(child, in_function)

    visit(ast.parse(path.read_text(encoding="utf-8")), False)
    return tuple(top), tuple(inner)


def heavy_loaded(names: tuple[str, ...] | list[str]) -> set[str]:
    """The HEAVY modules that importing ``names`` loads, following module-level imports through draftlab."""
    mods, seen, heavy, todo = _modules(), set(), set(), list(names)
    while todo:
        parts = todo.pop().split(".")
        for i in range(1, len(parts) + 1):
            m = ".".join(parts[:i])
            if m in mods and m not in seen:
                seen.add(m)
                todo.extend(_split_imports(m)[0])
            elif m not in mods:
                heavy |= {m} & HEAVY
    return heavy


def _function_imports():
    """(file, line, modules, source line) of every import inside a function of the library."""
    for name, path in sorted(_modules().items()):
        lines = path.read_text(encoding="utf-8").splitlines()
        for line, names in _split_imports(name)[1]:
            yield name, path.relative_to(ROOT).as_posix(), line, names, lines[line - 1]


def test_a_library_import_inside_a_function_says_why():
    """Inside the library an import sits in a function only to keep a heavy dependency off a light path,
    and says so (``# deferred: ...``); any other goes to the top of the module. The ``commands/``
    handlers import their library inside by rule (docs/layout.md), so they are exempt."""
    unmarked = [f"{rel}:{line}" for _, rel, line, _, text in _function_imports()
                if not (rel.startswith("commands/") or rel == "cli.py" or rel in UNMARKED_DEFERRALS)
                and "# deferred:" not in text]
    assert unmarked == []


def test_a_deferred_import_keeps_something_heavy_off_its_module():
    """A ``# deferred:`` import must load a HEAVY dependency that its module does not load anyway (else
    the deferral buys nothing and the import goes to the top)."""
    pointless = [f"{rel}:{line}" for name, rel, line, names, text in _function_imports()
                 if "# deferred:" in text and not heavy_loaded(names) - heavy_loaded([name])]
    assert pointless == []


def test_a_command_handler_imports_inside_only_what_the_cli_start_does_not_load():
    """``commands/`` handlers import their library when they run, so `draftlab --help` builds every parser
    without loading the library behind them; a module the CLI start loads anyway (errors, fsutil, the
    settings, the standard library) goes to the top of the command module."""
    code = ("import sys, draftlab.cli; draftlab.cli.build_parser(); "
            "print(' '.join(sorted(sys.modules)))")
    started = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split())
    at_start = [f"{rel}:{line} {' '.join(names)}" for name, rel, line, names, _ in _function_imports()
                if rel.startswith("commands/") and all(n in started for n in names)]
    assert at_start == []


def test_the_deferral_check_sees_a_pointless_one():
    """heavy_loaded follows module-level imports through draftlab (so the check above means something)."""
    assert "torch" in heavy_loaded(["draftlab.models.eagle3"]) and "torch" in heavy_loaded(["draftlab.static.d2t"])
    assert heavy_loaded(["draftlab.formats.safetensors_header"]) == set()
    assert heavy_loaded(["json", "os"]) == set() and heavy_loaded(["torch._dynamo"]) == {"torch", "torch._dynamo"}


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


def test_no_function_over_50_lines():
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
    code = ("import sys, draftlab.cli, draftlab.commands.static, draftlab.static.inspect; "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_cli_starts_without_a_heavy_import():
    """``draftlab --help`` (every command's parser built) loads none of HEAVY: what the deferred imports
    are for (`python -X importtime -m draftlab.cli --help` shows the rest)."""
    code = ("import sys, draftlab.cli; draftlab.cli.build_parser(); "
            f"print(sorted(m for m in {sorted(HEAVY)!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
