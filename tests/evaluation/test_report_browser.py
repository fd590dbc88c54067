"""The HTML report in a real browser: headless Chromium renders it, the episode list is there,
one episode opens, and the console stays free of errors. Without Chromium the test is skipped
with the reason, except under CI=true, where a missing browser is a failure."""

import json
import os
import shutil

import pytest

from tests.conftest import run_cli

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
CHROMEDRIVER = shutil.which("chromedriver")


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    directory = tmp_path_factory.mktemp("report")
    corpus = directory / "small.jsonl"
    assert run_cli("corpus", "generate", "--papers", "30", "--seed", "5", "--out", str(corpus)).returncode == 0
    for policy in ("direct-submit", "scripted"):
        done = run_cli("eval", "--corpus", str(corpus), "--split", "all", "--limit", "12", "--policy", policy, "--out", str(directory / policy))
        assert done.returncode == 0, done.stderr
    done = run_cli("report", str(directory / "direct-submit"), "-o", str(directory / "report.html"))
    assert done.returncode == 0, done.stderr
    return directory


def test_the_report_is_one_self_contained_file(report):
    text = (report / "report.html").read_text()
    assert "http://" not in text and "https://" not in text and "<link" not in text  # nothing fetched
    assert "shortcut collapse" in text
    scores = [json.loads(line) for line in (report / "direct-submit" / "scores.jsonl").read_text().splitlines()]
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
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


def test_the_report_renders_lists_episodes_and_opens_one(report, browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get((report / "report.html").as_uri())
    rows = browser.find_elements(By.CSS_SELECTOR, "#episodes tbody tr")
    assert len(rows) == 12
    assert "shortcut collapse" in browser.find_element(By.ID, "verdict").text
    assert len(browser.find_elements(By.CSS_SELECTOR, "figure svg")) == 4
    rows[0].click()
    WebDriverWait(browser, 10).until(expected_conditions.presence_of_element_located((By.CSS_SELECTOR, "#detail .step")))
    detail = browser.find_element(By.ID, "detail").text
    assert rows[0].get_attribute("data-episode") in detail and "submit(" in detail and "direct_submit" in detail
    # filtering by a flag keeps only the flagged episodes
    browser.find_element(By.CSS_SELECTOR, "#flag-filter option[value='direct_submit']").click()
    assert len(browser.find_elements(By.CSS_SELECTOR, "#episodes tbody tr")) == 12
    errors = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
    assert errors == []
    assert browser.save_screenshot(str(tmp_path / "report.png")) and (tmp_path / "report.png").stat().st_size > 10_000


def test_model_text_cannot_inject_markup(report, browser, tmp_path):
    """An action that writes HTML is shown as text, never run."""
    from selenium.webdriver.common.by import By

    from evaluation.report import write_report
    from evaluation.summary import load_run

    run = load_run(report / "scripted")
    run.scores[0] = run.scores[0].model_copy(update={"question": "<img src=x onerror=\"document.title='pwned'\"><script>document.title='pwned'</script>"})
    run.scores[1] = run.scores[1].model_copy(update={"question": "<!--<script>"})  # would swallow the page's own script if only "</" were escaped
    out = write_report(run, tmp_path / "hostile.html")
    browser.get(out.as_uri() + "#episode=" + run.scores[0].episode_id)
    assert browser.title != "pwned" and "<img src=x" in browser.find_element(By.ID, "detail").text
    assert len(browser.find_elements(By.CSS_SELECTOR, "#episodes tbody tr")) == len(run.scores)
