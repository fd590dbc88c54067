"""A run of explorer decide read back as a user reads it: inspect, report (in a real browser too),
compare, calibrate fit/apply, and the checks that refuse a run whose files were edited."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from paper_explorer.decisions.calibration import kind_figures, scaled
from paper_explorer.decisions.run import read_records
from paper_explorer.decisions.run_reading import DecisionRun
from paper_explorer.evaluation.errors import EvaluationError
from paper_explorer.evaluation.run_directory import DECIDE_RUN, EVAL_RUN, Run, kind_of
from tests.conftest import run_cli
from tests.decisions.decision_files import DOCUMENTS, labelled_documents, write_decisions
from tests.evaluation.test_report_browser import browser, console_errors, ink, screenshot, wait_for  # noqa: F401 - browser: a fixture

# What a hostile decision file holds: it would close the page's elements and run script if it were markup.
HOSTILE = "</td></section><script>document.title='pwned'</script><img src=x onerror=\"document.title='pwned'\"><!--"
HOSTILE_DOCUMENT = {
    "id": "evil",
    "text": f"A document that says {HOSTILE}.",
    "questions": [
        {"id": "<b>q</b><!--", "kind": "choice", "text": HOSTILE, "options": ["plain", HOSTILE, "</script>"], "label": HOSTILE},
        {"id": "evil-2", "kind": "noul", "text": "Is it <i>safe</i>?", "label": "no"},
    ],
}
MANY = {
    "id": "many",
    "text": "A list of twenty candidate names for the project.",
    "questions": [
        {"id": "q-many", "kind": "choice", "text": "Which name?", "options": [f"name {n}" for n in range(20)], "label": "name 3"}
    ],
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_model):
    """Three decide runs of the tiny model: every kind with a 20-option question, and a validation
    file and a test file of labelled questions (each kind right and wrong)."""
    directory = tmp_path_factory.mktemp("decide")
    files = {
        "small": write_decisions(directory / "small.jsonl", [*DOCUMENTS, MANY, HOSTILE_DOCUMENT]),
        "val": write_decisions(directory / "val.jsonl", labelled_documents("val", 12)),
        "test": write_decisions(directory / "test.jsonl", labelled_documents("test", 12)),
    }
    for name, file in files.items():
        done = run_cli("decide", str(file), "--model", str(tiny_model), "--out", str(directory / name))
        assert done.returncode == 0, done.stderr
    # the validation file again with its options listed last first: a comparison of one file
    done = run_cli("decide", str(files["val"]), "--model", str(tiny_model), "--out", str(directory / "val-reversed"), "--order", "reversed")
    assert done.returncode == 0, done.stderr
    return directory


def copied(runs, name, tmp_path):
    target = tmp_path / name
    shutil.copytree(runs / name, target)
    return target


def one_line_error(done, *said: str) -> str:
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert all(part in lines[0] for part in said), lines[0]
    return lines[0]


def test_a_decide_run_is_its_own_kind_and_the_eval_readers_name_the_command_that_takes_it(runs, tmp_path):
    assert kind_of(runs / "small") is DECIDE_RUN
    started = tmp_path / "started"  # a decide run before its first question: a manifest only
    started.mkdir()
    shutil.copy(runs / "small" / "manifest.json", started / "manifest.json")
    assert kind_of(started) is DECIDE_RUN
    with pytest.raises(EvaluationError, match=r"holds a run of explorer decide .*not a run of explorer eval; explorer inspect"):
        Run.load(runs / "small")
    one_line_error(run_cli("eval", "--out", str(runs / "small"), "--resume"), "holds a run of explorer decide", "no run to resume")
    eval_like = tmp_path / "eval"
    eval_like.mkdir()
    (eval_like / "manifest.json").write_text('{"created_at": "now", "config": {}}')
    assert kind_of(eval_like) is EVAL_RUN
    with pytest.raises(EvaluationError, match=r"holds a run of explorer eval .*not a run of explorer decide"):
        DecisionRun.load(eval_like)
    with pytest.raises(EvaluationError, match="a file of the run"):
        DecisionRun.load(runs / "small" / "decisions.jsonl")


def test_inspect_shows_the_figures_per_kind_within_80_columns(runs):
    run = DecisionRun.load(runs / "small")
    done = run_cli("inspect", str(runs / "small"), "--worst", "3", env={"COLUMNS": "80"})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    for kind, figures in run.metrics.kinds.items():
        row = next(line for line in lines if line.startswith(f"│ {kind} ") and "(" not in line)
        assert f"{figures.accuracy:.3f}" in row and f"{figures.brier:.3f}" in row and f"{figures.nll:.3f}" in row
        assert f"{figures.mean_confidence:.3f}" in row and f"{figures.mean_p_max:.3f}" in row
        interval = figures.ece_equal_width_ci95
        assert any(f"{figures.ece_equal_width:.3f} ({interval.low:.3f}-{interval.high:.3f})" in line for line in lines)
    assert "10 measured, 0 not measured, 0 cut to fit" in done.stdout
    wrong = sorted((r for r in run.records if r.correct is False), key=lambda r: -(r.p_max or 0))
    assert "most confidently wrong (3)" in done.stdout and f"│ {wrong[0].question_id} " in done.stdout
    assert "least confident (3)" in done.stdout


def test_inspect_one_question_lists_its_options_the_likeliest_ten_when_more(runs):
    done = run_cli("inspect", str(runs / "small"), "--episode", "q-many", env={"COLUMNS": "80"})
    assert done.returncode == 0, done.stderr
    record = next(r for r in read_records(runs / "small") if r.question_id == "q-many")
    probabilities = record.probabilities or []
    assert "20 options, the likeliest 10" in done.stdout
    shown = [line for line in done.stdout.splitlines() if line.startswith("│") and "name " in line]
    assert len(shown) == 10
    top = sorted(range(20), key=lambda i: -probabilities[i])[:10]
    assert [f"name {i} " in line for i, line in zip(top, shown)] == [True] * 10  # in order of probability
    assert f"{probabilities[top[0]]:.4f}" in shown[0] and "predicted" in shown[0]
    assert any("label" in line for line in shown) == (3 in top)
    missing = run_cli("inspect", str(runs / "small"), "--episode", "nope")
    one_line_error(missing, "no question 'nope'")


def test_inspect_prints_the_checks_the_run_recorded(runs):
    from paper_explorer.decisions.checks import check_lines
    from paper_explorer.decisions.run_reading import DecisionRun

    run = DecisionRun.load(runs / "small")
    assert run.metrics.checks is not None
    done = run_cli("inspect", str(runs / "small"), env={"COLUMNS": "200"})
    assert done.returncode == 0, done.stderr
    for line in check_lines(run.metrics.checks):
        assert line in done.stdout


def test_forged_check_figures_are_refused(runs, tmp_path):
    run = copied(runs, "small", tmp_path)
    metrics = json.loads((run / "metrics.json").read_text())
    metrics["checks"]["unknown"]["unknown_rate"] = 1.0
    (run / "metrics.json").write_text(json.dumps(metrics))
    one_line_error(run_cli("inspect", str(run)), "checks")


def test_edited_or_unfinished_runs_are_refused_in_one_line(runs, tmp_path):
    run = copied(runs, "small", tmp_path)
    lines = (run / "decisions.jsonl").read_text().splitlines()
    index = next(i for i, line in enumerate(lines) if json.loads(line)["correct"] is False)
    wrong = json.loads(lines[index])
    wrong["predicted"], wrong["correct"] = wrong["label"], True  # the answer the user hoped for
    lines[index] = json.dumps(wrong)
    (run / "decisions.jsonl").write_text("\n".join(lines) + "\n")
    one_line_error(run_cli("inspect", str(run)), f"decisions.jsonl: question {wrong['question_id']}:", "edited")

    run = copied(runs, "small", tmp_path / "b")
    metrics = json.loads((run / "metrics.json").read_text())
    metrics["kinds"]["noul"]["ece_equal_width"] = 0.01
    (run / "metrics.json").write_text(json.dumps(metrics))
    one_line_error(
        run_cli("calibrate", "fit", str(run), "--out", str(tmp_path / "c.json")), "metrics.json: 'kinds.noul.ece_equal_width' is 0.01"
    )

    run = copied(runs, "small", tmp_path / "c")
    whole = (runs / "small" / "decisions.jsonl").read_text().splitlines()
    (run / "decisions.jsonl").write_text("".join(line + "\n" for line in whole[:-1]))
    one_line_error(run_cli("inspect", str(run)), "9 of the 10 questions scored", "--resume finishes it")


def test_calibrate_fits_a_temperature_per_kind_and_apply_never_changes_the_likeliest_option(runs, tmp_path):
    calibration = tmp_path / "cal.json"
    fitted = run_cli("calibrate", "fit", str(runs / "val"), "--out", str(calibration))
    assert fitted.returncode == 0, fitted.stderr
    content = json.loads(calibration.read_text())
    assert content["kind"] == "decisions" and content["format"] == "explorer-calibration/1"
    assert set(content["kinds"]) | set(content["not_fitted"]) == {"noul", "choice", "score"} and content["kinds"]

    applied = run_cli("calibrate", "apply", str(runs / "test"), "--calibration", str(calibration), env={"COLUMNS": "80"})
    assert applied.returncode == 0, applied.stderr
    assert max(len(line) for line in applied.stdout.splitlines()) <= 80
    result = json.loads((runs / "test" / "calibrated.json").read_text())
    test = DecisionRun.load(runs / "test")  # calibrated.json beside the run's files does not disturb them
    for kind, fitted_kind in content["kinds"].items():
        records = [r for r in test.records if r.kind == kind]
        expected = kind_figures(kind, records, temperature=fitted_kind["temperature"])
        assert result["kinds"][kind]["after"] == json.loads(expected.model_dump_json())
        assert result["kinds"][kind]["before"] == json.loads(test.metrics.kinds[kind].model_dump_json())
        assert f"{expected.nll:.4f}" in applied.stdout
    by_id = test.by_question()
    assert len(result["questions"]) == len(test.measured)
    for question in result["questions"]:
        record = by_id[question["question_id"]]
        temperature = content["kinds"].get(record.kind, {}).get("temperature")
        calibrated = np.asarray(record.probabilities) if temperature is None else scaled(np.asarray(record.probabilities), temperature)
        assert question["predicted"] == record.predicted == record.options[int(np.argmax(calibrated))]
        assert question["calibrated_p_max"] == pytest.approx(float(calibrated.max()))


def test_apply_refuses_the_run_it_was_fitted_on_and_a_run_of_the_same_file(runs, tmp_path):
    calibration = tmp_path / "cal.json"
    assert run_cli("calibrate", "fit", str(runs / "val"), "--out", str(calibration)).returncode == 0
    one_line_error(run_cli("calibrate", "apply", str(runs / "val"), "--calibration", str(calibration)), "was fitted on", "itself")
    copy = copied(runs, "val", tmp_path)
    one_line_error(run_cli("calibrate", "apply", str(copy), "--calibration", str(calibration)), "a run of the same file")

    content = json.loads(calibration.read_text())
    first = next(iter(content["kinds"].values()))
    first["temperature"] = 1.0
    calibration.write_text(json.dumps(content))
    one_line_error(run_cli("calibrate", "apply", str(runs / "test"), "--calibration", str(calibration)), "do not match its sha256")


def test_calibrate_keeps_the_probe_flags_for_eval_runs_and_the_two_files_apart(runs, tmp_path):
    one_line_error(
        run_cli("calibrate", "fit", str(runs / "val"), "--probe", "answerable", "--out", str(tmp_path / "c.json")),
        "calibrated per kind",
        "--probe",
    )
    calibration = tmp_path / "cal.json"
    assert run_cli("calibrate", "fit", str(runs / "val"), "--out", str(calibration)).returncode == 0
    from paper_explorer.evaluation.calibration_fit import load_calibration

    with pytest.raises(EvaluationError, match="calibrates the kinds of a run of explorer decide"):
        load_calibration(calibration)  # what calibrate apply does first for an eval run


def test_a_run_whose_labelled_questions_are_all_right_or_wrong_fits_no_kind(runs, tmp_path, tiny_model):
    one = [{"id": "d", "text": "A short note.", "questions": [{"id": "q", "kind": "noul", "text": "Is it short?", "label": "yes"}]}]
    file = write_decisions(tmp_path / "one.jsonl", one)
    assert run_cli("decide", str(file), "--model", str(tiny_model), "--out", str(tmp_path / "run")).returncode == 0
    one_line_error(run_cli("calibrate", "fit", str(tmp_path / "run"), "--out", str(tmp_path / "c.json")), "no kind can be fitted", "noul")


def test_the_report_shows_the_calibration_table_and_two_reliability_diagrams_per_kind(runs, tmp_path):
    out = tmp_path / "val.html"
    done = run_cli("report", str(runs / "val"), "--out", str(out))
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    assert "http://" not in text and "https://" not in text and "<link" not in text and "src=" not in text  # nothing fetched
    run = DecisionRun.load(runs / "val")
    table = text[text.index('<table id="calibration-table">') : text.index("</table>", text.index('id="calibration-table"'))]
    for kind, figures in run.metrics.kinds.items():
        interval = figures.nll_ci95
        assert f"<td>{kind}</td>" in table and f"{figures.nll:.3f} ({interval.low:.3f}-{interval.high:.3f})" in table
        assert f'id="reliability-{kind}-width"' in text and f'id="reliability-{kind}-mass"' in text
    assert text.count('<div class="reliability"') == 2 * len(run.metrics.kinds)
    again = run_cli("report", str(runs / "val"), "--out", str(out))
    one_line_error(again, "already exists", "--force")
    one_line_error(run_cli("report", str(runs / "val"), str(runs / "test"), "--out", str(tmp_path / "two.html")), "explorer compare")
    one_line_error(run_cli("report", str(runs / "val"), "--corpus", "x.jsonl", "--out", str(tmp_path / "c.html")), "--corpus")


def test_the_report_keeps_a_hostile_decision_file_as_text(runs, tmp_path):
    out = tmp_path / "small.html"
    assert run_cli("report", str(runs / "small"), "--out", str(out)).returncode == 0
    text = out.read_text()
    assert "<script>document" not in text and "<img" not in text and "<b>q</b>" not in text
    assert text.count("<script") == 2  # the page's data block and its own script, nothing else


def test_the_report_in_a_browser_lists_questions_and_opens_one_with_its_options(runs, browser, tmp_path):
    from selenium.webdriver.common.by import By

    out = tmp_path / "small.html"
    assert run_cli("report", str(runs / "small"), "--out", str(out)).returncode == 0
    run = DecisionRun.load(runs / "small")
    browser.get(out.as_uri())
    rows = browser.find_elements(By.CSS_SELECTOR, "#questions tbody tr")
    assert len(rows) == len(run.records)
    first = run.records[0]
    cells = [cell.text for cell in rows[0].find_elements(By.TAG_NAME, "td")]
    assert cells == [first.question_id, first.kind, first.question, first.predicted, f"{first.p_max:.3f}", first.label]
    assert len(browser.find_elements(By.CSS_SELECTOR, "#plots figure svg")) == 2 * len(run.metrics.kinds)

    evil = run.by_question()["<b>q</b><!--"]
    browser.find_element(By.CSS_SELECTOR, "#questions tbody tr[data-question='evil-2']").click()
    wait_for(browser, "#detail table")
    from urllib.parse import quote

    browser.get(out.as_uri() + "#question=" + quote(evil.question_id))
    wait_for(browser, "#detail table")
    assert browser.title != "pwned" and not browser.find_elements(By.CSS_SELECTOR, "main img, #detail script, main b")
    detail = browser.find_element(By.ID, "detail")
    assert HOSTILE in detail.text and evil.question_id in detail.text
    options = [row.find_elements(By.TAG_NAME, "td") for row in detail.find_elements(By.CSS_SELECTOR, "table tr")[1:]]
    assert [cells[1].get_attribute("textContent") for cells in options] == evil.options
    probabilities = evil.probabilities or []
    assert [cells[2].text for cells in options] == [f"{p:.4f}" for p in probabilities]
    assert len(browser.find_elements(By.CSS_SELECTOR, "main > section")) == 2  # no element was closed early

    image = screenshot(browser)
    image.save(tmp_path / "decide-report.png")  # kept for a person to look at when the test fails
    boxes = browser.execute_script(
        "return [...document.querySelectorAll('#plots figure svg')].map(s => { const r = s.getBoundingClientRect(); "
        "return [r.left + scrollX, r.top + scrollY, r.right + scrollX, r.bottom + scrollY]; })"
    )
    for box in boxes:
        dark, _ = ink(image, tuple(round(v) for v in box))
        assert dark > 200, f"no axes or labels drawn in the diagram at {box}"
    assert console_errors(browser) == []


def test_compare_pairs_two_runs_of_one_file_per_kind_with_their_agreement(runs, tmp_path):
    done = run_cli("compare", str(runs / "val"), str(runs / "val-reversed"), "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    a, b = DecisionRun.load(runs / "val"), DecisionRun.load(runs / "val-reversed")
    assert result["measured_in_both"] == 36 and result["questions"] == 36
    same = sum(ra.predicted == b.by_question()[ra.question_id].predicted for ra in a.records)
    assert result["agreeing"] == same and result["agreement"] == pytest.approx(same / 36)
    assert any("order" in note for note in result["notes"])
    for kind, compared in result["kinds"].items():
        assert compared["paired"] == 12  # every question labelled and measured in both
        for figure, name in (("accuracy", "accuracy"), ("ece", "ece_equal_width"), ("brier", "brier"), ("nll", "nll")):
            assert compared[figure]["a"] == pytest.approx(getattr(a.metrics.kinds[kind], name))
            assert compared[figure]["b"] == pytest.approx(getattr(b.metrics.kinds[kind], name))
            assert compared[figure]["difference"] == pytest.approx(compared[figure]["b"] - compared[figure]["a"])
            interval = compared[figure]["difference_ci95"]
            assert interval["low"] <= interval["high"]
    shown = run_cli("compare", str(runs / "val"), str(runs / "val-reversed"), env={"COLUMNS": "80"})
    assert shown.returncode == 0, shown.stderr
    assert max(len(line) for line in shown.stdout.splitlines()) <= 80
    assert f"likeliest option the same in {same}" in shown.stdout.replace("\n", " ")
    one_line_error(run_cli("compare", str(runs / "val"), str(runs / "test")), "two decision files", "cannot be paired")
    eval_like = tmp_path / "eval"
    eval_like.mkdir()
    (eval_like / "manifest.json").write_text("{}")
    one_line_error(run_cli("compare", str(runs / "val"), str(eval_like)), "is a run of explorer decide and")


def test_inspect_counts_the_questions_not_measured_and_cut_and_says_why(tmp_path, tiny_model):
    file = write_decisions(tmp_path / "small.jsonl")
    for name, flags in (("over", ["--max-context", "60"]), ("cut", ["--max-context", "125", "--cut", "start"])):
        done = run_cli("decide", str(file), "--model", str(tiny_model), "--out", str(tmp_path / name), *flags)
        assert done.returncode == 0, done.stderr
    over = run_cli("inspect", str(tmp_path / "over"), env={"COLUMNS": "80"})
    assert over.returncode == 0, over.stderr
    assert "0 measured, 7 not measured, 0 cut to fit" in over.stdout
    assert "not measured: q1, q1n, q2, q3, q4, q5, q6" in over.stdout and "over the context" in over.stdout
    one = run_cli("inspect", str(tmp_path / "over"), "--episode", "q2")
    assert "not measured: the prompt is" in one.stdout.replace("\n", " ")
    cut = DecisionRun.load(tmp_path / "cut")
    dropped = sum(record.cut.tokens for record in cut.records if record.cut)
    shown = run_cli("inspect", str(tmp_path / "cut"), env={"COLUMNS": "80"})
    assert (
        f"{cut.metrics.measured} measured, 0 not measured, {cut.metrics.cut} cut to fit ({dropped} document tokens dropped)" in shown.stdout
    )
    assert cut.metrics.cut > 0
