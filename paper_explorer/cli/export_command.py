"""``explorer export``: a run as an inspect_ai log or a Hugging Face dataset; built SFT data as a
Hugging Face dataset.

The run's half lives in ``evaluation.export``. The SFT half is here because it reads ``sft``'s
records, which the evaluation layer may not import.
"""

from __future__ import annotations

import re
from pathlib import Path

import typer
from pydantic import ValidationError

from paper_explorer.cli.errors import UsageError
from paper_explorer.cli.options import open_corpus

FORMATS = ("inspect", "hf")


def export_command(
    source: Path = typer.Argument(
        ..., help="A run directory (explorer eval --out); with --to hf also an explorer sft build --out directory."
    ),
    out: Path = typer.Argument(..., help="--to inspect: the log file, .eval (inspect's format) or .json; --to hf: the dataset directory."),
    to: str = typer.Option(
        ..., "--to", help="inspect (an inspect_ai eval log for inspect view) or hf (a Hugging Face datasets directory with parquet files)."
    ),
    corpus_path: Path | None = typer.Option(
        None,
        "--corpus",
        "-c",
        help="The run's corpus, for the gold answers (default: the corpus its manifest records; its hash is checked).",
    ),
    questions_path: Path | None = typer.Option(
        None, "--questions", help="The questions file the run was given, if any (its hash is checked)."
    ),
    force: bool = typer.Option(False, "--force", help="Overwrite OUT (a directory only if it is an exported dataset)."),
) -> None:
    """Export a run (every episode: messages, code, observations, scores, detector flags) for inspect_ai
    or Hugging Face datasets, or an sft build's train/validation examples for Hugging Face datasets."""
    from paper_explorer.evaluation import export

    if to not in FORMATS:
        raise UsageError(f"--to: unknown format {to!r}; use inspect or hf")
    if to == "inspect" and out.suffix not in (".eval", ".json"):
        raise UsageError(f"{out}: name the inspect log .eval (inspect's format) or .json")
    if out.exists() and not force:
        raise UsageError(f"{out}: already exists; pass --force to overwrite it")
    if to == "inspect" and out.is_dir():
        raise UsageError(f"{out}: is a directory; name the .eval or .json file to write")
    if to == "hf" and out.exists() and not (export.is_dataset_directory(out) or (out.is_dir() and not any(out.iterdir()))):
        raise UsageError(f"{out}: exists and is not a dataset directory; --force replaces only an exported dataset")
    export.require("inspect_ai" if to == "inspect" else "datasets")
    if (source / "build_report.json").is_file():
        if to == "inspect":
            raise UsageError(
                f"{source}: holds a dataset built by explorer sft build (build_report.json), not a run of explorer "
                "eval; --to inspect exports a run: export this dataset with --to hf"
            )
        _export_sft_data(source, out)
        return
    records = export.read_run(source)
    gold = _gold_answers(records, corpus_path, questions_path)
    if to == "inspect":
        export.write_inspect_log(export.inspect_log(records, gold), out)
        typer.echo(f"inspect log written to {out} ({len(records.trajectories)} samples); view it with: inspect view --log-dir {out.parent}")
        if out.suffix == ".json" and not re.match(r"\d{4}-\d{2}-\d{2}T\d{2}[:-]\d{2}[:-]\d{2}", out.name):
            # inspect's own listing rule (inspect_ai.log._file.is_log_file); a .eval log is always listed
            typer.echo(
                "note: inspect view lists a .json log only when its name starts with a timestamp, as inspect "
                "names its own (2026-01-31T12-00-00_run.json); read_eval_log reads it whatever its name"
            )
        return
    files = export.save_dataset(
        out, {"trajectories": export.trajectory_rows(records, gold)}, export.trajectory_features(), single="trajectories"
    )
    _print_written(out, f"{len(records.trajectories)} episodes", files)


def _gold_answers(records, corpus_path: Path | None, questions_path: Path | None) -> dict[str, list[str]]:
    """Each question's reference answers, from --corpus or else the corpus the run's manifest
    records (a file, a folder, or the generated demo corpus): refused, as explorer report refuses
    it, when it is gone or its papers or questions are not the run's - an export with empty or
    another corpus's gold answers beside the predictions would mislead quietly."""
    from paper_explorer.evaluation.export import gold_answers
    from paper_explorer.evaluation.report_data import check_corpus
    from paper_explorer.evaluation.resume import recorded_corpus

    manifest = records.run.manifest
    path = corpus_path if corpus_path is not None else recorded_corpus(manifest)  # gone: one line that says to pass --corpus
    corpus = open_corpus(path, questions_path, manifest.config.split_of or None)
    check_corpus(
        records.run, corpus, f"--corpus {path}" if corpus_path is not None else f"the run's corpus ({path or 'the generated demo corpus'})"
    )
    return gold_answers(corpus)


def _export_sft_data(data: Path, out: Path) -> None:
    """``sft build``'s train.jsonl and validation.jsonl as a DatasetDict of the same name's splits."""
    from datasets import Features, List, Value

    from paper_explorer.evaluation.export import save_dataset
    from paper_explorer.sft.dataset import load_examples, load_report

    try:
        load_report(data)
        splits = {name: [example.model_dump() for example in load_examples(data / f"{name}.jsonl")] for name in ("train", "validation")}
    except FileNotFoundError as error:
        raise UsageError(f"{data}: no {Path(error.filename).name}; rebuild the data with explorer sft build") from None
    except ValidationError as error:
        raise UsageError(f"{data}: not what explorer sft build writes ({error.errors()[0]['msg']}); rebuild the data") from None
    text, integer = Value("string"), Value("int32")
    features = Features(
        {
            "episode_id": text,
            "question_id": text,
            "paper_id": text,
            "question": text,
            "first_action_submits": Value("bool"),
            "input_ids": List(integer),
            "labels": List(integer),  # labels: -100 except on assistant tokens
            "turns": List({"start": integer, "end": integer, "type": text, "end_of_turn": integer}),
            "split_at_turn": integer,
        }
    )
    files = save_dataset(out, splits, features)
    counts = ", ".join(f"{name} {len(rows)}" for name, rows in splits.items())
    _print_written(out, f"{counts} examples", files)


def _print_written(out: Path, what: str, files: dict[str, Path]) -> None:
    data_files = {name: str(path) for name, path in files.items()}
    typer.echo(
        f"dataset written to {out} ({what}): datasets.load_from_disk({str(out)!r}), "
        f"or datasets.load_dataset('parquet', data_files={data_files!r})"
    )
