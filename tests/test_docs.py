"""README.md and every docs page, followed as a newcomer follows them: in one fresh checkout, README
first, then the pages in the order README's "Guides" lists them.

A page shows commands in fenced blocks:

- ```` ```console ````: each line that starts with ``$ `` is a command (a line ending in ``\\``
  continues on the next). Every block runs in the order of the pages, in one copy of this
  checkout's tracked files (a fresh clone), from its root, so ``docs/examples/...`` resolves and
  what one page wrote is there for the next. ``explorer ...`` runs in-process through
  ``tests.conftest.run_cli``; any other line (a pipe, a glob, ``python``, ``echo``) runs in bash,
  where ``explorer`` and ``python`` are the copy's. Each must exit 0.
- ```` ```console TAG ```` with TAG in ``PARSE_ONLY``: the commands need what a test here cannot
  have (a GPU, a running server, the hub, QASPER's files, the set-up itself). Each ``explorer``
  command in it (also after ``-m paper_explorer.cli.main``) is parsed by the CLI's own parser: its
  subcommands and options must exist and its values must have the right type.
- ```` ```console slow ````: runs, and marks the test that follows the pages ``slow``
  (``pytest -m "not slow"`` leaves it out).
- ```` ```python ```` (or ```` ```python slow ````): runs with ``exec`` in the copy, in page order.
- ```` ```toml runs/eval.toml ```` (any language, a file name as its tag): the file a reader would
  save; written into the copy, in page order, for the commands after it.

Every command, run or only parsed, is held to what following the pages in order needs:

- it writes only where no earlier command wrote (``--resume`` and ``run``, which appends to its
  log, continue what they name);
- it writes only declared outputs: paths this checkout's .gitignore ignores (``runs/``,
  ``models/``), never the source tree;
- a page says ``pip install -e '.[EXTRA]'`` before its first command that needs the extra
  (``make demo`` installs the package alone).

What a command writes is its ``--out`` (parsed with the CLI's parser), or for a shell line its
redirections, ``mkdir``, ``curl -o``/``-O`` and ``pip download -d``; a command that runs is also
watched (the files it created or changed). After the last page, ``git status`` of the copy shows
nothing: nothing untracked but declared outputs, no tracked file changed.

Commands shown anywhere else (a ```` ```sh ```` block) would escape these tests: that is refused.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import pytest

from tests.conftest import HANG_SECONDS, run_cli

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PARSE_ONLY = {
    "gpu": "needs a CUDA GPU",
    "server": "needs a running model server",
    "hub": "downloads a model from the Hugging Face hub",
    "qasper": "needs QASPER's official files",
    "benchmarks": "downloads LongBench's or MemAgent's files from the Hugging Face hub",
    "setup": "sets up the checkout itself",
    "qwen3": "needs a Qwen3 tokenizer, in which each probe option is one token",
    "download": "downloads and converts a real model (make smollm2 does it once for the tests)",
    "smollm2": "needs the real model the README's download block converts, and minutes of CPU",
    "ray": "needs a Ray cluster of several machines (tests/test_ray.py starts one on this machine)",
}
SLOW = "slow"
FILE_NAME = re.compile(r"^[\w-]+(/[\w-]+)*\.\w+$")  # the tag of a block that is a file to save
FENCE = re.compile(r"^```(\S*)\s*(.*)$")
# A word the shell would expand or a redirection: the line goes to bash, not to run_cli.
SHELL_SYNTAX = re.compile(r"[|&;<>()$`*?~{}]")
SHELL_PRELUDE = 'explorer() { "$DOCS_PYTHON" -m paper_explorer.cli.main "$@"; }\npython() { "$DOCS_PYTHON" "$@"; }\n'
# What an extra installs, as a page must say it (pyproject.toml's optional dependencies); `make
# test` installs the dev extra, which holds them all.
INSTALL = "pip install -e '.[{extra}]'"


def guides() -> list[Path]:
    """The docs pages in the order README's "Guides" section lists them."""
    section = README.read_text(encoding="utf-8").split("\n## Guides\n", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"\]\((docs/[\w-]+\.md)\)", section)
    return [ROOT / name for name in dict.fromkeys(listed)]


PAGES = [README, *guides()]


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
        """The file name a block is saved as (```` ```toml runs/eval.toml ````), or None."""
        return self.tags[0] if self.tags and FILE_NAME.match(self.tags[0]) else None


@dataclass(frozen=True)
class Command:
    where: str
    text: str
    line: int  # its line in the page, 1-based


@dataclass(frozen=True)
class Output:
    """A path a command writes. ``continues``: it may write there again (``--resume``, ``run``'s
    log); ``owns``: what lies under it is the command's (an output directory), not a plain folder
    others fill (``mkdir``)."""

    path: str
    continues: bool = False
    owns: bool = True


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
            found.append(Command(f"{block.page.relative_to(ROOT)}:{block.line + start}", text, block.line + start))
            pending = []
    assert not pending, f"{block.where}: the last command ends with a continuation"
    return found


def simple_commands(text: str) -> list[list[str]]:
    """The words of each simple command of a shell line (``a | b && c`` is three), with
    redirections kept as words (``>``, then its target)."""
    lexer = shlex.shlex(text.replace("\\\n", " "), posix=True, punctuation_chars="|&;()")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    found, words = [], []
    for token in [*lexer, ";"]:
        if token and set(token) <= set("|&;()"):
            while words and (re.fullmatch(r"\w+=.*", words[0]) or words[0] in ("do", "then", "time", "exec")):
                words.pop(0)
            if words:
                found.append(words)
            words = []
        else:
            words.append(token)
    return found


def explorer_calls(text: str) -> list[list[str]]:
    """The arguments of every ``explorer`` in a shell line: ``explorer ARGS``, ``VAR=x explorer
    ARGS``, ``... -m paper_explorer.cli.main ARGS`` (accelerate launch), each simple command on its own."""
    calls = []
    for words in simple_commands(text):
        words = [word for word in words if not re.fullmatch(r"\d*>>?", word)]
        if words[0] == "explorer":
            calls.append(words[1:])
        elif "paper_explorer.cli.main" in words and words[words.index("paper_explorer.cli.main") - 1] == "-m":
            calls.append(words[words.index("paper_explorer.cli.main") + 1 :])
    return calls


@dataclass(frozen=True)
class Parsed:
    """An ``explorer`` command line as the CLI parses it, invoking nothing."""

    path: tuple[str, ...]  # ("corpus", "stats")
    values: dict[str, object]  # by the option's longest spelling ("--out") or the argument's name

    def value(self, name: str) -> object:
        return self.values.get(name)


@functools.cache
def explorer_command():
    import typer

    from paper_explorer.cli import main as cli_main

    return typer.main.get_command(cli_main.app)


def parse(arguments: list[str]) -> Parsed | None:
    """Parse as `explorer` would: unknown subcommands and options, extra arguments and values of
    the wrong type raise. None for ``--help`` and ``--version``."""
    import typer

    command = explorer_command()
    path: list[str] = []
    try:
        context = command.make_context("explorer", list(arguments))
        while hasattr(command, "commands"):  # a group: the next word names a subcommand
            words = [*getattr(context, "_protected_args", []), *context.args]
            name, command, rest = command.resolve_command(context, words)
            path.append(name)
            context = command.make_context(name, rest, parent=context)
    except typer.Exit:  # --help or --version: parsed
        return None
    values = {}
    for parameter in command.params:
        spellings = [option for option in parameter.opts if option.startswith("--")]
        values[max(spellings, key=len) if spellings else parameter.name] = context.params.get(parameter.name)
    return Parsed(tuple(path), values)


def page_blocks(page: Path) -> list[Block]:
    """The blocks a test acts on: commands, python, and files to save."""
    return [block for block in read_blocks(page) if block.language in ("console", "python") or block.file]


def followed_blocks() -> list[Block]:
    return [block for page in PAGES for block in page_blocks(page)]


def normal(path: str) -> str:
    return os.path.normpath(path)


def outputs_of_call(parsed: Parsed) -> list[Output]:
    out = parsed.value("--out") or parsed.value("out")
    if out is None:
        return []
    if parsed.path == ("run",):  # run appends its episode to OUT's log, by design: README and runs.md share runs/
        return [Output(normal(str(PurePosixPath(str(out)) / "trajectories.jsonl")), continues=True)]
    return [Output(normal(str(out)), continues=bool(parsed.value("--resume")))]


def outputs_of_shell(words: list[str]) -> list[Output]:
    """What a shell command writes: its redirections' targets, ``mkdir``'s folders, ``curl``'s
    ``-o FILE`` or ``-O`` (the URL's last part), ``pip download -d DIR``."""
    found = [Output(normal(target)) for before, target in zip(words, words[1:]) if re.fullmatch(r"\d*>>?", before)]
    if words[0] == "mkdir":  # -p: a folder that may be there already
        folders = [word for word in words[1:] if not word.startswith("-")]
        found += [Output(normal(word), continues="-p" in words, owns=False) for word in folders]
    if words[0] == "curl":
        for before, word in zip(words, words[1:]):
            if before in ("-o", "--output"):
                found.append(Output(normal(word)))
        if any(re.fullmatch(r"-\w*O\w*", word) for word in words):
            found += [Output(normal(word.rsplit("/", 1)[1])) for word in words if "://" in word]
    if words[:2] == ["pip", "download"]:
        found += [Output(normal(target), owns=False) for before, target in zip(words, words[1:]) if before in ("-d", "--dest")]
    return found


def outputs(command: Command) -> list[Output]:
    found = []
    for words in simple_commands(command.text):
        if words[0] != "explorer" and "paper_explorer.cli.main" not in words:
            found += outputs_of_shell(words)
    for arguments in explorer_calls(command.text):
        parsed = parse(arguments)
        found += outputs_of_call(parsed) if parsed else []
    return found


def inside(path: str, folder: str) -> bool:
    return path != folder and path.startswith(folder.rstrip("/") + "/")


def collision(output: Output, earlier: dict[str, tuple[Output, str]]) -> str | None:
    """Where an earlier command wrote what ``output`` would write, or None."""
    for path, (before, where) in earlier.items():
        same = path == output.path and not output.continues
        over = inside(path, output.path) and output.owns  # its output directory would hold an earlier output
        into = inside(output.path, path) and before.owns  # into another command's output directory
        if same or over or into:
            return f"{path}, which {where} already wrote"
    return None


def extra_needed(parsed: Parsed) -> str | None:
    """The extra of pyproject.toml a parsed command needs beyond ``make demo``'s install (measured:
    each of these says "install the model extra" without it; the rest runs on the base package)."""
    if parsed.path == ("export",):
        return "export"
    if parsed.path == ("train",) and parsed.value("--dry-run"):
        return None
    if parsed.path in {("train",), ("tiny-model",), ("convert-gguf",), ("rescore",), ("improve",), ("decide",), ("rl-rerank",)}:
        return "llm"
    if parsed.path == ("serve",):
        return "serve"
    if parsed.path in {("eval",), ("rl",)} and parsed.value("--ray"):
        return "ray"
    if parsed.path in {("run",), ("eval",)} and "hf" in (parsed.value("--policy"), parsed.value("--backend")):
        return "llm"
    return None


# A python block that trains, or runs the hf policy, needs the model extra.
PYTHON_NEEDS = {"llm": re.compile(r"\btrain\(|[\"']name[\"']:\s*[\"']hf[\"']")}


def needs(block: Block) -> list[tuple[int, str, str]]:
    """(line, what, extra) for each command or python block of ``block`` that needs an extra."""
    if block.language == "python":
        source = "\n".join(block.lines)
        return [(block.line, f"the python block at {block.where}", extra) for extra, uses in PYTHON_NEEDS.items() if uses.search(source)]
    found = []
    for command in commands(block) if block.language == "console" else []:
        for arguments in explorer_calls(command.text):
            parsed = parse(arguments)
            extra = extra_needed(parsed) if parsed else None
            if extra:
                found.append((command.line, f"`{command.text}` ({command.where})", extra))
    return found


# --- following the pages in one checkout ---------------------------------------------------------


def fresh_checkout(directory: Path) -> Path:
    """This checkout's tracked files as they are on disk (uncommitted edits included), in a new git
    repository that tracks them: what a clone holds, and what its `git status` is measured against."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=False)
    if listed.returncode != 0:
        pytest.skip(f"{ROOT} is not a git checkout, so it has no tracked files to copy")
    for name in filter(None, listed.stdout.decode().split("\0")):
        source = ROOT / name
        if source.exists() or source.is_symlink():  # a file deleted but not yet committed is not copied
            (directory / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, directory / name, follow_symlinks=False)
    identity = ["-c", "user.name=newcomer", "-c", "user.email=newcomer@example.invalid"]
    for git in (["init", "-q"], ["add", "-A"], [*identity, "commit", "-q", "--no-verify", "-m", "a fresh clone"]):
        subprocess.run(["git", *git], cwd=directory, check=True, capture_output=True)
    return directory


def snapshot(directory: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``directory`` (but .git and byte-code caches): its modification time and size."""
    files = {}
    for folder, subfolders, names in os.walk(directory):
        subfolders[:] = [name for name in subfolders if name not in (".git", "__pycache__")]
        for name in names:
            path = Path(folder) / name
            status = path.lstat()
            files[str(path.relative_to(directory))] = (status.st_mtime_ns, status.st_size)
    return files


class Newcomer:
    """Follows the blocks in one checkout, and says what went wrong on the way."""

    def __init__(self, checkout: Path) -> None:
        self.checkout = checkout
        self.tracked = set(snapshot(checkout))
        self.source_trees = {PurePosixPath(name).parts[0] for name in self.tracked if "/" in name}
        self.written: dict[str, str] = {}  # file -> the command that wrote it first
        self.files = snapshot(checkout)
        self.environment = {
            **os.environ,
            "PYTHONPATH": str(checkout),  # the project importable from the clone
            "DOCS_PYTHON": sys.executable,
            "PYTHONDONTWRITEBYTECODE": "1",
        }

    def follow(self, block: Block) -> None:
        if block.parse_only:
            return
        if block.file:
            (self.checkout / block.file).parent.mkdir(parents=True, exist_ok=True)
            (self.checkout / block.file).write_text("\n".join(block.lines) + "\n", encoding="utf-8")
            self.watch(block.where, [])
        elif block.language == "python":
            run_python(block)
            self.watch(f"the python block at {block.where}", [])
        else:
            for command in commands(block):
                self.run(command)
                self.watch(f"`{command.text}` ({command.where})", [o.path for o in outputs(command) if o.continues])

    def run(self, command: Command) -> None:
        words = shlex.split(command.text.replace("\\\n", " "), comments=True)
        if words and words[0] == "explorer" and not SHELL_SYNTAX.search(command.text):
            done = run_cli(*words[1:], cwd=self.checkout)
        else:
            done = subprocess.run(
                ["bash", "-ec", SHELL_PRELUDE + command.text],
                cwd=self.checkout,
                env=self.environment,
                capture_output=True,
                text=True,
                timeout=HANG_SECONDS,
            )
        assert done.returncode == 0, (
            f"{command.where}: `{command.text}` exited {done.returncode}\n"
            f"--- stdout (end)\n{done.stdout[-3000:]}\n--- stderr (end)\n{done.stderr[-3000:]}"
        )

    def watch(self, what: str, continued: list[str]) -> None:
        """Check the files ``what`` created or changed: none in the source tree, none an earlier
        command wrote (but under what it ``continued``)."""
        now = snapshot(self.checkout)
        changed = sorted(name for name, stamp in now.items() if self.files.get(name) != stamp)
        self.files = now
        for name in changed:
            if name in self.tracked or PurePosixPath(name).parts[0] in self.source_trees:
                pytest.fail(f"{what} wrote {name} inside the source tree; write under runs/ or models/")
            earlier = self.written.get(name)
            if earlier is not None and not any(name == path or inside(name, path) for path in continued):
                pytest.fail(f"{what} wrote {name}, which {earlier} already wrote: give it its own path")
            self.written.setdefault(name, what)

    def left_behind(self) -> list[str]:
        """`git status` of the checkout: untracked files that are not declared outputs, changed tracked files."""
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=all"], cwd=self.checkout, capture_output=True, text=True, check=True
        )
        return status.stdout.splitlines()


def run_python(block: Block) -> None:
    source = "\n".join(block.lines)
    try:
        exec(compile(source, block.where, "exec"), {"__name__": "__docs__"})
    except Exception as error:  # name the block: the traceback's file is the block's place
        raise AssertionError(f"{block.where}: the python block raised {type(error).__name__}: {error}") from error


FOLLOW_MARKS = [pytest.mark.slow] if any(block.slow for block in followed_blocks()) else []


# torch says this when it is first imported, here by a python block; a script never shows it (it is
# not raised in __main__), so neither does this test.
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
@pytest.mark.parametrize("pages", [pytest.param(PAGES, id="README-then-guides", marks=FOLLOW_MARKS)])
def test_a_newcomer_follows_readme_and_every_guide_in_order_in_one_clone(pages, tmp_path, monkeypatch):
    checkout = fresh_checkout(tmp_path / "clone")
    monkeypatch.chdir(checkout)  # python blocks write where the commands do
    monkeypatch.delenv("EXPLORER_CORPUS", raising=False)  # a reader's own default corpus is not the pages'
    newcomer = Newcomer(checkout)
    for page in pages:
        for block in page_blocks(page):
            newcomer.follow(block)
    left = newcomer.left_behind()
    assert not left, (
        "after every page, git status of the clone shows what is neither tracked nor a declared output "
        "(.gitignore: runs/, models/), or a tracked file changed:\n" + "\n".join(left)
    )


# --- what every command, run or parsed, is held to -----------------------------------------------


def all_commands() -> list[tuple[Block, Command]]:
    return [(block, command) for block in followed_blocks() if block.language == "console" for command in commands(block)]


def test_every_explorer_command_parses():
    problems = []
    for _, command in all_commands():
        for arguments in explorer_calls(command.text):
            try:
                parse(arguments)
            except Exception as error:
                problems.append(f"{command.where}: `explorer {shlex.join(arguments)}` does not parse: {error}")
    assert not problems, "\n".join(problems)


def written_in_order() -> list[tuple[str, list[Output]]]:
    """(what, its outputs) for every command and saved file, in the order a newcomer meets them."""
    found = []
    for block in followed_blocks():
        if block.file:
            found.append((block.where, [Output(normal(block.file))]))
        for command in commands(block) if block.language == "console" else []:
            found.append((f"`{command.text}` ({command.where})", outputs(command)))
    return found


def test_no_command_writes_where_an_earlier_one_wrote():
    earlier: dict[str, tuple[Output, str]] = {}
    problems = []
    for what, written in written_in_order():
        for output in written:
            clash = collision(output, earlier)
            if clash:
                problems.append(f"{what} writes {output.path}: {clash}")
            earlier.setdefault(output.path, (output, what))
    assert not problems, "pages followed in order collide; give each output its own path:\n" + "\n".join(problems)


def test_every_command_writes_only_declared_outputs():
    """Declared: what .gitignore ignores (runs/, models/), outside the source tree."""
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    if not tracked:
        pytest.skip(f"{ROOT} is not a git checkout")
    source_trees = {PurePosixPath(name).parts[0] for name in tracked if "/" in name}
    written = [(what, output.path) for what, outputs_ in written_in_order() for output in outputs_]
    ignored = subprocess.run(
        ["git", "check-ignore", "--no-index", "--stdin"],
        cwd=ROOT,
        input="\n".join(path for _, path in written),
        capture_output=True,
        text=True,
    ).stdout.split("\n")
    problems = []
    for what, path in written:
        if path.startswith(("/", "..")) or PurePosixPath(path).parts[0] in source_trees or path in tracked:
            problems.append(f"{what} writes {path}, outside the checkout or inside its source tree")
        elif path not in ignored:
            problems.append(f"{what} writes {path}, which .gitignore does not declare an output")
    assert not problems, "write under runs/ (models under models/):\n" + "\n".join(problems)


def test_every_page_says_to_install_the_extras_its_commands_need():
    problems = []
    for page in PAGES:
        lines = page.read_text(encoding="utf-8").splitlines()
        for block in page_blocks(page):
            for line, what, extra in needs(block):
                said = "\n".join(lines[: line - 1])
                if INSTALL.format(extra=extra) not in said and INSTALL.format(extra="dev") not in said:
                    problems.append(f"{what} needs the {extra} extra; say {INSTALL.format(extra=extra)} above it")
    assert not problems, "make demo installs the package alone:\n" + "\n".join(problems)


def test_readme_lists_every_docs_page_as_a_guide():
    unlisted = sorted(set((ROOT / "docs").glob("*.md")) - set(PAGES))
    assert not unlisted, f"README's Guides does not list {', '.join(p.name for p in unlisted)}: the test follows only what it lists"


def test_every_block_tag_is_known_and_commands_are_only_shown_where_they_are_tested():
    problems = []
    for page in PAGES:
        for block in read_blocks(page):
            unknown = set(block.tags) - set(PARSE_ONLY) - {SLOW} - {block.file}  # a file block's first tag is its name
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
    assert len(README.read_bytes()) <= 10_500, "README.md is for the first hour; move detail to docs/"


def test_the_readme_lists_every_command():
    import typer

    from paper_explorer.cli import main as cli_main

    def leaves(command, path):
        if hasattr(command, "commands"):
            for name, sub in command.commands.items():
                yield from leaves(sub, [*path, name])
        else:
            yield " ".join(path)

    readme = README.read_text(encoding="utf-8")
    absent = [name for name in leaves(typer.main.get_command(cli_main.app), ["explorer"]) if f"`{name}`" not in readme]
    assert not absent, f"README.md's table of commands lacks: {', '.join(absent)}"


def test_the_parser_of_this_test_finds_explorer_in_shell_lines():
    assert explorer_calls('VLLM_X=1 vllm serve m --port 8000 & explorer eval --out "a b" # note') == [["eval", "--out", "a b"]]
    assert explorer_calls("accelerate launch --num_processes 2 -m paper_explorer.cli.main train --out o") == [["train", "--out", "o"]]
    assert explorer_calls("for gpu in 0 1; do CUDA_VISIBLE_DEVICES=$gpu vllm serve m & done") == []
    with pytest.raises(Exception, match="No such option: --no-such-option"):
        parse(["eval", "--out", "x", "--no-such-option"])
    with pytest.raises(Exception, match="No such command"):
        parse(["no-such-command"])


def test_the_parser_of_this_test_finds_what_a_command_writes():
    def paths(text: str) -> list[tuple[str, bool]]:
        return [(output.path, output.continues) for output in outputs(Command("here", text, 1))]

    assert paths("explorer eval --out runs/a/ --limit 2") == [("runs/a", False)]
    assert paths("explorer eval --out runs/a --resume") == [("runs/a", True)]
    assert paths("explorer run --question-id q") == [("runs/trajectories.jsonl", True)]
    assert paths("explorer export runs/a runs/a.eval --to inspect") == [("runs/a.eval", False)]
    assert paths("echo 'x = 1' > runs/step.py && mkdir -p runs/q") == [("runs/step.py", False), ("runs/q", True)]
    assert paths("curl -LO https://example.org/a/data.tgz") == [("data.tgz", False)]
    assert paths("pip download --no-deps x==1 -d models/wheels") == [("models/wheels", False)]
    earlier = {"runs/a": (Output("runs/a"), "the first"), "data": (Output("data", owns=False), "mkdir")}
    assert collision(Output("runs/a"), earlier) == "runs/a, which the first already wrote"
    assert collision(Output("runs/a", continues=True), earlier) is None
    assert collision(Output("runs/a/report.html"), earlier) is not None  # inside another command's run
    assert collision(Output("runs"), earlier) is not None  # over it
    assert collision(Output("data/qasper-dev-v0.3.jsonl"), earlier) is None  # a plain folder is for filling


def test_the_install_rule_of_this_test_knows_the_model_commands():
    def extra(text: str) -> str | None:
        parsed = parse(shlex.split(text))
        return extra_needed(parsed) if parsed else None

    assert extra("tiny-model --out models/tiny") == "llm"
    assert extra("eval --policy hf --model m --out runs/a") == "llm"
    assert extra("eval --policy memory-reader --backend hf --model m --out runs/a") == "llm"
    assert extra("train --dry-run --data d") is None
    assert extra("eval --out runs/a --tokenizer models/tiny") is None
    assert extra("export runs/a runs/b --to hf") == "export"
    assert extra("decide f.jsonl --model m --out runs/d") == "llm"
    assert extra("serve --model m") == "serve"
    assert extra("eval --ray auto --out runs/a") == "ray"
