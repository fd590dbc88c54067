"""How an episode looks in the terminal, live (``explorer run``) and afterwards (``explorer show``)."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console, Group
from rich.panel import Panel
from rich.syntax import Syntax
from rich.text import Text

from agent.trajectory import Step, Trajectory

OBSERVATION_LINES = 12
OBSERVATION_WIDTH = 300


def shorten(observation: str) -> str:
    lines = observation.splitlines()
    shown = [line if len(line) <= OBSERVATION_WIDTH else line[:OBSERVATION_WIDTH] + " ..." for line in lines[:OBSERVATION_LINES]]
    if len(lines) > OBSERVATION_LINES:
        shown.append(f"... ({len(lines) - OBSERVATION_LINES} more lines)")
    return "\n".join(shown)


def _short(value, width: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= width else text[:width - 4] + "...'"


def print_question(console: Console, question: str, question_id: str | None, policy: str) -> None:
    where = f" [dim]({question_id})[/dim]" if question_id else ""
    console.print(f"[bold]Question[/bold]{where}: {question}")
    console.print(f"[dim]policy: {policy}[/dim]")


def print_step(console: Console, step: Step) -> None:
    parts = []
    thought = step.action_text.split("```", 1)[0].strip() if step.code is not None else ""
    if thought:
        parts.append(Text(thought, style="italic"))
    if step.code is not None:
        parts.append(Syntax(step.code, "python", theme="ansi_dark", background_color="default", word_wrap=True))
    else:
        shown = shorten(step.action_text.strip()) if step.action_text.strip() else f"(a blank reply: {len(step.action_text)} whitespace characters)"
        parts.append(Text(shown, style="red"))
    calls = ", ".join(
        f"{call.name}({', '.join(f'{k}={_short(v)}' for k, v in call.arguments.items() if v is not None)})"
        + (" [error]" if call.error else "") + f" {call.seconds * 1000:.1f} ms"
        for call in step.tool_calls
    )
    if calls:
        parts.append(Text(f"tools: {calls}", style="cyan"))
    if step.generation:
        g = step.generation
        tokens = f"tokens: prompt {g.prompt_tokens}" if g.prompt_tokens is not None else f"chat API: prompt {g.usage_prompt_tokens} (its tokens)"
        if g.prefill_tokens is not None:
            tokens += f", prefilled {g.prefill_tokens} (cached {g.cached_tokens})"
        tokens += f", generated {g.generated_tokens}" + (" - hit the cap" if g.hit_cap else "")
        if g.parity_warning:
            tokens += f"; parity warning: {g.parity_warning}"
        parts.append(Text(tokens, style="magenta"))
    flags = [flag for flag, on in (
        ("format error", step.format_error), (f"limit: {step.limit_hit}", step.limit_hit),
        (f"observation cut by {step.observation_chars_cut} characters", step.observation_chars_cut),
    ) if on]
    observation = Text(shorten(step.observation), style="red" if step.error or step.format_error else "")
    parts.append(Panel(observation, title="observation", title_align="left", border_style="dim"))
    if flags:
        parts.append(Text("; ".join(flags), style="yellow"))
    console.print(Panel(Group(*parts), title=f"step {step.index + 1}", title_align="left"))


def print_outcome(console: Console, trajectory: Trajectory, written_to: Path | None = None) -> None:
    outcome = trajectory.outcome
    style = {"submitted": "green", "abstained": "yellow"}.get(outcome.status, "red")
    line = f"[bold {style}]{outcome.status}[/bold {style}]"
    if outcome.answer is not None:
        line += f": {outcome.answer!r}"
    if outcome.reason:
        line += f" [dim]({outcome.reason})[/dim]"
    console.print(line)
    for item in outcome.evidence:
        console.print(f"  evidence: {item.paper_id} section {item.section} paragraph {item.paragraph}: [dim]{item.text[:120]}...[/dim]")
    tools = sum(len(step.tool_calls) for step in trajectory.steps)
    console.print(f"[dim]{len(trajectory.steps)} steps, {tools} tool calls, {trajectory.seconds:.2f} s; episode {trajectory.episode_id}[/dim]")
    if written_to is not None:
        console.print(f"trajectory written to {written_to}")


def print_episode(console: Console, trajectory: Trajectory) -> None:
    print_question(console, trajectory.question, trajectory.question_id, trajectory.policy.name)
    for step in trajectory.steps:
        print_step(console, step)
    print_outcome(console, trajectory)
