"""Two runs on the same questions, compared on the questions both scored.

Every headline figure - the answer metrics, the abstention tables, the direct-submit rate - is
computed on the *paired* questions (scored in both runs), never on each run's whole set: two runs
of different question sets differ by their questions as much as by their policies. Questions only
one run scored are counted and reported apart, marked as not comparable.

The primary tests are paired: a bootstrap interval of the per-question F1 difference (B - A) and
exact McNemar tests on each yes/no answer metric (``evaluation.answer_metrics``: exact match and both
SubEM variants, ours, whole tokens, and LongBench's, substring) and on abstention. Fisher's exact test on the two abstention tables -
the unpaired design a preregistration uses - is kept as a secondary figure, on the paired
questions' tables; it ignores the pairing, so it is conservative here. An episode that ended
without a decision (a limit, a policy error, no_answer) is scored zero and counted in every
correctness figure, and left out of the abstention tests. Tokens spent (``evaluation.tokens``)
are paired too: the mean per run and a bootstrap interval of the per-question difference, on the
paired questions whose episodes both made a model call.

Questions that carry a benchmark (``Question.benchmark``) are also compared per benchmark, on the
paired questions, as the benchmarks' tables report them (``evaluation.benchmarks``).

Calibration (``evaluation.calibration``): each run's figures per probe, on the paired questions,
when either run measured probes; the runs' probes are not paired episode by episode.

Runs of different policies pair as any two runs do (a code agent against a memory reader is the
point). What is compared is the policy - or, for one policy, its model or adapter (``compared``);
where the runs differ in anything else (seed, question selection, prompt, the episode's limits,
and for runs of one policy its decoding), ``setting_differs`` says so, since a difference in F1
then measures that too.

Why one module: the pairing of questions, the paired tests and what the two runs' settings make
of them are one comparison, recorded as one ``RunComparison``; split, the rule for which
questions pair would sit apart from the figures computed on them.
"""

from __future__ import annotations

from collections.abc import Callable
from statistics import fmean
from typing import Any

from pydantic import BaseModel, ConfigDict, SerializerFunctionWrapHandler, model_serializer, model_validator

from paper_explorer.agent.policies.settings import adapter_of, model_of
from paper_explorer.evaluation.answer_metrics import ANSWER_F1, EXACT_MATCH, answer_metric, answer_metrics, flattened, gathered
from paper_explorer.evaluation.benchmarks import PairedBenchmarks, paired_benchmarks
from paper_explorer.evaluation.calibration import probe_mass, run_calibration
from paper_explorer.evaluation.errors import EvaluationError
from paper_explorer.evaluation.records import AbstentionTable, FisherTest, MeanInterval, ProbeCalibration, ProbeMass
from paper_explorer.evaluation.run_directory import Run
from paper_explorer.evaluation.scoring import ENDED_BY_POLICY, EpisodeScore, abstention_table
from paper_explorer.evaluation.stats import abstention_fisher, bootstrap_mean_ci, discordant_pairs, mcnemar_exact_p


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PairedFigure(Record):
    """One figure of each run, on the paired questions (None when there are none)."""

    a: float | None
    b: float | None


class PairedMetric(PairedFigure):
    """An answer metric (``evaluation.answer_metrics``) in each run, on the paired questions: None in a
    run scored before the metric existed."""

    difference: float | None  # B - A
    # mean of B - A per question, seeded BCa bootstrap: only for a metric that declares an interval (else not written)
    paired_difference_ci95: MeanInterval | None = None

    @model_serializer(mode="wrap")
    def _interval_if_declared(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        dumped = handler(self)
        if dumped["paired_difference_ci95"] is None:
            del dumped["paired_difference_ci95"]
        return dumped


class PairedTokens(PairedFigure):
    """Tokens spent per episode (``evaluation.tokens.model_tokens``): each run's mean over the shared
    questions whose episode recorded a count (None: none did, as for a policy without a model), and
    the paired difference over the ``pairs`` of questions where both did."""

    pairs: int
    paired_difference_ci95: MeanInterval  # mean of B - A per question, seeded BCa bootstrap


# Policy settings that say what acts (compared, never a confound) or how a server was reached
# (no effect on what it wrote); every other policy setting is a confound between runs of one policy.
POLICY_IDENTITY = ("name", "model", "adapter", "served_adapter", "replay")
NOT_BEHAVIOUR = ("base_url", "timeout", "retries", "threads", "tokenizer", "api", "prompt_format")
# Episode settings that change no action: what is recorded or asked after the episode.
NOT_EPISODE_BEHAVIOUR = ("seed", "probes", "probes_file", "probe_min_mass", "record_prompt_ids")


class RunSetting(Record):
    """What a run was: its policy, the model it ran, its seed, the questions it selected, and the
    other settings that shape what the policy did (its decoding, the episode's limits, the prompt)."""

    policy: str
    model: str | None  # None: a policy without a model
    adapter: str | None
    seed: int
    selected_questions_sha256: str
    policy_settings: dict[str, Any] = {}  # the policy's settings but POLICY_IDENTITY and NOT_BEHAVIOUR
    episode: dict[str, Any] = {}  # the episode's budgets and sandbox limits but NOT_EPISODE_BEHAVIOUR
    prompt_template_sha256: str | None = None

    def describe(self) -> str:
        """In a few words: "policy scripted, model -, seed 0"."""
        adapter = f", adapter {self.adapter}" if self.adapter else ""
        return f"policy {self.policy}, model {self.model or '-'}{adapter}, seed {self.seed}"


class PairedAbstention(Record):
    a: AbstentionTable
    b: AbstentionTable


class McNemarTest(Record):
    """Exact McNemar test of one yes/no outcome per paired question: the four cells of the paired
    table, of which only the discordant ones (yes in one run only) carry the test."""

    outcome: str  # "exact match", "abstained", "abstained (answerable gold)", ...
    pairs: int
    both: int
    only_a: int
    only_b: int
    neither: int
    p_value: float  # two-sided, Binomial(only_a + only_b, 1/2)


class Unpaired(Record):
    """Questions only one run scored. Their F1 is each run's on its own questions: not comparable."""

    only_in_a: int
    only_in_b: int
    answer_f1_a: float | None  # A on the questions B did not score
    answer_f1_b: float | None  # B on the questions A did not score
    unscored_a: int  # episodes without gold answers, never compared
    unscored_b: int


class PairedCalibration(Record):
    """Each run's calibration figures per probe on the paired questions (None: that run measured none)."""

    a: dict[str, ProbeCalibration] | None
    b: dict[str, ProbeCalibration] | None
    mass_a: dict[str, ProbeMass] | None = None  # the options' share of the distribution (evaluation.calibration.probe_mass)
    mass_b: dict[str, ProbeMass] | None = None
    notes: list[str] = []  # a probe the runs asked otherwise (another probes file, another minimum mass): ``probe_notes``


class QuestionDifference(Record):
    question_id: str
    question: str
    a: str
    b: str
    f1_a: float
    f1_b: float


class RunComparison(Record):
    """``explorer compare RUN_A RUN_B --json``: every figure on the paired questions unless under ``unpaired``."""

    run_a: str
    run_b: str
    same_corpus: bool | None  # None: a manifest does not record its corpus hash
    paired_questions: int
    # each compared answer metric by name, written flat here (each under its own key, in the registry's order)
    answer_metrics: dict[str, PairedMetric] = {}
    # per benchmark/subset on the paired questions, and LongBench's QA average (evaluation.benchmarks); None: no benchmark
    benchmarks: PairedBenchmarks | None = None
    model_tokens: PairedTokens
    setting_a: RunSetting
    setting_b: RunSetting
    compared: list[str] = []  # what of the policy differs ("policy", "model", "adapter"; evaluation.compare.compared_part)
    setting_differs: list[str]  # what else differs ("seed", "question selection", "max_steps", "temperature", ...)
    abstention: PairedAbstention
    direct_submit_rate: PairedFigure
    mcnemar_answers: list[McNemarTest]  # each compared yes/no answer metric both runs hold, in the registry's order
    mcnemar_abstention: list[McNemarTest]  # all paired questions, then by gold answerable / unanswerable
    fisher_abstention: list[FisherTest]
    unpaired: Unpaired
    largest_differences: list[QuestionDifference]
    calibration: PairedCalibration | None = None  # None: neither run measured an option probe

    def metric(self, name: str) -> PairedMetric | None:
        """A compared answer metric on the paired questions (None: it is not compared)."""
        return self.answer_metrics.get(name)

    def mcnemar(self, name: str) -> McNemarTest | None:
        """The McNemar test of a yes/no answer metric (None: not compared, or a run lacks it)."""
        outcome = answer_metric(name).label
        return next((test for test in self.mcnemar_answers if test.outcome == outcome), None)

    @property
    def answer_f1(self) -> PairedMetric:
        return self.answer_metrics[ANSWER_F1]

    @property
    def mcnemar_exact_match(self) -> McNemarTest:
        """The primary test of correctness: exact match, held by every scored episode."""
        test = self.mcnemar(EXACT_MATCH)
        if test is None:
            raise ValueError("the comparison holds no McNemar test of exact match")
        return test

    @model_validator(mode="before")
    @classmethod
    def _gather_metrics(cls, data: Any) -> Any:
        return gathered(data, "answer_metrics", {metric.name: metric.name for metric in answer_metrics()}, cls.__name__)

    @model_serializer(mode="wrap")
    def _flat(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        dumped = handler(self)
        values = dumped["answer_metrics"]
        return flattened(dumped, "answer_metrics", {m.name: values[m.name] for m in answer_metrics() if m.name in values})


def scored_by_question(run: Run) -> dict[str, EpisodeScore]:
    """A run's scored episodes by question id: of a run with --samples K, each question's first
    sample (the pass@k figures are in its metrics). A question scored twice cannot be paired."""
    scored: dict[str, EpisodeScore] = {}
    for score in run.scores:
        if not score.scored or score.question_id is None or score.sample != 0:
            continue
        if score.question_id in scored:
            raise EvaluationError(
                f"{run.directory}: question {score.question_id} is scored twice in scores.jsonl; compare needs one episode per question"
            )
        scored[score.question_id] = score
    return scored


def mcnemar(outcome: str, yes_a: list[bool], yes_b: list[bool]) -> McNemarTest:
    only_a, only_b = discordant_pairs(yes_a, yes_b)
    both = sum(1 for a, b in zip(yes_a, yes_b) if a and b)
    return McNemarTest(
        outcome=outcome,
        pairs=len(yes_a),
        both=both,
        only_a=only_a,
        only_b=only_b,
        neither=len(yes_a) - both - only_a - only_b,
        p_value=mcnemar_exact_p(only_a, only_b),
    )


def _mean(scores: list[EpisodeScore], value: Callable[[EpisodeScore], float]) -> float | None:
    return fmean(value(s) for s in scores) if scores else None


def _direct_submit(score: EpisodeScore) -> float:
    """1 when the direct_submit detector flagged the episode (as ``detector_rates`` counts it)."""
    return float(any(flag.detector == "direct_submit" for flag in score.flags))


def _corpus_hash(run: Run) -> str | None:
    return run.manifest.hashes.corpus_sha256


def run_setting(run: Run) -> RunSetting:
    config = run.manifest.config
    policy = config.policy.model_dump(mode="json", exclude=set(POLICY_IDENTITY + NOT_BEHAVIOUR))
    episode = config.episode.model_dump(mode="json", exclude=set(NOT_EPISODE_BEHAVIOUR))
    return RunSetting(
        policy=config.policy.name,
        model=model_of(config.policy),
        adapter=None if adapter_of(config.policy) is None else str(adapter_of(config.policy)),
        seed=config.episode.seed,
        selected_questions_sha256=config.selected_questions_sha256,
        policy_settings=policy,
        episode=episode,
        prompt_template_sha256=run.manifest.hashes.prompt_template_sha256,
    )


def compared_part(a: RunSetting, b: RunSetting) -> list[str]:
    """What of the policy differs - what a comparison compares: the policy itself, else its model
    (and adapter), else its adapter; empty when both runs ran the same policy."""
    if a.policy != b.policy:
        return ["policy"]
    if a.model != b.model:
        return ["model", "adapter"] if a.adapter != b.adapter else ["model"]
    return ["adapter"] if a.adapter != b.adapter else []


def confound_note(comparison: RunComparison) -> str | None:
    """The sentence the terminal and the report show when the runs differ in more than what is compared."""
    differs = comparison.setting_differs
    if not differs or (not comparison.compared and len(differs) == 1):
        return None  # one policy, one setting changed: that setting is what is compared
    if not comparison.compared:
        return f"the runs of one policy differ in {', '.join(differs)}: a paired difference measures them all at once"
    return f"the runs differ in {', '.join(differs)} besides the {' and '.join(comparison.compared)}: a paired difference measures that too"


def setting_differences(a: RunSetting, b: RunSetting) -> list[str]:
    """What else differs between two runs than what is compared (``compared_part``): the seed, the
    question selection, the prompt, the episode's limits and - between runs of one policy, whose
    settings mean the same - its decoding and recipe settings. A paired difference measures these
    too. When the policy is the same, every difference is listed: what is compared is then the
    setting the user changed, and any second one confounds it."""
    found = []
    if a.seed != b.seed:
        found.append("seed")
    if a.selected_questions_sha256 != b.selected_questions_sha256:
        found.append("question selection")
    if None not in (a.prompt_template_sha256, b.prompt_template_sha256) and a.prompt_template_sha256 != b.prompt_template_sha256:
        found.append("prompt template")
    found += [key for key in dict.fromkeys([*a.episode, *b.episode]) if a.episode.get(key) != b.episode.get(key)]
    if a.policy == b.policy:
        found += [
            key
            for key in dict.fromkeys([*a.policy_settings, *b.policy_settings])
            if a.policy_settings.get(key) != b.policy_settings.get(key)
        ]
    return found


def paired_metrics(pa: list[EpisodeScore], pb: list[EpisodeScore]) -> dict[str, PairedMetric]:
    """Each compared answer metric in both runs on the paired questions (``pa[i]`` and ``pb[i]`` answer
    one question): its figure in each run, B - A, and a paired interval where the metric declares one."""
    paired = {}
    for metric in answer_metrics():
        if not metric.compared:
            continue
        values_a, values_b = _values(pa, metric.name), _values(pb, metric.name)
        a = None if values_a is None or not values_a else metric.aggregate(values_a)
        b = None if values_b is None or not values_b else metric.aggregate(values_b)
        interval = None
        if metric.interval and values_a is not None and values_b is not None:
            interval = bootstrap_mean_ci([y - x for x, y in zip(values_a, values_b)])
        paired[metric.name] = PairedMetric(a=a, b=b, difference=None if a is None or b is None else b - a, paired_difference_ci95=interval)
    return paired


def _values(scores: list[EpisodeScore], name: str) -> list[float] | None:
    """A metric's value per episode; None when an episode was scored before the metric existed."""
    values = [score.metric(name) for score in scores]
    present = [value for value in values if value is not None]
    return present if len(present) == len(values) else None


def answer_mcnemar(pa: list[EpisodeScore], pb: list[EpisodeScore]) -> list[McNemarTest]:
    """Exact McNemar on each compared yes/no answer metric that both runs hold (1: yes)."""
    tests = []
    for metric in answer_metrics():
        values_a, values_b = _values(pa, metric.name), _values(pb, metric.name)
        if metric.compared and metric.yes_no and values_a is not None and values_b is not None:
            tests.append(mcnemar(metric.label, [v >= 1 for v in values_a], [v >= 1 for v in values_b]))
    return tests


def paired_tokens(pa: list[EpisodeScore], pb: list[EpisodeScore]) -> PairedTokens:
    pairs = [(x.model_tokens, y.model_tokens) for x, y in zip(pa, pb) if x.model_tokens is not None and y.model_tokens is not None]
    counted_a = [x.model_tokens for x in pa if x.model_tokens is not None]
    counted_b = [y.model_tokens for y in pb if y.model_tokens is not None]
    return PairedTokens(
        a=fmean(counted_a) if counted_a else None,
        b=fmean(counted_b) if counted_b else None,
        pairs=len(pairs),
        paired_difference_ci95=bootstrap_mean_ci([y - x for x, y in pairs]),
    )


def probe_notes(a: Run, b: Run, mass_a: dict[str, ProbeMass] | None, mass_b: dict[str, ProbeMass] | None) -> list[str]:
    """What differs in how both runs asked a probe they share, besides the runs themselves: its
    probes file (another wording: the figures compare the prompts too) and its minimum mass (other
    episodes left out). The probes change no episode, so they are no confound of the paired figures;
    they are one of the calibration table's."""

    def files(run: Run) -> dict[str, set[str]]:
        found: dict[str, set[str]] = {}
        for trajectory in run.trajectories:
            for result in trajectory.probes:
                if result.at_step is None:
                    found.setdefault(result.probe, set()).add(result.probes_sha256[:12])
        return found

    notes = []
    files_a, files_b = files(a), files(b)
    for probe in [name for name in files_a if name in files_b]:
        if files_a[probe] != files_b[probe]:
            notes.append(
                f"probe {probe} was asked from other probes files (A {', '.join(sorted(files_a[probe]))}; "
                f"B {', '.join(sorted(files_b[probe]))}): its figures compare the wordings too"
            )
        floors = [(mass or {}).get(probe) for mass in (mass_a, mass_b)]
        if None not in floors and floors[0].min_mass != floors[1].min_mass:  # type: ignore[union-attr]
            notes.append(
                f"probe {probe}'s episodes were held to other minimum masses (A {floors[0].min_mass:g}, "  # type: ignore[union-attr]
                f"B {floors[1].min_mass:g}): each run leaves out its own"  # type: ignore[union-attr]
            )
    return notes


def compare_runs(a: Run, b: Run, top: int = 10) -> RunComparison:
    """The paired comparison of B with A, and the questions whose F1 moved most."""
    by_a, by_b = scored_by_question(a), scored_by_question(b)
    shared = [qid for qid in by_a if qid in by_b]  # A's order: the order its questions were asked
    pa, pb = [by_a[q] for q in shared], [by_b[q] for q in shared]
    only_a = [s for q, s in by_a.items() if q not in by_b]
    only_b = [s for q, s in by_b.items() if q not in by_a]

    table_a, table_b = abstention_table(pa), abstention_table(pb)

    # an abstention is a decision only where both episodes made one: a pair in which either ended at
    # a limit or in a policy error is left out, as the abstention tables and Fisher leave it out
    decided = [i for i, (x, y) in enumerate(zip(pa, pb)) if x.status in ENDED_BY_POLICY and y.status in ENDED_BY_POLICY]
    abstained_a, abstained_b = [s.status == "abstained" for s in pa], [s.status == "abstained" for s in pb]
    abstention_tests = [mcnemar("abstained", [abstained_a[i] for i in decided], [abstained_b[i] for i in decided])]
    for gold, answerable in (("answerable", True), ("unanswerable", False)):
        rows = [i for i in decided if bool(pa[i].answerable) is answerable]  # A's gold: the same question in B
        abstention_tests.append(mcnemar(f"abstained ({gold} gold)", [abstained_a[i] for i in rows], [abstained_b[i] for i in rows]))

    calibration_a, calibration_b = run_calibration(pa), run_calibration(pb)
    mass_a, mass_b = probe_mass(pa), probe_mass(pb)
    corpus_a, corpus_b = _corpus_hash(a), _corpus_hash(b)
    moved = sorted(shared, key=lambda q: -abs(by_b[q].value(ANSWER_F1) - by_a[q].value(ANSWER_F1)))[:top]
    setting_a, setting_b = run_setting(a), run_setting(b)
    return RunComparison(
        run_a=str(a.directory),
        run_b=str(b.directory),
        same_corpus=None if corpus_a is None or corpus_b is None else corpus_a == corpus_b,
        paired_questions=len(shared),
        answer_metrics=paired_metrics(pa, pb),
        benchmarks=paired_benchmarks(pa, pb),
        model_tokens=paired_tokens(pa, pb),
        setting_a=setting_a,
        setting_b=setting_b,
        compared=compared_part(setting_a, setting_b),
        setting_differs=setting_differences(setting_a, setting_b),
        abstention=PairedAbstention(a=table_a, b=table_b),
        direct_submit_rate=PairedFigure(a=_mean(pa, _direct_submit), b=_mean(pb, _direct_submit)),
        mcnemar_answers=answer_mcnemar(pa, pb),
        mcnemar_abstention=abstention_tests,
        fisher_abstention=[abstention_fisher(table_a, table_b, "unanswerable"), abstention_fisher(table_a, table_b, "answerable")],
        unpaired=Unpaired(
            only_in_a=len(only_a),
            only_in_b=len(only_b),
            answer_f1_a=_mean(only_a, lambda s: s.value(ANSWER_F1)),
            answer_f1_b=_mean(only_b, lambda s: s.value(ANSWER_F1)),
            unscored_a=sum(1 for s in a.scores if not s.scored),
            unscored_b=sum(1 for s in b.scores if not s.scored),
        ),
        largest_differences=[
            QuestionDifference(
                question_id=q,
                question=by_a[q].question,
                a=by_a[q].prediction,
                b=by_b[q].prediction,
                f1_a=by_a[q].value(ANSWER_F1),
                f1_b=by_b[q].value(ANSWER_F1),
            )
            for q in moved
            if by_a[q].value(ANSWER_F1) != by_b[q].value(ANSWER_F1)
        ],
        calibration=None
        if all(figures is None for figures in (calibration_a, calibration_b, mass_a, mass_b))
        else PairedCalibration(a=calibration_a, b=calibration_b, mass_a=mass_a, mass_b=mass_b, notes=probe_notes(a, b, mass_a, mass_b)),
    )
