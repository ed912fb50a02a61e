"""The import graph of the four packages, read statically: arrows go one way
(``training``/``inference`` → ``methods`` → ``envs``), modules import each other in no circle, and
inside ``training`` the rooms (sub-packages) and the entry points at its top import down one stack."""
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


# training/: its rooms (sub-packages) and the modules left at its top (entry points users run, and
# the configuration), stacked bottom first. A unit imports only units of lower layers, never one of its
# own layer nor one above it (function-local imports count too; `if TYPE_CHECKING:` ones do not).
TRAINING_LAYERS = (
    ("config_sections",),  # training/config_sections.py: the sections of PPOConfig
    ("sft_sections",),  # training/sft_sections.py: the sections of WarmStartConfig and PPOConfig's warm_start
    ("config",),  # training/config.py: PPOConfig, the root of those sections
    ("algorithm", "runtime", "teachers"),
    ("sft_config",),  # training/sft_config.py: WarmStartConfig (names the scripted teacher's settings)
    ("models",),
    ("rollouts",),
    ("evaluation",),
    ("warm_start",),
    ("sft",),  # python -m training.sft: the warm start's recipe, which the PPO set-up runs first
    ("ppo_loop", "studies", "seed_spread"),  # python -m training.seed_spread
    ("ppo", "rescore", "reevaluate"),  # python -m training.ppo / accelerate launch training/ppo.py; python -m
    # training.rescore; python -m training.reevaluate
)
TRAINING_TOP = {"__init__", "config", "config_sections", "sft_sections", "sft_config", "sft", "seed_spread", "ppo",
                "rescore", "reevaluate"}


def training_unit(module: str) -> str | None:
    """The room or top-level module of ``training`` that ``module`` (a dotted name) belongs to."""
    parts = module.split(".")
    return parts[1] if parts[0] == "training" and len(parts) > 1 else None


def against_the_stack(modules: dict[str, Path], layers=TRAINING_LAYERS) -> list[tuple[str, str]]:
    """(module, imported name) for every import of one training unit by another not below it."""
    layer = {unit: depth for depth, units in enumerate(layers) for unit in units}
    bad = []
    for mod, path in modules.items():
        unit = training_unit(mod)
        if unit is None:
            continue
        for name, _ in project_imports(path):
            target = training_unit(name)
            if target is not None and target != unit and not layer[target] < layer[unit]:
                bad.append((mod, name))
    return bad


def test_training_rooms_import_down_the_stack():
    bad = against_the_stack(MODULES)
    assert bad == [], f"training imports against its stack (TRAINING_LAYERS): {bad}"


def test_training_top_holds_only_entry_points_and_rooms_are_named():
    training = ROOT / "training"
    top = {p.stem for p in training.glob("*.py")}
    assert top == TRAINING_TOP, f"modules at training/ top that belong in a room: {sorted(top - TRAINING_TOP)}"
    rooms = {p.parent.name for p in training.glob("*/*.py")}
    units = {unit for units in TRAINING_LAYERS for unit in units}
    assert rooms | TRAINING_TOP - {"__init__"} == units, "every room and top-level module has its layer"
    for room in sorted(rooms):
        doc = ast.get_docstring(ast.parse((training / room / "__init__.py").read_text(encoding="utf-8")))
        assert doc and "\n" not in doc, f"training/{room}/__init__.py opens with a one-line docstring"


def test_the_room_checker_sees_an_import_up_the_stack(tmp_path):
    low, high = tmp_path / "low.py", tmp_path / "high.py"
    low.write_text("def f():\n    from training.studies.reader_study import teacher_table\n")
    high.write_text("from training.algorithm.ppo_core import masked_mean\n")
    modules = {"training.algorithm.low": low, "training.studies.high": high}
    assert against_the_stack(modules) == [("training.algorithm.low", "training.studies.reader_study"),
                                          ("training.algorithm.low", "training.studies.reader_study.teacher_table")]
