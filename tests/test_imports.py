"""No import cycles among kbv's modules, found by reading their source (ast), without importing them.

The rule. Module A depends on module B when A's source imports B at module level: `import B` or
`from B import name`, also inside a module-level `try`, `if`, `with` or class body, where
- `from P import name` depends on `P.name` where that is a module of kbv, else on `P` (the name is one
  that `P/__init__.py` defines, so `P` must have finished importing first);
- importing `P.Q.M` also runs the packages `P` and `P.Q`: A depends on them too, except on those A
  lies in itself (they are already importing when A is);
- imports under `if TYPE_CHECKING:` never run; they are collected apart, and a cycle that closes only
  through one of them is acceptable;
- imports inside a function count as well: a lazy import that closes a circle only hides it (the
  two modules still need each other, at the first call instead of at import).
A cycle among the rest fails: two modules that need each other share a concept that wants a module of
its own, which both import.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import NamedTuple

import kbv

KBV_SRC = Path(kbv.__file__).parent


class Imports(NamedTuple):
    runtime: set[str]  # kbv modules imported when the module is
    type_checking: set[str]  # kbv modules imported only under `if TYPE_CHECKING:`


def module_files(root: Path, package: str) -> dict[str, Path]:
    """Every module under `root` (the directory of `package`) by dotted name; a package by its own."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = [package, *path.relative_to(root).with_suffix("").parts]
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def import_graph(root: Path, package: str) -> dict[str, Imports]:
    """The imports of every module of `package` (under `root`) by the rule above, among its modules."""
    files = module_files(root, package)
    graph = {}
    for module, path in files.items():
        imports = Imports(set(), set())
        is_package = path.name == "__init__.py"
        _collect(ast.parse(path.read_text(), str(path)).body, module, is_package, files, imports.runtime, imports)
        graph[module] = imports
    return graph


def _collect(body: list[ast.stmt], module: str, is_package: bool, files: dict[str, Path], into: set[str],
             imports: Imports) -> None:
    """Add the modules that the statements of `body` import to `into`, descending into every block,
    function bodies too; `if TYPE_CHECKING:` bodies go to `imports.type_checking`."""
    for node in body:
        if isinstance(node, ast.Import):
            for alias in node.names:
                _depend(alias.name, module, files, into)
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(node, module, is_package)
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                _depend(submodule if submodule in files else source, module, files, into)
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            _collect(node.body, module, is_package, files, imports.type_checking, imports)
            _collect(node.orelse, module, is_package, files, into, imports)
        else:
            for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                block = getattr(node, field, None)
                if isinstance(block, list):
                    _collect(block, module, is_package, files, into, imports)


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The dotted name a `from ... import` reads from, relative ones resolved against `module`."""
    if not node.level:
        return node.module or ""
    parts = module.split(".") if is_package else module.split(".")[:-1]
    parts = parts[:len(parts) - (node.level - 1)]
    return ".".join([*parts, node.module] if node.module else parts)


def _depend(target: str, module: str, files: dict[str, Path], into: set[str]) -> None:
    """`module` imports `target`: it depends on `target` and on the packages above it, but for
    those it lies in itself."""
    parts = target.split(".")
    for i in range(1, len(parts)):
        above = ".".join(parts[:i])
        if above in files and not (module == above or module.startswith(above + ".")):
            into.add(above)
    if target in files and target != module:
        into.add(target)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def find_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other, directly or around a circle, each sorted."""
    reach = {module: _reachable(edges, module) for module in edges}
    cycles: list[list[str]] = []
    seen: set[str] = set()
    for module in sorted(edges):
        if module in reach[module] and module not in seen:
            group = sorted(other for other in reach[module] if module in reach[other])
            seen.update(group)
            cycles.append(group)
    return cycles


def _reachable(edges: dict[str, set[str]], start: str) -> set[str]:
    """The modules `start` reaches in one step or more."""
    found: set[str] = set()
    todo = list(edges.get(start, ()))
    while todo:
        module = todo.pop()
        if module not in found:
            found.add(module)
            todo.extend(edges.get(module, ()))
    return found


def _describe(cycles: list[list[str]], edges: dict[str, set[str]]) -> str:
    return "\n".join(", ".join(f"{a} -> {b}" for a in group for b in sorted(edges[a]) if b in group)
                     for group in cycles)


def test_kbv_s_modules_import_no_cycle():
    graph = import_graph(KBV_SRC, "kbv")
    edges = {module: imports.runtime for module, imports in graph.items()}
    assert len(edges) > 50  # the whole package was read
    cycles = find_cycles(edges)
    assert cycles == [], f"import cycles among kbv's modules (see this test's docstring):\n{_describe(cycles, edges)}"


# -- the rule itself, on small packages written for it ------------------------------------------------

def _package(root: Path, files: dict[str, str]) -> dict[str, set[str]]:
    for name, text in files.items():
        path = root / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return {m: i.runtime for m, i in import_graph(root / "pkg", "pkg").items()}


def test_a_module_level_cycle_is_found_whatever_the_import_form(tmp_path):
    edges = _package(tmp_path, {"__init__.py": "", "a.py": "from pkg.b import x\n",
                                "b.py": "try:\n    import pkg.c\nexcept ImportError:\n    pass\nx = 1\n",
                                "c.py": "from . import a\n", "d.py": "import pkg.a\n"})
    assert find_cycles(edges) == [["pkg.a", "pkg.b", "pkg.c"]]


def test_type_checking_imports_close_no_cycle_and_function_local_ones_do(tmp_path):
    typed = {"__init__.py": "", "a.py": "from pkg.b import x\n",
             "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import A\nx = 1\n"}
    assert find_cycles(_package(tmp_path / "typed", typed)) == []
    assert import_graph(tmp_path / "typed" / "pkg", "pkg")["pkg.b"].type_checking == {"pkg.a"}
    lazy = {**typed, "b.py": "x = 1\ndef f():\n    from pkg import a\n"}
    assert find_cycles(_package(tmp_path / "lazy", lazy)) == [["pkg.a", "pkg.b"]]


def test_a_package_s_names_count_and_its_submodules_do_not_lead_through_it(tmp_path):
    base = {"__init__.py": "from pkg.a import A\n", "b.py": "B = 1\n"}
    assert find_cycles(_package(tmp_path / "sub", {**base, "a.py": "from pkg import b\nA = 1\n"})) == []
    assert find_cycles(_package(tmp_path / "name", {**base, "a.py": "from pkg import B\nA = 1\n"})) == [["pkg", "pkg.a"]]
    # a module outside a package runs the package's __init__ when it imports one of its modules
    outside = {"__init__.py": "", "top.py": "import pkg.inner.leaf\n", "inner/__init__.py": "import pkg.top\n",
               "inner/leaf.py": ""}
    assert find_cycles(_package(tmp_path / "outside", outside)) == [["pkg.inner", "pkg.top"]]
