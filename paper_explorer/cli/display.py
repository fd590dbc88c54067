"""How an episode looks in the terminal, live (``explorer run``) and afterwards (``explorer show``),
and what a run says while it runs (``ConsoleReporter``: ``explorer eval``'s notes and progress bar);
``trajectories_file``: what ``explorer show`` was given instead of a trajectories file.

Everything an episode holds came from a model, a worker or a questions file: it is shown through
``agent.terminal_text`` (rich ``Text``, controls made visible), never as markup. Only the
labels and styles around it are ours."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

from rich.console import Console, Group, RenderableType
from rich.markup import escape
from rich.panel import Panel
from rich.syntax import Syntax
from rich.table import Column, Table
from rich.text import Text

from paper_explorer.agent.terminal_text import untrusted, visible
from paper_explorer.agent.trajectory import Reading, Step, Trajectory
from paper_explorer.cli.errors import UsageError

OBSERVATION_LINES = 12
OBSERVATION_WIDTH = 300


def shorten(observation: str) -> str:
    """At most OBSERVATION_LINES lines of OBSERVATION_WIDTH characters; controls made visible first,
    so only newlines split it (str.splitlines would break at U+2028, U+0085 and others too)."""
    lines = visible(observation).split("\n")
    shown = [line if len(line) <= OBSERVATION_WIDTH else line[:OBSERVATION_WIDTH] + " ..." for line in lines[:OBSERVATION_LINES]]
    if len(lines) > OBSERVATION_LINES:
        shown.append(f"... ({len(lines) - OBSERVATION_LINES} more lines)")
    return "\n".join(shown)


def id_column(header: str = "episode") -> Column:
    """A column of the ids the next command takes (``--episode ID``): whole on one line in any
    terminal, never cut to ``demo-00007-q0:s…`` or folded; the table's other columns fold instead."""
    return Column(header, no_wrap=True)


def _short(value, width: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= width else text[: width - 4] + "...'"


def print_question(console: Console, question: str, question_id: str | None, policy: str) -> None:
    where = Text.assemble(" (", untrusted(question_id), ")", style="dim") if question_id else ""
    console.print(Text.assemble(("Question", "bold"), where, ": ", untrusted(question)))
    console.print(Text.assemble("policy: ", untrusted(policy), style="dim"))


def print_step(console: Console, step: Step) -> None:
    parts: list[RenderableType] = []
    if step.reasoning is not None:  # thinking mode: the think block, whole; why the model acted is in it, and nowhere else
        budget = ", closed for the model at its budget" if step.generation and step.generation.thinking_budget_hit else ""
        said = untrusted(step.reasoning.strip("\n"), style="italic") if step.reasoning.strip() else Text("(empty)", style="dim")
        parts.append(Panel(said, title=f"reasoning (think block{budget})", title_align="left", border_style="dim"))
    thought = step.action_text.split("```", 1)[0].strip() if step.code is not None else ""
    if thought:
        parts.append(untrusted(thought, style="italic"))
    if step.code is not None:  # Syntax passes ESC and other controls through as they are: shown visibly first
        parts.append(Syntax(visible(step.code), "python", theme="ansi_dark", background_color="default", word_wrap=True))
    else:
        shown = (
            shorten(step.action_text.strip())
            if step.action_text.strip()
            else f"(a blank reply: {len(step.action_text)} whitespace characters)"
        )
        parts.append(Text(shown, style="red"))
    calls = ", ".join(
        f"{call.name}({', '.join(f'{k}={_short(v)}' for k, v in call.arguments.items() if v is not None)})"
        + (" [error]" if call.error else "")
        + f" {call.seconds * 1000:.1f} ms"
        for call in step.tool_calls
    )
    if calls:
        parts.append(untrusted(f"tools: {calls}", style="cyan"))
    if step.generation:
        g = step.generation
        tokens = (
            f"tokens: prompt {g.prompt_tokens}" if g.prompt_tokens is not None else f"chat API: prompt {g.usage_prompt_tokens} (its tokens)"
        )
        if g.prefill_tokens is not None:
            tokens += f", prefilled {g.prefill_tokens} (cached {g.cached_tokens})"
        tokens += f", generated {g.generated_tokens}" + (" - hit the cap" if g.hit_cap else "")
        if g.parity_warning:
            tokens += f"; parity warning: {g.parity_warning}"
        parts.append(untrusted(tokens, style="magenta"))  # a parity warning quotes the model's tokens
    flags = [
        flag
        for flag, on in (
            ("format error", step.format_error),
            (f"limit: {step.limit_hit}", step.limit_hit),
            (f"observation cut by {step.observation_chars_cut} characters", step.observation_chars_cut),
        )
        if on
    ]
    observation = Text(shorten(step.observation), style="red" if step.error or step.format_error else "")
    parts.append(Panel(observation, title="observation", title_align="left", border_style="dim"))
    if flags:
        parts.append(untrusted("; ".join(flags), style="yellow"))
    console.print(Panel(Group(*parts), title=f"step {step.index + 1}", title_align="left"))


def print_outcome(console: Console, trajectory: Trajectory, written_to: Path | None = None) -> None:
    outcome = trajectory.outcome
    style = {"submitted": "green", "abstained": "yellow"}.get(outcome.status, "red")
    line = Text(outcome.status, style=f"bold {style}")
    if outcome.answer is not None:
        line.append(": ").append_text(untrusted(repr(outcome.answer)))
    if outcome.reason:
        line.append(" ").append_text(untrusted(f"({outcome.reason})", style="dim"))
    console.print(line)
    for item in outcome.evidence:
        console.print(
            Text.assemble(
                "  evidence: ",
                untrusted(f"{item.paper_id} section {item.section} paragraph {item.paragraph}: "),
                untrusted(f"{item.text[:120]}...", style="dim"),
            )
        )
    reading = next((s.policy_info.reading for s in reversed(trajectory.steps) if s.policy_info and s.policy_info.reading), None)
    if reading is not None:
        print_reading(console, reading)
    tools = sum(len(step.tool_calls) for step in trajectory.steps)
    console.print(
        untrusted(
            f"{len(trajectory.steps)} steps, {tools} tool calls, {trajectory.seconds:.2f} s; episode {trajectory.episode_id}", style="dim"
        )
    )
    if written_to is not None:
        console.print(untrusted(f"trajectory written to {written_to}"))


def print_reading(console: Console, reading: Reading) -> None:
    """The memory reader's updates, one row each, and what it read and spent."""
    table = Table(title="memory updates", title_justify="left")
    for column in ("pass", "page", "tokens", "memory in", "memory out", "prompt", "written"):
        table.add_column(column, justify="right")
    table.add_column("note")
    for update in reading.updates:
        note = "kept (sentinel)" if update.kept else ("cut at the cap" if update.hit_cap else "")
        table.add_row(
            str(update.pass_index),
            str(update.page + 1),
            f"{update.start}-{update.end}",
            str(update.memory_tokens_in),
            str(update.memory_tokens_out),
            str(update.served.tokens),
            str(update.generation.generated_tokens if update.generation.generated_tokens is not None else "?"),
            note,
        )
    if reading.updates:
        console.print(table)
    last = next((update.memory for update in reversed(reading.updates) if update.memory is not None), None)
    if last is not None:
        console.print(Text.assemble(("final memory: ", "dim"), untrusted(_short(last, OBSERVATION_WIDTH))))
    if reading.answer is not None:
        said = f" ({reading.answer.invalid})" if reading.answer.invalid else ""
        console.print(Text.assemble(("model's answer: ", "dim"), untrusted(repr(reading.answer.text)), untrusted(said, style="dim")))
    if reading.document == "verbatim":
        oracle = f" (its own document, verbatim: {len(reading.document_text or ''):,} characters)"
    else:
        oracle = " (an oracle: the question's own paper)" if reading.scope == "paper" else ""
    papers = ", ".join(reading.papers) or "none"
    console.print(
        untrusted(
            f"read {papers}{oracle}: {reading.document_tokens} document tokens, {reading.unread_tokens} unread; "
            f"{reading.pages} pages x {reading.passes} pass(es); {reading.model_tokens} model tokens"
            + (f" of a budget of {reading.token_budget}" if reading.token_budget is not None else ""),
            style="dim",
        )
    )
    if reading.stopped:
        console.print(untrusted(f"stopped reading at {reading.stopped}", style="yellow"))


def print_episode(console: Console, trajectory: Trajectory) -> None:
    print_question(console, trajectory.question, trajectory.question_id, trajectory.policy.name)
    for step in trajectory.steps:
        print_step(console, step)
    print_outcome(console, trajectory)


class ConsoleReporter:
    """``evaluation.run.Reporter`` on a terminal: notes in yellow ("note: ...") and progress lines
    on ``console`` (stderr for eval), and a progress bar while the episodes run. A note may quote
    a server, so every line is shown as data, never as markup."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def note(self, line: str) -> None:
        self.console.print(untrusted(f"note: {line}", style="yellow"))

    def say(self, line: str) -> None:
        self.console.print(untrusted(line))

    @contextlib.contextmanager
    def progress(self, total: int, done: int) -> Iterator[Callable[[int], None]]:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        columns = (TextColumn("episodes"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn())
        with Progress(*columns, console=self.console, transient=False) as bar:
            task = bar.add_task("episodes", total=total, completed=done)
            yield lambda episodes: bar.advance(task, episodes)


# A run directory's other files, as a user would call them.
RUN_FILES = {
    "manifest.json": "manifest (config, versions, hashes)",
    "metrics.json": "metrics",
    "scores.jsonl": "per-episode scores",
    "calibrated.json": "calibrated probabilities",
}


def trajectories_file(path: Path) -> Path:
    """``path``, a trajectories .jsonl file; a run directory or another file of a run is refused
    with the command that reads it."""
    from paper_explorer.evaluation.run_directory import EVAL_RUN, TRAJECTORIES, kind_of

    if path.is_dir():
        log = path / TRAJECTORIES
        if log.is_file():
            raise UsageError(f"{path}: a run directory; name its trajectories file: explorer show {log}")
        raise UsageError(f"{path}: a directory without {TRAJECTORIES}; name a trajectories file (from explorer run or eval)")
    what = RUN_FILES.get(path.name)
    if what is not None and path.is_file():
        run = path.parent
        inspect = f"explorer inspect {run} summarises the run" if kind_of(run) is EVAL_RUN else "explorer inspect RUN reads it"
        raise UsageError(
            f"{path}: a run's {what}, not a trajectories file; explorer show {run / TRAJECTORIES} prints its episodes, {inspect}"
        )
    return path


def print_rl_rounds(console: Console, out: Path) -> None:
    """The rounds as a table (also what ``explorer inspect OUT`` shows for an rl run)."""
    from paper_explorer.rl.run import rounds_of

    summary, records = rounds_of(out)
    table = Table(
        "round",
        "reward",
        "no signal",
        "DS",
        "KL",
        "clipped",
        "val F1",
        "val DS",
        "chosen",
        title=f"explorer rl: {escape(visible(str(out)))}",
        caption="no signal: groups whose rewards were all equal; DS: direct-submit rate of the samples; val: greedy validation episodes",
    )
    for record in records:
        seen, update = record.validation, record.update
        table.add_row(
            str(record.round),
            f"{record.reward_mean:+.3f}",
            f"{record.groups_without_signal}/{record.groups}",
            f"{record.direct_submit_rate:.0%}",
            _formatted(update.kl, "{:.4f}"),
            _formatted(update.clip_fraction, "{:.1%}"),
            _formatted(seen.answer_f1, "{:.3f}"),
            _formatted(seen.direct_submit_rate, "{:.0%}"),
            "yes" if summary is not None and summary.best_round == record.round else "",
        )
    console.print(table)
    if summary is not None:
        console.print(untrusted(summary.criterion))
        for warning in summary.warnings:
            console.print(untrusted(f"warning: {warning}", style="bold red"))


def _formatted(value: float | None, form: str) -> str:
    return "-" if value is None else form.format(value)
