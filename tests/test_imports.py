"""Imports point down: every module of the package sits in a layer of the table in
docs/architecture.md ("Layer order"), imports only from its own layer or lower ones, and no
chain of imports comes back to where it started.

The imports are read from the source (ast), function-level ones included: a deferred import
runs too, just later. Importing `a.b.c` also runs the packages `a` and `a.b` (their
`__init__`), so it counts as importing them, unless the importer is inside them already.
Imports under `if TYPE_CHECKING:` never run and are not counted.
"""
from __future__ import annotations

import ast
import importlib.machinery
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = "tensorrt_llm"

# Modules allowed to import upward, (importer, imported): none.
KNOWN_UPWARD: set[tuple[str, str]] = set()


def layer_table(doc: Path) -> list[tuple[str, list[str]]]:
    """(layer, module prefixes) from the bottom up, as the "Layer order" table gives them."""
    text = doc.read_text()
    section = text[text.index("\n## Layer order\n"):]
    section = section[:section.index("\n## ", 1)]
    layers = []
    for row in re.findall(r"^\| (.+?) \| (.+?) \|$", section, flags=re.M):
        names = re.findall(r"`([\w.]+)`", row[1])
        if row[0] != "layer" and names:
            layers.append((row[0], [n if n == PACKAGE else f"{PACKAGE}.{n}" for n in names
                                    if n != "__init__"]))
    return layers


def modules(root: Path, package: str) -> dict[str, Path]:
    """Dotted name -> source file (None for a compiled extension) of every module."""
    found = {}
    for path in root.rglob("*"):
        parts = list(path.relative_to(root.parent).parts)
        if path.suffix == ".py":
            parts[-1] = path.stem
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
        else:
            for suffix in importlib.machinery.EXTENSION_SUFFIXES:  # the most specific first
                if path.name.endswith(suffix):
                    found[".".join(parts[:-1] + [path.name[:-len(suffix)]])] = None
                    break
    return {name: path for name, path in found.items() if name == package or name.startswith(package + ".")}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST):
    """Every Import/ImportFrom node, at any depth, outside `if TYPE_CHECKING:` bodies."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """Module -> the package modules importing it runs."""
    known = modules(root, package)
    graph = {}
    for name, path in known.items():
        if path is None:
            graph[name] = set()
            continue
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
                continue
            base = node.module or ""
            if node.level:
                base = ".".join(here.split(".")[:len(here.split(".")) - node.level + 1] + ([base] if base else []))
            targets.update(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names)
        edges = set()
        for target in targets:
            while target and target not in known:  # an attribute of a module
                target = target.rpartition(".")[0]
            if not target.startswith(package):
                continue
            parts = target.split(".")
            for i in range(1, len(parts) + 1):  # the packages it is in run first
                step = ".".join(parts[:i])
                if step != name and not name.startswith(step + "."):
                    edges.add(step)
        graph[name] = edges
    return graph


def layer_of(name: str, layers: list[tuple[str, list[str]]]) -> int:
    """Index of the layer whose most specific entry names the module or a package holding it
    (the top package names only its own __init__); -1: none."""
    best, index = "", -1
    for i, (_, prefixes) in enumerate(layers):
        for prefix in prefixes:
            inside = "." in prefix and name.startswith(prefix + ".")
            if (name == prefix or inside) and len(prefix) > len(best):
                best, index = prefix, i
    return index


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (or a module importing itself)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph.get(node, ()):
                    found.append(sorted(component))
    return found


def problems(root: Path, package: str, layers, known_upward=frozenset()) -> list[str]:
    """What breaks the layer order: modules in no layer, upward imports, cycles."""
    graph = import_graph(root, package)
    for importer, imported in known_upward:
        graph[importer] -= {imported} | {p for p in graph[importer] if imported.startswith(p + ".")}
    found = [f"{name} is in no layer" for name in sorted(graph) if layer_of(name, layers) < 0]
    for name in sorted(graph):
        for target in sorted(graph[name]):
            if layer_of(target, layers) > layer_of(name, layers):
                found.append(f"{name} ({layers[layer_of(name, layers)][0]}) imports {target} "
                             f"({layers[layer_of(target, layers)][0]})")
    found += [f"import cycle: {' <-> '.join(c)}" for c in cycles(graph)]
    return found


def test_the_package_imports_point_down():
    layers = layer_table(REPO / "docs" / "architecture.md")
    assert problems(REPO / PACKAGE, PACKAGE, layers, KNOWN_UPWARD) == []


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


LAYERS = [("low", ["pkg.low"]), ("high", ["pkg.high", "pkg.sub"]), ("package", ["pkg"])]


def test_an_upward_import_in_a_function_and_the_cycle_it_makes_are_found(tmp_path):
    write(tmp_path, {
        "pkg/__init__.py": "from . import high\n",
        "pkg/low.py": "def f():\n    from .high import g  # deferred: it still runs\n    return g\n",
        "pkg/high.py": ("from typing import TYPE_CHECKING\nfrom .low import f\n"
                        "if TYPE_CHECKING:\n    from . import sub\n"),
        "pkg/sub/__init__.py": "",
    })
    assert problems(tmp_path / "pkg", "pkg", LAYERS) == [
        "pkg.low (low) imports pkg.high (high)", "import cycle: pkg.high <-> pkg.low"]
    assert "pkg.sub" not in import_graph(tmp_path / "pkg", "pkg")["pkg.high"]  # TYPE_CHECKING only


def test_importing_a_module_of_a_package_runs_the_package(tmp_path):
    write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/low.py": "from .sub import leaf\n",
        "pkg/sub/__init__.py": "from .top import run\n",
        "pkg/sub/leaf.py": "",
        "pkg/sub/top.py": "from ..low import leaf\n",
        "pkg/high.py": "",
    })
    found = problems(tmp_path / "pkg", "pkg", LAYERS)
    assert "pkg.low (low) imports pkg.sub (high)" in found
    assert "import cycle: pkg.low <-> pkg.sub <-> pkg.sub.top" in found


def test_a_module_in_no_layer_is_found(tmp_path):
    write(tmp_path, {"pkg/__init__.py": "", "pkg/low.py": "", "pkg/high.py": "", "pkg/stray.py": ""})
    assert problems(tmp_path / "pkg", "pkg", LAYERS) == ["pkg.stray is in no layer"]


@pytest.mark.parametrize("name,layer", [("tensorrt_llm.runtime.session", "runtime"),
                                        ("tensorrt_llm.commands.serve", "server"),
                                        ("tensorrt_llm.commands.build", "build commands"),
                                        ("tensorrt_llm.bindings", "foundation"), ("tensorrt_llm", "package")])
def test_the_table_places_modules_by_their_most_specific_name(name, layer):
    layers = layer_table(REPO / "docs" / "architecture.md")
    assert layers[layer_of(name, layers)][0] == layer
