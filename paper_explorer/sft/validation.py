"""How the weights being trained are judged, by behaviour and not only by loss, and which
checkpoint is chosen.

* Teacher-forced, on validation examples: loss and token accuracy on assistant tokens by turn
  type, and the probability that the first action starts with submit/abstain.
* K greedy validation episodes with the current weights, scored like ``explorer eval``: tool
  calls before submit, direct-submit rate, abstention, answer F1.
* The best checkpoint by behaviour (default: the highest answer F1 among those whose
  direct-submit rate is below 25%; among equals - early in training no validation episode may
  answer at all - the fewest steps without an action, then the lowest validation loss), and a loud warning when validation loss improves while the
  direct-submit rate rises - the shortcut this project exists to catch.

A validation never draws from the random streams training uses (``rng_untouched``), so a
resumed run trains exactly what an uninterrupted one would. Figures written to disk keep their
full precision; ``shown`` rounds them for people.
"""

from __future__ import annotations

import math
import random
import time
from contextlib import contextmanager
from pathlib import Path

from paper_explorer.corpus.files import FileRefused
from paper_explorer.corpus.jsonl import JsonLinesError, append_records, read_records, write_records
from paper_explorer.sft.checkpoints import complete_checkpoint
from paper_explorer.sft.config import TrainConfig
from paper_explorer.sft.dataset import IGNORE
from paper_explorer.sft.errors import TrainingError
from paper_explorer.sft.model import assistant_loss
from paper_explorer.sft.records import Behaviour, Example, Selection, TeacherForced, ValidationRecord


def shown(value: float | None) -> str:
    """A figure for people: three decimals (records on disk keep every digit); "-" when there is none."""
    return "-" if value is None else f"{value:.3f}"


def teacher_forced(model, examples: list[Example], renderer) -> TeacherForced:
    """Loss and token accuracy on assistant tokens by turn type, and the probability that the
    first action starts with submit/abstain rather than a tool call."""
    import torch

    device = next(model.parameters()).device
    sums = {kind: [0.0, 0, 0] for kind in ("tool", "final", "all")}  # loss sum, correct, tokens
    end_probabilities = []
    submit_ids, abstain_ids = renderer.text("submit"), renderer.text("abstain")
    with torch.inference_mode():
        for example in examples:
            ids = torch.tensor([example.input_ids], device=device)
            labels = torch.tensor([example.labels], device=device)
            loss, logits, targets = assistant_loss(model, ids, labels, reduction="none")
            positions = [p for p, label in enumerate(example.labels[1:], 1) if label != IGNORE]
            kinds = {}
            for turn in example.turns:
                for position in range(turn.start, turn.end):
                    kinds[position] = turn.type
            correct = (logits.argmax(-1) == targets).tolist()
            for value, right, position in zip(loss.tolist(), correct, positions):
                for kind in (kinds.get(position, "tool"), "all"):
                    sums[kind][0] += value
                    sums[kind][1] += right
                    sums[kind][2] += 1
            end_probabilities.append(_first_action_end_probability(model, example, renderer, submit_ids, abstain_ids))
    result = {}
    for kind, (loss_sum, right, count) in sums.items():
        result[f"loss_{kind}"] = loss_sum / count if count else None
        result[f"accuracy_{kind}"] = right / count if count else None
    result["first_action_end_probability"] = sum(end_probabilities) / len(end_probabilities) if end_probabilities else None
    return TeacherForced.model_validate(result)


def _first_action_end_probability(model, example: Example, renderer, submit_ids: list[int], abstain_ids: list[int]) -> float:
    """P(the code of the first action begins with "submit" or "abstain"), teacher-forced up to the code."""
    import torch

    if not example.turns:
        return 0.0
    start = example.turns[0].start
    action = renderer.decode(example.input_ids[start : example.turns[0].end])
    fence = action.find("```python\n")
    prefix = example.input_ids[:start] + renderer.text(action[: fence + len("```python\n")] if fence >= 0 else "")
    device = next(model.parameters()).device
    total = 0.0
    for continuation in (submit_ids, abstain_ids):
        ids = torch.tensor([prefix + continuation], device=device)
        logits = model(input_ids=ids, use_cache=False).logits[0].float()
        log_probs = torch.log_softmax(logits[len(prefix) - 1 : -1], dim=-1)
        total += math.exp(sum(log_probs[i, token].item() for i, token in enumerate(continuation)))
    return total


def behaviour(model, renderer, corpus, question_ids: list[str], config: TrainConfig) -> tuple[Behaviour, list]:
    """K greedy validation episodes with the current weights, scored like ``explorer eval``; the
    figures and the trajectories."""
    from paper_explorer.agent.policies.hf import HFPolicy
    from paper_explorer.agent.runner import EpisodeRunner
    from paper_explorer.agent.trajectory import EpisodeConfig
    from paper_explorer.corpus import BM25Index
    from paper_explorer.evaluation.scoring import run_metrics, score_episode

    questions = {q.id: q for q in corpus.questions}
    chosen = [questions[qid] for qid in question_ids if qid in questions][: config.validation_episodes]
    if not chosen:
        return Behaviour(), []
    policy = HFPolicy(
        model,
        renderer,
        name=config.model,
        quantization="in-memory",
        dtype=next(model.parameters()).dtype,
        max_new_tokens=config.validation_max_new_tokens,
    )
    runner = EpisodeRunner(corpus, BM25Index.cached(corpus), policy, EpisodeConfig(max_steps=config.validation_max_steps))
    trajectories = [runner.run(q.text, q) for q in chosen]
    scores = [score_episode(trajectory, q) for trajectory, q in zip(trajectories, chosen)]
    metrics = run_metrics(scores)
    before = [s.tool_calls_before_end for s in scores if s.status in ("submitted", "abstained")]
    steps = [step for trajectory in trajectories for step in trajectory.steps]
    return Behaviour(
        format_error_rate=sum(step.format_error for step in steps) / len(steps) if steps else None,
        episodes=len(scores),
        answer_f1=metrics.answer_f1,
        exact_match=metrics.exact_match,
        direct_submit_rate=metrics.verdict.direct_submit_rate,
        abstention=metrics.abstention,
        tool_calls_before_submit=sum(before) / len(before) if before else None,
        status=metrics.status,
    ), trajectories


def select_checkpoint(records: list[ValidationRecord], config: TrainConfig) -> Selection:
    """The best checkpoint by behaviour, and the warnings a practitioner must see."""
    checkpoints = [r for r in records if r.checkpoint]
    warnings: list[str] = []
    for previous, current in zip(checkpoints, checkpoints[1:]):
        loss_then, loss_now = previous.teacher_forced.loss_all, current.teacher_forced.loss_all
        rate_then, rate_now = previous.behaviour.direct_submit_rate, current.behaviour.direct_submit_rate
        if (
            loss_then is not None
            and loss_now is not None
            and rate_then is not None
            and rate_now is not None
            and loss_now < loss_then
            and rate_now > rate_then
        ):
            warnings.append(
                f"validation loss improved ({loss_then:.4f} -> {loss_now:.4f}) while the direct-submit rate rose "
                f"({rate_then:.0%} -> {rate_now:.0%}) from {previous.checkpoint} to {current.checkpoint}: "
                "the policy is learning the shortcut"
            )

    def metric(record: ValidationRecord) -> float | None:
        return record.behaviour.answer_f1 if config.selection_metric == "answer_f1" else record.behaviour.exact_match

    eligible = [
        r
        for r in checkpoints
        if r.behaviour.episodes
        and r.behaviour.direct_submit_rate is not None
        and r.behaviour.direct_submit_rate < config.max_direct_submit_rate
        and metric(r) is not None
    ]

    def rank(record: ValidationRecord) -> tuple[float, float, float]:
        """The metric, then - among equals, as when no validation episode answered yet - fewer
        steps without an action, then the lower validation loss (unknown ranks last)."""
        errors, loss = record.behaviour.format_error_rate, record.teacher_forced.loss_all
        return (metric(record) or 0.0, -(1.0 if errors is None else errors), -(math.inf if loss is None else loss))

    best = max(eligible, key=rank, default=None)
    if best is None and checkpoints:
        warnings.append(f"no checkpoint has a direct-submit rate below {config.max_direct_submit_rate:.0%}: none is selected")
    return Selection(
        criterion=f"highest {config.selection_metric} among checkpoints with direct-submit rate < {config.max_direct_submit_rate:.0%}"
        "; among equals, fewest format errors, then lowest validation loss",
        best_checkpoint=best.checkpoint if best else None,
        warnings=warnings,
    )


class Validator:
    """Judges the weights being trained: teacher-forced loss on validation examples and greedy
    episodes on validation questions, logged to validation.jsonl (the episodes to
    validation-episodes/step-N.jsonl) and into each checkpoint. Used on the main process only."""

    def __init__(
        self, model, renderer, corpus, config: TrainConfig, data: Path, out: Path, examples: list[Example], quantized: bool, log=print
    ) -> None:
        self.model, self.renderer, self.corpus, self.config = model, renderer, corpus, config
        self.data, self.examples, self.quantized, self.log = data, examples, quantized, log
        self.question_ids = list(dict.fromkeys(e.question_id for e in examples if e.question_id))
        if not self.question_ids and config.validation_episodes:  # no validation example: the corpus's validation split
            self.question_ids = [q.id for q in corpus.split("validation").questions]
            log(f"no validation examples in {data}: validation episodes ask the corpus's validation questions")
        self.path = out / "validation.jsonl"
        self.episodes = out / "validation-episodes"
        self.started = time.perf_counter()

    def run(self, step: int, epoch: float) -> ValidationRecord:
        was_training = self.model.training
        self.model.eval()
        config = self.config
        with rng_untouched(next(self.model.parameters()).device):
            seen, trajectories = (
                behaviour(self.model, self.renderer, self.corpus, self.question_ids, config)
                if config.validation_episodes
                else (Behaviour(), [])
            )
            record = ValidationRecord(
                step=step,
                epoch=epoch,
                seconds=round(time.perf_counter() - self.started, 1),
                teacher_forced=teacher_forced(self.model, self.examples[: config.validation_examples], self.renderer)
                if self.examples
                else TeacherForced(),
                behaviour=seen,
            )
        if trajectories:  # written whole: a validation cut off by a kill and run again on resume leaves one file
            write_records(self.episodes / f"step-{step}.jsonl", trajectories)
        if was_training:
            self.model.train()
        return record

    def checkpoint(self, output_dir: str, step: int, record: ValidationRecord | None, interrupted: bool = False) -> None:
        """Complete a saved checkpoint with its manifest (``sft.checkpoints``) and log its validation
        (None: not validated)."""
        checkpoint = Path(output_dir) / f"checkpoint-{step}"
        if record is not None:
            record = record.model_copy(update={"checkpoint": checkpoint.name})
        complete_checkpoint(checkpoint, self.config, self.data, self.quantized, self.renderer.fingerprint, record, interrupted)
        if record is not None:
            self.write(record)

    def write(self, record: ValidationRecord) -> None:
        try:
            append_records(self.path, [record])  # a whole line, fsynced; a line torn by a kill is cut off first
        except FileRefused as error:  # a link, a FIFO or a device where the log belongs (corpus.files)
            raise TrainingError(str(error)) from None
        tf, seen = record.teacher_forced, record.behaviour
        self.log(
            f"validation at step {record.step}: loss {shown(tf.loss_all)}, "
            f"P(first action ends) {shown(tf.first_action_end_probability)}, "
            f"direct-submit {shown(seen.direct_submit_rate)}, answer F1 {shown(seen.answer_f1)}"
        )

    def records(self) -> list[ValidationRecord]:
        if not self.path.exists():
            return []
        try:  # lines split as bytes on \n only (corpus.jsonl)
            return read_records(self.path, ValidationRecord, what="validation record", inside=self.path.parent)
        except JsonLinesError as error:
            raise TrainingError(str(error)) from None


@contextmanager
def rng_untouched(device):
    """Run a validation on copies of every random stream training draws from (Python's, NumPy's,
    torch's CPU generator and this process's CUDA device's): the episodes seed torch's global
    generator (HFPolicy.start), and the Trainer saved the checkpoint's RNG state before validating
    it, so without this a run validated at a step trains differently from one resumed there."""
    import numpy
    import torch

    python_state, numpy_state = random.getstate(), numpy.random.get_state()
    devices = [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        random.setstate(python_state)
        numpy.random.set_state(numpy_state)


def scalars(record: ValidationRecord) -> dict[str, float]:
    """A validation's figures as tracker scalars. The ``eval_`` prefix is what the Trainer's
    reporters file under ``eval/`` (TensorBoard and W&B show eval/direct_submit_rate beside train/loss)."""
    tf, seen = record.teacher_forced, record.behaviour
    figures = {
        "eval_direct_submit_rate": seen.direct_submit_rate,
        "eval_tool_calls_before_submit": seen.tool_calls_before_submit,
        "eval_format_error_rate": seen.format_error_rate,
        "eval_answer_f1": seen.answer_f1,
        "eval_exact_match": seen.exact_match,
        "eval_first_action_end_probability": tf.first_action_end_probability,
        "eval_loss": tf.loss_all,
        "eval_accuracy": tf.accuracy_all,
    }
    return {name: value for name, value in figures.items() if value is not None}
