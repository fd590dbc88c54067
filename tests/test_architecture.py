"""Imports flow one way: corpus <- tools <- agent <- evaluation <- sft <- cli.

Every import in every module of the six packages is read from its source (lazy imports inside
functions included), and a module may import only its own package or one below it. Module-level
imports may not form a cycle either.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("corpus", "tools", "agent", "evaluation", "sft", "cli")


def modules() -> dict[str, Path]:
    found = {}
    for package in LAYERS:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def imported(path: Path, module_level_only: bool = False) -> list[tuple[int, str]]:
    """(line, module) for every import of one of our packages in ``path``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    nodes = tree.body if module_level_only else ast.walk(tree)
    names = []
    for node in nodes:
        if isinstance(node, ast.Import):
            names += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append((node.lineno, node.module))
            names += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return [(line, name) for line, name in names if name.split(".")[0] in LAYERS]


def test_every_layer_imports_only_itself_and_the_layers_below():
    upward = []
    for name, path in modules().items():
        rank = LAYERS.index(name.split(".")[0])
        for line, target in imported(path):
            if LAYERS.index(target.split(".")[0]) > rank:
                upward.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert not upward, "imports that point up the layers:\n" + "\n".join(sorted(set(upward)))


def test_module_level_imports_have_no_cycle():
    known = modules()
    graph = {}
    for name, path in known.items():
        targets = set()
        for _, target in imported(path, module_level_only=True):
            while target and target not in known:  # "corpus.BM25" -> "corpus"
                target = target.rpartition(".")[0]
            if target and target != name:
                targets.add(target)
        graph[name] = targets

    visiting, done, cycles = set(), set(), []

    def visit(node: str, trail: list[str]) -> None:
        if node in done:
            return
        if node in visiting:
            cycles.append(" -> ".join(trail[trail.index(node):] + [node]))
            return
        visiting.add(node)
        for target in sorted(graph[node]):
            visit(target, trail + [node])
        visiting.discard(node)
        done.add(node)

    for node in sorted(graph):
        visit(node, [])
    assert not cycles, "module-level import cycles:\n" + "\n".join(cycles)


@pytest.mark.parametrize("package", LAYERS[:-1])
def test_core_code_never_raises_the_cli_error(package):
    offenders = [str(path.relative_to(ROOT)) for path in (ROOT / package).rglob("*.py") if "UsageError" in path.read_text()]
    assert not offenders
