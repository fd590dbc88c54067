"""Every command shown in README.md and docs/*.md runs as written.

A page shows commands in fenced blocks:

- ```` ```console ````: each line that starts with ``$ `` is a command (a line ending in ``\\``
  continues on the next). A page's blocks run in order, in one temporary directory, as a reader
  who follows the page runs them; the checkout's ``docs/`` folder lies in that directory, so
  ``docs/examples/...`` resolves. ``explorer ...`` runs in-process through
  ``tests.conftest.run_cli``; any other line (a pipe, a glob, ``python``, ``echo``) runs in bash,
  where ``explorer`` and ``python`` are this checkout's. Each must exit 0.
- ```` ```console TAG ```` with TAG in ``PARSE_ONLY``: the commands need what a test here cannot
  have (a GPU, a running server, the hub, QASPER's files, the set-up itself). Each ``explorer``
  command in it (also after ``-m paper_explorer.cli.main``) is parsed by the CLI's own parser: its subcommands
  and options must exist and its values must have the right type.
- ```` ```console slow ````: runs, and marks the whole page's test ``slow`` (``pytest -m "not slow"``
  leaves it out).
- ```` ```python ```` (or ```` ```python slow ````): runs with ``exec`` in the page's directory,
  in page order.
- ```` ```toml eval.toml ```` (any language, a file name as its tag): the file a reader would
  save; written into the page's directory, in page order, for the commands after it.

Commands shown anywhere else (a ```` ```sh ```` block) would escape these tests: that is refused.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import HANG_SECONDS, checkout_environment, run_cli

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PARSE_ONLY = {
    "gpu": "needs a CUDA GPU",
    "server": "needs a running model server",
    "hub": "downloads a model from the Hugging Face hub",
    "qasper": "needs QASPER's official files",
    "setup": "sets up the checkout itself",
    "qwen3": "needs a Qwen3 tokenizer, in which each probe option is one token",
    "download": "downloads and converts a real model (make smollm2 does it once for the tests)",
    "smollm2": "needs the real model the README's download block converts, and minutes of CPU",
}
SLOW = "slow"
FILE_NAME = re.compile(r"^[\w-]+(/[\w-]+)*\.\w+$")  # the tag of a block that is a file to save
FENCE = re.compile(r"^```(\S*)\s*(.*)$")
# A word the shell would expand or a redirection: the line goes to bash, not to run_cli.
SHELL_SYNTAX = re.compile(r"[|&;<>()$`*?~{}]")
SHELL_PRELUDE = 'explorer() { "$DOCS_PYTHON" -m paper_explorer.cli.main "$@"; }\npython() { "$DOCS_PYTHON" "$@"; }\n'


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # the line of the opening fence, 1-based
    language: str
    tags: tuple[str, ...]
    lines: tuple[str, ...]

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def parse_only(self) -> bool:
        return any(tag in PARSE_ONLY for tag in self.tags)

    @property
    def slow(self) -> bool:
        return SLOW in self.tags

    @property
    def file(self) -> str | None:
        """The file name a block is saved as (```` ```toml eval.toml ````), or None."""
        return self.tags[0] if self.tags and FILE_NAME.match(self.tags[0]) else None


@dataclass(frozen=True)
class Command:
    where: str
    text: str


def read_blocks(page: Path) -> list[Block]:
    blocks, opened, body = [], None, []
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), start=1):
        fence = FENCE.match(line)
        if opened is None and fence:
            opened, body = (number, fence.group(1), tuple(fence.group(2).split())), []
        elif opened is not None and line.strip() == "```":
            blocks.append(Block(page, opened[0], opened[1], opened[2], tuple(body)))
            opened = None
        elif opened is not None:
            body.append(line)
    assert opened is None, f"{page.name}:{opened[0]}: a fenced block is never closed"
    return blocks


def commands(block: Block) -> list[Command]:
    """The ``$ `` lines of a console block, continuations joined."""
    found: list[Command] = []
    pending: list[str] = []
    for offset, line in enumerate(block.lines, start=1):
        if pending:
            pending.append(line)
        elif line.startswith("$ "):
            pending = [line[2:]]
            start = offset
        if pending and not line.endswith("\\"):
            text = "\n".join(pending)
            found.append(Command(f"{block.page.relative_to(ROOT)}:{block.line + start}", text))
            pending = []
    assert not pending, f"{block.where}: the last command ends with a continuation"
    return found


def explorer_calls(text: str) -> list[list[str]]:
    """The arguments of every ``explorer`` in a shell line: ``explorer ARGS``, ``VAR=x explorer
    ARGS``, ``... -m paper_explorer.cli.main ARGS`` (accelerate launch), each simple command on its own."""
    lexer = shlex.shlex(text.replace("\\\n", " "), posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    calls, words = [], []
    for token in [*lexer, ";"]:
        if token and set(token) <= set("|&;<>()"):
            while words and (re.fullmatch(r"\w+=.*", words[0]) or words[0] in ("do", "then", "time", "exec")):
                words.pop(0)
            if words and words[0] == "explorer":
                calls.append(words[1:])
            elif "paper_explorer.cli.main" in words and words[words.index("paper_explorer.cli.main") - 1] == "-m":
                calls.append(words[words.index("paper_explorer.cli.main") + 1 :])
            words = []
        else:
            words.append(token)
    return calls


def check_parses(arguments: list[str]) -> None:
    """Parse as `explorer` would, invoking nothing: unknown subcommands and options, extra
    arguments and values of the wrong type raise."""
    import typer

    from paper_explorer.cli import main as cli_main

    command = typer.main.get_command(cli_main.app)
    try:
        context = command.make_context("explorer", list(arguments))
        while hasattr(command, "commands"):  # a group: the next word names a subcommand
            words = [*getattr(context, "_protected_args", []), *context.args]
            name, command, rest = command.resolve_command(context, words)
            context = command.make_context(name, rest, parent=context)
    except typer.Exit:  # --help or --version: parsed
        return


def page_blocks(page: Path) -> list[Block]:
    """The blocks a test acts on: commands, python, and files to save."""
    return [block for block in read_blocks(page) if block.language in ("console", "python") or block.file]


def run_command(command: Command, directory: Path) -> None:
    words = shlex.split(command.text.replace("\\\n", " "), comments=True)
    if words and words[0] == "explorer" and not SHELL_SYNTAX.search(command.text):
        done = run_cli(*words[1:], cwd=directory)
    else:
        environment = checkout_environment({"DOCS_PYTHON": sys.executable})
        done = subprocess.run(
            ["bash", "-ec", SHELL_PRELUDE + command.text],
            cwd=directory,
            env=environment,
            capture_output=True,
            text=True,
            timeout=HANG_SECONDS,
        )
    assert done.returncode == 0, (
        f"{command.where}: `{command.text}` exited {done.returncode}\n"
        f"--- stdout (end)\n{done.stdout[-3000:]}\n--- stderr (end)\n{done.stderr[-3000:]}"
    )


def run_python(block: Block) -> None:
    source = "\n".join(block.lines)
    try:
        exec(compile(source, block.where, "exec"), {"__name__": "__docs__"})
    except Exception as error:  # name the block: the traceback's file is the block's place
        raise AssertionError(f"{block.where}: the python block raised {type(error).__name__}: {error}") from error


def follow(page: Path, directory: Path, monkeypatch) -> None:
    monkeypatch.chdir(directory)  # python blocks write where the page's commands do
    monkeypatch.delenv("EXPLORER_CORPUS", raising=False)  # a reader's own default corpus is not the page's
    (directory / "docs").symlink_to(ROOT / "docs")
    for block in page_blocks(page):
        if block.parse_only:
            continue
        if block.file:
            (directory / block.file).parent.mkdir(parents=True, exist_ok=True)
            (directory / block.file).write_text("\n".join(block.lines) + "\n", encoding="utf-8")
        elif block.language == "python":
            run_python(block)
        else:
            for command in commands(block):
                run_command(command, directory)


def page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


RUNNABLE = [
    pytest.param(page, id=page_id(page), marks=[pytest.mark.slow] if any(b.slow for b in page_blocks(page)) else [])
    for page in PAGES
    if any(not block.parse_only for block in page_blocks(page))
]
PARSED = [
    command
    for page in PAGES
    for block in page_blocks(page)
    if block.parse_only and block.language == "console"
    for command in commands(block)
]


# torch says this when it is first imported, here by a python block; a script never shows it (it is
# not raised in __main__), so neither does this test.
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
@pytest.mark.parametrize("page", RUNNABLE)
def test_every_command_of_the_page_runs_as_written(page, tmp_path, monkeypatch):
    follow(page, tmp_path, monkeypatch)


@pytest.mark.parametrize("command", PARSED, ids=lambda command: command.where)
def test_commands_that_need_a_gpu_or_a_server_parse(command):
    for arguments in explorer_calls(command.text):
        try:
            check_parses(arguments)
        except Exception as error:
            pytest.fail(f"{command.where}: `explorer {shlex.join(arguments)}` does not parse: {error}")


def test_every_block_tag_is_known_and_commands_are_only_shown_where_they_are_tested():
    problems = []
    for page in PAGES:
        for block in read_blocks(page):
            unknown = set(block.tags) - set(PARSE_ONLY) - {SLOW}
            if block.language in ("console", "python") and unknown:
                problems.append(f"{block.where}: unknown tag(s) {sorted(unknown)}; known: {sorted(PARSE_ONLY)}, {SLOW}")
            if block.language == "python" and block.parse_only:
                problems.append(f"{block.where}: a python block cannot be parse-only; make it run here (or `slow`)")
            shows_a_command = any(line.startswith(("$ ", "explorer ")) for line in block.lines)
            if block.language != "console" and shows_a_command:
                problems.append(f"{block.where}: a command in a ```{block.language} block; show it in ```console")
            if block.language == "console" and not commands(block):
                problems.append(f"{block.where}: a console block without a `$ ` command")
    assert not problems, "\n".join(problems)


def test_pages_link_only_to_files_a_clone_has():
    missing = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
            if "://" in target or target.startswith("mailto:"):
                continue
            path = (page.parent / target).resolve()
            if not path.exists() or not path.is_relative_to(ROOT):
                missing.append(f"{page.relative_to(ROOT)}: {target}")
    assert not missing, "links to files a clone does not have:\n" + "\n".join(missing)


def test_the_readme_stays_short():
    assert len((ROOT / "README.md").read_bytes()) <= 10_500, "README.md is for the first hour; move detail to docs/"


def test_the_readme_lists_every_command():
    import typer

    from paper_explorer.cli import main as cli_main

    def leaves(command, path):
        if hasattr(command, "commands"):
            for name, sub in command.commands.items():
                yield from leaves(sub, [*path, name])
        else:
            yield " ".join(path)

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    absent = [name for name in leaves(typer.main.get_command(cli_main.app), ["explorer"]) if f"`{name}`" not in readme]
    assert not absent, f"README.md's table of commands lacks: {', '.join(absent)}"


def test_the_parser_of_this_test_finds_explorer_in_shell_lines():
    assert explorer_calls('VLLM_X=1 vllm serve m --port 8000 & explorer eval --out "a b" # note') == [["eval", "--out", "a b"]]
    assert explorer_calls("accelerate launch --num_processes 2 -m paper_explorer.cli.main train --out o") == [["train", "--out", "o"]]
    assert explorer_calls("for gpu in 0 1; do CUDA_VISIBLE_DEVICES=$gpu vllm serve m & done") == []
    with pytest.raises(Exception, match="No such option: --no-such-option"):
        check_parses(["eval", "--out", "x", "--no-such-option"])
    with pytest.raises(Exception, match="No such command"):
        check_parses(["no-such-command"])
