"""Imports flow one way inside the one installed package, ``paper_explorer``:
corpus <- tools <- agent <- evaluation <- sft <- the Python API (``paper_explorer`` itself) <- cli.

Every import in every module of the seven layers is read from its source (lazy imports inside
functions included), and a module may import only its own package or one below it. Imports may
not form a cycle, not even through a lazy import inside a function. In cli/, a command module
imports no other command module: what two commands share is a workflow of the core packages or
one of the few shared cli modules.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "paper_explorer"
LAYERS = ("corpus", "tools", "agent", "evaluation", "decisions", "sft", "rl", "api", "cli")


def layer(module: str) -> str:
    """The layer of one of our modules: its subpackage, or "api" for ``paper_explorer`` itself."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else "api"


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imported(path: Path, module_level_only: bool = False) -> list[tuple[int, str]]:
    """(line, module) for every import of one of our packages in ``path``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    nodes = tree.body if module_level_only else ast.walk(tree)
    # An import under ``if TYPE_CHECKING:`` names a type for mypy and never runs: no runtime tie.
    type_only = {
        id(child)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
        for statement in node.body
        for child in ast.walk(statement)
    }
    nodes = [node for node in nodes if id(node) not in type_only]
    names = []
    for node in nodes:
        if isinstance(node, ast.Import):
            names += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append((node.lineno, node.module))
            names += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return [(line, name) for line, name in names if name.split(".")[0] == PACKAGE]


def test_every_layer_imports_only_itself_and_the_layers_below():
    upward = []
    for name, path in modules().items():
        rank = LAYERS.index(layer(name))
        for line, target in imported(path):
            if LAYERS.index(layer(target)) > rank:
                upward.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert not upward, "imports that point up the layers:\n" + "\n".join(sorted(set(upward)))


def import_graph(module_level_only: bool) -> dict[str, set[str]]:
    """Module -> the modules of ours it imports ("paper_explorer.corpus.BM25" resolves to "paper_explorer.corpus")."""
    known = modules()
    graph = {}
    for name, path in known.items():
        targets = set()
        for _, target in imported(path, module_level_only):
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                targets.add(target)
        graph[name] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[str]:
    """Each set of modules that import one another in a ring (a strongly connected component)."""
    order, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        order[node] = low[node] = len(order)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in order:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], order[target])
        if low[node] == order[node]:
            ring = []
            while not ring or ring[-1] != node:
                ring.append(stack.pop())
                on_stack.discard(ring[-1])
            if len(ring) > 1:
                found.append(" <-> ".join(sorted(ring)))

    for node in sorted(graph):
        if node not in order:
            visit(node)
    return found


def test_module_level_imports_have_no_cycle():
    found = cycles(import_graph(module_level_only=True))
    assert not found, "module-level import cycles:\n" + "\n".join(found)


def test_no_cycle_hides_in_a_function_level_import():
    """A lazy import inside a function still ties two modules together: no ring of imports at all."""
    found = cycles(import_graph(module_level_only=False))
    assert not found, "import cycles (lazy imports included):\n" + "\n".join(found)


# What every command module may share; cli.main assembles the commands.
SHARED_CLI_MODULES = {
    "paper_explorer.cli",
    "paper_explorer.cli.options",
    "paper_explorer.cli.help_layout",
    "paper_explorer.cli.plugins",
    "paper_explorer.cli.flags",
    "paper_explorer.cli.errors",
    "paper_explorer.cli.display",
    "paper_explorer.cli.usage_errors",
}


def test_no_command_module_imports_another():
    """A command is parse -> config -> one call -> print: a workflow another command needs lives in
    the core packages, never in a command module."""
    offenders = []
    for name, path in modules().items():
        if not name.startswith("paper_explorer.cli.") or name in SHARED_CLI_MODULES or name == "paper_explorer.cli.main":
            continue
        for line, target in imported(path):
            module = target if target in modules() else target.rpartition(".")[0]
            if module.startswith("paper_explorer.cli") and module not in SHARED_CLI_MODULES:
                offenders.append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    assert not offenders, "command modules that import another command module:\n" + "\n".join(sorted(set(offenders)))


def test_the_shared_cli_modules_import_no_command_module():
    known = modules()
    offenders = []
    for name in SHARED_CLI_MODULES & set(known):
        for line, target in imported(known[name]):
            module = target if target in known else target.rpartition(".")[0]
            if module.startswith("paper_explorer.cli") and module not in SHARED_CLI_MODULES:
                offenders.append(f"{known[name].relative_to(ROOT)}:{line} imports {target}")
    assert not offenders, "\n".join(sorted(set(offenders)))


@pytest.mark.parametrize("package", LAYERS[:-1])
def test_core_code_never_raises_the_cli_error(package):
    offenders = [
        str(path.relative_to(ROOT)) for name, path in modules().items() if layer(name) == package and "UsageError" in path.read_text()
    ]
    assert not offenders


LONG_MODULE_LINES = 400


def test_a_long_module_says_why_it_is_one_module():
    """Modules stay small and do one thing; one past ~400 lines says in its docstring why it is one."""
    unexplained = []
    for path in modules().values():
        lines = path.read_text().count("\n")
        docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
        if lines > LONG_MODULE_LINES and "Why one module" not in docstring:
            unexplained.append(f"{path.relative_to(ROOT)}: {lines} lines")
    assert not unexplained, "long modules without a 'Why one module' paragraph:\n" + "\n".join(unexplained)


def test_one_top_level_package_is_installed():
    """What ``pip install .`` puts in site-packages is one package: nothing named ``cli`` or ``tools`` beside it."""
    import tomllib

    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setuptools["packages"]["find"]["include"] == [PACKAGE, f"{PACKAGE}.*"]
    stray = sorted(path.parent.name for path in ROOT.glob("*/__init__.py") if path.parent.name not in (PACKAGE, "tests"))
    assert not stray, f"packages outside {PACKAGE}/: {stray}"
