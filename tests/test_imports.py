"""The library's modules import each other without cycles, read from their source with ``ast``.

Every import counts, also one inside a function (it runs when the function does, and a cycle
through it is a loop at run time); only imports under ``if TYPE_CHECKING:`` never run and are
left out. ``from pkg import name`` is an edge to the module ``pkg.name`` when there is one,
else to ``pkg`` itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "shared" / "agent_learning"
PACKAGE = "agent_learning"


def module_names() -> dict[str, Path]:
    names = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    found: list[ast.Import | ast.ImportFrom] = []

    def walk(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking_only(child):
                for other in child.orelse:
                    walk(other)
                continue
            if isinstance(child, ast.Import | ast.ImportFrom):
                found.append(child)
            walk(child)

    walk(tree)
    return found


def import_graph() -> dict[str, set[str]]:
    """Module → the library's modules it imports."""
    modules = module_names()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: set[str] = set()
        for node in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            edges.update(t for t in targets if t in modules and t != name)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through every strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

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
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_cycle_in(graph, component) for component in components]


def _cycle_in(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A shortest cycle through the component's first module (breadth-first)."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for v in frontier:
            for w in sorted(graph[v] & component):
                if w == start:
                    return [*paths[v], start]
                if w not in paths:
                    paths[w] = [*paths[v], w]
                    following.append(w)
        frontier = following
    raise AssertionError("a strongly connected component without a cycle")


def test_the_graph_reads_the_imports_it_should() -> None:
    graph = import_graph()
    assert "agent_learning.pipeline.train" in graph["agent_learning.pipeline"]
    assert "agent_learning.pipeline.publish" in graph["agent_learning.pipeline.train"]
    assert "agent_learning.learning.reinforce" in graph["agent_learning.pipeline.train"]  # imported inside a function
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]


def test_the_library_has_no_import_cycle() -> None:
    found = cycles(import_graph())
    assert not found, "import cycles:\n" + "\n".join(" → ".join(c) for c in found)


LAYERS = {
    # package → layer (docs/development.md): a package imports only its own layer and lower ones.
    "core": 0, "documents": 0,
    "policy": 1,
    "agent": 2, "store": 2, "queue": 2, "judges": 2,
    "learning": 3, "evaluation": 3, "rewards": 3,
    "pipeline": 4,
    "ops": 5, "sim": 5,
    "app": 6,
    "cli": 7,
}
ADAPTERS = {
    # concrete adapters: named by the composition root (app/) and their own package only
    "agent_learning.store.sqlite", "agent_learning.store.cosmos",
    "agent_learning.queue.sqlite", "agent_learning.queue.servicebus",
    "agent_learning.judges.offline", "agent_learning.judges.evaluators",
}
# store.memory is left out: an in-process store the simulations write throwaway episodes to.
NUMPY_PACKAGES = {"learning", "evaluation"}
AGENT_SIDE = {"policy", "agent"}


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def third_party_imports(path: Path) -> set[str]:
    names = set()
    for node in _imports(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif not node.level and node.module:
            names.add(node.module.split(".")[0])
    return names - {PACKAGE}


def test_every_module_sits_in_a_package_of_a_layer() -> None:
    loose = sorted(m for m in module_names() if m != PACKAGE and package_of(m) not in LAYERS)
    assert loose == []


def test_a_package_imports_only_its_own_layer_and_lower_ones() -> None:
    upward = sorted(
        f"{module} → {target}"
        for module, targets in import_graph().items()
        if module != PACKAGE
        for target in targets
        if target != PACKAGE and LAYERS[package_of(target)] > LAYERS[package_of(module)]
    )
    assert upward == []


def test_only_the_composition_root_names_concrete_adapters() -> None:
    named = sorted(
        f"{module} → {target}"
        for module, targets in import_graph().items()
        for target in targets & ADAPTERS
        if package_of(module) not in ("app", package_of(target))
    )
    assert named == []


def test_only_the_composition_root_reads_settings() -> None:
    readers = sorted(
        module for module, targets in import_graph().items()
        if "agent_learning.app.settings" in targets and package_of(module) not in ("app", "cli")
    )
    assert readers == []


def test_numpy_only_in_learning_and_evaluation() -> None:
    users = sorted(m for m, path in module_names().items()
                   if "numpy" in third_party_imports(path) and package_of(m) not in NUMPY_PACKAGES)
    assert users == []


def test_the_agent_side_stays_light() -> None:
    heavy = sorted(
        f"{module} → {target}"
        for module, targets in import_graph().items()
        if package_of(module) in AGENT_SIDE
        for target in targets
        if package_of(target) in {"pipeline", "judges", "app", "learning", "evaluation"}
    )
    assert heavy == []


def _says_why(lines: list[str], node: ast.stmt, imports: set[int]) -> bool:
    """A comment on the import's lines, or in or above the block of imports it is in."""
    end = node.end_lineno or node.lineno
    if any("#" in lines[n - 1] for n in range(node.lineno, end + 1)):
        return True
    above = node.lineno - 1
    while above in imports or not lines[above - 1].strip():
        if "#" in lines[above - 1]:
            return True
        above -= 1
    return lines[above - 1].strip().startswith("#")


def test_own_modules_are_imported_at_the_top_or_say_why() -> None:
    """An own module imported inside a function says why in a comment (on its line or the one
    above): a heavy third-party package behind it, or an optional extra. The CLI's commands import
    what they use when they run."""
    silent = []
    for module, path in module_names().items():
        if package_of(module) == "cli":
            continue
        lines = path.read_text().splitlines()
        for fn in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            found = [node for node in ast.walk(fn) if isinstance(node, ast.Import | ast.ImportFrom)]
            imports = {n for node in found for n in range(node.lineno, (node.end_lineno or node.lineno) + 1)}
            silent += [
                f"{module}:{node.lineno}" for node in found
                if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith(PACKAGE))
                and not _says_why(lines, node, imports)
            ]
    assert sorted(set(silent)) == []


def test_a_module_of_the_last_release_imports_from_its_new_place_with_a_warning() -> None:
    import importlib
    import sys

    import agent_learning

    modules = module_names()
    for old, new in agent_learning.MOVED.items():
        assert f"{PACKAGE}.{new}" in modules, (old, new)
        assert f"{PACKAGE}.{old}" not in modules, old  # the old place is free: no module shadows the alias
        sys.modules.pop(f"{PACKAGE}.{old}", None)
        with pytest.warns(DeprecationWarning, match=f"{PACKAGE}.{old} moved to {PACKAGE}.{new}"):
            moved = importlib.import_module(f"{PACKAGE}.{old}")
        assert moved is importlib.import_module(f"{PACKAGE}.{new}")
