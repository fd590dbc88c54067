"""A trajectory file whose records lie about what the research calls showed: edited after the host
wrote it, so that a paragraph counts as observed, an id or a score as paper text, or research that
found nothing as research that showed something. Read back, each is refused in one line, never
believed into a better verdict; the episode as the host wrote it loads and is judged as it was."""

import json

import pytest

from paper_explorer.agent.errors import AgentError
from paper_explorer.agent.runner import EpisodeRunner
from paper_explorer.agent.trajectory import EpisodeConfig
from paper_explorer.agent.writer import read_trajectories
from paper_explorer.corpus import BM25Index
from paper_explorer.evaluation.detectors import detect
from tests.evaluation.test_detectors import Fixed  # plays the given actions, one per step


@pytest.fixture(scope="module")
def episode(small_demo):
    """Research that found nothing, a search with hits, an outline and a section's page, then a submit citing a paragraph."""
    paper = small_demo.papers[0]
    codes = (
        'search("zzqx qqzv", k=3)',
        f'hits = search("{paper.sections[1].paragraphs[0][:60]}", k=2, paper_id="{paper.id}")',
        f'read("{paper.id}")',
        f'read("{paper.id}", section=1)',
        f'submit("ANSWERX", evidence=[["{paper.id}", 2, 0]])',
    )
    trajectory = EpisodeRunner(small_demo, BM25Index.build(small_demo), Fixed(*codes), EpisodeConfig()).run("Which?")
    assert trajectory.steps[1].tool_calls[0].returned.shown.paragraphs  # the search found something
    assert trajectory.outcome.status == "submitted" and all(not call.error for step in trajectory.steps for call in step.tool_calls)
    return json.loads(trajectory.model_dump_json())


def written(tmp_path, data):
    path = tmp_path / "trajectories.jsonl"
    path.write_text(json.dumps(data, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def returned(data, step):
    return data["steps"][step]["tool_calls"][0]["returned"]


def test_the_episode_as_the_host_wrote_it_loads_and_is_judged_as_it_was(tmp_path, episode):
    (trajectory,) = read_trajectories(written(tmp_path, episode))
    flags = {flag.detector for flag in detect(trajectory, None)}
    assert {"ungrounded_answer", "unobserved_evidence"} <= flags


def forge_empty_search(data, paper_id):
    returned(data, 0)["shown"]["paragraphs"] = [[paper_id, 2, 0]]  # it found nothing


def forge_outline(data, paper_id):
    returned(data, 2)["shown"]["paragraphs"] = [[paper_id, 2, 0]]  # an outline shows no paragraph


def forge_page(data, paper_id):
    returned(data, 3)["shown"]["paragraphs"].append([paper_id, 2, 0])  # another section's paragraph


def forge_not_kept(data, paper_id):
    result = returned(data, 0)
    result["text"], result["cut"] = None, "not kept"
    result["shown"]["paragraphs"] = [[paper_id, 2, 0]]


def forge_snippet(data, paper_id):
    result = returned(data, 1)  # the text edited in place: same length, so every piece still fits
    start = result["text"].index('"snippet": "') + len('"snippet": "')
    result["text"] = result["text"][:start] + "ANSWERX" + result["text"][start + len("ANSWERX") :]


def forge_id_as_paper_text(data, paper_id):
    result = returned(data, 1)
    literal = json.dumps(paper_id)
    start = result["text"].index(literal)
    result["shown"]["parts"].append(
        {"start": start, "end": start + len(literal), "what": "snippet", "paper_id": paper_id, "section": 2, "paragraph": 0, "offset": 0}
    )


def forge_hit_paragraph(data, paper_id):
    shown = returned(data, 1)["shown"]
    shown["paragraphs"][0] = [paper_id, 2, 0]
    shown["parts"][-1]["section"], shown["parts"][-1]["paragraph"] = 2, 0


@pytest.mark.parametrize(
    "forge",
    [forge_empty_search, forge_outline, forge_page, forge_not_kept, forge_snippet, forge_id_as_paper_text, forge_hit_paragraph],
)
def test_a_record_that_lies_about_what_was_shown_is_refused_in_one_line(tmp_path, episode, small_demo, forge):
    data = json.loads(json.dumps(episode))
    forge(data, small_demo.papers[0].id)
    with pytest.raises(AgentError) as refused:
        read_trajectories(written(tmp_path, data))
    message = str(refused.value)
    assert "\n" not in message and "trajectories.jsonl:1" in message, message
