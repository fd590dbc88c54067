"""Built SFT data against the trajectories it came from: the same tokens, the same labels.

``explorer check-parity --data DIR`` re-renders every example's trajectory with the tokenizer
being checked and compares ``input_ids`` and ``labels`` token by token (an example cut after a
whole turn is compared with that prefix); the data's tokenizer fingerprint must be the
tokenizer's too.
"""

from __future__ import annotations

from paper_explorer.agent.parity import Mismatch, differing
from paper_explorer.agent.renderer import ChatRenderer
from paper_explorer.agent.served import common_prefix
from paper_explorer.agent.trajectory import Trajectory, is_direct_submit
from paper_explorer.sft.dataset import IGNORE, tokenize_trajectory
from paper_explorer.sft.records import BuildReport, Example


def check_report(report: BuildReport, renderer: ChatRenderer, data: str) -> Mismatch | None:
    if report.tokenizer_sha256 != renderer.fingerprint:
        return Mismatch(
            data, f"built with the tokenizer {report.tokenizer_sha256[:12]} ({report.tokenizer}), checked with {renderer.fingerprint[:12]}"
        )
    return None


def check_example(example: Example, candidates: list[Trajectory], renderer: ChatRenderer, train_thinking: bool) -> Mismatch | None:
    """None when the example is exactly one of ``candidates`` (the trajectories with its episode
    id) through the renderer: ids, labels, turns, and where it was cut; else the first difference."""
    if not candidates:
        return Mismatch(
            f"example {example.episode_id}", "its trajectory is not among the files given; pass every file the data was built from"
        )
    mismatches = [_against(example, trajectory, renderer, train_thinking) for trajectory in candidates]
    return None if None in mismatches else mismatches[0]


def _against(example: Example, trajectory: Trajectory, renderer: ChatRenderer, train_thinking: bool) -> Mismatch | None:
    where = f"example {example.episode_id}"
    ids, labels, turns = tokenize_trajectory(trajectory, renderer, train_thinking)
    if example.split_at_turn is not None:
        kept = example.split_at_turn
        if not 0 < kept < len(turns):
            return Mismatch(where, f"cut after {kept} turns, but its trajectory has {len(turns)}")
        turns = turns[:kept]
        ids, labels = ids[: turns[-1].end_of_turn], labels[: turns[-1].end_of_turn]
    mismatch = differing(where, "the example's input_ids differ from its trajectory's tokens", example.input_ids, ids, renderer)
    if mismatch is not None:
        return mismatch
    if example.labels != labels:
        position = common_prefix(example.labels, labels)
        token = renderer.decode(example.input_ids[position : position + 1])
        said = "missing" if position >= len(example.labels) else "trained" if example.labels[position] != IGNORE else "not trained"
        return Mismatch(
            where, f"the example's labels differ from its trajectory's at token {position} ({token!r}): the example has it {said}"
        )
    if example.turns != turns:
        return Mismatch(where, "the example's turns (trained spans and their types) differ from its trajectory's")
    facts = {
        "question_id": trajectory.question_id,
        "question": trajectory.question,
        "first_action_submits": is_direct_submit(trajectory),
    }
    if trajectory.paper_id is not None:
        facts["paper_id"] = trajectory.paper_id
    wrong = [name for name, value in facts.items() if getattr(example, name) != value]
    if wrong:
        return Mismatch(where, f"the example's {', '.join(wrong)} differ from its trajectory's")
    return None
