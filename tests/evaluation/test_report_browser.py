"""The HTML reports in a real browser: headless Chromium renders the one-run report and the two-run
comparison, a user clicks an episode and a question and reads the gold answers beside the
prediction, a screenshot has ink where the plots are, and model-written markup in an action and an
answer stays text. Without Chromium the browser tests are skipped with the reason, except under
CI=true, where a missing browser is a failure."""

import io
import json
import os
import shutil

import numpy as np
import pytest

from tests.conftest import run_cli

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
CHROMEDRIVER = shutil.which("chromedriver")
# What a hostile policy writes: it would close the page's own elements and run script if it were markup.
HOSTILE = "</div></td></section><script>document.title='pwned'</script><img src=x onerror=\"document.title='pwned'\">"


def hostile_recording(recorded, out):
    """The first episode of a recording, its action rewritten to comment and submit markup; the rest as recorded."""
    lines = recorded.read_text().splitlines()
    first = json.loads(lines[0])
    first["steps"] = first["steps"][:1]
    first["steps"][0]["action_text"] = f"```python\n# {HOSTILE}\nsubmit({HOSTILE!r}, evidence=[])\n```"
    out.write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    return first["question_id"]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    directory = tmp_path_factory.mktemp("report")
    corpus = directory / "small.jsonl"
    assert run_cli("corpus", "generate", "--papers", "30", "--seed", "5", "--out", str(corpus)).returncode == 0
    for policy in ("direct-submit", "scripted"):
        done = run_cli(
            "eval", "--corpus", str(corpus), "--split", "all", "--limit", "12", "--policy", policy, "--out", str(directory / policy)
        )
        assert done.returncode == 0, done.stderr
    hostile_question = hostile_recording(directory / "direct-submit" / "trajectories.jsonl", directory / "hostile.jsonl")
    done = run_cli(
        "eval",
        "--corpus",
        str(corpus),
        "--split",
        "all",
        "--policy",
        "replay",
        "--replay",
        str(directory / "hostile.jsonl"),
        "--out",
        str(directory / "hostile"),
    )
    assert done.returncode == 0, done.stderr
    for *runs, out in (
        ["direct-submit", "report.html"],
        ["direct-submit", "scripted", "compare.html"],
        ["hostile", "hostile.html"],
        ["hostile", "scripted", "hostile-compare.html"],
    ):
        done = run_cli("report", *(str(directory / run) for run in runs), "--out", str(directory / out))
        assert done.returncode == 0, done.stderr
    return directory, hostile_question


def test_the_reports_are_self_contained_files(report):
    directory, _ = report
    for name in ("report.html", "compare.html"):
        text = (directory / name).read_text()
        assert "http://" not in text and "https://" not in text and "<link" not in text and "src=" not in text  # nothing fetched
    text = (directory / "report.html").read_text()
    assert "shortcut collapse" in text
    scores = [json.loads(line) for line in (directory / "direct-submit" / "scores.jsonl").read_text().splitlines()]
    assert all(f'"episode_id": "{s["episode_id"]}"' in text for s in scores)


@pytest.fixture(scope="module")
def browser():
    if not (CHROMIUM and CHROMEDRIVER):
        reason = "Chromium or chromedriver is not installed (apt-get install chromium chromium-driver)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but {reason}")
        pytest.skip(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1400,1000",
        "--force-device-scale-factor=1",
    ):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


def console_errors(browser) -> list:
    return [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]


def wait_for(browser, selector: str):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    # a bound on a hang, not a timing: the page renders from inline data with no network
    return WebDriverWait(browser, 120).until(expected_conditions.presence_of_element_located((By.CSS_SELECTOR, selector)))


def screenshot(browser):
    """The whole page as an RGB image: the window made as tall as the page first."""
    from PIL import Image

    height = browser.execute_script("return document.documentElement.scrollHeight")
    browser.set_window_size(1400, height + 200)
    try:
        image = Image.open(io.BytesIO(browser.get_screenshot_as_png())).convert("RGB")
    finally:
        browser.set_window_size(1400, 1000)
    return image


BAR = (0x4A, 0x78, 0xC2)  # svg .bar's fill


def ink(image, box) -> tuple[int, int]:
    """Pixels inside ``box`` (left, top, right, bottom) that are dark (text, axes), and that are bar-coloured."""
    pixels = np.asarray(image.crop(box), dtype=int)
    dark = int((pixels.sum(axis=2) < 300).sum())
    bars = int((np.abs(pixels - BAR).max(axis=2) < 12).sum())
    return dark, bars


def plot_boxes(browser) -> list[tuple[int, int, int, int]]:
    rectangles = browser.execute_script(
        "return [...document.querySelectorAll('#plots figure svg')].map(s => { const r = s.getBoundingClientRect(); "
        "return [r.left + scrollX, r.top + scrollY, r.right + scrollX, r.bottom + scrollY]; })"
    )
    return [tuple(round(v) for v in rectangle) for rectangle in rectangles]


def test_the_report_lists_episodes_opens_one_beside_its_gold_and_plots_with_axes(report, browser, tmp_path):
    from selenium.webdriver.common.by import By

    directory, _ = report
    browser.get((directory / "report.html").as_uri())
    rows = browser.find_elements(By.CSS_SELECTOR, "#episodes tbody tr")
    assert len(rows) == 12
    assert "shortcut collapse" in browser.find_element(By.ID, "verdict").text
    scores = [json.loads(line) for line in (directory / "direct-submit" / "scores.jsonl").read_text().splitlines()]
    first = scores[0]
    cells = [cell.text for cell in rows[0].find_elements(By.TAG_NAME, "td")]
    assert cells[:4] == [first["episode_id"], first["question"], first["status"], f"{first['answer_f1']:.2f}"]
    # every plot has a title, both axes labelled, ticks, and the count above or beside each bar
    plots = browser.find_elements(By.CSS_SELECTOR, "#plots figure svg")
    assert len(plots) == 5
    steps = plots[0]
    assert steps.find_element(By.CSS_SELECTOR, ".title").text == "steps per episode"
    assert [label.text for label in steps.find_elements(By.CSS_SELECTOR, ".axis-label")] == ["steps", "episodes"]
    assert [count.text for count in steps.find_elements(By.CSS_SELECTOR, ".count")] == ["12"]  # direct-submit: one step each
    assert {"0", "5", "10"} <= {tick.text for tick in steps.find_elements(By.CSS_SELECTOR, ".tick")}
    detectors = plots[3].find_elements(By.CSS_SELECTOR, ".count")
    assert "12 (100%)" in [count.text for count in detectors]  # direct_submit flags every episode

    rows[0].click()
    wait_for(browser, "#detail .step")
    gold = browser.find_element(By.CSS_SELECTOR, "#detail .gold").text
    prediction = browser.find_element(By.CSS_SELECTOR, "#detail .prediction").text
    from paper_explorer.corpus.loading import load

    question = next(q for q in load(directory / "small.jsonl").questions if q.id == first["question_id"])
    references = [answer.reference_text for answer in question.answers]
    assert references and all(reference in gold for reference in references)
    assert all(evidence.split()[0] in gold for answer in question.answers for evidence in answer.evidence)
    assert first["prediction"] in prediction and f"F1 {first['answer_f1']:.2f}" in prediction and "no paragraph cited" in prediction
    detail = browser.find_element(By.ID, "detail").text
    assert first["episode_id"] in detail and first["question"] in detail and "submit(" in detail and "direct_submit" in detail

    image = screenshot(browser)
    image.save(tmp_path / "report.png")  # kept for a person to look at when the test fails
    assert len(np.unique(np.asarray(image)[::3, ::3].reshape(-1, 3), axis=0)) > 50  # not a blank or flat page
    for box in plot_boxes(browser):
        dark, bars = ink(image, box)
        assert dark > 200, f"no axes or labels drawn in the plot at {box}"
    assert all(bars > 100 for _, bars in (ink(image, box) for box in plot_boxes(browser)[:3]))  # the three histograms have bars
    detail_box = browser.execute_script(
        "const r = document.getElementById('detail').getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom];"
    )
    assert ink(image, tuple(round(v) for v in detail_box))[0] > 1000  # the open episode is drawn, not only in the DOM

    browser.find_element(By.CSS_SELECTOR, "#flag-filter option[value='direct_submit']").click()
    assert len(browser.find_elements(By.CSS_SELECTOR, "#episodes tbody tr")) == 12
    assert console_errors(browser) == []


def test_the_comparison_shows_what_changed_with_the_statistics_of_compare(report, browser, tmp_path):
    from selenium.webdriver.common.by import By

    directory, _ = report
    compared = run_cli("compare", str(directory / "direct-submit"), str(directory / "scripted"), "--json")
    assert compared.returncode == 0, compared.stderr
    comparison = json.loads(compared.stdout)
    browser.get((directory / "compare.html").as_uri())
    figures = browser.find_element(By.ID, "figures").text
    ci = comparison["answer_f1"]["paired_difference_ci95"]
    assert f"{comparison['answer_f1']['a']:.3f}" in figures and f"{comparison['answer_f1']['b']:.3f}" in figures
    assert f"{ci['mean']:+.3f}" in figures and f"{ci['low']:+.3f} to {ci['high']:+.3f}" in figures
    mcnemar = browser.find_element(By.ID, "mcnemar").text
    test = next(test for test in comparison["mcnemar_answers"] if test["outcome"] == "exact match")
    assert f"exact match {test['pairs']} {test['both']} {test['only_a']} {test['only_b']} {test['neither']}" in mcnemar
    moved = comparison["largest_differences"]
    assert moved, "the scripted policy answers questions direct-submit gets wrong"
    rows = browser.find_elements(By.CSS_SELECTOR, "#questions tbody tr")
    assert len(rows) >= len(moved) and rows[0].get_attribute("data-question") == moved[0]["question_id"]
    change = moved[0]["f1_b"] - moved[0]["f1_a"]
    assert rows[0].find_elements(By.TAG_NAME, "td")[-1].text == f"{change:+.2f}"
    summary = browser.find_element(By.ID, "summary").text
    assert f"{comparison['paired_questions']} paired questions" in summary
    # unticking the filter lists the unchanged questions too
    browser.find_element(By.ID, "changed-only").click()
    assert len(browser.find_elements(By.CSS_SELECTOR, "#questions tbody tr")) == comparison["paired_questions"]

    browser.find_element(By.CSS_SELECTOR, f"#questions tbody tr[data-question='{moved[0]['question_id']}']").click()
    wait_for(browser, "#detail .prediction")
    predictions = [box.text for box in browser.find_elements(By.CSS_SELECTOR, "#detail .prediction")]
    assert len(predictions) == 2 and moved[0]["a"] in predictions[0] and moved[0]["b"] in predictions[1]
    assert "cited paragraphs:" in predictions[1] or "no paragraph cited" in predictions[1]
    assert (
        moved[0]["question"] in browser.find_element(By.ID, "detail").text and browser.find_element(By.CSS_SELECTOR, "#detail .gold").text
    )

    image = screenshot(browser)
    image.save(tmp_path / "compare.png")
    boxes = plot_boxes(browser)
    assert len(boxes) == 2
    for box in boxes:
        dark, bars = ink(image, box)
        assert dark > 200 and bars > 100, f"the plot at {box} is not drawn"
    assert console_errors(browser) == []


def test_model_written_markup_stays_text(report, browser):
    """An action and an answer that are HTML are shown as text in both reports, never run, and break nothing."""
    from selenium.webdriver.common.by import By

    directory, question_id = report
    scores = [json.loads(line) for line in (directory / "hostile" / "scores.jsonl").read_text().splitlines()]
    episode = next(s for s in scores if s["question_id"] == question_id)
    assert episode["prediction"] == HOSTILE  # the run really submitted it
    browser.get((directory / "hostile.html").as_uri() + "#episode=" + episode["episode_id"])
    wait_for(browser, "#detail .step")
    assert browser.title != "pwned" and not browser.find_elements(By.CSS_SELECTOR, "main img, #detail script")
    assert HOSTILE in browser.find_element(By.CSS_SELECTOR, "#detail .prediction").text
    assert f"# {HOSTILE}" in browser.find_element(By.CSS_SELECTOR, "#detail .step pre").text
    assert len(browser.find_elements(By.CSS_SELECTOR, "#episodes tbody tr")) == len(scores)
    assert len(browser.find_elements(By.CSS_SELECTOR, "main > section")) == 2  # no element was closed early

    browser.get((directory / "hostile-compare.html").as_uri() + "#question=" + question_id)
    wait_for(browser, "#detail .step")
    assert browser.title != "pwned" and not browser.find_elements(By.CSS_SELECTOR, "main img, #detail script")
    row = browser.find_element(By.CSS_SELECTOR, f"#questions tbody tr[data-question='{question_id}']")
    assert row.find_elements(By.TAG_NAME, "td")[1].get_attribute("textContent") == HOSTILE
    assert HOSTILE in browser.find_elements(By.CSS_SELECTOR, "#detail .prediction")[0].text
    assert len(browser.find_elements(By.CSS_SELECTOR, "main > section")) == 2
    assert console_errors(browser) == []


def test_a_hostile_question_stays_text(report, browser, tmp_path):
    """Question text comes from a corpus, which may be hostile too (a "<!--" would swallow the page's own script)."""
    from selenium.webdriver.common.by import By

    from paper_explorer.corpus.loading import load
    from paper_explorer.evaluation.report import write_report
    from paper_explorer.evaluation.run_directory import Run

    directory, _ = report
    run = Run.load(directory / "scripted")
    run.scores[0] = run.scores[0].model_copy(update={"question": HOSTILE})
    run.scores[1] = run.scores[1].model_copy(update={"question": "<!--<script>"})
    out = write_report(run, load(directory / "small.jsonl"), tmp_path / "hostile.html")
    browser.get(out.as_uri() + "#episode=" + run.scores[0].episode_id)
    wait_for(browser, "#detail .step")
    assert browser.title != "pwned" and HOSTILE in browser.find_element(By.ID, "detail").text
    assert len(browser.find_elements(By.CSS_SELECTOR, "#episodes tbody tr")) == len(run.scores)
    assert console_errors(browser) == []
