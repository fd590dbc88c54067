"""Click's usage errors (unknown option, missing option, bad value, no such command) as one line.

Left alone, typer prints them as a usage line, a hint and a boxed panel. The root group below
turns each into our own ``UsageError`` with one line, ``<command>: <what> (see <command> --help)``,
which ``cli.main.main`` prints like every other bad input (exit 2). Only the parsing and
invoking of commands is wrapped, never typer's ``main``: help, ``--version``, ``typer.Exit`` and
a bare group's help (click's ``NoArgsIsHelpError``, also a usage error) take typer's own path.
"""

from __future__ import annotations

from contextlib import contextmanager

from typer.core import TyperGroup

# Recent typer parses with its own copy of click: these, not the `click` package's, are what it
# raises. Older releases parse with `click` itself.
try:
    from typer._click.exceptions import NoArgsIsHelpError, NoSuchOption
    from typer._click.exceptions import UsageError as ClickUsageError
except ImportError:  # the same classes, from click: mypy checks against the typer installed, which has its own copy
    from click.exceptions import NoArgsIsHelpError, NoSuchOption  # type: ignore[assignment]
    from click.exceptions import UsageError as ClickUsageError  # type: ignore[assignment]

from paper_explorer.cli.errors import UsageError


def one_line(error: ClickUsageError, command: str) -> str:
    """``explorer run: no such option: --bogus (see explorer run --help)``.

    ``command`` names the command when click did not attach its context to the error (it does
    not for an option missing its value).
    """
    if error.ctx is not None:
        command = error.ctx.command_path
    if isinstance(error, NoSuchOption):  # click's "(Possible options: ...)" would nest parentheses
        what = error.message
        hint = f"close options: {', '.join(sorted(error.possibilities))}; " if error.possibilities else ""
    else:
        what, hint = error.format_message(), ""
    what = " ".join(what.split()).rstrip(".")
    if what[1:2].islower():  # "Missing option" -> "missing option", but "URL ..." stays
        what = what[0].lower() + what[1:]
    return f"{command}: {what} ({hint}see {command} --help)"


@contextmanager
def _as_one_line(command: str):
    try:
        yield
    except ClickUsageError as error:
        if isinstance(error, NoArgsIsHelpError):  # a bare group: help is printed, typer exits 2
            raise
        raise UsageError(one_line(error, command)) from error


def _named_command(ctx, args: list[str]) -> str:
    """``explorer corpus search`` for ``corpus search x -k``: the subcommands the words name."""
    path, command = [ctx.command_path], ctx.command
    for word in args:
        subcommand = command.get_command(ctx, word) if isinstance(command, TyperGroup) else None
        if subcommand is None:
            break
        path.append(word)
        command = subcommand
    return " ".join(path)


class OneLineUsageErrors(TyperGroup):
    """The root group: every click usage error below it, in any subcommand, becomes one line.

    Subcommands are parsed inside the root's ``invoke``, so wrapping the root's ``make_context``
    (its own options) and ``invoke`` (everything under it) covers the whole tree.
    """

    def make_context(self, info_name, args, parent=None, **extra):
        with _as_one_line(info_name or "explorer"):
            return super().make_context(info_name, args, parent=parent, **extra)

    def invoke(self, ctx):
        # The words after the root's options, read where TyperGroup.invoke reads them.
        with _as_one_line(_named_command(ctx, [*ctx._protected_args, *ctx.args])):
            return super().invoke(ctx)
