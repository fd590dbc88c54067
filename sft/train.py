"""QLoRA SFT on assistant tokens with Transformers' Trainer, validated by behaviour, not only loss.

* The data comes pre-tokenised by ``explorer sft build`` through the shared renderer; labels are
  -100 everywhere but assistant tokens, and the loss is computed only at those positions (the
  language-model head runs on them alone, which keeps an 8,192-token step within an L4).
* Every checkpoint (one per epoch) holds the adapter, tokenizer, trainer state, optimizer,
  scheduler, RNG state, the training arguments and ``explorer_manifest.json`` with the SHA-256
  of every file and the checkpoint's validation; it loads with plain ``PeftModel.from_pretrained``.
* Validation per checkpoint: loss and token accuracy on assistant tokens by turn type, the
  teacher-forced probability that the first action starts with submit/abstain, and K greedy
  validation episodes (tool calls before submit, direct-submit rate, abstention, answer F1).
* The best checkpoint is chosen by behaviour (default: the highest answer F1 among those whose
  direct-submit rate is below 25%), and a loud warning marks validation loss improving while
  the direct-submit rate rises - the shortcut this project exists to catch.

Because it is the plain Trainer, ``accelerate launch -m cli.main train ...`` runs the same
command on several GPUs.
"""

from __future__ import annotations

import math
import shutil
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from agent.models import file_sha256, load_causal_lm, load_renderer, tokenizer_file
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
    """Cross-entropy at the labelled (assistant) positions only: the LM head runs on those
    hidden states alone instead of on all of them. Equal to the usual shifted loss."""
    import torch.nn.functional as F

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    hidden = base.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
    targets = labels[:, 1:]
    keep = targets != IGNORE
    logits = base.lm_head(hidden[:, :-1][keep]).float()
    if logits.shape[0] == 0:
        return hidden.sum() * 0.0, logits, targets[keep]
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


def behaviour(model, renderer, corpus, question_ids: list[str], config: TrainConfig) -> dict:
    """K greedy validation episodes with the current weights, scored like ``explorer eval``."""
    from agent.policies.hf import HFPolicy
    from agent.runner import EpisodeRunner
    from agent.trajectory import EpisodeConfig
    from corpus import BM25Index
    from evaluation.scoring import run_metrics, score_episode

    questions = {q.id: q for q in corpus.questions}
    chosen = [questions[qid] for qid in question_ids if qid in questions][: config.validation_episodes]
    if not chosen:
        return Behaviour()
    policy = HFPolicy(model, renderer, name=config.model, quantization="in-memory", dtype=next(model.parameters()).dtype,
                      max_new_tokens=config.validation_max_new_tokens)
    runner = EpisodeRunner(corpus, BM25Index.cached(corpus), policy, EpisodeConfig(max_steps=config.validation_max_steps))
    scores = [score_episode(runner.run(q.text, q), q) for q in chosen]
    metrics = run_metrics(scores)
    before = [s.tool_calls_before_end for s in scores if s.status in ("submitted", "abstained")]
    return Behaviour(
        episodes=len(scores), answer_f1=metrics.answer_f1, exact_match=metrics.exact_match,
        direct_submit_rate=metrics.verdict.direct_submit_rate, abstention=metrics.abstention,
        tool_calls_before_submit=sum(before) / len(before) if before else None, status=metrics.status,
    )


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
    episodes on validation questions, logged to validation.jsonl and into each checkpoint."""

    def __init__(self, model, renderer, corpus, config: TrainConfig, data: Path, out: Path, examples: list[Example],
                 quantized: bool, log=print) -> None:
        self.model, self.renderer, self.corpus, self.config = model, renderer, corpus, config
        self.data, self.examples, self.quantized, self.log = data, examples, quantized, log
        self.question_ids = list(dict.fromkeys(e.question_id for e in examples if e.question_id))
        if not self.question_ids and config.validation_episodes:  # no validation example: the corpus's validation split
            self.question_ids = [q.id for q in corpus.split("validation").questions]
            log(f"no validation examples in {data}: validation episodes ask the corpus's validation questions")
        self.path = out / "validation.jsonl"
        self.started = time.perf_counter()

    def run(self, step: int, epoch: float) -> ValidationRecord:
        was_training = self.model.training
        self.model.eval()
        config = self.config
        record = ValidationRecord(
            step=step, epoch=epoch, seconds=round(time.perf_counter() - self.started, 1),
            teacher_forced=teacher_forced(self.model, self.examples[: config.validation_examples], self.renderer) if self.examples else TeacherForced(),
            behaviour=behaviour(self.model, self.renderer, self.corpus, self.question_ids, config) if config.validation_episodes else Behaviour(),
        )
        if was_training:
            self.model.train()
        return record

    def checkpoint(self, output_dir: str, step: int, record: ValidationRecord) -> None:
        """Complete a saved checkpoint: the tokenizer, and a manifest with every file's SHA-256 and its validation."""
        checkpoint = Path(output_dir) / f"checkpoint-{step}"
        record = record.model_copy(update={"checkpoint": checkpoint.name})
        for name in ("tokenizer.json", "tokenizer_config.json"):
            source = Path(self.config.model) / name
            if source.exists():
                shutil.copy(source, checkpoint / name)
        files = {str(p.relative_to(checkpoint)): file_sha256(p) for p in sorted(checkpoint.rglob("*")) if p.is_file() and p.name != MANIFEST}
        manifest = CheckpointManifest(
            base_model=self.config.model, quantized=self.quantized, config=self.config.model_dump(mode="json"), data=str(self.data),
            data_build_report_sha256=file_sha256(self.data / "build_report.json"), data_tokenizer_sha256=self.renderer.fingerprint,
            validation=record, files=files,
        )
        (checkpoint / MANIFEST).write_text(manifest.model_dump_json(indent=2))
        self.write(record)

    def write(self, record: ValidationRecord) -> None:
        with open(self.path, "a") as handle:
            handle.write(record.model_dump_json() + "\n")
        tf, seen = record.teacher_forced, record.behaviour
        self.log(f"validation at step {record.step}: loss {tf.loss_all}, P(first action ends) {tf.first_action_end_probability}, "
                 f"direct-submit {seen.direct_submit_rate}, answer F1 {seen.answer_f1}")

    def records(self) -> list[ValidationRecord]:
        if not self.path.exists():
            return []
        return [ValidationRecord.model_validate_json(line) for line in self.path.read_text().splitlines() if line.strip()]


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


def training_arguments(config: TrainConfig, out: Path, cuda: bool):
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=str(out), num_train_epochs=config.epochs, max_steps=config.max_steps,
        per_device_train_batch_size=config.batch_size, gradient_accumulation_steps=config.gradient_accumulation_steps,
        learning_rate=config.learning_rate, save_strategy="epoch", logging_steps=1, report_to=[], seed=config.seed,
        bf16=cuda, gradient_checkpointing=config.gradient_checkpointing,
        gradient_checkpointing_kwargs={"use_reentrant": False}, remove_unused_columns=False,
        dataloader_num_workers=0, use_cpu=not cuda, disable_tqdm=True, save_only_model=False,
    )


def train(config: TrainConfig, data: Path, out: Path, corpus, log=print, resume: bool = False) -> dict:
    """Check the data, load the model, train with a validation per checkpoint, select one by behaviour."""
    import torch

    from sft.trainer import AssistantLossTrainer, Collator, ValidationCallback

    _, train_examples, validation_examples = checked_data(config, data)
    renderer = load_renderer(config.model)
    torch.manual_seed(config.seed)
    model, quantized = load_model(config)
    validator = Validator(model, renderer, corpus, config, data, out, validation_examples, quantized, log)
    if validator.path.exists() and not resume:
        validator.path.unlink()
    trainer = AssistantLossTrainer(
        model=model, args=training_arguments(config, out, torch.cuda.is_available()), train_dataset=train_examples,
        data_collator=Collator(renderer.tokenizer.token_to_id("<|endoftext|>") or 0),
        callbacks=[ValidationCallback(validator, config.eval_steps)],
    )
    result = trainer.train(resume_from_checkpoint=resume or None)
    records = validator.records()
    summary = TrainingSummary(
        train_loss=result.training_loss, steps=result.global_step, seconds=round(time.perf_counter() - validator.started, 1),
        losses=[entry["loss"] for entry in trainer.state.log_history if "loss" in entry],
        **select_checkpoint(records, config).model_dump(), checkpoints=[r for r in records if r.checkpoint],
    )
    (out / "training_summary.json").write_text(summary.model_dump_json(indent=2))
    return summary
