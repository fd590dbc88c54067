"""The trajectory: an exact, versioned record of one episode (one JSONL line per episode).

Why one module: these models are one versioned schema (``SCHEMA_VERSION``), and the few functions
beside them (``ending_step``, ``is_direct_submit``, ``without_timings``) define what every reader
of the schema must agree on; split, a schema change would be made in one file and read by rules in
another.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, field_validator, model_serializer, model_validator

from paper_explorer.tools import registry
from paper_explorer.tools.limits import MAX_OUTPUT_CHARS, SandboxSettings
from paper_explorer.tools.records import Evidence, Outcome, Status, ToolCallRecord

# 11: the reranker of a search(..., rerank=K) call (ToolCallRecord.reranker) and the run's reranking service
# (EpisodeConfig.rerank_url); 10: which documents the episode's tools saw (Trajectory.documents: a question's own, or the shared papers);
# 9: the tokens each model call sampled, with their log-probabilities (Served.sampled, kept with
# EpisodeConfig.record_sampled): explorer rl trains on exactly those ids;
# 8: each piece of paper text a research call showed, typed and placed, and a read's page
# (Shown.parts, Shown.read): the memory reader builds its document from them, and the detectors read
# them; 7: what each research call showed of the papers (Returned.shown), which the grounding detectors read
# instead of parsing the result's text (evaluation.detectors keeps the old rule for schemas 4 to 6);
# 6: option probes (Trajectory.probes); 5: the memory reader's record (StepPolicyInfo.reading) and the no_answer outcome; 4: what each tool
# call returned (ToolCallRecord.returned); 3: served prompts, reasoning; 2: isolation,
# deferred_output_chars. Older files still load: every field added since is optional.
SCHEMA_VERSION: Final = 11
# A probe's options must hold at least this share of the model's next-token distribution for their
# renormalised probabilities to be read as its belief: below it the model wanted to write something
# else (a fine-tuned policy after its turn: code), and renormalising magnifies the noise of a
# distribution's far tail into confident-looking numbers (issue 37: options holding 1e-6 renormalised
# to 0.84-0.90 on every question). A tenth keeps probes a model answers in its own words only in part
# (SmolLM2-135M-Instruct: "Yes"/"No" 0.55-0.73, its agent-trained adapter 0.20-0.33).
DEFAULT_PROBE_MIN_MASS: Final = 0.1
ENDING_STATUSES: Final = ("submitted", "abstained")


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Sparse(Record):
    """A record whose unset (None) fields are left out of the JSON: each policy fills only its own."""

    @model_serializer(mode="wrap")
    def _without_nones(self, handler):
        return {key: value for key, value in handler(self).items() if value is not None}


class Generation(Sparse):
    """One model step: its token counts, how it ended, what the server did (hf and openai policies)."""

    prompt_tokens: int | None = None  # the renderer's prompt, as sent (None: a chat API, sent messages)
    api: str | None = None  # openai: "chat" for /v1/chat/completions (else the token or text completions API)
    usage_prompt_tokens: int | None = None  # chat: the API's count of the prompt, in the teacher's own tokens
    cut_chars: int | None = None  # chat: characters after the first python block, cut (one action per turn)
    cached_tokens: int | None = None  # hf: prompt tokens the KV cache already held
    prefill_tokens: int | None = None  # hf: prompt tokens encoded for this step
    cache_cut_tokens: int | None = None  # hf: cached tokens dropped because the prompt diverged from them
    generated_tokens: int | None = None
    server_prompt_tokens: int | None = None  # openai: the server's own count of the prompt
    hit_cap: bool = False  # cut at the policy's own cap (max_new_tokens), never at the room the context left
    clamped_max_tokens: int | None = None  # openai: the request's max_tokens, lowered from the policy's cap to the room left
    finish_reason: str | None = None  # openai: as the server said
    api_retries: int = 0  # openai: requests retried before this one succeeded
    replica: str | None = None  # openai with several --base-url: the replica that answered
    replica_errors: list[str] | None = None  # openai with several --base-url: the failed requests before it, "URL: what"
    parity_warning: str | None = None  # openai: the server saw other tokens than the renderer made
    thinking_tokens: int | None = None  # thinking mode: tokens of the think block the model wrote
    thinking_budget_hit: bool | None = None  # thinking mode: the think block was closed for the model at its budget
    thinking_unclosed: bool | None = None  # thinking mode: the turn ended without </think>; its whole text is the action
    seconds: float | None = None
    prefill_seconds: float | None = None
    decode_seconds: float | None = None


class PromptIds(Record):
    """A served prompt's ids, stored as a change from the previous step's prompt: its first
    ``keep`` ids, then ``append`` (an episode's prompts grow, so the whole episode costs about
    one sequence of ids instead of one per step)."""

    keep: int = Field(ge=0, strict=True)
    append: list[int] = Field(strict=True)


class Sampled(Record):
    """The tokens one model call generated, as ids, each with its log-probability under the
    distribution it was drawn from: the logits divided by ``temperature``, before any top-k or top-p
    cut (the convention of TRL and vLLM's processed log-probabilities). What ``explorer rl`` trains
    on, so that the ids trained are the ids sampled and the ratio's denominator is the sampler's."""

    ids: list[int] = Field(strict=True)  # in order, the stop token included when the call stopped on one
    # None: a token written for the model rather than drawn (thinking mode's </think> at its budget): never trained
    logprobs: list[StrictFloat | None] = Field(strict=True)
    temperature: float = Field(gt=0, allow_inf_nan=False)  # the log-probabilities are of logits / temperature (1 for greedy)
    source: Literal["hf", "server"]  # computed in this process (hf), or as a server returned them (openai)

    @model_validator(mode="after")
    def _one_logprob_per_id(self) -> Sampled:
        if len(self.logprobs) != len(self.ids):
            raise ValueError(f"{len(self.ids)} sampled ids but {len(self.logprobs)} log-probabilities")
        return self


class Served(Sparse):
    """The prompt a step was served, as ids: what a model policy sent (``source`` "policy"), or
    what the renderer would have served a policy without a model ("renderer")."""

    source: Literal["policy", "renderer"]
    tokens: int = Field(ge=0, strict=True)
    sha256: str  # agent.served.ids_sha256 of the prompt's ids
    tokenizer_sha256: str  # sha256 of the tokenizer.json that made them
    reply_sha256: str  # agent.served.reply_sha256 of what the policy wrote back (reasoning and action)
    ids: PromptIds | None = None  # the ids themselves, with --record-prompt-ids
    server_tokens: int | None = None  # openai: how many prompt tokens the server said it saw
    server_sha256: str | None = None  # openai: the digest of the prompt ids the server returned
    server_ids: list[int] | None = None  # openai with --record-prompt-ids: the server's ids, when they differ from those sent
    sampled: Sampled | None = None  # with record_sampled: the ids the model generated for this prompt, and their log-probabilities


class Drift(Record):
    """Where a replayed observation first differs from the recorded one, with context on both sides."""

    position: int
    recorded: str
    current: str


class MemoryUpdate(Sparse):
    """One memory update of the memory reader (``agent.memory_reader``): the model read one page
    with the memory so far and wrote the memory anew (or the keep sentinel)."""

    pass_index: int  # 1; 2 for ReadTwice's second pass over the same pages
    page: int  # the page's index in the document's paging, from 0
    start: int  # the page's text is the document's ids [start, end)
    end: int
    page_sha256: str  # agent.served.ids_sha256 of the page's text ids (its outline excluded)
    outline_tokens: int = 0  # the page-local outline served before the page's text
    memory_tokens_in: int  # the memory the prompt held
    memory_tokens_out: int  # the memory after this update (memory_tokens_in when kept)
    hit_cap: bool  # the update was cut at the memory cap (the memory is what was written up to it)
    kept: bool  # the model answered the keep sentinel: the memory is unchanged
    memory: str | None = None  # the memory after this update, as the next prompt holds it (None: none yet, kept)
    written: str | None = None  # what the model wrote, where it is not the memory: the sentinel, or a text cut to the cap
    served: Served  # the prompt, as ids' digest; reply_sha256 digests the update's text
    generation: Generation


class MemoryAnswer(Sparse):
    """The memory reader's final call: the problem and the memory, no page text."""

    text: str  # what the model wrote
    answer: str | None = None  # the answer taken from it; None when invalid
    invalid: str | None = None  # why there is no answer: empty, or cut at the answer cap (scored zero)
    memory_tokens_in: int
    served: Served
    generation: Generation


class Reading(Sparse):
    """What the memory reader read and spent in one episode."""

    scope: str  # "search:K" (the top K papers of a BM25 search) or "paper" (the question's own: an oracle)
    papers: list[str]  # the papers read, in reading order
    # "verbatim": the question's own document (a benchmark's context) paged as given, read in the
    # host's process, its text kept whole in ``document_text``; None: papers read through the tools
    document: Literal["verbatim"] | None = None
    document_text: str | None = None
    # verbatim: agent.served.ids_sha256 of the whole document's ids, so the check holds the text a
    # token budget left unread (which no prompt shows) to what was read too
    document_sha256: str | None = None
    document_tokens: int  # the whole document, in the model's tokens
    read_tokens: int  # the tokens paged (the rest was left unread by the token budget)
    unread_tokens: int
    pages: int
    passes: int
    updates: list[MemoryUpdate] = Field(default_factory=list)
    answer: MemoryAnswer | None = None  # None: the episode ended before the final call
    model_tokens: int = 0  # prompt plus generated tokens over every model call of the episode
    token_budget: int | None = None  # the model tokens the episode might spend (None: no budget)
    stopped: str | None = None  # why reading stopped before the document's end (the token budget)


class StepPolicyInfo(Sparse):
    """What a policy reported about a step beyond its action (replay: whether the runtime drifted)."""

    replayed_step: int | None = None
    previous_observation_matches: bool | None = None
    drift: Drift | None = None
    final_observation_matches: bool | None = None
    final_drift: Drift | None = None
    finish_error: str | None = None  # the policy's finish() failed; the episode is kept
    reading: Reading | None = None  # the memory reader: its pages, memory updates and answer


class ProbeResult(Sparse):
    """One option probe (``agent.probes``): a closed question appended to the conversation, and the
    probability of each option read from the next-token distribution, in one forward pass."""

    probe: str  # its name in the probes file: "answerable" (can the papers answer it?), "correct" (is the answer right?)
    at_step: int | None = None  # the steps the conversation held; None: at the episode's end
    options: list[str]  # the options, as the probes file names them ("yes", "no")
    option_ids: list[int]  # each option's single token
    # numbers as numbers (strict: a forged "0.5" or true is no reading), a share as a share: agent.probes
    # clamps the mass to [0, 1], so a record outside it was edited (1e308 would overflow every sum of it)
    logprobs: list[StrictFloat | None] | None = None  # each option token's log-probability, unnormalised (None: not returned)
    probabilities: list[StrictFloat] | None = None  # renormalised over the options; None when not measured
    mass: StrictFloat | None = Field(None, ge=0, le=1, allow_inf_nan=False)  # the options' total probability before renormalising
    source: str | None = None  # "hf" (one forward pass), "server" (the top log-probabilities), "server+fallback"
    fallback_options: list[str] | None = None  # options outside the server's top-k, read by a second request
    cached_tokens: int | None = None  # hf: prompt tokens the episode's KV cache already held
    prompt_tokens: int  # the probe's whole prompt: the conversation, the probe turn, the generation prompt
    prompt_sha256: str  # agent.served.ids_sha256 of that prompt
    probes_sha256: str  # the probes file's
    not_measured: str | None = None  # why there are no probabilities (over the context: recorded, never truncated)


class Timings(Record):
    policy_seconds: float = 0.0
    sandbox_seconds: float = 0.0
    tools_seconds: float = 0.0
    host_seconds: float = 0.0  # the host's wall time serving this action's tool calls (its host_seconds budget)
    host_cpu_seconds: float = 0.0  # the host's CPU for this action (counted in its cpu_seconds budget)
    worker_cpu_seconds: float = 0.0  # the worker's CPU for this action (counted in its cpu_seconds budget)
    reply_cpu_seconds: float = 0.0  # the policy's process's CPU reading the action's reply (counted in its cpu and wall budgets)


class Step(Record):
    index: int
    action_text: str  # thinking mode: the text after </think>
    reasoning: str | None = None  # thinking mode: the text between <think> and </think>, as generated
    code: str | None  # None: the text held no code (a format error)
    observation: str  # exactly what the policy is shown next, cut marker included
    observation_chars_cut: int = 0
    format_error: bool = False
    error: str | None = None
    limit_hit: str | None = None
    variables_lost: bool = False
    deferred_output_chars: int = 0  # printed by finalizers after the action returned: dropped, counted
    tool_calls: list[ToolCallRecord] = Field(default_factory=list)
    served: Served | None = None  # the prompt this step was served
    generation: Generation | None = None  # model policies: what the step's generation cost and how it ended
    policy_info: StepPolicyInfo | None = None  # what else the policy reported (replay: drift)
    timings: Timings = Field(default_factory=Timings)


class PolicyInfo(Record):
    name: str
    settings: dict[str, Any] = Field(default_factory=dict)


# Upper bounds of the budgets: past them a budget bounds nothing, and a forged manifest that a
# resume reads would have an episode run for ever or hold more than its log can.
MAX_STEPS = 10_000  # actions per episode: the memory reader's plan at most 1,004 by default (search:50), a code agent tens
MAX_CONTEXT_CHARS = 1 << 30  # a conversation longer than a run's log may be (corpus.files.DATA_BYTES) could not be read back


class EpisodeBudgets(Record):
    """The first fields of an ``EpisodeConfig``: how long an episode may go, and its seed."""

    max_steps: int = Field(10, ge=1, le=MAX_STEPS, description="Actions before the episode ends with step_limit.")
    # An observation is cut from an action's output, which is at most MAX_OUTPUT_CHARS (tools.limits).
    observation_chars: int = Field(4_000, ge=200, le=MAX_OUTPUT_CHARS, description="An observation longer than this is cut, and says so.")
    context_chars: int = Field(
        100_000, ge=1_000, le=MAX_CONTEXT_CHARS, description="A conversation longer than this ends with context_limit."
    )
    seed: int = Field(0, description="Seed passed to the policy (every built-in policy is deterministic given it).")
    # Names are checked against agent/prompts/probes.toml when a run starts (agent.probes.check_probes), not
    # here: a trajectory must still load after the probes file changes.
    probes: list[str] = Field(
        default_factory=list,
        description="Option probes asked after the episode (agent/prompts/probes.toml: answerable, correct); hf and openai policies.",
    )
    probes_file: Path | None = Field(
        None, description="Probes TOML of your own (default agent/prompts/probes.toml); each result records its SHA-256."
    )
    probe_min_mass: float = Field(
        DEFAULT_PROBE_MIN_MASS,
        ge=0,
        le=1,
        description="A probe whose options hold less of the next-token distribution measures no belief: "
        "kept out of calibration figures, refused by calibrate.",
    )

    @model_serializer(mode="wrap")
    def _without_no_probes(self, handler):
        """No probes asked: no probe keys, so the configs of runs recorded before probes existed are
        written back the same."""
        data = handler(self)
        if isinstance(data, dict) and not data.get("probes", True):
            del data["probes"]
            data.pop("probe_min_mass", None)
        if isinstance(data, dict) and data.get("probes_file", 0) is None:
            del data["probes_file"]
        if isinstance(data, dict) and data.get("record_sampled") is False:  # EpisodeConfig's: absent in runs from before it
            del data["record_sampled"]
        return data

    @field_validator("probes_file")
    @classmethod
    def _absolute(cls, path: Path | None) -> Path | None:
        """Recorded absolute: a resume or a rescore from another directory reads the same file."""
        return None if path is None else path.absolute()


class EpisodeConfig(SandboxSettings, EpisodeBudgets):
    """An episode's settings (``[episode]`` of a config): its budgets, and the sandbox limits of
    ``tools.limits.SandboxSettings`` (declared there once; ``Limits.from_settings`` reads them).
    pydantic puts the fields of the last base first, so the JSON keeps the order it always had:
    budgets, limits, then ``record_prompt_ids``."""

    model_config = ConfigDict(extra="forbid")

    record_prompt_ids: bool = Field(False, description="Keep each served prompt's ids in the trajectory, not only their digest.")
    record_sampled: bool = Field(
        False, description="Keep the ids each model call generated and their log-probabilities (what explorer rl trains on)."
    )


class Hashes(Record):
    corpus_sha256: str
    questions_sha256: str
    prompt_template_sha256: str


class Trajectory(Record):
    schema_version: Literal[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11] = SCHEMA_VERSION
    episode_id: str
    question_id: str | None  # None for a free-text question given on the command line
    question: str
    paper_id: str | None = None
    system_prompt: str
    policy: PolicyInfo
    config: EpisodeConfig
    steps: list[Step]
    outcome: Outcome
    sample: int = 0  # which of the question's attempts (explorer eval --samples K)
    episode_seed: int | None = None  # the seed the policy got (None in files written before it was recorded)
    failed_request_retries: int = 0  # policy_error: the failed request's retries (a step's own are in its generation)
    probes: list[ProbeResult] = Field(default_factory=list)  # option probes (agent.probes), when the run asked for them
    hashes: Hashes
    # Which sandbox layers held, as the host verified them: "seccomp[+netns][+uid-drop]" or
    # "language-only" (tools.sandbox); None only in schema-version-1 files, which did not record it.
    isolation: str | None = None
    # What the tools saw (tools.sandbox.Sandbox.documents): "own", the paper paper_id alone (its
    # question's own documents: a LongBench or MemAgent context); "shared", the corpus's shared papers
    # (every paper that holds no question's own documents). None in files written before schema 10.
    documents: Literal["own", "shared"] | None = None
    versions: dict[str, str]
    started_at: str
    seconds: float

    def messages(self, upto: int | None = None) -> list[dict[str, str]]:
        """The conversation the policy saw: before step ``upto`` (all steps when None)."""
        from paper_explorer.agent.prompt import question_message

        messages = [{"role": "system", "content": self.system_prompt}, {"role": "user", "content": question_message(self.question)}]
        for step in self.steps[:upto]:
            turn: dict[str, Any] = {"role": "assistant", "content": step.action_text}
            if step.reasoning is not None:
                turn["reasoning"] = step.reasoning
            if step.generation is not None and step.generation.thinking_unclosed:
                turn["thinking_unclosed"] = True  # served in thinking mode, its whole text the action (agent.renderer)
            messages.append(turn)
            messages.append({"role": "user", "content": step.observation})
        return messages


# -- what an episode did: one definition, read by the detectors, the scores and SFT alike ----------


def ending_step(trajectory: Trajectory) -> int | None:
    """The index of the step whose action ended the episode with an answer or an abstention; None
    when it ended otherwise (a step or context limit, a policy error, no valid answer).

    Read from the outcome, which the host's tools decide: only a submit or abstain that succeeded
    sets "submitted" or "abstained", and the loop stops after the action that set it, so the ending
    step is the last one. Nothing else the action did changes it: which call came first, what it
    called before or after, whether those calls failed, loops, try blocks."""
    if trajectory.outcome.status in ENDING_STATUSES and trajectory.steps:
        return len(trajectory.steps) - 1
    return None


def is_direct_submit(trajectory: Trajectory) -> bool:
    """The direct-submit shortcut: the episode ended with an answer or an abstention in an action
    written before any research had shown the policy anything. That is its first action, whatever
    else that action called, failed or not (what it called in the same action, it could not read
    before answering); or a later one after actions that showed it nothing of the papers: format
    errors, prints, failed calls, actions stopped by a limit (their results died with the worker),
    and, for an answer, searches and extracts that found nothing and reads of empty text. An
    abstention after research that found nothing is not the shortcut: the policy looked, and
    saying the papers do not answer is what it found."""
    end = ending_step(trajectory)
    if end is None:
        return False
    reading = verbatim_reading(trajectory)
    if reading is not None:  # the memory reader's model read pages of the question's own document before it answered, or none
        return reading.read_tokens == 0
    looked = [call for step, call in research_before_end(trajectory) if step is not trajectory.steps[end]]
    if trajectory.outcome.status == "abstained":
        return not looked
    return not any(showed_papers(call) for call in looked)


def verbatim_reading(trajectory: Trajectory) -> Reading | None:
    """The memory reader's verbatim reading (``Reading.document``), when the episode had one: its
    research is the pages it read, done in its own process with no tool call. Its one tool call, the
    outline of the question's paper (so the run shows which document was read), showed its model
    nothing: only pages reach the model's prompts, so it is not research."""
    for step in reversed(trajectory.steps):
        reading = step.policy_info.reading if step.policy_info is not None else None
        if reading is not None:
            return reading if reading.document == "verbatim" else None
    return None


def read_verbatim(trajectory: Trajectory) -> Reading | None:
    """The memory reader's verbatim reading, when it paged any of the question's own document."""
    reading = verbatim_reading(trajectory)
    return reading if reading is not None and reading.read_tokens > 0 else None


def research_before_end(trajectory: Trajectory) -> Iterator[tuple[Step, ToolCallRecord]]:
    """The searches, reads and extracts whose results reached the policy before the episode's
    submit or abstain (or in the whole episode, when it ended otherwise): a failed call showed the
    policy nothing, nor did a call of an action stopped by a limit (the worker is killed, and with it
    what the action printed and kept), and a call after the submit or abstain that succeeded cannot
    have informed it."""
    research, ending = registry.research_tools(), registry.ending_tools()
    for step in trajectory.steps:
        for call in step.tool_calls:
            if call.name in ending and not call.error:
                return
            if call.name in research and not call.error and step.limit_hit is None:
                yield step, call


def showed_papers(call: ToolCallRecord) -> bool:
    """Whether a research call's result held anything of the papers, as the host recorded it: a
    search or extract with no hit, or a read of empty text, showed nothing. A call recorded before
    the host kept that record (schema 6 and older) is taken to have shown something, as then."""
    shown = call.returned.shown if call.returned is not None else None
    return shown is None or bool(shown.paragraphs or shown.spans())


def without_timings(trajectory: Trajectory) -> dict:
    """The trajectory minus wall-clock fields, for determinism checks."""
    data = trajectory.model_dump(exclude={"seconds", "started_at"})
    for step in data["steps"]:
        step.pop("timings")
        for call in step["tool_calls"]:
            call.pop("seconds")
        if step["generation"]:
            step["generation"] = _untimed(step["generation"])
        reading = (step["policy_info"] or {}).get("reading")
        for call in ((reading or {}).get("updates") or []) + ([reading["answer"]] if reading and reading.get("answer") else []):
            call["generation"] = _untimed(call["generation"])
    return data


def _untimed(generation: dict) -> dict:
    return {key: value for key, value in generation.items() if not key.endswith("seconds")}


__all__ = [
    "ENDING_STATUSES",
    "Drift",
    "EpisodeConfig",
    "Evidence",
    "Generation",
    "Hashes",
    "MemoryAnswer",
    "MemoryUpdate",
    "Outcome",
    "PolicyInfo",
    "ProbeResult",
    "Reading",
    "Sampled",
    "Status",
    "Step",
    "StepPolicyInfo",
    "Timings",
    "ToolCallRecord",
    "Trajectory",
    "is_direct_submit",
    "ending_step",
    "research_before_end",
    "showed_papers",
    "without_timings",
]
