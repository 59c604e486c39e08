"""The package's own imports, read with ``ast`` (no database, no Django): no module imports
another in a circle, and none uses another module's private (underscore) names."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "django_pgoutbox"


def _modules() -> dict[str, Path]:
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


MODULES = _modules()


def _runtime_imports(body: list[ast.stmt]) -> list[ast.Import | ast.ImportFrom]:
    """The imports that run when the module is imported: not those under ``TYPE_CHECKING``,
    nor those inside functions and classes."""
    found: list[ast.Import | ast.ImportFrom] = []
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        elif isinstance(node, ast.If):
            if ast.unparse(node.test) not in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
                found += _runtime_imports(node.body)
            found += _runtime_imports(node.orelse)
        elif isinstance(node, ast.Try):
            found += _runtime_imports(node.body) + _runtime_imports(node.finalbody)
            for handler in node.handlers:
                found += _runtime_imports(handler.body)
    return found


def _imported(name: str, node: ast.Import | ast.ImportFrom) -> set[str]:
    """The package's modules that ``node`` (in module ``name``) imports, with their packages
    (importing ``a.b.c`` runs ``a`` and ``a.b`` first)."""
    if isinstance(node, ast.Import):
        targets = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]
            parts = package.split(".")[: len(package.split(".")) - node.level + 1]
            base = ".".join([*parts, *([node.module] if node.module else [])])
        targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
    # The packages of ``name`` itself ran before it did: importing a sibling through them
    # (``a.b.d`` from ``a.b.c``) runs only the sibling, not ``a.b`` again.
    own = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
    found = set()
    for target in targets:
        parts = target.split(".")
        packages = {".".join(parts[:i]) for i in range(1, len(parts))} - own
        found |= ({target} | packages) & MODULES.keys()
    return found - {name}


def _graph() -> dict[str, set[str]]:
    graph = {}
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        graph[name] = set().union(*(_imported(name, n) for n in _runtime_imports(tree.body)))
    return graph


def _circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of imports in ``graph``, or None."""
    done: set[str] = set()
    path: list[str] = []

    def visit(name: str) -> list[str] | None:
        if name in path:
            return [*path[path.index(name) :], name]
        if name in done:
            return None
        path.append(name)
        for imported in sorted(graph[name]):
            if (circle := visit(imported)) is not None:
                return circle
        path.pop()
        done.add(name)
        return None

    for name in sorted(graph):
        if (circle := visit(name)) is not None:
            return circle
    return None


def test_no_module_imports_another_in_a_circle():
    circle = _circle(_graph())
    assert circle is None, " -> ".join(circle or [])


def test_the_check_finds_a_circle():
    assert _circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _circle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_uses_another_modules_private_names(name):
    tree = ast.parse(MODULES[name].read_text())
    modules_by_alias: dict[str, str] = {}
    private: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("django_pgoutbox"):
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    private.append(f"line {node.lineno}: {node.module}.{alias.name}")
                if f"{node.module}.{alias.name}" in MODULES:
                    modules_by_alias[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in modules_by_alias
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            private.append(f"line {node.lineno}: {modules_by_alias[node.value.id]}.{node.attr}")
    assert not private
