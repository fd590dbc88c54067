"""``explorer calibrate fit|apply``: temperature scaling of an option probe, fitted on a validation
run and applied to another (``evaluation.calibration_fit``), or of a decide run's kinds, one
temperature per kind (``decisions.calibration_fit``), chosen by the run's kind; this module parses
flags and prints.

Paths and probe names come from the user or the run's files: printed through
``agent.terminal_text.untrusted``, never as rich markup."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from paper_explorer.agent.terminal_text import untrusted
from paper_explorer.cli.errors import UsageError

if TYPE_CHECKING:
    from paper_explorer.evaluation.prereg import Preregistered

calibrate_app = typer.Typer(
    help="Calibrate an option probe's probabilities (fit a temperature and an abstention threshold on validation, apply them to a run), "
    "or a decide run's: a temperature per kind.",
    no_args_is_help=True,
)
console = Console()

PreregistrationOption = typer.Option(
    None, "--preregistration", help="A preregistration TOML: its abstention bounds (fit) or its calibration rule (apply)."
)


MinMassOption = typer.Option(
    None,
    "--min-mass",
    help="The options' least share of the model's next-token distribution (default: the run's --probe-min-mass; apply: the calibration file's when higher); "
    "an episode under it measured no belief and is refused.",
)


def _check_min_mass(value: float | None) -> None:
    if value is not None and not 0 <= value <= 1:  # NaN fails too
        raise UsageError(f"--min-mass {value}: give a share of the distribution, 0 to 1")


def _prereg(path: Path | None) -> Preregistered | None:
    if path is None:
        return None
    from paper_explorer.evaluation.prereg import Preregistered

    return Preregistered.read(path)


@calibrate_app.command("fit")
def fit_command(
    run_dir: Path = typer.Argument(
        ...,
        help="A finished run of the validation (or train) split, with probes (explorer eval --probe), or a decide run of a validation file.",
    ),
    probe: str | None = typer.Option(None, "--probe", help="The probe to calibrate (default: answerable; not for a decide run)."),
    out: Path = typer.Option(..., "--out", "-o", help="The calibration file to write (JSON)."),
    label: str | None = typer.Option(
        None, "--label", help="Label definition: gold-answerable, answer-f1>=X (default: the probe's own; answerable: gold-answerable)."
    ),
    bins: int = typer.Option(10, "--bins", help="Bins of the ECE figures (2 to 1000, as a preregistration's)."),
    preregistration: Path | None = PreregistrationOption,
    min_mass: float | None = MinMassOption,
    force: bool = typer.Option(False, "--force", help="Overwrite OUT."),
) -> None:
    """Fit a temperature by NLL on a validation run, and an abstention threshold.

    A test-split run is refused. For the answerable probe, the threshold on the calibrated
    probability meets the preregistered abstention bounds; the file records its own hash.
    A decide run (of a validation file) gets one temperature per kind."""
    from paper_explorer.evaluation.calibration_fit import fit
    from paper_explorer.evaluation.run_directory import DECIDE_RUN, Run, kind_of

    if not 2 <= bins <= 1000:
        raise UsageError(f"--bins {bins}: give 2 to 1000")
    _check_min_mass(min_mass)
    if out.exists() and not force:
        raise UsageError(f"{out}: already exists; pass --force to overwrite it")
    if kind_of(run_dir) is DECIDE_RUN:
        _only_for_probes(run_dir, probe=probe, label=label, preregistration=preregistration, min_mass=min_mass)
        _fit_decisions(run_dir, out, bins)
        return
    calibration = fit(Run.load(run_dir), probe or "answerable", out, label, bins, _prereg(preregistration), min_mass)
    before, after = calibration.before, calibration.after
    console.print(
        untrusted(
            f"probe {calibration.probe} ({calibration.label}; {calibration.validation.episodes} episodes of "
            f"{calibration.validation.split} run {calibration.validation.run}): temperature {calibration.temperature:.4f}"
        )
    )
    if calibration.at_bound:
        from paper_explorer.evaluation.calibration_fit import bound_note

        console.print(f"[bold yellow]note:[/] {bound_note(calibration.temperature)}")
    console.print(f"figures on the validation run, before and after ({calibration.bins} bins):")
    table = Table("figure", "before", "after")
    for name in ("ece_equal_width", "ece_equal_mass", "brier", "nll"):
        table.add_row(name, f"{getattr(before, name):.4f}", f"{getattr(after, name):.4f}")
    console.print(table)
    threshold = calibration.threshold
    if threshold is not None:
        console.print(
            untrusted(
                f"abstain when calibrated P({calibration.probe}) < {threshold.threshold:.4f} ({threshold.chosen_by}): "
                f"{threshold.correct_abstentions} correct and {threshold.false_abstentions} false abstentions, "
                f"decision accuracy {threshold.decision_accuracy:.3f} on validation"
            )
        )
    console.print(untrusted(f"written: {out} (sha256 {calibration.sha256})"))
    typer.echo(f"next: explorer calibrate apply TEST_RUN --calibration {out}", err=True)


def _only_for_probes(run_dir: Path, **given: object) -> None:
    """The flags of a probe's calibration, refused for a decide run (calibrated per kind, with its labels)."""
    named = [f"--{name.replace('_', '-')}" for name, value in given.items() if value is not None]
    if named:
        raise UsageError(
            f"{run_dir}: a decide run is calibrated per kind against its labels; {', '.join(named)} applies to an eval run's probes"
        )


def _fit_decisions(run_dir: Path, out: Path, bins: int) -> None:
    from paper_explorer.decisions.calibration_fit import fit
    from paper_explorer.decisions.run_reading import DecisionRun
    from paper_explorer.evaluation.calibration_fit import bound_note

    calibration = fit(DecisionRun.load(run_dir), out, bins)
    console.print(untrusted(f"decide run {run_dir} (questions of {calibration.fitted_on.file}): a temperature per kind, by NLL"))
    table = Table(
        "kind", "T", "n", "ECE before", "ECE after", "NLL before", "NLL after", title=f"on the fitted run ({bins} equal-width bins)"
    )
    for kind, fitted in calibration.kinds.items():
        before, after = fitted.before, fitted.after
        table.add_row(
            kind,
            f"{fitted.temperature:.4f}",
            str(before.labelled),
            f"{before.ece_equal_width:.4f}",
            f"{after.ece_equal_width:.4f}",
            f"{before.nll:.4f}",
            f"{after.nll:.4f}",
        )
    console.print(table)
    for kind, fitted in calibration.kinds.items():
        if fitted.at_bound:
            console.print(Text.assemble(("note: ", "bold yellow"), f"{kind}: {bound_note(fitted.temperature)}"))
    for unfitted, why in calibration.not_fitted.items():
        console.print(Text.assemble(("not fitted: ", "bold yellow"), untrusted(f"{unfitted}: {why}")))
    console.print(untrusted(f"written: {out} (sha256 {calibration.sha256})"))
    typer.echo(f"next: explorer calibrate apply TEST_DECIDE_RUN --calibration {out}", err=True)


def _apply_decisions(run_dir: Path, calibration: Path) -> None:
    from paper_explorer.decisions.calibration_fit import apply
    from paper_explorer.decisions.run_reading import DecisionRun
    from paper_explorer.evaluation.calibration_fit import CALIBRATED

    result = apply(DecisionRun.load(run_dir), calibration)
    table = Table("kind", "T", "n", "figure", "before", "after", title="per kind, raw and calibrated (the likeliest option never changes)")
    for kind, figures in result.kinds.items():
        before, after = figures.before, figures.after
        temperature = "-" if figures.temperature is None else f"{figures.temperature:.4f}"
        for index, name in enumerate(("accuracy", "ece_equal_width", "ece_equal_mass", "brier", "nll")):
            was, now = getattr(before, name), getattr(after, name)
            table.add_row(
                kind if index == 0 else "",
                temperature if index == 0 else "",
                str(before.labelled) if index == 0 else "",
                name,
                "-" if was is None else f"{was:.4f}",
                "-" if now is None else f"{now:.4f}",
                end_section=index == 4,
            )
    console.print(table)
    for note in result.notes:
        console.print(Text.assemble(("note: ", "bold yellow"), untrusted(note)))
    console.print(untrusted(f"written: {Path(result.run) / CALIBRATED}"))


@calibrate_app.command("apply")
def apply_command(
    run_dir: Path = typer.Argument(..., help="A finished run with probes (e.g. of the test split), or a decide run of a test file."),
    calibration: Path = typer.Option(..., "--calibration", help="The file explorer calibrate fit wrote (its hash is checked)."),
    preregistration: Path | None = PreregistrationOption,
    min_mass: float | None = MinMassOption,
) -> None:
    """Apply a calibration file to a run: writes RUN/calibrated.json.

    Per episode the raw and calibrated probability and the threshold's decision beside the
    policy's; ECE raw against calibrated, and the exact McNemar test of the two decisions."""
    from paper_explorer.evaluation.calibration_fit import CALIBRATED, apply
    from paper_explorer.evaluation.run_directory import DECIDE_RUN, Run, kind_of
    from paper_explorer.evaluation.stats import format_p

    _check_min_mass(min_mass)
    if kind_of(run_dir) is DECIDE_RUN:
        _only_for_probes(run_dir, preregistration=preregistration, min_mass=min_mass)
        _apply_decisions(run_dir, calibration)
        return
    run = Run.load(run_dir)
    result = apply(run, calibration, _prereg(preregistration), min_mass)
    raw, cal = result.raw, result.calibrated
    console.print(
        untrusted(f"probe {result.probe} ({result.label}; n = {raw.n}), temperature {result.temperature:.4f}: raw and calibrated")
    )
    table = Table("figure", "raw", "calibrated")
    for name in ("ece_equal_width", "ece_equal_mass", "brier", "nll", "accuracy"):
        table.add_row(name, f"{getattr(raw, name):.4f}", f"{getattr(cal, name):.4f}")
    console.print(table)
    for note in result.notes:
        console.print(Text.assemble(("note: ", "bold yellow"), untrusted(note)))
    if result.threshold is not None and result.decided == 0:
        console.print(f"exact McNemar: no decided episodes (the policy neither answered nor abstained on any of the {raw.n})")
    elif result.threshold is not None:
        tests = Table(
            "outcome",
            "pairs",
            "both yes",
            "A only",
            "B only",
            "both no",
            "two-sided p",
            title=f"exact McNemar: the policy's decisions (A) against abstaining when P < {result.threshold:.4f} (B); "
            "decision right: abstained exactly on unanswerable gold",
        )
        for test in result.mcnemar:
            tests.add_row(
                test.outcome, str(test.pairs), str(test.both), str(test.only_a), str(test.only_b), str(test.neither), format_p(test.p_value)
            )
        console.print(tests)
    prereg = result.preregistration
    if prereg is not None:
        style = "bold green" if prereg.passed else "bold red"
        console.print(
            Text.assemble(
                (f"preregistered calibration rule: {'PASS' if prereg.passed else 'FAIL'}", style), " ", untrusted(f"({prereg.file})")
            )
        )
        for check in prereg.checks:
            got = "" if check.value is None else f" (got {check.value})"
            console.print(untrusted(f"  {'pass' if check.passed else 'FAIL'}: {check.check}{got}"))
    console.print(untrusted(f"written: {run.directory / CALIBRATED}"))
    if prereg is not None and not prereg.passed:
        raise typer.Exit(1)
