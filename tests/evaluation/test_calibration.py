"""Calibration measured and fitted (``evaluation.calibration``, ``evaluation.calibration_fit``,
``explorer calibrate``): ECE, Brier and NLL against hand-worked values, equal-mass bins, the
temperature fit recovering a known temperature, the argmax kept, and the commands on real runs.

The runs are real scripted runs (``explorer eval``) on the validation and test splits of a generated
corpus, whose trajectories are then given the option probes a model policy records
(``Trajectory.probes``: synthetic probabilities, overconfident by a known temperature) and rescored
as ``explorer eval`` scores them."""

from __future__ import annotations

import json
import math
import shutil

import numpy as np
import pytest

from paper_explorer.agent.trajectory import ProbeResult
from paper_explorer.agent.writer import read_trajectories
from paper_explorer.corpus.loading import load
from paper_explorer.evaluation.calibration import (
    brier,
    ece,
    equal_mass_bins,
    fit_temperature,
    nll,
    observations,
    reliability,
    run_calibration,
    scaled,
)
from paper_explorer.evaluation.calibration_fit import at_bound, bound_note, content_sha256, file_sha256, judge_calibrated, load_calibration
from paper_explorer.evaluation.prereg import CalibrationRule, Preregistered, Preregistration, judge
from paper_explorer.evaluation.records import RunMetrics
from paper_explorer.evaluation.run_directory import Run
from tests.conftest import rescored, run_cli
from tests.evaluation.test_report_browser import browser, console_errors, ink, screenshot  # noqa: F401 (browser: a fixture)

WIDE = {"COLUMNS": "200"}
TRUE_TEMPERATURE = 2.5


# -- the figures by hand ------------------------------------------------------------------------


def test_ece_brier_and_nll_equal_hand_computed_values():
    p = np.array([0.1, 0.2, 0.3, 0.9])
    y = np.array([False, False, True, True])
    # equal-width, 2 bins: [0, 0.5) holds 0.1, 0.2, 0.3: mean 0.2, accuracy 1/3, |1/3 - 0.2| = 0.1333, weight 3/4 -> 0.1;
    # [0.5, 1] holds 0.9: accuracy 1, |1 - 0.9| = 0.1, weight 1/4 -> 0.025. ECE = 0.125.
    assert ece(p, y, bins=2) == pytest.approx(0.125)
    # equal-mass, 2 bins of 2: {0.1, 0.2}: mean 0.15, accuracy 0 -> 0.15 x 1/2 = 0.075;
    # {0.3, 0.9}: mean 0.6, accuracy 1 -> 0.4 x 1/2 = 0.2. ECE = 0.275.
    assert ece(p, y, bins=2, equal_mass=True) == pytest.approx(0.275)
    # Brier: (0.1^2 + 0.2^2 + 0.7^2 + 0.1^2) / 4 = (0.01 + 0.04 + 0.49 + 0.01) / 4 = 0.1375
    assert brier(p, y) == pytest.approx(0.1375)
    # NLL: -(ln 0.9 + ln 0.8 + ln 0.3 + ln 0.9) / 4
    assert nll(p, y) == pytest.approx(-(math.log(0.9) + math.log(0.8) + math.log(0.3) + math.log(0.9)) / 4)
    # ten bins: a probability of exactly 1 falls in the last, closed bin; a perfect forecaster scores 0
    assert ece(np.array([0.0, 1.0]), np.array([False, True])) == 0.0
    assert nll(np.array([0.0, 1.0]), np.array([True, False])) == pytest.approx(-math.log(1e-12))  # clipped, not infinite


def test_equal_mass_bins_hold_equal_counts_and_the_bins_report_them():
    rng = np.random.default_rng(1)
    p, y = rng.random(50), rng.random(50) < 0.5
    assert [len(members) for members in equal_mass_bins(p, 10)] == [5] * 10
    bins = reliability(p, y, 10, equal_mass=True)
    assert [b.count for b in bins] == [5] * 10
    assert all(b.low <= b.mean_confidence <= b.high for b in bins)
    assert [b.low for b in bins] == sorted(b.low for b in bins)
    # 53 episodes: sizes differ by at most one
    assert {len(members) for members in equal_mass_bins(rng.random(53), 10)} == {5, 6}


# -- temperature scaling ------------------------------------------------------------------------


def synthetic(n: int, seed: int, temperature: float) -> tuple[np.ndarray, np.ndarray]:
    """Labels drawn from calibrated logits z; the recorded probabilities are sigmoid(temperature x z)."""
    rng = np.random.default_rng(seed)
    z = rng.normal(0.0, 1.5, n)
    labels = rng.random(n) < 1 / (1 + np.exp(-z))
    yes = 1 / (1 + np.exp(-temperature * z))
    return np.stack([yes, 1 - yes], axis=1), labels


def test_the_fit_recovers_a_known_temperature():
    probabilities, labels = synthetic(5000, seed=0, temperature=TRUE_TEMPERATURE)
    fitted = fit_temperature(probabilities, labels)
    assert abs(fitted - TRUE_TEMPERATURE) / TRUE_TEMPERATURE < 0.05
    before, after = ece(probabilities[:, 0], labels), ece(scaled(probabilities, fitted)[:, 0], labels)
    assert after < before / 3


def test_scaling_never_changes_which_option_wins():
    rng = np.random.default_rng(2)
    three = rng.dirichlet([0.5, 0.5, 0.5], size=400)
    for temperature in (0.05, 0.3, 1.0, 2.5, 20.0):
        assert (np.argmax(scaled(three, temperature), axis=1) == np.argmax(three, axis=1)).all()
    two, _ = synthetic(200, seed=3, temperature=1.0)
    logit = np.log(two[:, 0] / two[:, 1])
    assert scaled(two, 2.5)[:, 0] == pytest.approx(1 / (1 + np.exp(-logit / 2.5)))  # two options: sigmoid(logit / T)


# -- runs with probes ---------------------------------------------------------------------------


def with_probes(run, corpus, seed: int, mass=lambda index: 0.9) -> None:
    """Give each episode an ``answerable`` probe at its end, overconfident by TRUE_TEMPERATURE, its
    options holding ``mass(index)`` of the distribution, and rescore the run as explorer eval does
    (scores.jsonl, metrics.json)."""
    by_id = {q.id: q for q in corpus.questions}
    rng = np.random.default_rng(seed)
    trajectories = []
    for index, trajectory in enumerate(read_trajectories(run / "trajectories.jsonl")):
        answerable = by_id[trajectory.question_id].answerable
        z = (0.8 if answerable else -0.8) + rng.normal(0.0, 1.0)
        yes = float(1 / (1 + math.exp(-TRUE_TEMPERATURE * z)))
        held = mass(index)
        probe = ProbeResult(
            probe="answerable",
            options=["yes", "no"],
            option_ids=[9693, 2152],
            logprobs=[math.log(yes * held), math.log((1 - yes) * held)],
            probabilities=[yes, 1 - yes],
            mass=held,
            source="hf",
            prompt_tokens=100,
            prompt_sha256="0" * 64,
            probes_sha256="1" * 64,
        )
        trajectories.append(trajectory.model_copy(update={"probes": [probe]}))
    (run / "trajectories.jsonl").write_text("".join(t.model_dump_json() + "\n" for t in trajectories))
    rescored(run, corpus)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """validation and test: scripted runs with probes; plain: the validation run as eval wrote it."""
    directory = tmp_path_factory.mktemp("calibration")
    corpus = directory / "small.jsonl"
    assert run_cli("corpus", "generate", "--papers", "40", "--seed", "5", "--out", str(corpus)).returncode == 0
    for split in ("validation", "test"):
        done = run_cli("eval", "--corpus", str(corpus), "--split", split, "--policy", "scripted", "--out", str(directory / split))
        assert done.returncode == 0, done.stderr
    shutil.copytree(directory / "validation", directory / "plain")
    shutil.copytree(directory / "validation", directory / "faint")
    shutil.copytree(directory / "test", directory / "faint-test")
    loaded = load(corpus)
    with_probes(directory / "validation", loaded, seed=0)
    with_probes(directory / "test", loaded, seed=1)
    # a model that wants to write something else: on every third episode its options hold 1e-6
    with_probes(directory / "faint", loaded, seed=0, mass=lambda index: 1e-6 if index % 3 == 0 else 0.6)
    with_probes(directory / "faint-test", loaded, seed=1, mass=lambda index: 2e-6)
    return directory


def test_metrics_gain_calibration_only_when_the_run_has_probes(runs):
    plain = json.loads((runs / "plain" / "metrics.json").read_text())
    assert plain["calibration"] is None
    assert all("probes" not in json.loads(line) for line in (runs / "plain" / "scores.jsonl").read_text().splitlines())
    figures = RunMetrics.model_validate_json((runs / "validation" / "metrics.json").read_text()).calibration
    answerable = figures["answerable"]
    scored = [json.loads(line) for line in (runs / "validation" / "scores.jsonl").read_text().splitlines()]
    assert answerable.n == len(scored) and answerable.label == "gold-answerable" and answerable.option == "yes"
    assert answerable.positives == sum(s["answerable"] for s in scored)
    assert (
        sum(b.count for b in answerable.reliability_equal_width) == answerable.n == sum(b.count for b in answerable.reliability_equal_mass)
    )
    assert answerable.ece_equal_width_ci95.low <= answerable.ece_equal_width <= answerable.ece_equal_width_ci95.high
    assert answerable.nll_clip == 1e-12
    again = run_calibration(Run.load(runs / "validation").scores)  # seeded: the same figures twice
    assert again["answerable"] == answerable


def test_fit_refuses_a_run_of_the_test_split(runs, tmp_path):
    done = run_cli("calibrate", "fit", str(runs / "test"), "--out", str(tmp_path / "c.json"))
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "test split" in done.stderr and "--split validation" in done.stderr
    assert not (tmp_path / "c.json").exists()


def test_fit_then_apply_writes_calibrated_json_with_mcnemar(runs, tmp_path):
    out = tmp_path / "calibration.json"
    done = run_cli("calibrate", "fit", str(runs / "validation"), "--probe", "answerable", "--out", str(out), env=WIDE)
    assert done.returncode == 0, done.stderr
    calibration = json.loads(out.read_text())
    assert calibration["probe"] == "answerable" and calibration["label"] == "gold-answerable"
    assert calibration["temperature"] > 1  # the probabilities were overconfident
    assert calibration["validation"]["split"] == "validation" and len(calibration["validation"]["trajectories_sha256"]) == 64
    assert calibration["after"]["nll"] <= calibration["before"]["nll"]
    assert f"temperature {calibration['temperature']:.4f}" in done.stdout and "ece_equal_width" in done.stdout
    assert f"< {calibration['threshold']['threshold']:.4f}" in done.stdout

    done = run_cli("calibrate", "apply", str(runs / "test"), "--calibration", str(out), env=WIDE)
    assert done.returncode == 0, done.stderr
    result = json.loads((runs / "test" / "calibrated.json").read_text())
    scores = [json.loads(line) for line in (runs / "test" / "scores.jsonl").read_text().splitlines()]
    assert len(result["episodes"]) == len(scores) and result["calibration_sha256"] == calibration["sha256"]
    for episode in result["episodes"]:
        # the same winner before and after; the threshold's decision recorded beside the policy's own
        assert (episode["raw"] >= 0.5) == (episode["calibrated"] >= 0.5)
        assert episode["threshold_abstains"] == (episode["calibrated"] < calibration["threshold"]["threshold"])
        assert episode["policy_abstained"] == (episode["policy_status"] == "abstained")
    tests = {test["outcome"]: test for test in result["mcnemar"]}
    right = tests["decision right"]
    assert right["pairs"] == result["decided"] and right["both"] + right["only_a"] + right["only_b"] + right["neither"] == right["pairs"]
    assert 0 <= right["p_value"] <= 1
    assert result["raw"]["n"] == result["calibrated"]["n"] == len(scores)
    assert "exact McNemar" in done.stdout and "ece_equal_width" in done.stdout


def test_an_edited_calibration_file_is_refused(runs, tmp_path):
    out = tmp_path / "calibration.json"
    assert run_cli("calibrate", "fit", str(runs / "validation"), "--out", str(out)).returncode == 0
    edited = json.loads(out.read_text())
    edited["temperature"] = 1.0
    out.write_text(json.dumps(edited, indent=2))
    done = run_cli("calibrate", "apply", str(runs / "test"), "--calibration", str(out))
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "edited or damaged" in done.stderr


def test_the_preregistered_calibration_rule(runs, tmp_path):
    scores = Run.load(runs / "validation").scores
    found = observations(scores, "answerable")
    raw_ece = ece(found.confidence, found.labels, 10)
    frozen = {"corpus_sha256": "0" * 64, "questions_sha256": "0" * 64}
    rule = {"min_correct_abstentions": 0, "max_false_abstentions": 100}

    def judged(calibration: dict, with_scores=scores):
        prereg = Preregistration.model_validate({"frozen": frozen, "rule": rule, "calibration": calibration})
        metrics = RunMetrics.model_validate_json((runs / "validation" / "metrics.json").read_text())
        return judge(prereg, tmp_path / "p.toml", metrics.abstention, with_scores)

    passing = judged({"max_ece": min(1.0, raw_ece + 0.01)})
    assert passing.passed and passing.checks[-1].value == pytest.approx(raw_ece, abs=1e-6)
    assert not judged({"max_ece": raw_ece / 2}).passed
    no_probe = judged({"probe": "correct", "max_ece": 0.5})
    assert not no_probe.passed and no_probe.checks[-1].value is None  # a preregistered probe the run did not measure fails
    pinned = judged({"max_ece": 0.5, "calibration_sha256": "a" * 64})
    assert pinned.passed and "calibrate apply" in pinned.pending[0]  # judged by apply, with the file

    # apply judges a pinned rule: the file must be the pinned one
    out = tmp_path / "calibration.json"
    assert run_cli("calibrate", "fit", str(runs / "validation"), "--out", str(out)).returncode == 0
    sha = json.loads(out.read_text())["sha256"]
    test_run = Run.load(runs / "test").manifest  # apply checks the [frozen] hashes against the run's manifest
    for pin, code in ((sha, 0), ("b" * 64, 1)):
        toml = tmp_path / "prereg.toml"
        toml.write_text(
            f'[frozen]\ncorpus_sha256 = "{test_run.hashes.corpus_sha256}"\n'
            f'questions_sha256 = "{test_run.config.selected_questions_sha256}"\n'
            "[rule]\nmin_correct_abstentions = 0\nmax_false_abstentions = 100\n"
            f'[calibration]\nprobe = "answerable"\nmax_ece = 0.9\ncalibration_sha256 = "{pin}"\n'
        )
        done = run_cli("calibrate", "apply", str(runs / "test"), "--calibration", str(out), "--preregistration", str(toml), env=WIDE)
        assert done.returncode == code, done.stderr
        assert ("PASS" if code == 0 else "FAIL") in done.stdout
    assert CalibrationRule(max_ece=0.1).label_name() == "gold-answerable"


def test_fit_under_preregistered_abstention_bounds(runs, tmp_path):
    toml = tmp_path / "prereg.toml"
    toml.write_text(
        f'[frozen]\ncorpus_sha256 = "{"0" * 64}"\nquestions_sha256 = "{"0" * 64}"\n[rule]\nmin_correct_abstentions = 2\nmax_false_abstentions = 100\n'
    )
    out = tmp_path / "calibration.json"
    done = run_cli("calibrate", "fit", str(runs / "validation"), "--out", str(out), "--preregistration", str(toml))
    assert done.returncode == 0, done.stderr
    threshold = json.loads(out.read_text())["threshold"]
    assert threshold["correct_abstentions"] >= 2 and threshold["chosen_by"].startswith("preregistered bounds")
    toml.write_text(toml.read_text().replace("max_false_abstentions = 100", "max_false_abstentions = 0").replace("= 2", "= 1000"))
    done = run_cli("calibrate", "fit", str(runs / "validation"), "--out", str(out), "--force", "--preregistration", str(toml))
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "no threshold meets" in done.stderr


def test_the_reports_and_compare_show_calibration(runs, tmp_path):
    report = tmp_path / "report.html"
    done = run_cli("report", str(runs / "validation"), "--out", str(report))
    assert done.returncode == 0, done.stderr
    text = report.read_text()
    assert 'id="reliability-answerable"' in text and 'id="calibration-table"' in text and 'class="diagonal"' in text
    figures = RunMetrics.model_validate_json((runs / "validation" / "metrics.json").read_text()).calibration["answerable"]
    assert f"{figures.ece_equal_width:.3f}" in text
    plain = tmp_path / "plain.html"
    assert run_cli("report", str(runs / "plain"), "--out", str(plain)).returncode == 0
    assert "reliability" not in plain.read_text()  # a run without probes: no section

    both = tmp_path / "both.html"
    done = run_cli("report", str(runs / "plain"), str(runs / "validation"), "--out", str(both))
    assert done.returncode == 0, done.stderr
    assert 'id="reliability-B-answerable"' in both.read_text() and "reliability-A-" not in both.read_text()

    done = run_cli("compare", str(runs / "plain"), str(runs / "validation"), "--json")
    assert done.returncode == 0, done.stderr
    paired = json.loads(done.stdout)["calibration"]
    assert paired["a"] is None and paired["b"]["answerable"]["n"] > 0
    done = run_cli("compare", str(runs / "plain"), str(runs / "validation"), env=WIDE)
    assert done.returncode == 0 and "calibration of the option probes" in done.stdout


def test_the_reliability_diagram_renders_in_the_browser(runs, browser, tmp_path):
    from selenium.webdriver.common.by import By

    report = tmp_path / "report.html"
    assert run_cli("report", str(runs / "validation"), "--out", str(report)).returncode == 0
    browser.get(report.as_uri())
    diagram = browser.find_element(By.CSS_SELECTOR, "#reliability-answerable svg")
    figures = RunMetrics.model_validate_json((runs / "validation" / "metrics.json").read_text()).calibration["answerable"]
    filled = [b for b in figures.reliability_equal_width if b.count]
    assert len(diagram.find_elements(By.CSS_SELECTOR, "rect.bar")) == len(diagram.find_elements(By.CSS_SELECTOR, "circle")) == len(filled)
    assert "accuracy" in diagram.text and "probability given (bin)" in diagram.text
    box = browser.execute_script(
        "const r = document.querySelector('#reliability-answerable svg').getBoundingClientRect(); "
        "return [r.left + scrollX, r.top + scrollY, r.right + scrollX, r.bottom + scrollY];"
    )
    dark, bars = ink(screenshot(browser), tuple(round(v) for v in box))
    assert dark > 200 and bars > 200  # axes and labels drawn, and bars of the bar colour
    assert not console_errors(browser)


# -- a forged file, forged scores, a preregistration of other questions (attack 25) ----------------


def fitted(runs, tmp_path, name: str = "calibration.json"):
    out = tmp_path / name
    done = run_cli("calibrate", "fit", str(runs / "validation"), "--out", str(out))
    assert done.returncode == 0, done.stderr
    return out


def forged(source, out, path: str, value) -> None:
    """The file with one value changed and its sha256 computed afresh, as a forger would."""
    content = json.loads(source.read_text())
    content.pop("sha256")
    node = content
    for key in path.split(".")[:-1]:
        node = node[key]
    node[path.split(".")[-1]] = value
    content["sha256"] = content_sha256(content)
    out.write_text(json.dumps(content))


@pytest.mark.parametrize(
    "path, value, said",
    [
        ("temperature", -1, "temperature"),
        ("temperature", float("nan"), "temperature"),
        ("temperature", float("inf"), "temperature"),
        ("temperature", 5e-324, "temperature"),  # > 0, and every probability becomes 0 or 1
        ("temperature", 0.01, "temperature"),  # below the fit's search bound: no fit gives it
        ("temperature", 1e308, "temperature"),
        ("before.ece_equal_width", float("nan"), "NaN"),  # refused as it is read: not a JSON value
        ("after.brier", 2.0, "after.brier"),
        ("after.nll", -1.0, "after.nll"),
        ("threshold.decision_accuracy", float("inf"), "Infinity"),
        ("threshold.false_abstentions", -3, "threshold.false_abstentions"),
        ("options", ["yes"], "options"),
        ("label", "answer-f1>=7", "label"),
        ("validation.episodes", 0, "validation.episodes"),
        ("bins", 0, "bins"),
        ("bins", 1_000_000, "bins"),
        ("threshold.threshold", 1.5, "threshold"),
        ("threshold.threshold", float("nan"), "threshold"),
        ("validation.split", "test", "validation.split"),
        ("validation.split", "all", "validation.split"),
    ],
)
def test_a_rehashed_file_with_values_out_of_range_is_refused(runs, tmp_path, path, value, said):
    out = tmp_path / "forged.json"
    forged(fitted(runs, tmp_path), out, path, value)
    done = run_cli("calibrate", "apply", str(runs / "test"), "--calibration", str(out))
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and said in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("bins", ["1", "1001"])
def test_fit_bins_are_bounded_like_the_preregistrations(runs, tmp_path, bins):
    done = run_cli("calibrate", "fit", str(runs / "validation"), "--bins", bins, "--out", str(tmp_path / "c.json"))
    assert done.returncode == 2 and "2 to 1000" in done.stderr and not (tmp_path / "c.json").exists()


def test_forged_scores_are_refused_and_the_file_records_what_it_was_fitted_on(runs, tmp_path):
    out = fitted(runs, tmp_path)
    validation = json.loads(out.read_text())["validation"]
    manifest = Run.load(runs / "validation").manifest
    assert validation["scores_sha256"] == file_sha256(runs / "validation" / "scores.jsonl")
    assert validation["probes_sha256"] == "1" * 64  # what with_probes recorded in the trajectories
    assert (validation["policy"], validation["model"]) == (manifest.config.policy.name, None)  # scripted: a policy without a model

    copy = tmp_path / "forged-run"
    shutil.copytree(runs / "validation", copy)
    lines = [json.loads(line) for line in (copy / "scores.jsonl").read_text().splitlines()]
    for line in lines:  # a perfect probe: exactly the label
        line["probes"][0]["probabilities"] = [1.0, 0.0] if line["answerable"] else [0.0, 1.0]
    (copy / "scores.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    done = run_cli("calibrate", "fit", str(copy), "--out", str(tmp_path / "c.json"))
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and lines[0]["episode_id"] in done.stderr, done.stderr
    assert (
        "scores.jsonl:1:" in done.stderr and "probes is" in done.stderr and "but its trajectory (trajectories.jsonl:1) gives" in done.stderr
    )
    assert not (tmp_path / "c.json").exists()


def test_apply_checks_the_preregistrations_frozen_hashes(runs, tmp_path):
    out = fitted(runs, tmp_path)
    toml = tmp_path / "prereg.toml"
    toml.write_text(
        f'[frozen]\ncorpus_sha256 = "{"0" * 64}"\nquestions_sha256 = "{"0" * 64}"\n'
        '[rule]\nmin_correct_abstentions = 0\nmax_false_abstentions = 100\n[calibration]\nprobe = "answerable"\nmax_ece = 0.9\n'
    )
    done = run_cli("calibrate", "apply", str(runs / "test"), "--calibration", str(out), "--preregistration", str(toml))
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "corpus_sha256 is pinned" in done.stderr, done.stderr


def test_an_ece_rule_of_a_probe_not_calibrated_fails_as_not_measured(runs, tmp_path):
    calibration = load_calibration(fitted(runs, tmp_path))
    found = observations(Run.load(runs / "test").scores, "answerable")
    prereg = Preregistration.model_validate(
        {
            "frozen": {"corpus_sha256": "0" * 64, "questions_sha256": "0" * 64},
            "rule": {"min_correct_abstentions": 0, "max_false_abstentions": 100},
            "calibration": {"probe": "correct", "max_ece": 1.0},
        }
    )
    result = judge_calibrated(Preregistered(prereg, tmp_path / "p.toml"), calibration, found)
    ece_line = result.checks[-1]
    assert not result.passed and not ece_line.passed and ece_line.value is None and "no episode measured probe correct" in ece_line.check


def test_a_temperature_at_the_search_bound_is_said(runs, tmp_path):
    yes = np.array([0.6, 0.6, 0.4, 0.4])
    labels = np.array([True, False, True, False])  # each probability meets both labels: it carries nothing
    temperature = fit_temperature(np.column_stack([yes, 1 - yes]), labels)
    assert at_bound(temperature) and "search bound 20" in bound_note(temperature)
    assert not at_bound(1.0) and "search bound 0.05" in bound_note(0.05)

    out = tmp_path / "bound.json"
    forged(fitted(runs, tmp_path), out, "at_bound", True)
    assert load_calibration(out).at_bound
    assert json.loads(fitted(runs, tmp_path, "again.json").read_text())["at_bound"] is False  # overconfident: T inside the bounds


def test_apply_refuses_the_fitted_run_notes_another_model_and_says_no_decided_episodes(runs, tmp_path):
    out = fitted(runs, tmp_path)
    done = run_cli("calibrate", "apply", str(runs / "validation"), "--calibration", str(out))
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "fitted on" in done.stderr

    done = run_cli("calibrate", "apply", str(runs / "test"), "--calibration", str(out), env={"COLUMNS": "80"})
    assert done.returncode == 0 and "decision right" in done.stdout and "abstained" in done.stdout
    assert not any("\u2026" in line for line in done.stdout.splitlines() if "decision" in line or "abstained" in line)
    assert all(len(line) <= 80 for line in done.stdout.splitlines())

    copy = tmp_path / "other"
    shutil.copytree(runs / "test", copy)
    another = tmp_path / "another-model.json"  # as if fitted on a model's run (the scripted policy has none)
    forged(out, another, "validation.model", "another-model")
    episodes = [json.loads(line) for line in (copy / "trajectories.jsonl").read_text().splitlines()]
    for episode in episodes:  # no episode ended by the policy's own decision
        episode["outcome"] = {"status": "step_limit", "reason": "the step limit", "evidence": []}
    (copy / "trajectories.jsonl").write_text("".join(json.dumps(episode) + "\n" for episode in episodes))
    rescored(copy, load(runs / "small.jsonl"))
    done = run_cli("calibrate", "apply", str(copy), "--calibration", str(another), env=WIDE)
    assert done.returncode == 0, done.stderr
    assert "no decided episodes" in done.stdout and "p = 1.000" not in done.stdout
    assert "fitted on a run of model another-model; this run's model is none" in done.stdout
    assert json.loads((copy / "calibrated.json").read_text())["notes"]


def test_another_run_is_decided_by_its_episodes_not_its_bytes(runs, tmp_path):
    """The validation run with a blank line added, with one episode changed (and rescored), or rerun
    on the same questions, is the run the file was fitted on: a calibration judged on the questions
    it was fitted on flatters itself."""
    out = fitted(runs, tmp_path)
    blank = tmp_path / "blank"
    shutil.copytree(runs / "validation", blank)
    (blank / "trajectories.jsonl").write_text((blank / "trajectories.jsonl").read_text() + "\n")
    assert Run.load(blank).metrics == Run.load(runs / "validation").metrics  # the same records: a readable run
    done = run_cli("calibrate", "apply", str(blank), "--calibration", str(out))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "ask its questions" in done.stderr and "apply it to a run of other questions" in done.stderr

    changed = tmp_path / "changed"
    shutil.copytree(runs / "validation", changed)
    episodes = [json.loads(line) for line in (changed / "trajectories.jsonl").read_text().splitlines()]
    episodes[0]["question_id"] = "renamed"  # its id and its answer changed; its paper and text are the validation run's
    episodes[0]["episode_id"] = "renamed:scripted"
    (changed / "trajectories.jsonl").write_text("".join(json.dumps(episode) + "\n" for episode in episodes[:1]))
    questions = tmp_path / "renamed.jsonl"
    original = next(q for q in load(runs / "small.jsonl").questions if q.text == episodes[0]["question"])
    questions.write_text(original.model_copy(update={"id": "renamed"}).model_dump_json() + "\n")
    rescored(changed, load(runs / "small.jsonl", questions))
    done = run_cli("calibrate", "apply", str(changed), "--calibration", str(out))
    assert done.returncode == 2 and "1 of the 1 episodes" in done.stderr and "ask its questions" in done.stderr, done.stderr

    assert run_cli("calibrate", "apply", str(runs / "test"), "--calibration", str(out)).returncode == 0  # other questions: another run


def test_a_file_that_records_no_questions_is_refused_rather_than_judged_by_bytes(runs, tmp_path):
    """An older file (no ``validation.questions``) has only the log's bytes to tell the run it was
    fitted on: a copy of that run with a blank line added would pass as another run."""
    out = tmp_path / "older.json"
    forged(fitted(runs, tmp_path), out, "validation.questions", None)
    content = json.loads(out.read_text())
    del content["validation"]["questions"], content["sha256"]
    content["sha256"] = content_sha256(content)
    out.write_text(json.dumps(content))
    blank = tmp_path / "blank"
    shutil.copytree(runs / "validation", blank)
    (blank / "trajectories.jsonl").write_text((blank / "trajectories.jsonl").read_text() + "\n")
    for run in (blank, runs / "test"):
        done = run_cli("calibrate", "apply", str(run), "--calibration", str(out))
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
        assert "records no questions of the run it was fitted on" in done.stderr and "fit it again" in done.stderr, done.stderr


@pytest.mark.parametrize("probabilities", [[float("nan"), float("nan")], [0.9, 0.9], [1.0]])
def test_probabilities_that_are_not_probabilities_never_reach_a_temperature_or_a_test(runs, tmp_path, probabilities):
    out = fitted(runs, tmp_path)
    for name in ("validation", "test"):
        copy = tmp_path / name
        shutil.copytree(runs / name, copy)
        (copy / "calibrated.json").unlink(missing_ok=True)  # what an earlier apply wrote there
        episodes = [json.loads(line) for line in (copy / "trajectories.jsonl").read_text().splitlines()]
        episodes[1]["probes"][0]["probabilities"] = probabilities
        (copy / "trajectories.jsonl").write_text("".join(json.dumps(episode) + "\n" for episode in episodes))
        scores = [json.loads(line) for line in (copy / "scores.jsonl").read_text().splitlines()]
        scores[1]["probes"][0]["probabilities"] = probabilities  # the copy agrees with its trajectory
        (copy / "scores.jsonl").write_text("".join(json.dumps(score) + "\n" for score in scores))
    for done in (
        run_cli("calibrate", "fit", str(tmp_path / "validation"), "--out", str(tmp_path / "c.json")),
        run_cli("calibrate", "apply", str(tmp_path / "test"), "--calibration", str(out)),
    ):
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
        if any(isinstance(p, float) and p != p for p in probabilities):  # NaN is not JSON: refused as the file is read
            assert "jsonl:2: NaN" in done.stderr, done.stderr
            continue
        assert "trajectories.jsonl:2: episode" in done.stderr and 'probe "answerable" recorded' in done.stderr
    assert not (tmp_path / "c.json").exists() and not (tmp_path / "test" / "calibrated.json").exists()


# -- the options' mass (issue 37) -----------------------------------------------------------------


def test_the_mass_is_a_figure_and_low_mass_episodes_leave_the_calibration(runs):
    metrics = RunMetrics.model_validate_json((runs / "faint" / "metrics.json").read_text())
    masses = [1e-6 if index % 3 == 0 else 0.6 for index in range(metrics.episodes)]
    mass = metrics.probe_mass["answerable"]
    assert (mass.measured, mass.min, mass.min_mass, mass.below) == (len(masses), 1e-6, 0.1, masses.count(1e-6))
    assert mass.mean == pytest.approx(sum(masses) / len(masses))
    figures = metrics.calibration["answerable"]
    assert figures.low_mass == masses.count(1e-6) and figures.n == metrics.scored - masses.count(1e-6)
    whole = RunMetrics.model_validate_json((runs / "validation" / "metrics.json").read_text())
    assert whole.probe_mass["answerable"].below == 0 and whole.calibration["answerable"].low_mass == 0
    inspected = run_cli("inspect", str(runs / "faint"), env=WIDE)
    assert inspected.returncode == 0, inspected.stderr
    line = next(line for line in inspected.stdout.splitlines() if line.startswith("probe answerable: its options held"))
    assert f"least 1e-06); {masses.count(1e-6)} of {len(masses)} episodes under the minimum 0.1 measured no belief" in line
    assert f"{masses.count(1e-6)} under the minimum mass left out" in inspected.stdout


def test_calibrate_refuses_to_fit_or_judge_on_a_probe_that_measures_no_belief(runs, tmp_path):
    out = tmp_path / "faint.json"
    done = run_cli("calibrate", "fit", str(runs / "faint"), "--out", str(out))
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and not out.exists()
    assert "options held less than 0.1 of the model's next-token distribution" in done.stderr and "measure no belief" in done.stderr
    assert "--min-mass" in done.stderr
    done = run_cli("calibrate", "fit", str(runs / "faint"), "--out", str(out), "--min-mass", "0")  # asked for: fitted on all
    assert done.returncode == 0, done.stderr
    assert load_calibration(out).min_mass == 0 and load_calibration(out).validation.episodes == Run.load(runs / "faint").metrics.scored
    good = tmp_path / "good.json"
    assert run_cli("calibrate", "fit", str(runs / "validation"), "--out", str(good)).returncode == 0
    assert load_calibration(good).min_mass == 0.1  # the run's own minimum, recorded
    judged = run_cli("calibrate", "apply", str(runs / "faint-test"), "--calibration", str(good))
    assert judged.returncode == 2 and judged.stderr.count("\n") == 1 and "will not judge a calibration" in judged.stderr
    assert not (runs / "faint-test" / "calibrated.json").exists()
    for bad in ("1.5", "-0.1", "nan"):
        refused = run_cli("calibrate", "fit", str(runs / "faint"), "--out", str(tmp_path / "x.json"), "--min-mass", bad)
        assert refused.returncode == 2 and "--min-mass" in refused.stderr and refused.stderr.count("\n") == 1, bad


def test_the_report_and_compare_show_the_mass(runs, tmp_path):
    page = tmp_path / "faint.html"
    assert run_cli("report", str(runs / "faint"), "--out", str(page)).returncode == 0
    html = page.read_text()
    below = RunMetrics.model_validate_json((runs / "faint" / "metrics.json").read_text()).probe_mass["answerable"].below
    assert "<th>options&#x27;s mass (least)</th>" in html or "<th>options&#x27; mass (least)</th>" in html
    assert f"(1e-06), {below} under 0.1</td>" in html and f"{below} under the minimum mass)" in html
    compared = run_cli("compare", str(runs / "validation"), str(runs / "faint"), "--json")
    paired = json.loads(compared.stdout)["calibration"]
    assert paired["mass_a"]["answerable"]["below"] == 0 and paired["mass_b"]["answerable"]["below"] == below
    shown = run_cli("compare", str(runs / "validation"), str(runs / "faint"), env=WIDE)
    assert "options' mass (least)" in shown.stdout and f"(1e-06), {below} under 0.1" in shown.stdout


def edited_run(runs, tmp_path, source: str, change, manifest=None):
    """A copy of run ``source`` whose trajectories ``change(index, line)`` edits as JSON (and whose
    manifest ``manifest(data)`` does), rescored as explorer eval scores it; None when the edited
    log no longer reads (rescoring refused it)."""
    from paper_explorer.agent.errors import AgentError

    copy = tmp_path / f"{source}-edited"
    shutil.copytree(runs / source, copy)
    lines = [json.loads(line) for line in (copy / "trajectories.jsonl").read_text().splitlines()]
    for index, line in enumerate(lines):
        change(index, line)
    (copy / "trajectories.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    if manifest is not None:
        data = json.loads((copy / "manifest.json").read_text())
        manifest(data)
        (copy / "manifest.json").write_text(json.dumps(data))
    try:
        rescored(copy, load(runs / "small.jsonl"))
    except AgentError:
        pass  # the edited log no longer reads: every command that reads it says so in one line
    return copy


@pytest.mark.parametrize(
    "field, value, said",
    [
        ("mass", 5.0, "less than or equal to 1"),
        ("mass", -1.0, "greater than or equal to 0"),
        ("mass", 1e308, "less than or equal to 1"),  # was an OverflowError in the mass's mean
        ("mass", "0.5", "valid number"),
        ("mass", True, "valid number"),
        ("mass", 0.6, "its mass 0.6 is not the"),  # raised above the minimum, its log-probabilities left as they were
        ("probabilities", [0.5, 0.5], "are not the"),
        ("logprobs", ["-0.1", -3.0], "valid number"),
    ],
)
def test_a_forged_mass_is_refused_in_one_line(runs, tmp_path, field, value, said):
    copy = edited_run(runs, tmp_path, "faint", lambda index, line: line["probes"][0].update({field: value}) if index == 0 else None)
    for done in (run_cli("inspect", str(copy)), run_cli("calibrate", "fit", str(copy), "--out", str(tmp_path / "c.json"))):
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
        assert "trajectories.jsonl:1" in done.stderr and said in done.stderr, done.stderr
    assert not (tmp_path / "c.json").exists()


def test_a_minimum_mass_edited_in_the_log_or_the_manifest_alone_is_refused(runs, tmp_path):
    def lowered(index, line):
        line["config"]["probe_min_mass"] = 0.0

    def raised(data):
        data["config"]["episode"]["probe_min_mass"] = 0.5

    for copy in (
        edited_run(runs, tmp_path / "one", "faint", lambda index, line: lowered(index, line) if index == 0 else None),
        edited_run(runs, tmp_path / "all", "faint", lowered),  # every line, the manifest left: the faint episodes would be fitted
        edited_run(runs, tmp_path / "manifest", "faint", lambda index, line: None, raised),
    ):
        done = run_cli("calibrate", "fit", str(copy), "--out", str(tmp_path / "c.json"), "--min-mass", "0")
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
        assert "trajectories.jsonl:1: episode" in done.stderr and "episode settings differ from the run's (probe_min_mass)" in done.stderr


def test_apply_holds_a_run_to_the_minimum_the_calibration_was_fitted_at(runs, tmp_path):
    out = tmp_path / "strict.json"
    assert run_cli("calibrate", "fit", str(runs / "validation"), "--out", str(out), "--min-mass", "0.8").returncode == 0
    assert load_calibration(out).min_mass == 0.8
    middling = edited_run(runs, tmp_path, "test", lambda index, line: None)
    with_probes(middling, load(runs / "small.jsonl"), seed=1, mass=lambda index: 0.6)  # above the run's 0.1, under the fit's 0.8
    done = run_cli("calibrate", "apply", str(middling), "--calibration", str(out))
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "held less than 0.8" in done.stderr, done.stderr
    assert run_cli("calibrate", "apply", str(middling), "--calibration", str(out), "--min-mass", "0.5").returncode == 0


def test_a_calibration_rule_on_a_probe_whose_every_episode_held_too_little_fails_its_check(runs, tmp_path):
    run = Run.load(runs / "faint-test")  # every episode's options held 2e-6
    assert run.metrics.calibration is None and run.metrics.probe_mass["answerable"].below == run.metrics.probe_mass["answerable"].measured
    prereg = Preregistration.model_validate(
        {
            "frozen": {"corpus_sha256": "0" * 64, "questions_sha256": "0" * 64},
            "rule": {"min_correct_abstentions": 0, "max_false_abstentions": 100},
            "calibration": {"max_ece": 0.5},
        }
    )
    result = judge(prereg, tmp_path / "p.toml", run.metrics.abstention, run.scores)
    assert not result.passed and result.checks[-1].value is None
    assert f"{run.metrics.probe_mass['answerable'].below} held less than the minimum mass" in result.checks[-1].check
    page = tmp_path / "faint.html"
    assert run_cli("report", str(runs / "faint-test"), "--out", str(page)).returncode == 0
    assert "0 (no episode held the minimum mass)" in page.read_text()


def test_compare_notes_a_probe_asked_from_another_file_or_held_to_another_minimum(runs, tmp_path):
    from paper_explorer.evaluation.compare import compare_runs

    def reworded(index, line):
        line["probes"][0]["probes_sha256"] = "2" * 64
        line["config"].update({"probe_min_mass": 0.3, "probes_file": "/elsewhere/probes.toml"})

    def recorded(data):
        data["config"]["episode"].update({"probe_min_mass": 0.3, "probes_file": "/elsewhere/probes.toml"})

    other = edited_run(runs, tmp_path, "validation", reworded, recorded)
    result = compare_runs(Run.load(runs / "validation"), Run.load(other))
    assert result.setting_differs == []  # the probes change no episode: no confound of the paired figures
    notes = result.calibration.notes
    assert len(notes) == 2 and "other probes files (A 111111111111; B 222222222222)" in notes[0] and "(A 0.1, B 0.3)" in notes[1]
    shown = run_cli("compare", str(runs / "validation"), str(other), env=WIDE)
    assert shown.returncode == 0 and "note: probe answerable was asked from other probes files" in shown.stdout
    assert compare_runs(Run.load(runs / "validation"), Run.load(runs / "validation")).calibration.notes == []


def test_a_resume_refuses_a_probes_file_changed_since_the_run_started(runs, tmp_path):
    from paper_explorer.agent.config import EvalConfig
    from paper_explorer.agent.trajectory import EpisodeConfig
    from paper_explorer.evaluation.errors import EvaluationError
    from paper_explorer.evaluation.run import _refuse_other_probes

    logged = Run.load(runs / "validation").trajectories  # their probes were asked from a file of SHA-256 111...
    mine = tmp_path / "probes.toml"
    mine.write_text('[answerable]\ntext = "Can it be answered?"\noptions = ["yes", "no"]\n')
    config = EvalConfig(episode=EpisodeConfig(probes=["answerable"], probes_file=mine))
    with pytest.raises(EvaluationError, match=r"refusing to resume: episode .* SHA-256 111111111111, and .*probes.toml is"):
        _refuse_other_probes(tmp_path, config, logged)
    _refuse_other_probes(tmp_path, config, [])  # nothing logged yet: nothing to agree with
    _refuse_other_probes(tmp_path, EvalConfig(), logged)  # no probes asked now


def test_an_edited_probe_mass_in_metrics_json_is_refused(runs, tmp_path):
    copy = tmp_path / "faint"
    shutil.copytree(runs / "faint", copy)
    metrics = json.loads((copy / "metrics.json").read_text())
    metrics["probe_mass"]["answerable"]["below"] = 0  # "no episode under the minimum"
    (copy / "metrics.json").write_text(json.dumps(metrics))
    done = run_cli("inspect", str(copy))
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "metrics.json: probe_mass is" in done.stderr, done.stderr


def test_calibrate_refuses_a_probe_asked_from_two_probes_files(runs, tmp_path):
    """A probes file changed mid-run (each episode reads it) or between shards: two wordings under one name."""
    mixed = edited_run(
        runs, tmp_path, "validation", lambda index, line: line["probes"][0].update({"probes_sha256": "2" * 64}) if index else None
    )
    done = run_cli("calibrate", "fit", str(mixed), "--out", str(tmp_path / "c.json"))
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and not (tmp_path / "c.json").exists(), done.stderr
    assert "was asked from 2 probes files" in done.stderr and "SHA-256 111111111111" in done.stderr and "222222222222" in done.stderr
