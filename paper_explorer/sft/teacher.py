"""A gold-guided teacher that writes trajectories for QASPER-format questions, so users can
bootstrap SFT data without an API model. It acts through the same tools and loop as any policy
(its observations are real); only its choices come from the gold annotation:

* answerable: search with the question's key terms, read the section that holds the gold
  evidence, extract from the paper, submit the gold answer citing the gold paragraphs;
* unanswerable: search, read the paper's outline, extract, find nothing, abstain.

``direct=True`` writes the failure this project exists to catch - the first action submits the
gold answer at once - for reproducing the shortcut in tests and demos.
"""

from __future__ import annotations

import json

from paper_explorer.agent.policies.base import EpisodeStart, Policy, PolicyError, Reply, action, steps_taken
from paper_explorer.agent.policies.records import PolicySettings
from paper_explorer.agent.policies.scripted import key_terms
from paper_explorer.corpus import Corpus
from paper_explorer.corpus.schema import Question


class TeacherSettings(PolicySettings):
    direct: bool  # it submits the gold answer as its first action (the shortcut)
    thinking: bool  # its actions carry their reasoning as think blocks


class Teacher(Policy):
    name = "teacher"

    def __init__(self, corpus: Corpus, direct: bool = False, thinking: bool = False) -> None:
        self.corpus = corpus
        self.direct, self.thinking = direct, thinking
        self.questions = {question.id: question for question in corpus.questions}

    def settings(self) -> TeacherSettings:
        return TeacherSettings(direct=self.direct, thinking=self.thinking)

    def start(self, episode: EpisodeStart) -> None:
        super().start(episode)
        question = self.questions.get(episode.question_id or "")
        if question is None:
            raise PolicyError(f"the teacher needs a corpus question with gold answers, not {episode.question_id or episode.question!r}")
        self.question = question
        self.answer = gold_answer(question)
        self.evidence = gold_paragraphs(self.corpus, question)

    def act(self, messages: list[dict[str, str]]) -> Reply:
        q, step = self.question, steps_taken(messages)
        if self.direct and step == 0:
            return self._reply(*self._final())
        plan = [
            lambda: (
                f"hits = search({json.dumps(key_terms(q.text))}, k=5)\n"
                "[(h['paper_id'], h['section'], h['paragraph'], h['title']) for h in hits]",
                "I search the corpus for the question's key terms.",
            ),
            lambda: (
                f"print(read({json.dumps(q.paper_id)}" + (f", section={self.evidence[0][0]}))" if self.evidence else "))"),
                "I read the part of the paper that should answer it." if self.evidence else "I read the paper's outline.",
            ),
            lambda: (
                f"found = extract({json.dumps(q.paper_id)}, {json.dumps(q.text)}, k=3)\n"
                "[(s['section'], s['paragraph'], s['sentence']) for s in found]",
                "I extract the sentences that best match the question.",
            ),
        ]
        return self._reply(*(plan[step]() if step < len(plan) else self._final()))

    def _reply(self, code: str, thought: str) -> Reply:
        """In thinking mode the thought is the think block, laid out as Qwen3 writes one."""
        if self.thinking:
            return Reply("\n\n" + action(code), reasoning=f"\n{thought}\n")
        return Reply(action(code, thought))

    def _final(self) -> tuple[str, str]:
        if self.answer is None:
            return f"abstain({json.dumps('The paper does not state this.')})", "The paper does not contain the answer."
        cited = json.dumps([[self.question.paper_id, s, p] for s, p in self.evidence])
        return f"submit({json.dumps(self.answer)}, evidence={cited})", "The evidence answers the question."


def gold_answer(question: Question) -> str | None:
    """The first annotator's answer that is not "unanswerable"; None when every annotator abstained."""
    for answer in question.answers:
        if answer.kind not in (None, "none"):
            return answer.reference_text
    return None


def gold_paragraphs(corpus: Corpus, question: Question) -> list[tuple[int, int]]:
    """(section, paragraph) of the first answering annotator's text evidence, found in the paper."""
    if question.paper_id not in corpus:
        return []
    paper = corpus.paper(question.paper_id)
    located = {text: (s, p) for s, section in enumerate(paper.sections) for p, text in enumerate(section.paragraphs) if text}
    for answer in question.answers:
        if answer.kind not in (None, "none"):
            return [located[text] for text in answer.evidence if text in located]
    return []
