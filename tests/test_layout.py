"""The tree's import rules, read from the source with `ast` (nothing is imported):

- no private name (`_name`) of one module is used by another: `from X import _y`, or `X._y` on a
  module bound by an import, anywhere in search/, harness/ and bench/;
- no import circle between files of search/ and harness/;
- harness/ never imports search/ (or bench/), search/ never imports bench/;
- no import from a lower layer back up (LAYERS, below);
- a config becomes a RunRequest in one place, search/space/space.py (`Space.request`, `Resolved`).

Every import counts: module level, inside functions, and under `if TYPE_CHECKING:` (a type-only
import back is still a circle between two files' concepts). `from pkg import name` counts as an
import of the module pkg.name when that is a module, else of pkg itself.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("search", "harness", "bench")


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the imported module (one of PACKAGES')
    name: str | None  # the name taken from it (`from target import name`), None for `import target`
    line: int

    def where(self) -> str:
        return f"{_file(self.source)}:{self.line}"


def modules() -> dict[str, Path]:
    """Dotted module name -> file, for every .py under PACKAGES (a package is its __init__.py)."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = modules()


def _file(module: str) -> str:
    return str(MODULES[module].relative_to(ROOT))


def _absolute(module: str, path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = base[:len(base) - node.level + 1]
    return ".".join([*base, *([node.module] if node.module else [])])


def _known(dotted: str) -> str | None:
    """The module of PACKAGES a dotted name lies in (its longest prefix that is a module)."""
    parts = dotted.split(".")
    while parts:
        if ".".join(parts) in MODULES:
            return ".".join(parts)
        parts.pop()
    return None


def imports_of(module: str) -> Iterator[Import]:
    path = MODULES[module]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _known(alias.name)
                if target and target != module:
                    yield Import(module, target, None, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, path, node)
            for alias in node.names:
                if f"{base}.{alias.name}" in MODULES:
                    target, name = f"{base}.{alias.name}", None
                else:
                    target, name = _known(base), alias.name
                if target and target != module:
                    yield Import(module, target, name, node.lineno)


IMPORTS = [imp for module in MODULES for imp in imports_of(module)]


# The layers, lowest first: a module imports modules of its own layer and of lower ones, never of a
# higher one. bench/ stands above them all (it may use anything; nothing of search/ or harness/ uses it).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("harness",),  # everything that touches an engine, behind one door (harness/session.py)
    ("search.exit_codes", "search.shipped", "search.terminal"),  # what a command returns, ships and prints
    ("search.space",),  # space files -> Space; a config -> its RunRequest
    ("search.store",),  # records on disk and in the study storage, the study read back
    ("search.verdicts",),  # the statistics of every verdict
    ("search.sampling",),  # which config comes next, and when to stop
    ("search.study",),  # the trial loop, its noise probes, one fresh start
    ("search.confirm",),  # a study's answer
    ("search.regress",),  # comparing builds and sides
    ("search.report",),  # a stored study as tables and HTML
    ("search.commands",),  # one module per subcommand
    ("search.cli",),  # the command line
)


def layer_of(module: str) -> int | None:
    """The index in LAYERS of the layer `module` belongs to (None: bench/, and search/'s own __init__)."""
    for i, layer in enumerate(LAYERS):
        if any(module == top or module.startswith(top + ".") for top in layer):
            return i
    return None


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_uses() -> list[str]:
    """`from X import _y` and `X._y` (X a module of PACKAGES bound by an import) across modules."""
    found = [f"{imp.where()}: from {imp.target} import {imp.name}" for imp in IMPORTS
             if imp.name and _private(imp.name)]
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        bound: dict[str, str] = {}  # the name (or dotted path) a module is used by -> the module
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in MODULES:
                        bound[alias.asname or alias.name] = alias.name
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(module, path, node)
                for alias in node.names:
                    if f"{base}.{alias.name}" in MODULES:
                        bound[alias.asname or alias.name] = f"{base}.{alias.name}"
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _private(node.attr):
                target = bound.get(ast.unparse(node.value))
                if target and target != module:
                    found.append(f"{_file(module)}:{node.lineno}: {target}.{node.attr}")
    return found


def circles(prefixes: tuple[str, ...]) -> list[list[str]]:
    """The import circles among modules under `prefixes`: strongly connected groups of two or more
    modules (Tarjan), each sorted."""
    graph: dict[str, set[str]] = {m: set() for m in MODULES if m.startswith(prefixes)}
    for imp in IMPORTS:
        if imp.source in graph and imp.target in graph:
            graph[imp.source].add(imp.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(groups)


def _describe(group: list[str]) -> str:
    arrows = [f"{imp.where()} imports {imp.target}" for imp in IMPORTS
              if imp.source in group and imp.target in group]
    return " <-> ".join(group) + ":\n    " + "\n    ".join(sorted(set(arrows)))


def test_the_rules_see_the_tree() -> None:
    # The checks below pass vacuously on an empty or unparsed tree: make sure they read it.
    assert len(MODULES) > 150, len(MODULES)
    assert any(imp.source == "search.regress.ab" and imp.target == "harness.session" for imp in IMPORTS)
    assert any(imp.source.startswith("search.commands.") and imp.name is None for imp in IMPORTS)


def test_no_private_name_is_used_across_modules() -> None:
    found = private_uses()
    assert not found, "private names used by another module (make them public in their home):\n" + "\n".join(found)


def test_no_import_circle_between_files_of_search_and_harness() -> None:
    groups = circles(("search", "harness"))
    assert not groups, "import circles:\n" + "\n".join(_describe(g) for g in groups)


def test_harness_never_imports_search_or_bench() -> None:
    found = [f"{imp.where()}: {imp.target}" for imp in IMPORTS
             if imp.source.split(".")[0] == "harness" and imp.target.split(".")[0] != "harness"]
    assert not found, "harness/ imports search/ or bench/:\n" + "\n".join(found)


# bench/quality.py runs damaged copies of a model file, not a config of a space: it builds its own request.
OWN_REQUESTS = {"search.space.space", "bench.quality"}


def test_a_config_becomes_a_run_request_in_one_place() -> None:
    found = []
    for module, path in MODULES.items():
        if module.startswith(("search", "bench")) and module not in OWN_REQUESTS:
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] == "RunRequest":
                    found.append(f"{_file(module)}:{node.lineno}")
    assert not found, "RunRequest built outside Space.request / Resolved.run_request:\n" + "\n".join(found)


def test_no_import_from_a_lower_layer_back_up() -> None:
    unplaced = [m for m in MODULES if m.startswith(("search.", "harness")) and layer_of(m) is None]
    assert not unplaced, f"modules in no layer of LAYERS (place them): {unplaced}"
    found = []
    for imp in IMPORTS:
        low, high = layer_of(imp.source), layer_of(imp.target)
        if imp.source.split(".")[0] in ("search", "harness") and imp.target.split(".")[0] == "bench":
            found.append(f"{imp.where()}: {imp.target} (bench/ is above every layer)")
        elif low is not None and high is not None and high > low:
            found.append(f"{imp.where()}: {imp.source} ({' '.join(LAYERS[low])}) imports {imp.target} "
                         f"({' '.join(LAYERS[high])})")
    assert not found, "imports from a lower layer back up:\n" + "\n".join(sorted(set(found)))
