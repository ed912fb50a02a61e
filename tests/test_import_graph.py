"""The import graph of the four packages, read statically: arrows go one way
(``training``/``inference`` → ``methods`` → ``envs``) and modules import each other in no circle."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("envs", "methods", "inference", "training")
# What each package may import from the others (itself always).
ALLOWED = {"envs": set(), "methods": {"envs"}, "inference": {"envs", "methods"},
           "training": {"envs", "methods", "inference"}}


def module_name(path: Path) -> str:
    name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    return name.removesuffix(".__init__")


def project_imports(path: Path) -> list[tuple[str, bool]]:
    """(imported project module, imported inside a function) for every import in ``path``;
    imports under ``if TYPE_CHECKING:`` are types only and not counted."""
    found = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                if isinstance(child, ast.Import):
                    names = [alias.name for alias in child.names]
                elif child.level == 0 and child.module:
                    names = [child.module] + [f"{child.module}.{alias.name}" for alias in child.names]
                else:
                    names = []
                found.extend((name, in_function) for name in names if name.split(".")[0] in PACKAGES)
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

    visit(ast.parse(path.read_text(encoding="utf-8")), False)
    return found


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}


MODULES = all_modules()


@pytest.mark.parametrize("package", PACKAGES)
def test_imports_run_one_way(package):
    upward = [(module_name(path), name) for mod, path in MODULES.items() if mod.split(".")[0] == package
              for name, _ in project_imports(path)
              if name.split(".")[0] not in ALLOWED[package] | {package}]
    assert upward == [], f"{package} imports from a package above it: {upward}"


def module_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports (any import, at any depth)."""
    graph = {}
    for mod, path in MODULES.items():
        targets = set()
        for name, _ in project_imports(path):
            while name and name not in MODULES:  # `from pkg.mod import function` -> pkg.mod
                name = name.rpartition(".")[0]
            if name and name != mod and not mod.startswith(name + "."):
                targets.add(name)
        graph[mod] = targets
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if state.get(nxt) is None:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if state.get(node) is None:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_no_import_circles():
    graph = module_graph()
    packages = {m for m in graph if (ROOT / Path(*m.split("."))).is_dir()}
    # a package's __init__ re-exporting its modules is not a circle with them
    graph = {m: {t for t in targets if t not in packages} for m, targets in graph.items()}
    assert find_cycle(graph) is None, f"import circle: {' -> '.join(find_cycle(graph))}"


def test_the_checker_sees_an_upward_import(tmp_path):
    bad = tmp_path / "m.py"
    bad.write_text("import os\n\ndef f():\n    from training.ppo import train\n    return train\n")
    assert ("training.ppo", True) in project_imports(bad)
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) is not None
    assert find_cycle({"a": {"b"}, "b": set()}) is None


# Function-local imports of project modules, each with its reason; any other is hoisted to the top.
LOCAL_IMPORTS_ALLOWED = {
    # the entry point of a spawned embedding process reports a failing import to its parent
    "envs.retrieval.index_embed",
    # load_backend imports only the engine a spec names (vLLM's and the HTTP client's stay unloaded)
    "inference.backends",
}


def test_function_local_imports_only_where_listed():
    local = sorted({mod for mod, path in MODULES.items() for _, in_function in project_imports(path) if in_function})
    assert set(local) <= LOCAL_IMPORTS_ALLOWED, (
        f"function-local project imports in {set(local) - LOCAL_IMPORTS_ALLOWED}"
    )
