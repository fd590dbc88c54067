"""QLoRA SFT on assistant tokens with Transformers' Trainer, validated by behaviour, not only loss:
``train(config, data=..., out=...)``, the workflow behind ``explorer train`` (and the training
stage of ``explorer improve``).

* The data comes pre-tokenised by ``explorer sft build`` (``sft.build``) through the shared
  renderer; labels are -100 everywhere but assistant tokens, and the loss is computed only at
  those positions (``sft.model``; the language-model head runs on them alone, which keeps an
  8,192-token step within an L4).
* Every checkpoint (one per epoch, and every ``save_steps`` steps) holds the adapter, tokenizer,
  trainer state, optimizer, scheduler, RNG state, the training arguments and
  ``explorer_manifest.json`` (``sft.checkpoints``); it loads with plain ``PeftModel.from_pretrained``.
* Each checkpoint is validated by loss and by greedy episodes, and the best is chosen by
  behaviour (``sft.validation``).
* Progress: loss, input tokens/s and ETA, a bar on a terminal and one line per step otherwise
  (``sft.trainer``); the loss and the validation figures go to ``report_to`` (TensorBoard,
  Weights & Biases) too. The third-party warnings we know are silenced (``sft.known_warnings``).
* Ctrl-C: the first saves a checkpoint at the end of the step and stops (``TrainingInterrupted``,
  ``sft.interrupts``; ``resume=True`` continues from it), the second exits at once. A resume
  refuses settings that would change what is trained, so a resumed run trains exactly what an
  uninterrupted one would.

Because it is the plain Trainer, ``accelerate launch -m cli.main train ...`` runs the same
command on several GPUs. The main process alone validates and writes manifests, validation
records, validation episodes and logs, while the others wait for it.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from importlib.util import find_spec
from pathlib import Path

from pydantic import ValidationError

import paper_explorer.corpus.files as files
from paper_explorer.agent.chat_template import read_template
from paper_explorer.agent.models import file_sha256, load_renderer, tokenizer_file
from paper_explorer.corpus.files import atomic_file
from paper_explorer.corpus.setting_names import setting
from paper_explorer.sft.checkpoints import check_resume, finished, newest_complete, resumable_checkpoint
from paper_explorer.sft.config import TrainConfig
from paper_explorer.sft.dataset import load_examples, load_report
from paper_explorer.sft.errors import TrainingError
from paper_explorer.sft.interrupts import Interrupt, TrainingInterrupted
from paper_explorer.sft.known_warnings import known_warnings_silenced
from paper_explorer.sft.model import load_model
from paper_explorer.sft.records import BuildReport, Example, TrainingSummary
from paper_explorer.sft.validation import Validator, select_checkpoint

# Validation runs on the main process while the others wait in a collective; the default 30-minute
# timeout of the process group would kill a long validation of a large model.
DISTRIBUTED_TIMEOUT_SECONDS = 6 * 3600
SUMMARY = "training_summary.json"


def train(
    config: TrainConfig, *, data: str | Path, out: str | Path, corpus=None, resume: bool = False, log=print
) -> TrainingSummary | None:
    """Train a LoRA adapter on the examples in ``data`` (a directory ``explorer sft build`` or
    ``sft.build.build_dataset`` wrote) into ``out``, validating each checkpoint and choosing one by
    behaviour; the summary, also written to ``out/training_summary.json``.

    ``corpus`` (a ``corpus.Corpus``, or a path to load one from) holds the questions of the
    validation episodes; None: the demo corpus, as ``explorer train`` without ``--corpus``.
    ``resume`` continues the run in ``out`` from its newest complete checkpoint, with the same
    settings; without it ``out`` must be new or empty. ``log`` gets the lines a person should see.

    Raises TrainingError on input that cannot be used (one line saying how to fix it), and
    TrainingInterrupted after a Ctrl-C saved a checkpoint. Under accelerate launch, None on the
    processes other than the main one."""
    data, out = Path(data), Path(out)
    check_run_directory(data, out, resume)
    check_reporter(config, out)
    from paper_explorer.agent.policies import require_llm_extra

    require_llm_extra()
    with known_warnings_silenced():
        return _train(config, data, out, _validation_corpus(corpus, config), resume, log)


def check_run_directory(data: Path, out: Path, resume: bool) -> None:
    """The data must be built, and OUT new (or, to resume, a run): one line each, before anything
    loads. A directory of another kind is named as what it is, with the command that takes it."""
    from paper_explorer.evaluation.run_directory import TRAINING_RUN, kind_of

    if not (data / "build_report.json").exists():
        other = kind_of(data)
        if other is not None:
            raise TrainingError(f"{other.named(data)}, not a dataset of explorer sft build; {other.taken_by(data)}")
        raise TrainingError(f"{data}: no build_report.json; build the data with explorer sft build")
    if out.exists() and not out.is_dir():
        raise TrainingError(f"{out}: is a file; {setting('out')} names the training run's directory")
    other = kind_of(out)
    if other is not None and other is not TRAINING_RUN:
        raise TrainingError(f"{other.named(out)}, not a training run; {other.taken_by(out)}; choose another {setting('out')}")
    foreign = sorted(child.name for child in out.iterdir() if not _written_by_training(child.name)) if out.is_dir() else []
    if foreign:  # a source package, someone's data: a resume would write checkpoints among its files
        raise TrainingError(
            f"{out}: not a training run (it holds {foreign[0]}, which explorer train never writes); "
            f"{setting('out')} names a new directory for the run, e.g. runs/sft"
        )
    started = out.is_dir() and any(out.iterdir())
    if started and not resume:
        raise TrainingError(
            f"{out}: already holds a training run; pass {setting('resume', True)} to continue it or choose another {setting('out')}"
        )
    if resume and not started:
        raise TrainingError(f"{out}: no training run to resume; start training without {setting('resume', True)}")


# What explorer train writes into OUT (validation's files, TensorBoard's runs/, checkpoints, the summary).
TRAINING_FILES = {"training_summary.json", "validation.jsonl", "validation-episodes", "runs"}


def _written_by_training(name: str) -> bool:
    return name in TRAINING_FILES or name.startswith("checkpoint-") or name.startswith(".")


def _validation_corpus(corpus, config: TrainConfig):
    """The corpus validation episodes ask: as given, loaded from a path, or the demo corpus when
    none is given and episodes are wanted."""
    from paper_explorer.corpus import Corpus
    from paper_explorer.evaluation.run import load_corpus

    if isinstance(corpus, Corpus) or (corpus is None and not config.validation_episodes):
        return corpus  # a loaded one has said its warnings
    return load_corpus(corpus)


def checked_data(config: TrainConfig, data: Path) -> tuple[BuildReport, list[Example], list[Example]]:
    """The build report and the examples, refused whole if any is longer than max_length or if they
    were tokenised with another tokenizer than the model's (a directory's or the hub's tokenizer.json)."""
    try:
        report = load_report(data)
    except ValidationError as error:
        raise TrainingError(
            f"{data / 'build_report.json'}: not a build report ({error.errors()[0]['msg']}); rebuild it with explorer sft build"
        ) from None
    train_examples, validation_examples = load_examples(data / "train.jsonl"), load_examples(data / "validation.jsonl")
    if not train_examples:
        raise TrainingError(f"{data}: no training examples")
    too_long = [e.episode_id for e in train_examples if len(e.input_ids) > config.max_length]
    if too_long:
        raise TrainingError(
            f"{len(too_long)} examples are longer than max_length {config.max_length} (first: {too_long[0]}); "
            "rebuild the data with that --max-length"
        )
    model_tokenizer = file_sha256(tokenizer_file(config.model))
    if model_tokenizer != report.tokenizer_sha256:
        raise TrainingError(
            f"{data} was tokenised with another tokenizer ({report.tokenizer_sha256[:12]}) than {config.model}'s "
            f"({model_tokenizer[:12]}); rebuild it with explorer sft build --tokenizer {config.model}"
        )
    built_template = (report.chat_template or {}).get("chat_template_sha256")
    model_template = read_template(tokenizer_file(config.model).parent).sha256
    if built_template is not None and built_template != model_template:
        raise TrainingError(
            f"{data} was rendered with another chat template ({built_template[:12]}) than {config.model}'s "
            f"({model_template[:12]}); rebuild it with explorer sft build --tokenizer {config.model}"
        )
    return report, train_examples, validation_examples


def check_reporter(config: TrainConfig, out: Path | None = None) -> None:
    """A tracker's package must be installed, and TensorBoard's log directory (OUT/runs, or
    TENSORBOARD_LOGGING_DIR) writable, before anything heavy is loaded."""
    if config.report_to != "none" and find_spec(config.report_to) is None:
        raise TrainingError(
            f"{setting('report_to', config.report_to)} needs the {config.report_to} package, which is not installed; "
            f"pip install {config.report_to}, or pass {setting('report_to', 'none')}"
        )
    if config.report_to == "tensorboard" and out is not None:
        logs = Path(os.environ.get("TENSORBOARD_LOGGING_DIR") or out / "runs").expanduser()
        existing = next(p for p in (logs, *logs.parents) if p.exists())
        if not existing.is_dir():
            raise TrainingError(
                f"{setting('report_to', 'tensorboard')} writes its logs under {logs}, but {existing} is a file; move it away, "
                f"or choose another {setting('out')}"
            )
        if not os.access(existing, os.W_OK | os.X_OK):
            raise TrainingError(
                f"{setting('report_to', 'tensorboard')} writes its logs under {logs}, but {existing} is not writable; "
                f"fix its permissions, or choose another {setting('out')}"
            )


def training_arguments(config: TrainConfig, out: Path, cuda: bool):
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=str(out),
        num_train_epochs=config.epochs,
        max_steps=config.max_steps,
        per_device_train_batch_size=config.batch_size,
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        # A checkpoint per epoch; with save_steps every N steps as well (the callback adds the epoch ends).
        learning_rate=config.learning_rate,
        save_strategy="steps" if config.save_steps else "epoch",
        save_steps=config.save_steps or 500,
        logging_steps=1,
        seed=config.seed,
        report_to=[] if config.report_to == "none" else [config.report_to],
        run_name=out.name,
        include_num_input_tokens_seen="non_padding",  # summed over processes: the progress line's tokens/s
        bf16=cuda,
        gradient_checkpointing=config.gradient_checkpointing,
        gradient_checkpointing_kwargs={"use_reentrant": False},
        remove_unused_columns=False,
        dataloader_num_workers=0,
        use_cpu=not cuda,
        disable_tqdm=True,
        save_only_model=False,
        ddp_timeout=DISTRIBUTED_TIMEOUT_SECONDS,
    )


def _train(config: TrainConfig, data: Path, out: Path, corpus, resume: bool, log) -> TrainingSummary | None:
    """Check the data, load the model, train with a validation per checkpoint, select one by behaviour."""
    import torch

    from paper_explorer.sft.trainer import AssistantLossTrainer, Collator, Progress, ValidationCallback, barrier

    _, train_examples, validation_examples = checked_data(config, data)
    if resume and (checkpoint := newest_complete(out)) is not None:
        check_resume(checkpoint, config, data)
        if finished(checkpoint) and (out / SUMMARY).exists():
            if os.environ.get("RANK", "0") == "0":  # under accelerate launch: said once
                log(f"{out}: training already finished at step {finished(checkpoint)}; nothing to train, its {SUMMARY} is kept")
            try:
                return files.read_model(out / SUMMARY, TrainingSummary, what="training summary", inside=out)
            except files.FileRefused as error:
                raise TrainingError(f"{error}; remove it to train again") from None
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
        model=model,
        args=args,
        train_dataset=train_examples,
        data_collator=Collator(renderer.pad_id),
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
    return _summarise(config, out, trainer, result, validator, validation.first_step)


def _summarise(config: TrainConfig, out: Path, trainer, result, validator: Validator, first_step: int) -> TrainingSummary:
    """The whole run's summary (every session's losses), its checkpoint chosen by behaviour; written to OUT."""
    records = validator.records()
    # The log history comes back with a resumed checkpoint: the losses of every session, step 1 on.
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    summary = TrainingSummary(
        train_loss=sum(losses) / len(losses) if losses else result.training_loss,
        steps=result.global_step,
        seconds=round(time.perf_counter() - validator.started, 1),
        losses=losses,
        resumed_from_step=first_step,
        **select_checkpoint(records, config).model_dump(),
        checkpoints=[r for r in records if r.checkpoint],
    )
    with atomic_file(out / SUMMARY) as handle:
        handle.write(summary.model_dump_json(indent=2))
    return summary
