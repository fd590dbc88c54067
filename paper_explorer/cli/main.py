"""The ``explorer`` command line.

Every command turns a bad input into one line on stderr and exit code 2; a traceback from our
own code never reaches the user. Heavy modules are imported inside the commands that need them.
Error and log lines may quote a server, a worker or a data file: they are written through
``agent.terminal_text.visible``, so a control character in them is shown, never acted on.
"""

from __future__ import annotations

import logging
import os
import sys
from importlib.metadata import PackageNotFoundError, version

import typer

from paper_explorer.agent.errors import AgentError
from paper_explorer.agent.terminal_text import visible
from paper_explorer.cli.calibrate_command import calibrate_app
from paper_explorer.cli.corpus_commands import corpus_app
from paper_explorer.cli.decide_command import decide_command
from paper_explorer.cli.errors import UsageError, error_line
from paper_explorer.cli.eval_command import eval_command
from paper_explorer.cli.exec_command import exec_command
from paper_explorer.cli.export_command import export_command
from paper_explorer.cli.flags import flag_spelling
from paper_explorer.cli.improve_command import improve_command
from paper_explorer.cli.inspect_commands import compare_command, inspect_command, preregister_command, report_command
from paper_explorer.cli.merge_command import merge_command
from paper_explorer.cli.model_commands import convert_gguf_command, tiny_model_command
from paper_explorer.cli.parity_command import check_parity_command
from paper_explorer.cli.questions_command import questions_app
from paper_explorer.cli.rerank_command import rerank_serve_command
from paper_explorer.cli.rerank_rl_command import rl_rerank_command
from paper_explorer.cli.rescore_command import rescore_command
from paper_explorer.cli.rl_command import rl_command
from paper_explorer.cli.run_commands import run_command, show_command
from paper_explorer.cli.schema_command import schema_command
from paper_explorer.cli.serve_command import serve_command
from paper_explorer.cli.sft_commands import sft_app, train_command
from paper_explorer.cli.usage_errors import OneLineUsageErrors
from paper_explorer.corpus.errors import CorpusError
from paper_explorer.corpus.files import FileRefused
from paper_explorer.corpus.setting_names import spelled
from paper_explorer.evaluation.errors import EvaluationError
from paper_explorer.sft.errors import TrainingError

# Bad input, found by the layer that read it: one line, exit 2. FileRefused: a file that is not one
# to read or write (corpus.files), where no layer put it in words of its own.
INPUT_ERRORS = (UsageError, CorpusError, AgentError, EvaluationError, TrainingError, FileRefused)

app = typer.Typer(
    name="explorer",
    cls=OneLineUsageErrors,  # click's usage errors become our one-line UsageError
    help="Run research agents over a corpus of papers, train their adapters, and inspect what they did.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.add_typer(corpus_app, name="corpus")
app.add_typer(sft_app, name="sft")
app.add_typer(questions_app, name="questions")
app.add_typer(calibrate_app, name="calibrate")
app.command("exec")(exec_command)
app.command("run")(run_command)
app.command("show")(show_command)
app.command("eval")(eval_command)
app.command("check-parity")(check_parity_command)
app.command("tiny-model")(tiny_model_command)
app.command("convert-gguf")(convert_gguf_command)
app.command("preregister")(preregister_command)
app.command("inspect")(inspect_command)
app.command("compare")(compare_command)
app.command("report")(report_command)
app.command("train")(train_command)
app.command("improve")(improve_command)
app.command("rl")(rl_command)
app.command("schema")(schema_command)
app.command("export")(export_command)
app.command("merge")(merge_command)
app.command("rescore")(rescore_command)
app.command("decide")(decide_command)
app.command("rl-rerank")(rl_rerank_command)
app.command("serve")(serve_command)
app.command("rerank-serve")(rerank_serve_command)


class VisibleFormatter(logging.Formatter):
    """Log lines with their controls shown: a logged message may quote a server or a corpus file."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        """The message itself on one line: a path in it that holds a newline cannot start a forged line."""
        return visible(super().formatMessage(record)).replace("\n", "\\n")

    def format(self, record: logging.LogRecord) -> str:
        return visible(super().format(record))


def not_shown_by_its_library(record: logging.LogRecord) -> bool:
    """Whether the root's handler should show ``record``: not when a logger on its way up holds a
    handler of its own. huggingface_hub's does, and propagates too, so each retry it logs (offline,
    five of them) came out twice, once from each."""
    logger: logging.Logger | None = logging.getLogger(record.name)
    while logger is not None and logger is not logging.root:
        if logger.handlers:
            return False
        logger = logger.parent if logger.propagate else None
    return True


def _version(value: bool) -> None:
    if value:
        try:
            typer.echo(f"explorer {version('paper-explorer')}")
        except PackageNotFoundError:
            typer.echo("explorer (not installed)")
        raise typer.Exit()


@app.callback()
def _root(
    show_version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Also log informational messages (cache rebuilds)."),
) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(VisibleFormatter("%(levelname)s: %(message)s"))
    handler.addFilter(not_shown_by_its_library)
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, handlers=[handler])


def _is_sandbox_error(error: Exception) -> bool:
    """Whether ``error`` is a ``tools.sandbox.SandboxError``, without importing the sandbox (it
    brings the paper tools, numpy and scipy, which ``--help`` has no use for): a command that raised
    one has imported it already."""
    sandbox = sys.modules.get("paper_explorer.tools.sandbox")
    return sandbox is not None and isinstance(error, sandbox.SandboxError)


def _path_error(error: OSError) -> str | None:
    """A file system error about a path the user gave (a name too long, a directory that may not
    be searched, a file where a directory should be), met by a check outside ``corpus.files``
    (``Path.exists`` raises these in Python 3.11): one line naming the path, or None when the error
    names no path (then it is a bug, and its traceback is wanted)."""
    if error.filename is None:
        return None
    reason = error.strerror or type(error).__name__
    return f"{os.fsdecode(error.filename)}: {reason}; check the path"


def main() -> None:
    try:
        with spelled(flag_spelling):  # core errors name a setting by its flag (corpus.setting_names)
            app(prog_name="explorer")
    except INPUT_ERRORS as error:
        typer.echo(error_line(str(error)), err=True)
        sys.exit(2)
    except OSError as error:
        line = _path_error(error)
        if line is None:
            raise
        typer.echo(error_line(line), err=True)
        sys.exit(2)
    except Exception as error:
        if not _is_sandbox_error(error):
            raise
        typer.echo(error_line(str(error)), err=True)  # the machine, not the input: one line, exit 1
        sys.exit(1)
    except KeyboardInterrupt:
        typer.echo("interrupted", err=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
