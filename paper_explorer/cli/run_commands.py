"""``explorer run`` (one episode, shown live) and ``explorer show`` (an episode from a log)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Column, Table

from paper_explorer.agent.config import RunConfig, load_config
from paper_explorer.agent.terminal_text import untrusted, visible
from paper_explorer.agent.trajectory import Trajectory
from paper_explorer.agent.writer import TornLine, read_whole_lines
from paper_explorer.cli.display import id_column, print_episode, print_outcome, print_question, print_step, trajectories_file
from paper_explorer.cli.errors import UsageError
from paper_explorer.cli.flags import config_flags
from paper_explorer.cli.options import ConfigOption, CorpusOption, ReplayOtherCorpusOption

console = Console()


@config_flags(RunConfig)
def run_command(
    question_text: str | None = typer.Option(None, "--question", "-q", help="A question of your own (no gold answer)."),
    question_id: str | None = typer.Option(None, "--question-id", help="A question of the corpus, by id."),
    corpus_path: Path | None = CorpusOption,
    config_file: Path | None = ConfigOption,
    out: Path = typer.Option(Path("runs"), "--out", "-o", help="Directory whose trajectories.jsonl the episode is appended to."),
    replay_other_corpus: bool = ReplayOtherCorpusOption,
    overrides: dict | None = None,  # the policy and episode settings given as flags (cli.flags, from RunConfig's fields)
) -> None:
    """Run one episode and show each step live: the code, the tools it called, what it observed."""
    from paper_explorer.evaluation.episode import run

    config = load_config(RunConfig, config_file, overrides or {})
    episode = run(
        config,
        question=question_text,
        question_id=question_id,
        corpus=corpus_path,  # loaded after the policy's preflight: a dead server is said before a big corpus loads
        out=out,
        replay_other_corpus=replay_other_corpus,
        note=lambda line: typer.echo(f"note: {visible(line)}", err=True),  # it may quote the server
        on_start=lambda text, asked, policy: print_question(console, text, asked, policy),
        on_step=lambda step: print_step(console, step),
    )
    print_outcome(console, episode.trajectory, written_to=episode.written_to)
    if episode.replay_drift is not None:
        from paper_explorer.evaluation.summary import print_replay_drift

        print_replay_drift(console, episode.replay_drift)
    if episode.question is not None:
        console.print(untrusted(f"gold answer: {episode.gold_answer or '(none)'}", style="dim"))


def show_command(
    trajectories: Path = typer.Argument(..., help="A trajectories .jsonl file (from run or eval)."),
    episode: str | None = typer.Option(None, "--episode", "-e", help="Episode id (or question id) to show."),
    line: int | None = typer.Option(
        None, "--line", "-l", min=1, help="Show the episode on this line of the file (when --episode matches several)."
    ),
) -> None:
    """Print an episode the way `run` showed it; without --episode or --line, list the file's episodes.

    A torn last line (a run killed mid-write, or one still writing) is skipped and said on stderr."""
    found, torn = read_whole_lines(trajectories_file(trajectories))
    if torn is not None:
        typer.echo(
            f"note: {trajectories}:{torn.number}: skipped a torn last line ({torn.size} bytes without a newline: "
            "an interrupted run, or one still writing)",
            err=True,
        )
    if not found:
        raise UsageError(f"{trajectories}: holds no episodes")
    if line is not None:
        print_episode(console, episode_on_line(trajectories, found, line, episode, torn))
        return
    if episode is None:
        if len(found) == 1:
            print_episode(console, found[0][1])
            return
        console.print(episode_table(found))
        console.print(f"[dim]{len(found)} episodes; show one with --episode ID (or --line N)[/dim]")
        return
    matches = [(number, t) for number, t in found if episode in (t.episode_id, t.question_id)]
    if not matches:
        raise UsageError(f"{trajectories}: no episode {episode!r}; run without --episode to list them")
    if len(matches) > 1:  # the same question run twice, or copied logs: the user picks, nothing is guessed
        console.print(episode_table(matches))
        raise UsageError(
            f"{trajectories}: {len(matches)} episodes match {episode!r} (listed above); "
            f"pick one with --line N (lines {', '.join(str(number) for number, _ in matches)})"
        )
    print_episode(console, matches[0][1])


def episode_table(numbered: list[tuple[int, Trajectory]]) -> Table:
    """Episodes with the file line each is on (what --line takes)."""
    # the id stays whole (--episode takes it) and the time folds, never cut short: they tell duplicates apart
    table = Table("line", id_column(), "question", "status", "steps", Column("started_at", overflow="fold"), "answer")
    for number, item in numbered:  # every cell but the line number came from the log: data, not markup
        table.add_row(
            str(number),
            *(
                untrusted(cell)
                for cell in (
                    item.episode_id,
                    item.question[:50],
                    item.outcome.status,
                    str(len(item.steps)),
                    item.started_at,
                    (item.outcome.answer or "")[:30],
                )
            ),
        )
    return table


def episode_on_line(path: Path, found: list[tuple[int, Trajectory]], line: int, episode: str | None, torn: TornLine | None) -> Trajectory:
    """The episode on file line ``line``; with --episode too, it must be that episode."""
    if torn is not None and line == torn.number:
        raise UsageError(f"{path}:{line}: is the torn last line, which holds no whole episode; choose another --line")
    chosen = next((t for number, t in found if number == line), None)
    if chosen is None:
        raise UsageError(f"{path}:{line}: no episode on that line (the file's episodes are on lines {found[0][0]}-{found[-1][0]})")
    if episode is not None and episode not in (chosen.episode_id, chosen.question_id):
        raise UsageError(f"{path}:{line}: holds episode {chosen.episode_id} (question {chosen.question_id}), not {episode!r}")
    return chosen
