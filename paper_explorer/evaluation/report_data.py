"""What the HTML report shows of each episode, as typed records: its score, its steps, the gold
answers and evidence of its question, and the text of the paragraphs it cited - the last two
read from the corpus the run used, which is checked against the run's manifest first (a report
that showed another corpus's gold answers beside a prediction would mislead quietly)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from paper_explorer.agent.trajectory import Drift, Trajectory
from paper_explorer.corpus.collection import Corpus
from paper_explorer.corpus.schema import Question
from paper_explorer.corpus.setting_names import setting
from paper_explorer.evaluation.derived import check_with_corpus
from paper_explorer.evaluation.errors import EvaluationError
from paper_explorer.evaluation.replay_drift import compared_observations
from paper_explorer.evaluation.run_directory import Run
from paper_explorer.evaluation.scoring import EpisodeScore


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class GoldAnswer(Record):
    """One annotator's answer: QASPER's reference string and type, and the evidence they marked."""

    kind: str  # extractive, abstractive, boolean, none; "empty" for an annotation with no answer
    text: str | None  # the reference QASPER scores against; None for an empty annotation
    evidence: list[str]


class CitedParagraph(Record):
    """A paragraph the episode submitted as evidence, with its text and section name from the corpus."""

    paper_id: str
    section: int
    paragraph: int
    section_name: str
    text: str


class ReportStep(Record):
    index: int
    action: str
    code: str | None
    observation: str
    tools: list[str]
    error: str | None
    limit: str | None
    format_error: bool
    changed: str | None  # replay: how the observation differs from the recording


class ReportEpisode(EpisodeScore):
    """A line of scores.jsonl with what the report shows beside it."""

    answer: str | None = None
    reason: str | None = None
    gold: list[GoldAnswer] | None = None  # None: the question has no gold (a free-text question)
    cited: list[CitedParagraph] = []
    steps_detail: list[ReportStep] = []


def check_corpus(run: Run, corpus: Corpus, where: str) -> None:
    """Refuse a corpus whose papers or questions are not the ones the run was made on; then, with
    the run's own corpus in hand, a run whose scores.jsonl or retrieval figures it does not give
    (``evaluation.derived.check_with_corpus``: the gold fields, which ``Run.load`` cannot recompute)."""
    hashes = run.manifest.hashes
    for what, recorded, found in (
        ("papers", hashes.corpus_sha256, corpus.papers_sha256),
        ("questions", hashes.questions_sha256, corpus.questions_sha256),
    ):
        if recorded != found and what == "questions" and not corpus.questions:  # not a hash of nothing: what is missing
            raise EvaluationError(
                f"{where}: holds no questions of its own, and run {run.directory} asked {len({s.question_id for s in run.scores})} "
                "from a questions file; pass that file with --questions (as explorer eval --questions was given it)"
            )
        if recorded != found:
            raise EvaluationError(
                f"{where}: its {what} are not those of run {run.directory} (the sha256 hash differs: "
                f"{found[:12]}, the run recorded {recorded[:12]}); pass {setting('corpus')} (and {setting('questions')}) with the "
                "corpus the run used"
            )
    check_with_corpus(run.directory, run.trajectories, run.scores, run.metrics, corpus, run.manifest.config.selected_questions_sha256)


def gold_answers(question: Question) -> list[GoldAnswer]:
    return [
        GoldAnswer(kind=answer.kind or "empty", text=answer.reference_text, evidence=list(answer.evidence)) for answer in question.answers
    ]


def cited_paragraphs(trajectory: Trajectory, corpus: Corpus) -> list[CitedParagraph]:
    cited = []
    for item in trajectory.outcome.evidence:
        # the host resolved each address against this corpus (its hash was checked): it is there
        section = corpus.paper(item.paper_id).sections[item.section]
        cited.append(
            CitedParagraph(
                paper_id=item.paper_id,
                section=item.section,
                paragraph=item.paragraph,
                section_name=section.name or "(untitled)",
                text=section.paragraphs[item.paragraph],
            )
        )
    return cited


def report_steps(trajectory: Trajectory) -> list[ReportStep]:
    changed = {index: drift for index, matches, drift in compared_observations(trajectory) if not matches}
    return [
        ReportStep(
            index=s.index,
            action=s.action_text,
            code=s.code,
            observation=s.observation,
            tools=[
                f"{c.name}({', '.join(f'{k}={v!r}' for k, v in c.arguments.items() if v is not None)})"[:200]
                + (f" -> error: {c.error}" if c.error else "")
                for c in s.tool_calls
            ],
            error=s.error,
            limit=s.limit_hit,
            format_error=s.format_error,
            changed=_changed(changed[s.index]) if s.index in changed else None,
        )
        for s in trajectory.steps
    ]


def _changed(drift: Drift | None) -> str:
    """What a replayed step's detail says under an observation the replay did not reproduce."""
    if drift is None:
        return "this observation differs from the recording"
    return f"this observation differs from the recording at character {drift.position}: recorded {drift.recorded!r}, now {drift.current!r}"


def report_episodes(run: Run, corpus: Corpus) -> list[ReportEpisode]:
    """Every scored line of the run with its trajectory, gold answers and cited paragraphs."""
    trajectories = {t.episode_id: t for t in run.trajectories}
    questions = {question.id: question for question in corpus.questions}
    episodes = []
    for score in run.scores:
        trajectory = trajectories.get(score.episode_id)
        if trajectory is None:
            raise EvaluationError(
                f"{run.directory}: episode {score.episode_id} is in scores.jsonl but not in "
                "trajectories.jsonl; rerun explorer eval --resume"
            )
        question = questions.get(score.question_id) if score.question_id is not None else None
        if score.question_id is not None and question is None:
            raise EvaluationError(f"{run.directory}: question {score.question_id} is not in the corpus the run recorded")
        episodes.append(
            ReportEpisode(
                **score.model_dump(),
                answer=trajectory.outcome.answer,
                reason=trajectory.outcome.reason,
                gold=None if question is None else gold_answers(question),
                cited=cited_paragraphs(trajectory, corpus),
                steps_detail=report_steps(trajectory),
            )
        )
    return episodes
