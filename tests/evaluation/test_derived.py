"""A run's derived files (scores.jsonl, metrics.json) are checked against the trajectories they
came from (``evaluation.derived``): every command that reads them refuses a run whose files
disagree in one line (file, line, field, and the command that writes them again), exit 2, and
accepts what changes bytes but not records (blank lines, spacing).

Each attack starts from a copy of a real run; "a forger" rewrites metrics.json and its digests to
agree with what it edited, as someone who read this module would."""

from __future__ import annotations

import json
import math
import re
import shutil

import pytest

from paper_explorer.evaluation.errors import EvaluationError
from paper_explorer.evaluation.run import load_corpus
from paper_explorer.evaluation.run_directory import Run
from tests.conftest import run_cli


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """On the bundled demo corpus: "scripted" (it searches and reads) and "direct" (it answers at once)."""
    directory = tmp_path_factory.mktemp("derived")
    for name, policy in (("scripted", "scripted"), ("direct", "direct-submit")):
        done = run_cli("eval", "--split", "all", "--limit", "12", "--policy", policy, "--out", str(directory / name))
        assert done.returncode == 0, done.stderr
    return directory


def copy_of(runs, tmp_path, name="direct"):
    copy = tmp_path / "copy"
    shutil.copytree(runs / name, copy)
    return copy


def lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write(path, records) -> None:
    path.write_text("".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records))


def forge_metrics(run) -> None:
    """metrics.json recomputed from the run's (edited) files, digests included, as a forger would."""
    from paper_explorer.evaluation import derived
    from paper_explorer.evaluation.run_directory import read_scores

    loaded = Run.load(run, check=False)
    trajectories = loaded.trajectories
    numbered = read_scores(run / "scores.jsonl")
    scores = [score for _, score in numbered]
    log_lines = sum(1 for line in (run / "trajectories.jsonl").read_text().splitlines() if line.strip())
    metrics = derived.recomputed(scores, trajectories, log_lines).model_copy(
        update={
            "retrieval": loaded.metrics.retrieval,
            "preregistration": loaded.metrics.preregistration,
            "derived_from": derived.derived_from(trajectories, scores),
        }
    )
    (run / "metrics.json").write_text(metrics.to_json())


def refused(run, tmp_path, *said) -> None:
    """Every reader of the run refuses it in one line that says ``said``; Run.load too."""
    for words in (
        ["inspect", str(run)],
        ["compare", str(run), str(run)],
        ["report", str(run), "--out", str(tmp_path / "report.html")],
        ["export", str(run), str(tmp_path / "export.json"), "--to", "inspect"],
    ):
        done = run_cli(*words)
        assert done.returncode == 2, (words, done.stdout, done.stderr)
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
        assert all(part in done.stderr for part in said), done.stderr
        assert f"explorer eval --out {run} --resume" in done.stderr, done.stderr
    with pytest.raises(EvaluationError) as error:
        Run.load(run)
    assert all(part in str(error.value) for part in said)


# -- scores.jsonl -------------------------------------------------------------------------------


def test_scores_edited_to_a_perfect_run_without_shortcuts_are_refused(runs, tmp_path):
    """The issue's case: F1 1.000 and no direct submit in scores.jsonl, 0.000 and 100% in the trajectories and metrics."""
    copy = copy_of(runs, tmp_path)
    scores = lines(copy / "scores.jsonl")
    for score in scores:
        score["flags"] = [flag for flag in score["flags"] if flag["detector"] not in ("direct_submit", "no_tool_use")]
        score.update(answer_f1=1.0, exact_match=1.0, tool_calls_before_end=2)
    write(copy / "scores.jsonl", scores)
    refused(copy, tmp_path, f"{copy}/scores.jsonl:1: episode {scores[0]['episode_id']}", "but its trajectory (trajectories.jsonl:1) gives")
    forge_metrics(copy)  # metrics and digests made to agree: the trajectories still disagree
    refused(copy, tmp_path, f"{copy}/scores.jsonl:1:")


@pytest.mark.parametrize("field", ["flags", "status", "prediction", "steps", "tool_calls"])
def test_any_field_the_trajectory_decides_is_checked_even_with_metrics_forged_to_agree(runs, tmp_path, field):
    copy = copy_of(runs, tmp_path, "scripted")
    scores = lines(copy / "scores.jsonl")
    forged = {"flags": [{"detector": "direct_submit", "step": 0, "text": "x"}], "status": "abstained", "prediction": "42", "steps": 1}
    scores[3][field] = forged[field] if field in forged else scores[3][field] + 7
    write(copy / "scores.jsonl", scores)
    forge_metrics(copy)
    refused(copy, tmp_path, f"scores.jsonl:4: episode {scores[3]['episode_id']}'s {field}")


def test_gold_fields_edited_with_metrics_and_digests_forged_are_refused_where_the_corpus_is_at_hand(runs, tmp_path):
    copy = copy_of(runs, tmp_path, "scripted")
    scores = lines(copy / "scores.jsonl")
    wrong = next(index for index, score in enumerate(scores) if score["answer_f1"] < 1)
    scores[wrong]["answer_f1"] = 1.0
    write(copy / "scores.jsonl", scores)
    forge_metrics(copy)
    done = run_cli("report", str(copy), "--out", str(tmp_path / "r.html"))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert (
        f"episode {scores[wrong]['episode_id']}" in done.stderr
        and "answer_f1 is 1.0, but its trajectory and gold question give" in done.stderr
    )


def test_a_swap_that_keeps_every_figure_is_refused_by_the_digest(runs, tmp_path):
    """Two lines' gold fields exchanged: the means are the same; which question scored what is not."""
    copy = copy_of(runs, tmp_path, "scripted")
    scores = lines(copy / "scores.jsonl")
    first, second = next((i, j) for i in range(len(scores)) for j in range(i) if scores[i]["answer_f1"] != scores[j]["answer_f1"])
    gold = ("answer_f1", "exact_match", "sub_exact_match", "sub_exact_match_substring")
    for name in gold:
        scores[first][name], scores[second][name] = scores[second][name], scores[first][name]
    write(copy / "scores.jsonl", scores)
    refused(copy, tmp_path, "scores.jsonl: is not the file metrics.json was computed with")


def test_reordered_repeated_or_missing_lines_are_refused(runs, tmp_path):
    copy = copy_of(runs, tmp_path, "scripted")
    scores = lines(copy / "scores.jsonl")
    write(copy / "scores.jsonl", [scores[1], scores[0], *scores[2:]])
    refused(copy, tmp_path, f"scores.jsonl:1: episode {scores[1]['episode_id']} is out of the log's order")
    write(copy / "scores.jsonl", scores[:-1])
    refused(copy, tmp_path, f"scores.jsonl: holds no line for episode {scores[-1]['episode_id']}")
    write(copy / "scores.jsonl", [*scores, scores[0]])
    refused(copy, tmp_path, f"scores.jsonl:{len(scores) + 1}: episode {scores[0]['episode_id']} is scored again")

    shutil.rmtree(copy)
    copy = copy_of(runs, tmp_path, "scripted")
    episodes = (copy / "trajectories.jsonl").read_text().splitlines(keepends=True)
    (copy / "trajectories.jsonl").write_text("".join([episodes[1], episodes[0], *episodes[2:]]))
    refused(copy, tmp_path, "scores.jsonl:1: episode", "is out of the log's order")


def test_blank_lines_and_spacing_change_bytes_not_records(runs, tmp_path):
    copy = copy_of(runs, tmp_path, "scripted")
    scores = lines(copy / "scores.jsonl")
    (copy / "scores.jsonl").write_text(
        "\n" + "\n\n".join(json.dumps(score, indent=None, separators=(", ", ": ")) for score in scores) + "\n\n"
    )
    episodes = lines(copy / "trajectories.jsonl")
    (copy / "trajectories.jsonl").write_text("\n".join(json.dumps(episode, sort_keys=True) for episode in episodes) + "\n\n\n")
    assert Run.load(copy).metrics == Run.load(runs / "scripted").metrics
    done = run_cli("compare", str(runs / "scripted"), str(copy))
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    "value, said",
    [
        ("NaN", "scores.jsonl:3: NaN, which JSON does not have"),  # refused as the line is read
        ("Infinity", "scores.jsonl:3: Infinity, which JSON does not have"),
        ("1e400", "scores.jsonl:3: the number 1e400 (not a finite number)"),
        ("-0.5", "scores.jsonl:3: not an episode score: field 'answer_f1'"),
        ("1.5", "scores.jsonl:3: not an episode score: field 'answer_f1'"),
        ("5e-324", "scores.jsonl: is not the file metrics.json was computed with"),  # a share, but not the one computed
    ],
)
def test_a_score_that_is_not_a_share_or_not_the_one_computed_is_refused(runs, tmp_path, value, said):
    copy = copy_of(runs, tmp_path, "scripted")
    text = (copy / "scores.jsonl").read_text().splitlines()
    text[2] = re.sub(r'"answer_f1":[^,}]+', f'"answer_f1":{value}', text[2])
    (copy / "scores.jsonl").write_text("\n".join(text) + "\n")
    refused(copy, tmp_path, said)


# -- metrics.json -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, value",
    [
        ("answer_f1", 1.0),
        ("episodes", 10**20),
        ("detector_rates", {"direct_submit": 0.0}),
        ("verdict", {"verdict": "no shortcut collapse", "direct_submit_rate": 0.0, "threshold": 0.5}),
        ("status", {"submitted": 1}),
        ("mean_steps", float("nan")),
        ("duplicate_lines", 3),
    ],
)
def test_an_edited_figure_of_metrics_json_is_refused(runs, tmp_path, name, value):
    copy = copy_of(runs, tmp_path)
    metrics = json.loads((copy / "metrics.json").read_text())
    metrics[name] = value
    (copy / "metrics.json").write_text(json.dumps(metrics))
    refused(copy, tmp_path, f"metrics.json: {name} is", "but scores.jsonl and trajectories.jsonl give")


@pytest.mark.parametrize("value", [1.5, -1, float("nan"), "x"])
def test_a_retrieval_figure_out_of_range_is_refused(runs, tmp_path, value):
    copy = copy_of(runs, tmp_path)
    metrics = json.loads((copy / "metrics.json").read_text())
    metrics["retrieval"]["recall@5"] = value
    (copy / "metrics.json").write_text(json.dumps(metrics))
    done = run_cli("inspect", str(copy))
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "metrics.json" in done.stderr and "recall@5" in done.stderr, (
        done.stderr
    )


def test_a_metrics_json_without_its_digest_is_refused_and_eval_resume_writes_it_again(runs, tmp_path):
    copy = copy_of(runs, tmp_path)
    metrics = json.loads((copy / "metrics.json").read_text())
    metrics.pop("derived_from")
    (copy / "metrics.json").write_text(json.dumps(metrics))
    refused(copy, tmp_path, "metrics.json: records no digest")
    done = run_cli("eval", "--out", str(copy), "--resume")
    assert done.returncode == 0, done.stderr
    assert Run.load(copy).metrics == Run.load(runs / "direct").metrics
    assert run_cli("compare", str(runs / "scripted"), str(copy)).returncode == 0


def test_a_forged_preregistration_verdict_is_refused(tmp_path):
    prereg = tmp_path / "prereg.toml"
    made = run_cli(
        "preregister",
        "--split",
        "all",
        "--limit",
        "6",
        "--min-correct-abstentions",
        "99",
        "--max-false-abstentions",
        "0",
        "--out",
        str(prereg),
    )
    assert made.returncode == 0, made.stderr
    run = tmp_path / "run"
    done = run_cli("eval", "--split", "all", "--limit", "6", "--preregistration", str(prereg), "--out", str(run))
    metrics = json.loads((run / "metrics.json").read_text())
    result = metrics["preregistration"]
    assert done.returncode == 1 and result["pass"] is False, done.stderr
    for check in result["checks"]:
        check["pass"] = True
    result["pass"] = True
    (run / "metrics.json").write_text(json.dumps(metrics))
    done = run_cli("inspect", str(run))
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "the preregistration check" in done.stderr, done.stderr


# -- the trajectories changed after scoring -----------------------------------------------------


def test_a_copied_run_with_one_episode_changed_is_refused(runs, tmp_path):
    copy = copy_of(runs, tmp_path)
    episodes = lines(copy / "trajectories.jsonl")
    episodes[5]["outcome"]["answer"] = "a better answer"
    write(copy / "trajectories.jsonl", episodes)
    refused(copy, tmp_path, f"scores.jsonl:6: episode {episodes[5]['episode_id']}'s prediction")

    episodes = lines(runs / "direct" / "trajectories.jsonl")  # what no line of scores.jsonl shows: the prompt it was given
    episodes[5]["system_prompt"] += " Answer at once."
    write(copy / "trajectories.jsonl", episodes)
    shutil.copy(runs / "direct" / "scores.jsonl", copy / "scores.jsonl")
    refused(copy, tmp_path, "metrics.json: was computed from other episodes than trajectories.jsonl holds now")


@pytest.mark.parametrize("probabilities", [["NaN", "NaN"], [0.7, 0.7], [1e400, 0.0], [-0.1, 1.1], [1.0]])
def test_probabilities_that_are_not_probabilities_are_refused(runs, tmp_path, probabilities):
    """A forger who puts them in the trajectories and scores alike, digests recomputed: no figure or
    McNemar test is computed from them; the line that holds them is named."""
    copy = copy_of(runs, tmp_path)
    episodes = lines(copy / "trajectories.jsonl")
    probe = {
        "probe": "answerable",
        "options": ["yes", "no"],
        "option_ids": [1, 2],
        "probabilities": [float(p) for p in probabilities],
        "prompt_tokens": 10,
        "prompt_sha256": "0" * 64,
        "probes_sha256": "1" * 64,
    }
    for episode in episodes:
        episode["probes"] = [probe]
    (copy / "trajectories.jsonl").write_text("".join(json.dumps(e) + "\n" for e in episodes))
    scores = lines(copy / "scores.jsonl")
    for score in scores:
        score["probes"] = [{"probe": "answerable", "options": ["yes", "no"], "probabilities": probe["probabilities"]}]
    (copy / "scores.jsonl").write_text("".join(json.dumps(s) + "\n" for s in scores))
    done = run_cli("inspect", str(copy))
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    if any(math.isinf(p) or math.isnan(p) for p in probe["probabilities"]):  # not JSON: refused as the first file is read
        assert "jsonl:1: " in done.stderr and "not a value this file may hold" in done.stderr
        return
    assert f'trajectories.jsonl:1: episode {episodes[0]["episode_id"]}\'s probe "answerable" recorded' in done.stderr
    assert "remove that line and run explorer eval" in done.stderr


def test_the_demo_corpus_runs_are_what_load_corpus_gives(runs):
    """The fixture's runs were made on the demo corpus: report's recomputation (check_with_corpus) holds on them."""
    from paper_explorer.evaluation import derived

    run = Run.load(runs / "scripted")
    derived.check_with_corpus(run.directory, run.trajectories, run.scores, run.metrics, load_corpus(None))


def test_episodes_removed_from_the_log_and_the_scores_alike_are_refused(runs, tmp_path):
    """The failures dropped from every file, metrics recomputed and digests forged: the manifest
    still says how many questions the run selected, and a finished run has them all."""
    copy = copy_of(runs, tmp_path, "scripted")
    scores = lines(copy / "scores.jsonl")
    kept = [index for index, score in enumerate(scores) if score["answer_f1"] > 0]
    assert 0 < len(kept) < len(scores)
    episodes = lines(copy / "trajectories.jsonl")
    write(copy / "trajectories.jsonl", [episodes[index] for index in kept])
    write(copy / "scores.jsonl", [scores[index] for index in kept])
    forge_metrics(copy)
    refused(copy, tmp_path, f"trajectories.jsonl: holds {len(kept)} episodes that count, but the run selected 12 questions x 1 samples")


# -- a manifest and a log of different runs ------------------------------------------------------


def refused_as_another_run(run, tmp_path, *said) -> None:
    """Every reader of the run refuses it in one line that says ``said``."""
    for words in (
        ["inspect", str(run)],
        ["compare", str(run), str(run)],
        ["report", str(run), "--out", str(tmp_path / "report.html")],
        ["export", str(run), str(tmp_path / "export.json"), "--to", "inspect"],
    ):
        done = run_cli(*words)
        assert done.returncode == 2, (words, done.stdout, done.stderr)
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
        assert all(part in done.stderr for part in said), done.stderr


@pytest.mark.parametrize("swapped", [("manifest.json",), ("trajectories.jsonl", "scores.jsonl", "metrics.json")])
def test_a_manifest_and_a_log_of_different_runs_are_refused(runs, tmp_path, swapped):
    """The direct-submit run's files under the scripted run's manifest (or its manifest over the
    scripted run's files): each file agrees with the ones derived from it, but the manifest says a
    policy made the episodes that did not; inspect would name the wrong policy."""
    copy = copy_of(runs, tmp_path, "scripted")
    for name in swapped:
        shutil.copy(runs / "direct" / name, copy / name)
    refused_as_another_run(copy, tmp_path, f"{copy}/trajectories.jsonl:1: episode", "made by policy", "of different runs")


def test_a_log_of_other_questions_under_the_manifest_is_refused_where_the_corpus_is_at_hand(runs, tmp_path):
    """A run of the same policy on other questions (another split, the same number of them): no
    episode is a stranger, but the corpus says they are not the questions the manifest selected."""
    other = tmp_path / "validation"
    done = run_cli("eval", "--split", "validation", "--limit", "12", "--out", str(other))
    assert done.returncode == 0, done.stderr
    copy = copy_of(runs, tmp_path, "scripted")
    for name in ("trajectories.jsonl", "scores.jsonl", "metrics.json"):
        shutil.copy(other / name, copy / name)
    for words in (
        ["report", str(copy), "--out", str(tmp_path / "r.html")],
        ["export", str(copy), str(tmp_path / "e.json"), "--to", "inspect"],
    ):
        done = run_cli(*words)
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
        assert "its episodes ask other questions of the corpus than the run selected" in done.stderr, done.stderr


def test_episodes_of_samples_the_run_did_not_draw_are_refused(runs, tmp_path):
    """One episode's sample renumbered (scores and metrics forged to agree): the count holds, the
    manifest's one sample per question does not."""
    copy = copy_of(runs, tmp_path, "scripted")
    episodes, scores = lines(copy / "trajectories.jsonl"), lines(copy / "scores.jsonl")
    episodes[2]["sample"] = scores[2]["sample"] = 3
    write(copy / "trajectories.jsonl", episodes)
    write(copy / "scores.jsonl", scores)
    forge_metrics(copy)
    refused_as_another_run(copy, tmp_path, "trajectories.jsonl:3: episode", "it is sample 3; the run drew 1 per question")
