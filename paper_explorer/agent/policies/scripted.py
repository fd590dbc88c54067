"""The scripted researcher: search, read the section the best hit is in, extract sentences, decide.

Each step is one action a model could have written; the policy reads the results back from the
observations (the ``Out:`` line), exactly as a model would have to.
"""

from __future__ import annotations

import json
import re
from typing import Literal

from paper_explorer.agent.policies.base import Plan, Policy, PolicyError, Reply, action, last_value
from paper_explorer.agent.policies.reading import answer_type, decide, names_in
from paper_explorer.agent.policies.records import PolicySettings
from paper_explorer.agent.policies.settings import PromptRecording
from paper_explorer.agent.policy_registry import register_policy
from paper_explorer.corpus.tokenize import tokenize


def key_terms(question: str) -> str:
    return " ".join(dict.fromkeys(tokenize(question, stopwords=True)))


TYPE_HINTS = {
    "duration": "hours days weeks takes training",
    "count": "",
    "quantity": "of",
    "polar": "",
    "entity": "",
    "improvement": "compared",
    "date": "",
}


def extract_query(question: str) -> str:
    """The question plus the words an answer of its type tends to come with ("hours" for "how long")."""
    hint = TYPE_HINTS[answer_type(question)]
    return f"{question} {hint}".strip()


class ScriptedConfig(PromptRecording):
    """``--policy scripted``: the scripted researcher (no model)."""

    name: Literal["scripted"] = "scripted"


@register_policy(ScriptedConfig)
def scripted(config: ScriptedConfig, max_steps: int) -> Policy:
    return Scripted()


class ScriptedSettings(PolicySettings):
    search_k: int  # hits its search asks for
    extract_k: int  # sentences it extracts from the section it reads


class Scripted(Plan):
    name = "scripted"

    def __init__(self, search_k: int = 10, extract_k: int = 8) -> None:
        self.search_k = search_k
        self.extract_k = extract_k

    def settings(self) -> ScriptedSettings:
        return ScriptedSettings(search_k=self.search_k, extract_k=self.extract_k)

    def next_step(self, messages: list[dict[str, str]], step: int) -> Reply:
        question = self.episode.question
        if step == 0:
            return Reply(
                action(
                    f"hits = search({json.dumps(key_terms(question))}, k={self.search_k})\n"
                    "[(h['paper_id'], h['section'], h['paragraph'], round(h['score'], 2), h['title']) for h in hits]",
                    "I search the corpus with the question's key terms.",
                )
            )
        if step == 1:
            hits = last_value(messages)
            if not hits:
                return Reply(action('abstain("The search found no paragraph about this question.")'))
            self.paper_id, section, self.title = self._best_paper(question, hits)
            return Reply(
                action(
                    f"print(read({json.dumps(self.paper_id)}, section={section}))",
                    "I read the section of the best-matching paper that the top hit comes from.",
                )
            )
        if step == 2:
            return Reply(
                action(
                    f"found = extract({json.dumps(self.paper_id)}, {json.dumps(extract_query(question))}, k={self.extract_k})\n"
                    "[(s['section'], s['paragraph'], s['sentence']) for s in found]",
                    "I extract the sentences of that paper that best match the question.",
                )
            )
        if step == 3:
            found = last_value(messages)
            if found is None:
                raise PolicyError("could not read the extracted sentences from the last observation")
            decision = decide(question, [sentence for _, _, sentence in found], known=self.title)
            if decision.answer is None:
                return Reply(action(f"abstain({json.dumps(decision.reason)})", "The evidence does not answer the question."))
            section, paragraph, _ = next(item for item in found if item[2] == decision.sentence)
            evidence = [self.paper_id, section, paragraph]
            return Reply(
                action(
                    f"submit({json.dumps(decision.answer)}, evidence=[{json.dumps(evidence)}])",
                    f"The evidence answers the question ({decision.reason}).",
                )
            )
        raise PolicyError(f"the scripted policy has no step {step}")

    @staticmethod
    def _best_paper(question: str, hits: list) -> tuple[str, int, str]:
        """The top hit, preferring a paper whose title names what the question names."""
        names = [re.compile(rf"(?<![\w-]){re.escape(name)}(?![\w-])", re.IGNORECASE) for name in names_in(question)]
        for paper_id, section, _, _, title in hits:
            if any(name.search(title) for name in names):
                return paper_id, section, title
        paper_id, section, _, _, title = hits[0]
        return paper_id, section, title
