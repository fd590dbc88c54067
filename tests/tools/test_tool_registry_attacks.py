"""Attacks on the tool registry's seam between the policy's process and the episode host: the host
serves exactly the tools the policy's registry holds, from the very file that registered them, and
no tool name is one the sandbox cannot call."""

import importlib.util
import sys
from pathlib import Path

import pytest

from paper_explorer.tools import registry
from paper_explorer.tools.registry import RegistryError, Tool
from paper_explorer.tools.sandbox import Sandbox, SandboxError

MODULE = """
from typing import Annotated

from pydantic import Field

from paper_explorer.tools.arguments import Arguments
from paper_explorer.tools.registry import Tool, register


class WordArgs(Arguments):
    word: Annotated[str, Field(min_length=1, max_length=100, description="a word")]


def echo(episode, args):
    return "{said}" + args.word


def hidden(episode, args):
    return "hidden:" + args.word


HIDDEN = register(Tool(name="hidden", arguments=WordArgs, function=hidden, summary="s", returns="r", example="hidden('x')", order=71))
TOOL = Tool(name="echo", arguments=WordArgs, function=echo, summary="s", returns="r", example="echo('x')", order=70)
"""


def load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def echo_module(tmp_path):
    path = tmp_path / "echo_tools.py"
    path.write_text(MODULE.replace("{said}", "registered:"), encoding="utf-8")
    module = load(path, "echo_tools")
    registry.register(module.TOOL)
    yield path
    for name in ("echo", "hidden"):
        if name in registry.names():
            registry.unregister(name)
    del sys.modules["echo_tools"]


def test_a_tool_file_changed_after_registration_is_refused_not_run(echo_module, small_demo):
    with Sandbox(small_demo) as sandbox:
        assert sandbox.execute('echo("w")').value == "'registered:w'"
    echo_module.write_text(MODULE.replace("{said}", "changed:"), encoding="utf-8")
    registry.unregister("hidden")  # a new registration: the next sandbox needs a new host server, which loads the file again
    registry.register(sys.modules["echo_tools"].HIDDEN)
    with pytest.raises(SandboxError, match=r"echo_tools.*changed since"):
        with Sandbox(small_demo) as sandbox:
            sandbox.execute('echo("w")')


def test_a_tool_unregistered_in_the_policys_process_is_not_served_to_an_escaped_worker(echo_module, small_demo):
    registry.unregister("hidden")  # its module stays: it registered echo too
    escaped = (
        "rt = [c.cell_contents for c in echo.__closure__ if type(c.cell_contents).__name__ == 'Runtime'][0]\n"
        "from paper_explorer.tools import wire\n"
        "rt.exchange(wire.encode({'op': 'call', 'tool': 'hidden', 'args': ['zz'], 'kwargs': {}}))"
    )
    with Sandbox(small_demo, restricted=False) as sandbox:  # an action past the language layer
        result = sandbox.execute(escaped)
    assert [call.name for call in result.tool_calls] == [] and "hidden:zz" not in (result.value or "")


def test_a_tool_whose_host_process_cannot_register_it_is_refused_when_the_host_starts(tmp_path, small_demo):
    # the function lives in another module than its declaration: the host loads that module, which declares nothing
    (tmp_path / "helper_functions.py").write_text("def shout(episode, args):\n    return args.word.upper()\n", encoding="utf-8")
    helpers = load(tmp_path / "helper_functions.py", "helper_functions")
    arguments = registry.by_name()["abstain"].arguments
    tool = Tool(name="shout", arguments=arguments, function=helpers.shout, summary="s", returns="r", example="shout('x')", order=72)
    registry.register(tool)
    try:
        with pytest.raises(SandboxError, match=r"'shout'.*helper_functions.*did not register it"):
            with Sandbox(small_demo) as sandbox:
                sandbox.execute('shout(reason="x")')
    finally:
        registry.unregister("shout")
        del sys.modules["helper_functions"]


@pytest.mark.parametrize("name", ["printed", "last_expression_value_"])
def test_a_name_the_sandbox_rewrites_or_uses_itself_is_no_tool_name(name):
    search = registry.by_name()["search"]
    with pytest.raises(RegistryError, match="no builtin"):
        registry.register(
            Tool(name=name, arguments=search.arguments, function=search.function, summary="", returns="", example="", order=99)
        )
