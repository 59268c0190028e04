"""The package's layers, read from its own imports (lazy ones inside functions included): no import cycle,
the library never imports a command, and strategies and methods never reach an engine."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "corag"
# Modules that load or drive a model; strategies and methods see only the LM protocol (corag.lm.base).
BACKENDS = {
    "corag.lm",
    "corag.lm.hf",
    "corag.lm.vllm",
    "corag.lm.openai",
    "corag.lm.render",
    "corag.lm.settings",
}
COMMAND_LAYER = ("corag.commands", "corag.cli", "corag.recipes")
# docs/architecture.md's layers, from the ground up: a module imports only from its own layer or those before.
LAYERS = [
    [
        "corag.errors",
        "corag.types",
        "corag.tasks",
        "corag.budget",
        "corag.metrics",
        "corag.config",
        "corag.scaling",
        "corag.resources",
    ],
    ["corag.data"],
    ["corag.lm.base", "corag.retrieval.base", "corag.prompts"],
    ["corag.lm", "corag.retrieval"],
    ["corag.executor", "corag.chain"],
    ["corag.decoding", "corag.methods"],
    [
        "corag.sampling",
        "corag.evaluation",
        "corag.kilt",
        "corag.training",
        "corag.iterate",
        "corag.models",
        "corag.plan",
    ],
    ["corag.toy"],
    ["corag.commands", "corag.cli", "corag.recipes"],
]


def layer_of(module: str) -> int:
    """The layer of `module`: that of the longest listed prefix it falls under."""
    matches = [
        (len(prefix), index)
        for index, prefixes in enumerate(LAYERS)
        for prefix in prefixes
        if module == prefix or module.startswith(prefix + ".")
    ]
    assert matches, f"{module} is in no layer of docs/architecture.md"
    return max(matches)[1]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """module -> the corag modules it imports anywhere in its source."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                targets.add(base)
                targets.update(f"{base}.{alias.name}" for alias in node.names)  # `from pkg import module`
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path that ends where it starts, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def test_no_import_cycle() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_every_module_imports_only_its_own_layer_or_those_below() -> None:
    graph = import_graph()
    upward = [
        (module, target)
        for module, targets in graph.items()
        if module != "corag"
        for target in targets
        if target != "corag" and layer_of(target) > layer_of(module)
    ]
    assert upward == []


def test_the_library_never_imports_a_command() -> None:
    wrong = [
        (module, target)
        for module, targets in import_graph().items()
        if not module.startswith(COMMAND_LAYER)
        for target in targets
        if target.startswith(COMMAND_LAYER)
    ]
    assert wrong == []


@pytest.mark.parametrize("layer", ["corag.decoding", "corag.methods"])
def test_strategies_and_methods_import_no_command_and_no_backend(layer: str) -> None:
    wrong = [
        (module, target)
        for module, targets in import_graph().items()
        if module.startswith(layer)
        for target in targets
        if target in BACKENDS or target.startswith(COMMAND_LAYER)
    ]
    assert wrong == []


def test_the_checks_see_cycles_and_lazy_imports() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    graph = import_graph()
    assert "corag.lm.hf" in graph["corag.lm"]  # load_lm imports its backends inside the function
    assert layer_of("corag.lm.base") < layer_of("corag.lm.hf") < layer_of("corag.decoding.greedy")
