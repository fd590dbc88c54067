"""Built SFT data against the trajectories it came from: the same tokens, the same labels.

``explorer check-parity --data DIR`` re-renders every example's trajectory with the tokenizer
being checked and compares ``input_ids`` and ``labels`` token by token (an example cut after a
whole turn is compared with that prefix); the data's tokenizer fingerprint must be the
tokenizer's too.
"""

from __future__ import annotations

from agent.parity import Mismatch, differing
from agent.renderer import ChatRenderer
from agent.served import common_prefix
from agent.trajectory import Trajectory
from sft.dataset import IGNORE, tokenize_trajectory
from sft.records import BuildReport, Example


def check_report(report: BuildReport, renderer: ChatRenderer, data: str) -> Mismatch | None:
    if report.tokenizer_sha256 != renderer.fingerprint:
        return Mismatch(data, f"built with the tokenizer {report.tokenizer_sha256[:12]} ({report.tokenizer}), "
                              f"checked with {renderer.fingerprint[:12]}")
    return None


def check_example(example: Example, trajectory: Trajectory | None, renderer: ChatRenderer, train_thinking: bool) -> Mismatch | None:
    where = f"example {example.episode_id}"
    if trajectory is None:
        return Mismatch(where, "its trajectory is not among the files given; pass every file the data was built from")
    ids, labels, _ = tokenize_trajectory(trajectory, renderer, train_thinking)
    end = len(example.input_ids) if example.split_at_turn is not None else len(ids)
    mismatch = differing(where, "the example's input_ids differ from its trajectory's tokens", example.input_ids, ids[:end], renderer)
    if mismatch is not None:
        return mismatch
    if example.labels != labels[:end]:
        position = common_prefix(example.labels, labels[:end])
        token = renderer.decode(example.input_ids[position:position + 1])
        said = "trained" if example.labels[position] != IGNORE else "not trained"
        return Mismatch(where, f"the example's labels differ from its trajectory's at token {position} ({token!r}): "
                               f"the example has it {said}, the trajectory's rendering does not")
    return None
