"""The package's layers, read from its own imports (lazy ones inside functions included): no import cycle,
the library never imports a command, and strategies and methods never reach an engine."""

from __future__ import annotations

import ast
import inspect
import re
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
COMMAND_LAYER = ("corag.commands", "corag.cli", "corag.options", "corag.recipes")
# Entry points that may import a command: the commands and the programs a cluster job runs
# (corag.cluster's lower modules, stop, submit and rounds, sit in lower layers and are held there).
ENTRY_POINTS = (*COMMAND_LAYER, "corag.cluster")
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
        "corag.cluster.stop",
        "corag.cluster.submit",
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
        "corag.cluster.rounds",
        "corag.smoke",
    ],
    ["corag.toy"],
    ["corag.commands", "corag.cli", "corag.options", "corag.recipes"],
    ["corag.cluster"],
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
        if not module.startswith(ENTRY_POINTS)
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


# docs/architecture.md, point by point ------------------------------------------------------------------

DOC = PACKAGE.parent / "docs" / "architecture.md"


def doc_layers() -> list[list[str]]:
    """The modules column of the doc's layer table, row by row, as dotted names (`decoding/*` -> corag.decoding)."""
    text = DOC.read_text().split("## The layers", 1)[1].split("\n\n## ", 1)[0]
    rows = [line.split("|")[2] for line in text.splitlines() if line.startswith("| ") and "---" not in line]
    return [
        ["corag." + name.removesuffix("/*").replace("/", ".") for name in re.findall(r"`([\w/*]+)`", row)]
        for row in rows[1:]  # after the header
    ]


def test_the_doc_layer_table_is_the_layers_the_checks_use() -> None:
    layers = doc_layers()
    assert len(layers) == len(LAYERS)
    for index, modules in enumerate(layers):
        for module in modules:
            assert layer_of(module) == index, (module, index)
    text = DOC.read_text().split("## The layers", 1)[1].split("\n\n## ", 1)[0]
    stars = {"corag." + s.replace("/", ".") for s in re.findall(r"`([\w/]+)/\*`", text)}
    listed = {m for row in layers for m in row} - stars
    unlisted = [
        module
        for module in import_graph()
        if module != "corag" and module not in listed and not any(module.startswith(s) for s in stars)
    ]
    assert unlisted == [], "modules in no row of docs/architecture.md's table"


def test_every_file_the_doc_names_exists() -> None:
    names = re.findall(r"`((?:corag|tests|recipes|benchmarks|docs)/[\w./-]*)`", DOC.read_text())
    assert len(names) > 30
    missing = [n for n in names if not (PACKAGE.parent / n).exists()]
    assert missing == []


def test_every_strategy_takes_what_predict_and_evaluate_pass_it() -> None:
    """docs/architecture.md: `name(ctx, example, corpus, *, max_steps, stop_bias, task_desc, docs,
    final_docs, limits, ...)`; corag predict and corag evaluate pass final_docs and limits to every one."""
    from corag.decoding import STRATEGIES

    for name, strategy in STRATEGIES.items():
        parameters = inspect.signature(strategy).parameters
        assert list(parameters)[:3] == ["ctx", "example", "corpus"], name
        keywords = {p for p, v in parameters.items() if v.kind is inspect.Parameter.KEYWORD_ONLY}
        assert {"max_steps", "stop_bias", "task_desc", "docs", "final_docs", "limits"} <= keywords, name


def test_every_method_takes_its_corpus_by_keyword() -> None:
    """docs/architecture.md: `name(ctx, example, *, corpus, **settings) -> dict`."""
    from corag.methods import METHODS

    for name, method in METHODS.items():
        parameters = inspect.signature(method).parameters
        assert list(parameters)[:2] == ["ctx", "example"], name
        assert parameters["corpus"].kind is inspect.Parameter.KEYWORD_ONLY, name


def test_the_names_the_doc_gives_exist_where_it_says() -> None:
    """The dicts, functions and tuples 'Where to add' tells a contributor to edit."""
    import corag.commands.plan as plan_command
    import corag.commands.train as train
    import corag.evaluation as evaluation
    import corag.lm as lm
    import corag.lm.settings as settings
    import corag.metrics as metrics
    import corag.plan as plan
    import corag.retrieval as retrieval
    import corag.tasks as tasks
    from corag.cli import COMMANDS
    from corag.data import formats

    scoring = {"ALIASES", "AT_LEAST_ONE", "RULE_CHOICES", "answer_row", "rule_of", "methods"}
    assert scoring <= set(vars(evaluation))
    assert {"load_lm"} <= set(vars(lm)) and {"BACKENDS", "EngineSettings"} <= set(vars(settings))
    planned = {"_plan_engines", "index_size", "STAGES", "plan_stage", "detect_stage", "check_visible"}
    assert planned <= set(vars(plan))
    assert {"load_retriever", "check_corpus"} <= set(vars(retrieval))
    assert {"LOADERS", "format_of_keys", "detect_format"} <= set(vars(formats))
    assert {"TASKS", "RULES", "_BENCHMARK_WORDS"} <= set(vars(tasks))
    assert {"F1_RULES", "token_prf"} <= set(vars(metrics))
    assert "STAGE_CONFIGS" in vars(plan_command) and "RECIPES" in vars(train)
    assert all(":" in target for target, _ in COMMANDS.values())
    # which methods get IRCoT's demonstrations is a tuple in corag/commands/evaluate.py, as the doc says
    source = (PACKAGE / "commands" / "evaluate.py").read_text()
    assert '("ircot", "one_step", "no_retrieval")' in source and "`--demonstrations`" in DOC.read_text()
