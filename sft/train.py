"""QLoRA SFT on assistant tokens with Transformers' Trainer, validated by behaviour, not only loss.

* The data comes pre-tokenised by ``explorer sft build`` through the shared renderer; labels are
  -100 everywhere but assistant tokens, and the loss is computed only at those positions (the
  language-model head runs on them alone, which keeps an 8,192-token step within an L4).
* Every checkpoint (one per epoch, and every ``save_steps`` steps) holds the adapter, tokenizer, trainer state, optimizer,
  scheduler, RNG state, the training arguments and ``explorer_manifest.json`` with the SHA-256
  of every file and the checkpoint's validation; it loads with plain ``PeftModel.from_pretrained``.
* Validation per checkpoint: loss and token accuracy on assistant tokens by turn type, the
  teacher-forced probability that the first action starts with submit/abstain, and K greedy
  validation episodes (tool calls before submit, direct-submit rate, abstention, answer F1).
* The best checkpoint is chosen by behaviour (default: the highest answer F1 among those whose
  direct-submit rate is below 25%), and a loud warning marks validation loss improving while
  the direct-submit rate rises - the shortcut this project exists to catch.

* Progress: loss, input tokens/s and ETA, a bar on a terminal and one line per step otherwise;
  the loss and the validation figures go to ``report_to`` (TensorBoard, Weights & Biases) too.
* Ctrl-C: the first saves a checkpoint at the end of the step and stops (``TrainingInterrupted``;
  ``resume=True`` continues from it), the second exits at once. A resume refuses settings that
  would change what is trained (``resume_conflicts``), and validation never draws from the random
  streams training uses, so a resumed run trains exactly what an uninterrupted one would.

Because it is the plain Trainer, ``accelerate launch -m cli.main train ...`` runs the same
command on several GPUs. The main process alone validates and writes manifests, validation
records, validation episodes and logs, while the others wait for it.
"""

from __future__ import annotations

import math
import os
import random
import shutil
import signal
import threading
import time
from contextlib import contextmanager
from importlib.util import find_spec
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from agent.models import file_sha256, load_causal_lm, load_renderer, tokenizer_file
from corpus.atomic import atomic_file
from corpus.jsonl import JsonLinesError, append_records, read_records, write_records
from sft.dataset import IGNORE
from sft.records import (
    Behaviour,
    BuildReport,
    CheckpointManifest,
    Example,
    Selection,
    TeacherForced,
    TrainingSummary,
    ValidationRecord,
)

TARGET_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
MANIFEST = "explorer_manifest.json"
REPORTERS = ("none", "tensorboard", "wandb")
# Validation runs on the main process while the others wait in a collective; the default 30-minute
# timeout of the process group would kill a long validation of a large model.
DISTRIBUTED_TIMEOUT_SECONDS = 6 * 3600
# Settings a resumed run may change: where the figures go, which steps are saved, validated or
# selected - never the weights. Any other field of TrainConfig differing from the checkpoint's is refused.
RESUMABLE_CHANGES = ("report_to", "save_steps", "eval_steps", "max_direct_submit_rate", "selection_metric")
# torchrun (and accelerate launch) kill their workers this many seconds after forwarding a Ctrl-C,
# unless TORCH_ELASTIC_SHUTDOWN_TIMEOUT (or torchrun --shutdown-timeout) says otherwise.
LAUNCHER_SHUTDOWN_SECONDS = 30


class TrainConfig(BaseModel):
    """The reference recipe by default; every field can be set in a TOML file or on the command line."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    model: str = "Qwen/Qwen3-8B"
    quantization: Literal["auto", "4bit", "none"] = "auto"  # auto: 4-bit NF4 on CUDA, full precision on CPU
    lora_r: int = Field(4, ge=1)
    lora_alpha: int = Field(8, ge=1)
    lora_dropout: float = Field(0.05, ge=0, lt=1)
    target_modules: list[str] = Field(default_factory=lambda: list(TARGET_MODULES))
    learning_rate: float = Field(2e-4, gt=0)
    batch_size: int = Field(1, ge=1)
    gradient_accumulation_steps: int = Field(4, ge=1)
    max_length: int = Field(8192, ge=128)
    gradient_checkpointing: bool = True
    epochs: float = Field(2, gt=0)
    max_steps: int = -1
    eval_steps: int | None = Field(None, ge=1)  # also validate every N optimizer steps (logged, not checkpointed)
    save_steps: int | None = Field(None, ge=1)  # also save (and validate) a checkpoint every N optimizer steps
    report_to: Literal["none", "tensorboard", "wandb"] = "none"  # where the loss and validation figures go too
    seed: int = 0
    validation_examples: int = Field(64, ge=1)  # teacher-forced metrics on at most this many validation examples
    validation_episodes: int = Field(16, ge=0)  # K greedy episodes per validation
    validation_max_steps: int = Field(6, ge=1)
    validation_max_new_tokens: int = Field(256, ge=1)
    max_direct_submit_rate: float = Field(0.25, ge=0, le=1)
    selection_metric: Literal["answer_f1", "exact_match"] = "answer_f1"


def load_config(path: Path | None, overrides: dict[str, Any]) -> TrainConfig:
    """The recipe from a TOML file (or the defaults), the flags winning; read as every config is."""
    from agent.config import load_config as load_any_config

    return load_any_config(TrainConfig, path, overrides)


def load_model(config: TrainConfig):
    """The base as ``agent.models.load_causal_lm`` loads it for serving, made trainable, with LoRA."""
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    loaded = load_causal_lm(config.model, config.quantization)
    model, quantize = loaded.model, loaded.quantization == "4bit"
    if quantize:
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=config.gradient_checkpointing,
                                                gradient_checkpointing_kwargs={"use_reentrant": False})
    elif config.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    lora = LoraConfig(task_type="CAUSAL_LM", r=config.lora_r, lora_alpha=config.lora_alpha,
                      lora_dropout=config.lora_dropout, target_modules=config.target_modules)
    return get_peft_model(model, lora), quantize


def assistant_loss(model, input_ids, labels, attention_mask=None, reduction: str = "mean"):
    """Cross-entropy at the labelled (assistant) positions only: the LM head runs on those hidden
    states alone (``logits_to_keep`` as a mask) instead of on all of them. Equal to the usual shifted
    loss. It calls the model's own forward, so under several processes DDP synchronises the gradients."""
    import torch.nn.functional as F

    targets = labels[:, 1:]
    keep = targets != IGNORE
    positions = F.pad(keep, (0, 1))  # the hidden state at p predicts token p + 1; the last one predicts nothing
    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, logits_to_keep=positions).logits
    logits = logits.reshape(-1, logits.shape[-1]).float()
    if logits.shape[0] == 0:
        return logits.sum() * 0.0, logits, targets[keep]
    loss = F.cross_entropy(logits, targets[keep], reduction=reduction)
    return loss, logits, targets[keep]


# -- validation -------------------------------------------------------------------------------------

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
    action = renderer.decode(example.input_ids[start:example.turns[0].end])
    fence = action.find("```python\n")
    prefix = example.input_ids[:start] + renderer.text(action[: fence + len("```python\n")] if fence >= 0 else "")
    device = next(model.parameters()).device
    total = 0.0
    for continuation in (submit_ids, abstain_ids):
        ids = torch.tensor([prefix + continuation], device=device)
        logits = model(input_ids=ids, use_cache=False).logits[0].float()
        log_probs = torch.log_softmax(logits[len(prefix) - 1:-1], dim=-1)
        total += math.exp(sum(log_probs[i, token].item() for i, token in enumerate(continuation)))
    return total


def behaviour(model, renderer, corpus, question_ids: list[str], config: TrainConfig) -> tuple[Behaviour, list]:
    """K greedy validation episodes with the current weights, scored like ``explorer eval``; the
    figures and the trajectories."""
    from agent.policies.hf import HFPolicy
    from agent.runner import EpisodeRunner
    from agent.trajectory import EpisodeConfig
    from corpus import BM25Index
    from evaluation.scoring import run_metrics, score_episode

    questions = {q.id: q for q in corpus.questions}
    chosen = [questions[qid] for qid in question_ids if qid in questions][: config.validation_episodes]
    if not chosen:
        return Behaviour(), []
    policy = HFPolicy(model, renderer, name=config.model, quantization="in-memory", dtype=next(model.parameters()).dtype,
                      max_new_tokens=config.validation_max_new_tokens)
    runner = EpisodeRunner(corpus, BM25Index.cached(corpus), policy, EpisodeConfig(max_steps=config.validation_max_steps))
    trajectories = [runner.run(q.text, q) for q in chosen]
    scores = [score_episode(trajectory, q) for trajectory, q in zip(trajectories, chosen)]
    metrics = run_metrics(scores)
    before = [s.tool_calls_before_end for s in scores if s.status in ("submitted", "abstained")]
    return Behaviour(
        episodes=len(scores), answer_f1=metrics.answer_f1, exact_match=metrics.exact_match,
        direct_submit_rate=metrics.verdict.direct_submit_rate, abstention=metrics.abstention,
        tool_calls_before_submit=sum(before) / len(before) if before else None, status=metrics.status,
    ), trajectories


# -- selection --------------------------------------------------------------------------------------

def select_checkpoint(records: list[ValidationRecord], config: TrainConfig) -> Selection:
    """The best checkpoint by behaviour, and the warnings a practitioner must see."""
    checkpoints = [r for r in records if r.checkpoint]
    warnings = []
    for previous, current in zip(checkpoints, checkpoints[1:]):
        loss_then, loss_now = previous.teacher_forced.loss_all, current.teacher_forced.loss_all
        rate_then, rate_now = previous.behaviour.direct_submit_rate, current.behaviour.direct_submit_rate
        if None not in (loss_then, loss_now, rate_then, rate_now) and loss_now < loss_then and rate_now > rate_then:
            warnings.append(f"validation loss improved ({loss_then:.4f} -> {loss_now:.4f}) while the direct-submit rate rose "
                            f"({rate_then:.0%} -> {rate_now:.0%}) from {previous.checkpoint} to {current.checkpoint}: "
                            "the policy is learning the shortcut")

    def metric(record: ValidationRecord) -> float | None:
        return record.behaviour.answer_f1 if config.selection_metric == "answer_f1" else record.behaviour.exact_match

    eligible = [r for r in checkpoints if r.behaviour.episodes and r.behaviour.direct_submit_rate is not None
                and r.behaviour.direct_submit_rate < config.max_direct_submit_rate and metric(r) is not None]
    best = max(eligible, key=metric, default=None)
    if best is None and checkpoints:
        warnings.append(f"no checkpoint has a direct-submit rate below {config.max_direct_submit_rate:.0%}: none is selected")
    return Selection(
        criterion=f"highest {config.selection_metric} among checkpoints with direct-submit rate < {config.max_direct_submit_rate:.0%}",
        best_checkpoint=best.checkpoint if best else None, warnings=warnings,
    )


# -- training ---------------------------------------------------------------------------------------

class Validator:
    """Judges the weights being trained: teacher-forced loss on validation examples and greedy
    episodes on validation questions, logged to validation.jsonl (the episodes to
    validation-episodes/step-N.jsonl) and into each checkpoint. Used on the main process only."""

    def __init__(self, model, renderer, corpus, config: TrainConfig, data: Path, out: Path, examples: list[Example],
                 quantized: bool, log=print) -> None:
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
            seen, trajectories = (behaviour(self.model, self.renderer, self.corpus, self.question_ids, config)
                                  if config.validation_episodes else (Behaviour(), []))
            record = ValidationRecord(
                step=step, epoch=epoch, seconds=round(time.perf_counter() - self.started, 1),
                teacher_forced=teacher_forced(self.model, self.examples[: config.validation_examples], self.renderer) if self.examples else TeacherForced(),
                behaviour=seen,
            )
        if trajectories:  # written whole: a validation cut off by a kill and run again on resume leaves one file
            write_records(self.episodes / f"step-{step}.jsonl", trajectories)
        if was_training:
            self.model.train()
        return record

    def checkpoint(self, output_dir: str, step: int, record: ValidationRecord | None, interrupted: bool = False) -> None:
        """Complete a saved checkpoint: the tokenizer, and a manifest with every file's SHA-256 and its
        validation (None: not validated). The manifest is written last and whole: it marks the checkpoint complete."""
        checkpoint = Path(output_dir) / f"checkpoint-{step}"
        if record is not None:
            record = record.model_copy(update={"checkpoint": checkpoint.name})
        for name in ("tokenizer.json", "tokenizer_config.json"):
            source = Path(self.config.model) / name
            if source.exists():
                shutil.copy(source, checkpoint / name)
        files = {str(p.relative_to(checkpoint)): file_sha256(p) for p in sorted(checkpoint.rglob("*")) if p.is_file() and p.name != MANIFEST}
        manifest = CheckpointManifest(
            base_model=self.config.model, quantized=self.quantized, config=self.config.model_dump(mode="json"), data=str(self.data),
            data_build_report_sha256=file_sha256(self.data / "build_report.json"), data_tokenizer_sha256=self.renderer.fingerprint,
            validation=record, interrupted=interrupted, step=step, files=files,
        )
        with atomic_file(checkpoint / MANIFEST) as handle:
            handle.write(manifest.model_dump_json(indent=2))
        if record is not None:
            self.write(record)

    def write(self, record: ValidationRecord) -> None:
        append_records(self.path, [record])  # a whole line, fsynced; a line torn by a kill is cut off first
        tf, seen = record.teacher_forced, record.behaviour
        self.log(f"validation at step {record.step}: loss {tf.loss_all}, P(first action ends) {tf.first_action_end_probability}, "
                 f"direct-submit {seen.direct_submit_rate}, answer F1 {seen.answer_f1}")

    def records(self) -> list[ValidationRecord]:
        if not self.path.exists():
            return []
        from sft.errors import TrainingError

        try:  # lines split as bytes on \n only (corpus.jsonl)
            return read_records(self.path, ValidationRecord, what="validation record")
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
        "eval_direct_submit_rate": seen.direct_submit_rate, "eval_tool_calls_before_submit": seen.tool_calls_before_submit,
        "eval_answer_f1": seen.answer_f1, "eval_exact_match": seen.exact_match,
        "eval_first_action_end_probability": tf.first_action_end_probability,
        "eval_loss": tf.loss_all, "eval_accuracy": tf.accuracy_all,
    }
    return {name: value for name, value in figures.items() if value is not None}


class Interrupt:
    """Ctrl-C while training: the first asks for a checkpoint at the end of the current step and a
    stop (the callbacks read ``requested``), the second raises KeyboardInterrupt at once. Installed
    only in the main thread (the only one Python delivers signals to)."""

    def __init__(self, announce: bool) -> None:
        self.requested = False
        self.announce = announce
        self.previous = None

    def __enter__(self) -> Interrupt:
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, self.handle)
        return self

    def __exit__(self, *exc_info) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)

    def handle(self, signum, frame) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        if self.announce:  # os.write: a print could re-enter a stream the interrupted code is writing
            os.write(2, b"\nCtrl-C: saving a checkpoint at the end of this step, then stopping "
                        b"(Ctrl-C again to exit at once, without it)\n")
            warning = launcher_warning(os.environ)
            if warning:
                os.write(2, warning.encode() + b"\n")


def launcher_warning(environment) -> str | None:
    """Under torchrun / accelerate launch the launcher SIGKILLs every worker some seconds after it
    forwards a Ctrl-C: a step and a save that take longer are lost. Said at interrupt time, unless
    the timeout was raised through the environment (torchrun's --shutdown-timeout is not visible here)."""
    if int(environment.get("WORLD_SIZE", "1")) <= 1 or "TORCHELASTIC_RUN_ID" not in environment:
        return None
    if environment.get("TORCH_ELASTIC_SHUTDOWN_TIMEOUT") or environment.get("PET_SHUTDOWN_TIMEOUT"):
        return None
    return (f"warning: the launcher kills these {environment['WORLD_SIZE']} processes {LAUNCHER_SHUTDOWN_SECONDS} s after Ctrl-C; "
            "if this step and its save take longer, the checkpoint is lost and --resume continues from the one before. "
            "Launch with TORCH_ELASTIC_SHUTDOWN_TIMEOUT=3600 in the environment to give them an hour")


class TrainingInterrupted(Exception):
    """Training stopped on Ctrl-C after saving a resumable checkpoint: not validated, unless the
    step was one that saves a checkpoint anyway (a --save-steps multiple or an epoch's end)."""

    def __init__(self, checkpoint: Path, step: int, max_steps: int, main: bool, validated: bool = False) -> None:
        super().__init__(f"interrupted at step {step} of {max_steps}; checkpoint saved to {checkpoint}")
        self.checkpoint, self.step, self.max_steps, self.main, self.validated = checkpoint, step, max_steps, main, validated


def checked_data(config: TrainConfig, data: Path) -> tuple[BuildReport, list[Example], list[Example]]:
    """The build report and the examples, refused whole if any is longer than max_length or if they
    were tokenised with another tokenizer than the model's (a directory's or the hub's tokenizer.json)."""
    from pydantic import ValidationError

    from sft.dataset import load_examples, load_report
    from sft.errors import TrainingError

    try:
        report = load_report(data)
    except ValidationError as error:
        raise TrainingError(f"{data / 'build_report.json'}: not a build report ({error.errors()[0]['msg']}); rebuild it with explorer sft build") from None
    train_examples, validation_examples = load_examples(data / "train.jsonl"), load_examples(data / "validation.jsonl")
    if not train_examples:
        raise TrainingError(f"{data}: no training examples")
    too_long = [e.episode_id for e in train_examples if len(e.input_ids) > config.max_length]
    if too_long:
        raise TrainingError(f"{len(too_long)} examples are longer than max_length {config.max_length} (first: {too_long[0]}); "
                            "rebuild the data with that --max-length")
    model_tokenizer = file_sha256(tokenizer_file(config.model))
    if model_tokenizer != report.tokenizer_sha256:
        raise TrainingError(f"{data} was tokenised with another tokenizer ({report.tokenizer_sha256[:12]}) than {config.model}'s "
                            f"({model_tokenizer[:12]}); rebuild it with explorer sft build --tokenizer {config.model}")
    return report, train_examples, validation_examples


def check_reporter(config: TrainConfig, out: Path | None = None) -> None:
    """A tracker's package must be installed, and TensorBoard's log directory (OUT/runs, or
    TENSORBOARD_LOGGING_DIR) writable, before anything heavy is loaded."""
    from sft.errors import TrainingError

    if config.report_to != "none" and find_spec(config.report_to) is None:
        raise TrainingError(f"--report-to {config.report_to} needs the {config.report_to} package, which is not installed; "
                            f"pip install {config.report_to}, or pass --report-to none")
    if config.report_to == "tensorboard" and out is not None:
        logs = Path(os.environ.get("TENSORBOARD_LOGGING_DIR") or out / "runs").expanduser()
        existing = next(p for p in (logs, *logs.parents) if p.exists())
        if not existing.is_dir():
            raise TrainingError(f"--report-to tensorboard writes its logs under {logs}, but {existing} is a file; "
                                "move it away, or choose another --out")
        if not os.access(existing, os.W_OK | os.X_OK):
            raise TrainingError(f"--report-to tensorboard writes its logs under {logs}, but {existing} is not writable; "
                                "fix its permissions, or choose another --out")


def _number(checkpoint: Path) -> int:
    return int(checkpoint.name.removeprefix("checkpoint-"))


def _checkpoints(out: Path) -> list[Path]:
    """OUT's checkpoint directories, oldest first."""
    return sorted((p for p in out.glob("checkpoint-*") if p.is_dir() and p.name.removeprefix("checkpoint-").isdigit()), key=_number)


def newest_complete(out: Path) -> Path | None:
    """The newest checkpoint that has its manifest (the last thing a save writes)."""
    return next((p for p in reversed(_checkpoints(out)) if (p / MANIFEST).exists()), None)


def finished(checkpoint: Path) -> int | None:
    """The checkpoint's step when it is the run's last (its trainer state says so), else None."""
    import json

    state = json.loads((checkpoint / "trainer_state.json").read_text())
    return state["global_step"] if state.get("max_steps") and state["global_step"] >= state["max_steps"] else None


def resumable_checkpoint(out: Path, log=print, main: bool = True) -> Path | None:
    """The newest complete checkpoint in OUT, or None when there is none: training starts from
    step 0, saying so. A newer one without its manifest was cut off while saving: it is removed,
    saying so, never resumed from."""
    newest = newest_complete(out)
    for partial in (p for p in _checkpoints(out) if newest is None or _number(p) > _number(newest)):
        if main:
            log(f"{partial}: cut off while saving (no {MANIFEST}); removed, resuming from {newest.name if newest else 'step 0'}")
            shutil.rmtree(partial)
    if newest is None:
        log(f"{out}: no complete checkpoint to resume from; training starts from step 0")
    return newest


def checkpoint_manifest(checkpoint: Path) -> CheckpointManifest:
    from pydantic import ValidationError

    from sft.errors import TrainingError

    try:
        return CheckpointManifest.model_validate_json((checkpoint / MANIFEST).read_text())
    except ValidationError as error:
        raise TrainingError(f"{checkpoint / MANIFEST}: not a checkpoint manifest ({error.errors()[0]['msg']}); "
                            "remove the checkpoint to resume from the one before") from None


def resume_conflicts(manifest: CheckpointManifest, config: TrainConfig, data: Path) -> list[str]:
    """What differs between the run a checkpoint belongs to and the one asked to resume it, as
    ``field then -> now``: the settings (but RESUMABLE_CHANGES), the data directory and its build report.
    Fields added to TrainConfig since the manifest was written count as their defaults."""
    now = config.model_dump(mode="json")
    then = {**TrainConfig().model_dump(mode="json"), **manifest.config}
    changed = [f"{key} {then[key]!r} -> {value!r}" for key, value in now.items() if then[key] != value and key not in RESUMABLE_CHANGES]
    changed += [f"{key} (not a setting of this version)" for key in then if key not in now]
    if Path(manifest.data).resolve() != data.resolve():
        changed.append(f"data {manifest.data} -> {data}")
    elif manifest.data_build_report_sha256 != file_sha256(data / "build_report.json"):
        changed.append(f"data (its build_report.json is not the one {data} held then: rebuilt)")
    return changed


def check_resume(checkpoint: Path, config: TrainConfig, data: Path) -> None:
    """Refuse (one line, before the model loads) to continue a run with settings that change what is trained."""
    from sft.errors import TrainingError

    changed = resume_conflicts(checkpoint_manifest(checkpoint), config, data)
    if changed:
        raise TrainingError(f"{checkpoint.parent}: refusing to resume: {checkpoint.name} was trained with other settings "
                            f"({'; '.join(changed)}); resume with the original ones (its {MANIFEST} holds them), "
                            f"or start a new run with another --out (only {', '.join(RESUMABLE_CHANGES)} may change)")


def training_arguments(config: TrainConfig, out: Path, cuda: bool):
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=str(out), num_train_epochs=config.epochs, max_steps=config.max_steps,
        per_device_train_batch_size=config.batch_size, gradient_accumulation_steps=config.gradient_accumulation_steps,
        # A checkpoint per epoch; with save_steps every N steps as well (the callback adds the epoch ends).
        learning_rate=config.learning_rate, save_strategy="steps" if config.save_steps else "epoch",
        save_steps=config.save_steps or 500, logging_steps=1, seed=config.seed,
        report_to=[] if config.report_to == "none" else [config.report_to], run_name=out.name,
        include_num_input_tokens_seen="non_padding",  # summed over processes: the progress line's tokens/s
        bf16=cuda, gradient_checkpointing=config.gradient_checkpointing,
        gradient_checkpointing_kwargs={"use_reentrant": False}, remove_unused_columns=False,
        dataloader_num_workers=0, use_cpu=not cuda, disable_tqdm=True, save_only_model=False,
        ddp_timeout=DISTRIBUTED_TIMEOUT_SECONDS,
    )


def train(config: TrainConfig, data: Path, out: Path, corpus, log=print, resume: bool = False) -> TrainingSummary | None:
    """Check the data, load the model, train with a validation per checkpoint, select one by behaviour.
    The summary on the main process, None on the others (under accelerate launch). Raises
    TrainingInterrupted after a Ctrl-C (a checkpoint saved), TrainingError on bad input."""
    import sys

    import torch

    from sft.trainer import AssistantLossTrainer, Collator, Progress, ValidationCallback, barrier

    check_reporter(config, out)
    _, train_examples, validation_examples = checked_data(config, data)
    if resume and (checkpoint := newest_complete(out)) is not None:
        check_resume(checkpoint, config, data)
        if finished(checkpoint) and (out / "training_summary.json").exists():
            if os.environ.get("RANK", "0") == "0":  # under accelerate launch: said once
                log(f"{out}: training already finished at step {finished(checkpoint)}; nothing to train, its training_summary.json is kept")
            return TrainingSummary.model_validate_json((out / "training_summary.json").read_text())
    args = training_arguments(config, out, torch.cuda.is_available())  # under accelerate launch: joins the process group
    main = args.process_index == 0
    log = log if main else (lambda *_: None)
    checkpoint = resumable_checkpoint(out, log, main) if resume else None
    renderer = load_renderer(config.model)
    torch.manual_seed(config.seed)
    model, quantized = load_model(config)
    validator = Validator(model, renderer, corpus, config, data, out, validation_examples, quantized, log)
    if main and checkpoint is None:  # a run from step 0: what an earlier start left is not its own
        validator.path.unlink(missing_ok=True)
        shutil.rmtree(validator.episodes, ignore_errors=True)
    barrier()  # nobody trains before the main process has cleared what a previous run left
    trainer = AssistantLossTrainer(
        model=model, args=args, train_dataset=train_examples,
        data_collator=Collator(renderer.tokenizer.token_to_id("<|endoftext|>") or 0),
    )
    with Interrupt(announce=main) as interrupt:
        validation = ValidationCallback(validator, config.eval_steps, trainer.log, interrupt, main)
        trainer.remove_callback(Progress.replaces)
        trainer.add_callback(Progress(terminal=sys.stderr.isatty()))
        trainer.add_callback(validation)
        result = trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    if validation.stopped_step is not None:
        step = validation.stopped_step
        raise TrainingInterrupted(out / f"checkpoint-{step}", step, trainer.state.max_steps, main, validated=not validation.unscheduled)
    if not main:
        return None
    records = validator.records()
    # The log history comes back with a resumed checkpoint: the losses of every session, step 1 on.
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    summary = TrainingSummary(
        train_loss=sum(losses) / len(losses) if losses else result.training_loss, steps=result.global_step,
        seconds=round(time.perf_counter() - validator.started, 1), losses=losses, resumed_from_step=validation.first_step,
        **select_checkpoint(records, config).model_dump(), checkpoints=[r for r in records if r.checkpoint],
    )
    with atomic_file(out / "training_summary.json") as handle:
        handle.write(summary.model_dump_json(indent=2))
    return summary
