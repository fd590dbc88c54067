"""The policy interface: a policy sees the message history and returns the text of its next action."""

from __future__ import annotations

import ast
import copy
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from paper_explorer.agent.policies.records import PolicySettings, SamplingRecord, SettingsRecord
from paper_explorer.agent.trajectory import Generation, Sampled, Step, StepPolicyInfo
from paper_explorer.corpus.setting_names import setting

if TYPE_CHECKING:  # tokenizers is loaded only by the policies that serve prompts
    from paper_explorer.agent.renderer import ChatRenderer


@dataclass(frozen=True)
class EpisodeStart:
    """What a policy may know when an episode starts, besides the messages it will be shown."""

    seed: int  # derived from the run's seed, the question and the sample number (agent.loop.episode_seed)
    question: str
    question_id: str | None = None
    sample: int = 0  # which of a question's K attempts (explorer eval --samples K)
    paper_id: str | None = None  # the question's own paper (the memory reader's oracle scope); None for free text
    # the question's own document exactly as its benchmark gives it (``Paper.context``), None for a
    # question about shared papers: the memory reader's verbatim page source, read in the host's process
    document: str | None = None
    record_ids: bool = (
        False  # the episode keeps served prompts' ids (EpisodeConfig.record_prompt_ids): calls the loop does not record need to know
    )
    record_sampled: bool = False  # ... and the ids sampled with their log-probabilities (EpisodeConfig.record_sampled)


@dataclass(frozen=True, kw_only=True)
class Sampling:
    """Decoding settings of the model policies: temperature 0 is greedy (then top_p and top_k do
    nothing). Keyword-only: two numbers swapped by position would pass silently."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def settings(self) -> SamplingRecord:
        if self.greedy:
            return SamplingRecord(decoding="greedy", do_sample=False, temperature=0)
        return SamplingRecord(decoding="sampling", do_sample=True, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k)


@dataclass
class Reply:
    """A policy's answer to one step: its action, and the records of it the step keeps, built
    typed where they are made (the trajectory's own ``Generation`` and ``StepPolicyInfo``)."""

    text: str  # the action; in thinking mode, what the model wrote after </think>
    generation: Generation | None = None  # token counts, hit_cap, how the server answered (model policies)
    info: StepPolicyInfo | None = None  # anything else worth recording (replay: drift found)
    reasoning: str | None = None  # thinking mode: what the model wrote between <think> and </think>
    prompt_ids: list[int] | None = None  # model policies: the prompt sent, as ids
    server_prompt_ids: list[int] | None = None  # openai: the prompt ids the server says it used
    server_prompt_tokens: int | None = None  # openai: the server's count of them
    sampled: Sampled | None = None  # model policies: the ids generated and their log-probabilities (kept with record_sampled)


@dataclass(frozen=True)
class ProbeReading:
    """What a model policy read for an option probe (``agent.probes``): each option token's
    log-probability under the whole vocabulary (log-softmax of one forward pass, or a server's)."""

    logprobs: list[float | None]  # per option, in the order asked; None: the server did not return it
    source: str  # "hf" (one forward pass), "server" (the top log-probabilities), "server+fallback"
    cached_tokens: int | None = None  # hf: prompt tokens the episode's KV cache already held
    fallback: tuple[int, ...] = ()  # openai: the positions of the options read by a second request
    not_measured: str | None = None  # why these log-probabilities are no measurement (a refused or lying answer)


class PolicyError(Exception):
    """The policy could not produce an action; the episode ends with status policy_error.
    ``retries``: requests retried before giving up (counted in the run's api_retries)."""

    def __init__(self, message: str, retries: int = 0) -> None:
        super().__init__(message)
        self.retries = retries


class ContextExceeded(Exception):
    """The conversation no longer fits the policy's context; the episode ends with status context_limit."""


class NoAnswer(Exception):
    """The policy ended without a valid answer of its own (the memory reader's final answer was empty
    or cut at its cap); the episode ends with status no_answer: scored zero, kept in the denominator."""


class Policy(ABC):
    """Deterministic given the seed passed to ``start``. Language-model policies implement the same two methods."""

    name: str = ""
    renderer: ChatRenderer | None = None  # the renderer whose prompts this policy is (or would be) served
    thinking: bool = False  # Qwen3 thinking mode: the generation prompt leaves the think block to the model

    def settings(self) -> SettingsRecord:
        """What every trajectory records of this policy (``records``): its config, when that is all, or its own record."""
        return PolicySettings()

    def start(self, episode: EpisodeStart) -> None:
        self.episode = episode

    def for_episode(self) -> Policy:
        """A policy for one of several episodes in flight at once (``eval --concurrency``): a
        shallow copy, so what is read-only and thread-safe (a tokenizer, a server pool) is shared
        and what ``start`` and ``act`` assign is the episode's own. A policy that mutates state
        it holds from before ``start`` overrides this."""
        return copy.copy(self)

    def preflight(self) -> str | None:
        """Before the first episode of a run: raise AgentError if the policy cannot work at all
        (a server that is down or serves another model), so a run fails once, not per episode;
        return a note when something could not be checked."""
        return None

    @abstractmethod
    def act(self, messages: list[dict[str, str]]) -> Reply: ...

    def observed(self, step: Step) -> None:
        """Called once each step's action has run, with the step as the trajectory records it: the
        host's records of its tool calls (``Step.tool_calls``: what each returned and what that
        showed of the papers) beside the observation the messages carry. A policy that acts on what
        its tools returned reads it here, from the records, never parsed back from the observation's
        text (the memory reader)."""
        return None

    def complete(self, prompt: list[int], *, max_new_tokens: int) -> Reply:
        """One completion of ``prompt`` (token ids) by the model: for a policy that builds its own
        prompts around a model policy (the memory reader). Only the model policies have one."""
        raise NotImplementedError(f"the {self.name} policy has no model to complete a prompt")

    def probe_unavailable(self) -> str | None:
        """Why this policy cannot answer option probes (``agent.probes``), or None when it can."""
        return f"the {self.name} policy has no model to probe ({setting('episode.probes')} is for {setting('policy.name')} hf or openai)"

    def probe(self, prompt_ids: list[int], option_ids: list[int]) -> ProbeReading:
        """The log-probability of each option token as the next token after ``prompt_ids``, read in
        one forward pass; only the model policies have one (``probe_unavailable``)."""
        raise NotImplementedError(self.probe_unavailable())

    def prompt_template_sha256(self) -> str:
        """The digest of everything fixed that shapes this policy's prompts (``Hashes``): the code
        agent's template and tool page, unless the policy builds other prompts."""
        from paper_explorer.agent.prompt import prompt_template_sha256

        return prompt_template_sha256()

    def finish(self, messages: list[dict[str, str]]) -> dict[str, Any] | None:
        """Called once the episode has ended, with the whole conversation (the last observation
        included); what it returns is added to the last step's ``policy_info``."""
        return None


class Plan(Policy):
    """A scripted policy that goes through a plan step by step, reading each action's result. An
    action that hit a limit is taken again (the sandbox was restarted; each action of a plan stands
    alone), so a plan never reads a result it has not got: its step is the plan's, not the episode's."""

    def start(self, episode: EpisodeStart) -> None:
        super().start(episode)
        self.stage = 0  # the plan's next step
        self.last: Reply | None = None

    def act(self, messages: list[dict[str, str]]) -> Reply:
        if self.last is not None and hit_limit(messages):
            return self.last
        self.last = self.next_step(messages, self.stage)
        self.stage += 1
        return self.last

    @abstractmethod
    def next_step(self, messages: list[dict[str, str]], step: int) -> Reply: ...


def hit_limit(messages: list[dict[str, str]]) -> bool:
    """Whether the last observation says its action hit a limit (so it did not run to its end)."""
    from paper_explorer.agent.prompt import PROMPTS  # with the tools' page: loaded by an episode, not by --help

    said = PROMPTS["limit_hit"].partition("{limit}")[0]
    last = messages[-1]["content"] if steps_taken(messages) and messages[-1]["role"] == "user" else ""
    return any(line.startswith(said) for line in last.split("\n"))


def action(code: str, thought: str = "") -> str:
    """An action as a model would write it: an optional line of reasoning, then one python block."""
    prefix = f"{thought}\n\n" if thought else ""
    return f"{prefix}```python\n{code}\n```"


def last_value(messages: list[dict[str, str]]) -> Any:
    """The Python value shown on the last observation's ``Out:`` line, or None when it is absent or cut."""
    text = messages[-1]["content"] if messages and messages[-1]["role"] == "user" else ""
    start = text.rfind("\nOut: ") + 1 if "\nOut: " in text else (0 if text.startswith("Out: ") else -1)
    if start < 0:
        return None
    try:
        return ast.literal_eval(text[start + len("Out: ") :])
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None


def steps_taken(messages: list[dict[str, str]]) -> int:
    return sum(1 for message in messages if message["role"] == "assistant")


@dataclass
class Memory:
    """A bounded memory of (score, item) pairs that keeps the best ``size``."""

    size: int
    items: list[tuple[float, Any]] = field(default_factory=list)

    def add(self, score: float, item: Any) -> None:
        if any(existing == item for _, existing in self.items):
            return
        self.items.append((score, item))
        self.items.sort(key=lambda pair: -pair[0])
        del self.items[self.size :]
