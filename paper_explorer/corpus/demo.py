"""A synthetic corpus of NLP/ML papers with QASPER-format questions, deterministic by seed.

Every paper proposes a uniquely named method for one task and states concrete facts about it:
datasets, baselines, scores, hyper-parameters, model size, hardware, training time, languages
and whether the code is released. Papers on the same task share datasets, baselines and
vocabulary, some methods come in families ("SpanMAT", "SpanMAT-Lite"), and related-work
sections name other papers' methods, so retrieval has real distractors.

Questions follow QASPER's answer types: extractive spans, yes/no, free-form, and unanswerable
ones. Unanswerable questions are near misses: the paper discusses the topic (it says the batch
size was tuned, or that the model is comparable in size to a baseline) but never states the
asked detail. The facts a paper omits are decided before its text is written, so no filler
sentence can leak them. Gold evidence is the exact paragraph that states the fact.

Determinism: one ``random.Random(seed)`` drives everything, nothing iterates over a set or
depends on hash order, so the same config gives byte-identical output in any process.

Why one module of this size: the generator's facts, its sentence templates and the questions
asked of them must agree (a fact a paper omits is never in its text); read together, they do.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from paper_explorer.corpus.collection import Corpus
from paper_explorer.corpus.loading import from_parts
from paper_explorer.corpus.schema import Answer, Paper, Question, Section

GENERATOR_VERSION = 1


@dataclass(frozen=True)
class DemoConfig:
    """Settings of ``generate``; the defaults give the bundled demo corpus."""

    papers: int = 416
    seed: int = 0
    #: Share of questions that are unanswerable (near misses), exact up to rounding.
    unanswerable_ratio: float = 0.5
    questions_per_paper: int = 3
    #: Train / validation / test shares of the papers; splits never share a paper.
    split_shares: tuple[float, float, float] = (0.7, 0.15, 0.15)

    def __post_init__(self) -> None:
        if self.papers < 1:
            raise ValueError(f"papers must be at least 1, got {self.papers}")
        if not 0 <= self.unanswerable_ratio <= 1:
            raise ValueError(f"unanswerable_ratio must lie in [0, 1], got {self.unanswerable_ratio}")
        if not 1 <= self.questions_per_paper <= 6:
            raise ValueError(f"questions_per_paper must lie in [1, 6], got {self.questions_per_paper}")
        if len(self.split_shares) != 3 or min(self.split_shares) < 0 or abs(sum(self.split_shares) - 1) > 1e-9:
            raise ValueError(f"split_shares must be three non-negative shares summing to 1, got {self.split_shares}")


@dataclass(frozen=True)
class Task:
    name: str
    short: str
    metric: str
    datasets: tuple[str, ...]
    baselines: tuple[str, ...]
    multilingual: bool
    unit: str = "input"


TASKS = (
    Task(
        "named entity recognition",
        "NER",
        "F1",
        ("CoNLL-2003", "OntoNotes 5.0", "WNUT-17", "WikiNER", "BC5CDR"),
        ("BiLSTM-CRF", "BERT-base", "LUKE", "Flair", "RoBERTa-large"),
        True,
        "sentence",
    ),
    Task(
        "machine translation",
        "MT",
        "BLEU",
        ("WMT14 En-De", "WMT16 En-Ro", "IWSLT14 De-En", "FLORES-101", "WMT19 Zh-En"),
        ("Transformer-big", "mBART", "ConvS2S", "Marian", "M2M-100"),
        True,
        "sentence pair",
    ),
    Task(
        "sentiment analysis",
        "SA",
        "accuracy",
        ("SST-2", "IMDb", "Yelp-5", "Amazon Reviews", "SemEval-2017"),
        ("TextCNN", "BERT-base", "XLNet", "ELECTRA", "RoBERTa-base"),
        False,
        "review",
    ),
    Task(
        "extractive question answering",
        "QA",
        "exact match",
        ("SQuAD 1.1", "SQuAD 2.0", "NaturalQuestions", "TriviaQA", "HotpotQA"),
        ("BiDAF", "BERT-large", "SpanBERT", "ALBERT", "DeBERTa"),
        False,
        "question",
    ),
    Task(
        "abstractive summarization",
        "SUM",
        "ROUGE-L",
        ("CNN/DailyMail", "XSum", "arXiv", "PubMed", "Multi-News"),
        ("PEGASUS", "BART-large", "T5-base", "Pointer-Generator", "LED"),
        False,
        "document",
    ),
    Task(
        "dependency parsing",
        "DP",
        "LAS",
        ("Penn Treebank", "Universal Dependencies 2.8", "CTB5", "UD English-EWT", "UD German-GSD"),
        ("Biaffine parser", "UDPipe", "Stanza", "StackPointer", "UDify"),
        True,
        "sentence",
    ),
    Task(
        "natural language inference",
        "NLI",
        "accuracy",
        ("SNLI", "MultiNLI", "XNLI", "ANLI", "SciTail"),
        ("ESIM", "BERT-base", "RoBERTa-large", "DeBERTa", "InferSent"),
        True,
        "premise-hypothesis pair",
    ),
    Task(
        "relation extraction",
        "RE",
        "micro F1",
        ("TACRED", "DocRED", "SemEval-2010 Task 8", "NYT10", "ChemProt"),
        ("PCNN", "SpanBERT", "LUKE", "ATLOP", "BERT-base"),
        False,
        "sentence",
    ),
    Task(
        "speech recognition",
        "ASR",
        "word error rate",
        ("LibriSpeech", "Common Voice", "TED-LIUM 3", "Switchboard", "AISHELL-1"),
        ("wav2vec 2.0", "Conformer", "DeepSpeech 2", "QuartzNet", "Whisper-small"),
        True,
        "utterance",
    ),
    Task(
        "text classification",
        "TC",
        "macro F1",
        ("AG News", "DBpedia", "20 Newsgroups", "TREC", "Yahoo Answers"),
        ("fastText", "TextCNN", "BERT-base", "XLNet", "HAN"),
        False,
        "document",
    ),
    Task(
        "code generation",
        "CG",
        "pass@1",
        ("HumanEval", "MBPP", "APPS", "CodeContests", "DS-1000"),
        ("Codex", "CodeT5", "InCoder", "StarCoder", "CodeGen-2B"),
        False,
        "problem",
    ),
    Task(
        "image captioning",
        "IC",
        "CIDEr",
        ("MS COCO", "Flickr30k", "NoCaps", "Conceptual Captions", "TextCaps"),
        ("Show-Attend-Tell", "OSCAR", "BLIP", "VinVL", "ClipCap"),
        False,
        "image",
    ),
)

PREFIXES = (
    "Span",
    "Hi",
    "Co",
    "Dyn",
    "Graph",
    "Meta",
    "Cross",
    "Deep",
    "Sparse",
    "Adapt",
    "Contra",
    "Lex",
    "Syn",
    "Poly",
    "Uni",
    "Omni",
    "Tree",
    "Retro",
    "Mem",
    "Proto",
    "Quant",
    "Fusion",
    "Relay",
    "Echo",
)
CORES = (
    "MAT",
    "Former",
    "BERT",
    "Net",
    "Flow",
    "Gate",
    "Align",
    "Route",
    "Mix",
    "Lens",
    "Tune",
    "Attn",
    "Rank",
    "Path",
    "Grid",
    "Link",
    "Fuse",
    "Prompt",
    "Distill",
    "Sum",
)
FAMILY_SUFFIXES = ("-Lite", "-XL", "++", "-2", "-Base", "-Large")
COMPONENTS = (
    "hierarchical attention",
    "gated fusion",
    "contrastive alignment",
    "span-level memory",
    "graph propagation",
    "dynamic routing",
    "adapter layers",
    "mixture of experts",
    "retrieval augmentation",
    "structured pruning",
    "curriculum sampling",
    "token mixing",
    "relative position encoding",
    "latent alignment",
)
LANGUAGES = ("English", "German", "French", "Spanish", "Chinese", "Arabic", "Hindi", "Russian", "Japanese", "Swahili", "Finnish", "Turkish")
HARDWARE = ("NVIDIA V100", "NVIDIA A100", "NVIDIA RTX 3090", "NVIDIA T4", "TPU v3", "NVIDIA H100", "NVIDIA L4")
OPTIMIZERS = ("Adam", "AdamW", "SGD with momentum", "Adafactor", "LAMB")
LEARNING_RATES = ("1e-5", "2e-5", "3e-5", "5e-5", "1e-4", "3e-4", "5e-4", "1e-3")
BATCH_SIZES = (8, 16, 32, 64, 128, 256)
ADJECTIVES = ("Efficient", "Robust", "Scalable", "Hierarchical", "Contrastive", "Lightweight", "Adaptive", "Structured")

#: Facts a paper may omit, each the subject of one near-miss unanswerable question.
OMITTABLE = ("batch_size", "heads", "parameters", "training_time", "dropout", "other_dataset")


@dataclass
class Facts:
    method: str
    task: Task
    component: str
    datasets: list[str]
    unused_dataset: str
    baselines: list[str]
    scores: dict[str, dict[str, float]]  # dataset -> system -> score
    learning_rate: str
    batch_size: int
    optimizer: str
    epochs: int
    dropout: float
    layers: int
    hidden_size: int
    heads: int
    parameters_m: int
    gpus: int
    hardware: str
    hours: int
    languages: list[str]
    code_released: bool
    omitted: set[str] = field(default_factory=set)
    evidence: dict[str, str] = field(default_factory=dict)  # fact name -> the paragraph stating it


def _method_names(rng: random.Random, count: int) -> list[str]:
    """Unique method names; about one in six extends an earlier name into a family."""
    names: list[str] = []
    taken: set[str] = set()
    while len(names) < count:
        if names and rng.random() < 0.17:
            name = rng.choice(names) + rng.choice(FAMILY_SUFFIXES)
        else:
            name = rng.choice(PREFIXES) + rng.choice(CORES)
        if name in taken:
            name = f"{name}-{len(names)}"
        taken.add(name)
        names.append(name)
    return names


def _higher_is_better(task: Task) -> bool:
    return task.metric != "word error rate"


def _facts(rng: random.Random, method: str) -> Facts:
    task = rng.choice(TASKS)
    pool = list(task.datasets)
    rng.shuffle(pool)
    n_datasets = rng.randint(1, 3)
    datasets, unused = pool[:n_datasets], pool[n_datasets]
    baselines = rng.sample(task.baselines, rng.randint(2, 3))
    better = _higher_is_better(task)
    scores: dict[str, dict[str, float]] = {}
    for i, dataset in enumerate(datasets):
        base = {name: round(rng.uniform(55, 88) if better else rng.uniform(4, 25), 1) for name in baselines}
        best = max(base.values()) if better else min(base.values())
        # The method wins on its main dataset; elsewhere it sometimes loses (yes/no questions need both).
        margin = rng.uniform(0.4, 4.0) if i == 0 or rng.random() < 0.7 else -rng.uniform(0.3, 2.0)
        ours = round(best + margin if better else best - margin, 1)
        scores[dataset] = {method: ours, **base}
    languages = ["English"]
    if task.multilingual and rng.random() < 0.6:
        languages += rng.sample(LANGUAGES[1:], rng.randint(1, 4))
    layers = rng.choice((4, 6, 8, 12, 24))
    hidden = rng.choice((256, 512, 768, 1024))
    return Facts(
        method=method,
        task=task,
        component=rng.choice(COMPONENTS),
        datasets=datasets,
        unused_dataset=unused,
        baselines=baselines,
        scores=scores,
        learning_rate=rng.choice(LEARNING_RATES),
        batch_size=rng.choice(BATCH_SIZES),
        optimizer=rng.choice(OPTIMIZERS),
        epochs=rng.randint(3, 40),
        dropout=rng.choice((0.1, 0.2, 0.3, 0.5)),
        layers=layers,
        hidden_size=hidden,
        heads=rng.choice((4, 8, 12, 16)),
        parameters_m=max(5, int(layers * hidden * hidden * 12 / 1e6 + rng.randint(0, 40))),
        gpus=rng.choice((1, 2, 4, 8)),
        hardware=rng.choice(HARDWARE),
        hours=rng.randint(2, 96),
        languages=languages,
        code_released=rng.random() < 0.6,
    )


# ---------------------------------------------------------------------------------------------
# Text. Filler sentences never state a number or a hyper-parameter value, so they cannot leak
# an omitted fact; they do repeat the task's vocabulary so that papers compete in retrieval.

FILLER = (
    "Progress on {task} has been driven by larger pretrained encoders and better benchmarks.",
    "Most systems for {task} still treat each {unit} independently of its context.",
    "We argue that {component} is a natural fit for the structure of {task}.",
    "Errors in {task} often come from rare entities, long inputs and annotation noise.",
    "Prior work on {task} has mostly focused on English benchmarks such as {dataset}.",
    "A recurring difficulty is that strong baselines like {baseline} are expensive to fine-tune.",
    "The design of {method} keeps the inference cost close to that of a standard encoder.",
    "We describe each component of {method} and motivate the choices we made.",
    "Ablations indicate that {component} contributes most of the gain.",
    "The representation of each {unit} is computed once and reused across layers.",
    "Qualitative inspection shows that {method} attends to the informative parts of each {unit}.",
    "Remaining errors are concentrated on ambiguous cases that annotators also disagree on.",
    "Earlier approaches to {task} relied on hand-crafted features and pipelines.",
    "{baseline} remains a strong reference point for {task} on {dataset}.",
    "Our analysis follows the evaluation protocol that is standard for {dataset}.",
    "Several studies report that gains on {dataset} do not always transfer to other domains.",
    "We also examine how {method} behaves when the training data is reduced.",
    "The loss combines the task objective with an auxiliary term for {component}.",
    "Each layer of the encoder applies {component} before the feed-forward block.",
    "This makes {method} easy to combine with existing models for {task}.",
    "We compare against published numbers where the original code was unavailable.",
    "Future work will extend {method} to related problems beyond {task}.",
    "Limitations include the reliance on labelled data and on a fixed vocabulary.",
    "Our findings suggest that {component} is underexplored for {task}.",
    "Results are averaged over several runs with different random seeds.",
    "We follow the official train, development and test partitions of each benchmark.",
    "The error analysis groups mistakes by {unit} length and by frequency.",
    "Related approaches combine {component} with pretrained language models.",
)


class _Writer:
    def __init__(self, rng: random.Random, facts: Facts, others: list[str]) -> None:
        self.rng = rng
        self.facts = facts
        self.others = others

    def slots(self) -> dict[str, str]:
        f = self.facts
        return {
            "task": f.task.name,
            "unit": f.task.unit,
            "component": f.component,
            "method": f.method,
            "dataset": self.rng.choice(f.task.datasets),
            "baseline": self.rng.choice(f.task.baselines),
        }

    def filler(self, sentences: int | None = None) -> str:
        count = sentences or self.rng.randint(3, 5)
        return " ".join(self.rng.choice(FILLER).format(**self.slots()) for _ in range(count))

    def fact(self, name: str, sentence: str) -> str:
        """A paragraph stating one fact among filler; it becomes that fact's gold evidence."""
        text = f"{self.filler(1)} {sentence} {self.filler(self.rng.randint(1, 2))}"
        self.facts.evidence[name] = text
        return text


def _joined(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _paper(rng: random.Random, paper_id: str, facts: Facts, others: list[str]) -> Paper:
    f, w = facts, _Writer(rng, facts, others)
    t = f.task
    main = f.datasets[0]
    ours, best_name = f.scores[main][f.method], _best_baseline(f, main)
    gain = abs(ours - f.scores[main][best_name])
    title = f"{f.method}: {rng.choice(ADJECTIVES)} {f.component.title()} for {t.name.title()}"
    abstract = (
        f"We present {f.method}, a model for {t.name} built on {f.component}. "
        f"On {main}, {f.method} reaches {ours} {t.metric}, {gain:.1f} points better than {best_name}. "
        f"{w.filler(2)}"
    )
    cited = rng.sample(others, min(3, len(others)))
    sections: list[tuple[str, list[str]]] = []

    intro = [w.filler(), w.filler(), w.filler()]
    intro.insert(
        rng.randint(1, 3),
        w.fact(
            "code",
            (
                f"The code and trained models of {f.method} are publicly available."
                if f.code_released
                else f"We do not release the code of {f.method} at this time because of licensing constraints."
            ),
        ),
    )
    sections.append(("Introduction", intro))

    related = [w.filler() for _ in range(5)]
    related.append(
        f"{w.filler(1)} Closely related systems include {_joined(cited)}, which also target {t.name}. {w.filler(1)}"
        if cited
        else w.filler()
    )
    sections.append(("Related Work", related))

    encoder = f"The encoder of {f.method} has {f.layers} layers with a hidden size of {f.hidden_size}" + (
        "." if "heads" in f.omitted else f" and {f.heads} attention heads per layer."
    )
    if "heads" in f.omitted:
        encoder += " The attention layers follow the standard multi-head design."
    size = (
        "The model is comparable in size to its strongest baseline."
        if "parameters" in f.omitted
        else f"In total, {f.method} has {f.parameters_m}M parameters."
    )
    method_paragraphs = [w.filler(), w.fact("layers", encoder), w.filler(), w.fact("parameters", size), w.filler()]
    sections.append(("Method", method_paragraphs[:2]))
    sections.append(("Method ::: Architecture", method_paragraphs[2:] + [w.filler()]))

    data_sentence = f"We evaluate {f.method} on {_joined(f.datasets)}." if len(f.datasets) > 1 else f"We evaluate {f.method} on {main}."
    if "other_dataset" in f.omitted:
        data_sentence += f" We leave other {t.name} benchmarks for future work."
    language_sentence = (
        "All experiments use English data only." if f.languages == ["English"] else f"The experiments cover {_joined(f.languages)}."
    )
    sections.append(("Experiments ::: Datasets", [w.fact("datasets", data_sentence), w.fact("languages", language_sentence), w.filler()]))
    sections.append(
        (
            "Experiments ::: Baselines",
            [
                w.fact("baselines", f"We compare {f.method} against {_joined(f.baselines)}."),
                w.filler(),
            ],
        )
    )

    setup = f"We train {f.method} with {f.optimizer} and a learning rate of {f.learning_rate} for {f.epochs} epochs"
    setup += ". The batch size was tuned on the development set." if "batch_size" in f.omitted else f" with a batch size of {f.batch_size}."
    dropout = (
        "Regularisation follows the settings of prior work."
        if "dropout" in f.omitted
        else f"Dropout of {f.dropout} is applied after every layer."
    )
    hardware = f"Training uses {f.gpus} {f.hardware} GPUs" if "TPU" not in f.hardware else f"Training uses {f.gpus} {f.hardware} cores"
    hardware += ". Training fits comfortably on this hardware." if "training_time" in f.omitted else f" and takes about {f.hours} hours."
    sections.append(
        (
            "Experiments ::: Implementation Details",
            [
                w.fact("setup", setup),
                w.fact("dropout", dropout),
                w.fact("hardware", hardware),
                w.filler(),
            ],
        )
    )

    results = [w.filler()]
    for dataset in f.datasets:
        row = f.scores[dataset]
        listed = ", ".join(f"{name} {row[name]}" for name in f.baselines)
        results.append(
            w.fact(f"result:{dataset}", (f"On {dataset}, {f.method} obtains {row[f.method]} {t.metric}, compared with {listed}."))
        )
    results += [w.filler(), w.filler()]
    sections.append(("Results", results))
    sections.append(("Analysis", [w.filler() for _ in range(rng.randint(5, 8))]))
    sections.append(
        (
            "Conclusion",
            [
                f"We introduced {f.method} for {t.name}. {w.filler(2)}",
                w.filler(),
            ],
        )
    )
    return Paper(
        id=paper_id,
        title=title,
        abstract=abstract,
        sections=tuple(Section(name=name, paragraphs=tuple(paragraphs)) for name, paragraphs in sections),
    )


def _best_baseline(f: Facts, dataset: str) -> str:
    row = {name: row_score for name, row_score in f.scores[dataset].items() if name != f.method}
    pick = max if _higher_is_better(f.task) else min
    return pick(row, key=lambda name: (row[name], name))


# ---------------------------------------------------------------------------------------------
# Questions. Each builder returns (text, answer fields, evidence fact names) or None when the
# paper lacks what the question needs.


def _answerable_questions(rng: random.Random, f: Facts) -> list[tuple[str, dict, list[str]]]:
    m, t = f.method, f.task
    other = f.baselines[0]
    dataset = rng.choice(f.datasets)
    ours, theirs = f.scores[dataset][m], f.scores[dataset][other]
    beats = ours > theirs if _higher_is_better(t) else ours < theirs
    best = _best_baseline(f, f.datasets[0])
    gain = abs(f.scores[f.datasets[0]][m] - f.scores[f.datasets[0]][best])
    options: list[tuple[str, dict, list[str]]] = [
        (f"Which datasets is {m} evaluated on?", {"extractive_spans": tuple(f.datasets)}, ["datasets"]),
        (f"What baselines is {m} compared against?", {"extractive_spans": tuple(f.baselines)}, ["baselines"]),
        (f"What learning rate is used to train {m}?", {"extractive_spans": (f.learning_rate,)}, ["setup"]),
        (f"Which optimizer is used to train {m}?", {"extractive_spans": (f.optimizer,)}, ["setup"]),
        (f"How many layers does the encoder of {m} have?", {"extractive_spans": (str(f.layers),)}, ["layers"]),
        (f"What hardware is {m} trained on?", {"extractive_spans": (f"{f.gpus} {f.hardware}",)}, ["hardware"]),
        (f"Is the code of {m} publicly released?", {"yes_no": f.code_released}, ["code"]),
        (f"Does {m} outperform {other} on {dataset}?", {"yes_no": beats}, [f"result:{dataset}"]),
        (f"Is {m} evaluated on languages other than English?", {"yes_no": len(f.languages) > 1}, ["languages"]),
        (
            f"How much does {m} improve over the strongest baseline on {f.datasets[0]}?",
            {"free_form_answer": f"By {gain:.1f} {t.metric} points over {best}."},
            [f"result:{f.datasets[0]}"],
        ),
    ]
    if len(f.languages) > 1:
        options.append((f"Which languages does {m} cover?", {"extractive_spans": tuple(f.languages)}, ["languages"]))
    if "batch_size" not in f.omitted:
        options.append((f"What batch size is used to train {m}?", {"extractive_spans": (str(f.batch_size),)}, ["setup"]))
    if "training_time" not in f.omitted:
        options.append(
            (f"How long does it take to train {m}?", {"free_form_answer": f"About {f.hours} hours on {f.gpus} {f.hardware}."}, ["hardware"])
        )
    if "parameters" not in f.omitted:
        options.append((f"How many parameters does {m} have?", {"extractive_spans": (f"{f.parameters_m}M",)}, ["parameters"]))
    return options


def _unanswerable_question(f: Facts, fact: str) -> str:
    """The near-miss question for an omitted fact (the paper discusses the topic, see _paper)."""
    m = f.method
    return {
        "batch_size": f"What batch size is used to train {m}?",
        "heads": f"How many attention heads does {m} use?",
        "parameters": f"How many parameters does {m} have?",
        "training_time": f"How long does it take to train {m}?",
        "dropout": f"What dropout rate is used in {m}?",
        "other_dataset": f"What {f.task.metric} does {m} reach on {f.unused_dataset}?",
    }[fact]


def generate(config: DemoConfig = DemoConfig()) -> Corpus:
    """The demo corpus for ``config``; equal configs give byte-identical exports."""
    rng = random.Random(config.seed)
    n = config.papers
    total_questions = n * config.questions_per_paper
    unanswerable_count = round(config.unanswerable_ratio * total_questions)
    is_unanswerable = [True] * unanswerable_count + [False] * (total_questions - unanswerable_count)
    rng.shuffle(is_unanswerable)
    order = list(range(n))
    rng.shuffle(order)
    train_end = round(config.split_shares[0] * n)
    validation_end = train_end + round(config.split_shares[1] * n)
    split_of = {}
    for rank, index in enumerate(order):
        split_of[index] = "train" if rank < train_end else "validation" if rank < validation_end else "test"

    names = _method_names(rng, n)
    papers: list[Paper] = []
    questions: list[Question] = []
    width = max(5, len(str(n - 1)))
    for i, method in enumerate(names):
        paper_id = f"demo-{i:0{width}d}"
        facts = _facts(rng, method)
        flags = is_unanswerable[i * config.questions_per_paper : (i + 1) * config.questions_per_paper]
        facts.omitted = set(rng.sample(OMITTABLE, sum(flags)))
        others = [names[j] for j in rng.sample(range(n), min(4, n)) if j != i]
        paper = _paper(rng, paper_id, facts, others).model_copy(update={"split": split_of[i]})
        papers.append(paper)

        answerable = _answerable_questions(rng, facts)
        rng.shuffle(answerable)
        omitted = sorted(facts.omitted)
        rng.shuffle(omitted)
        for j, unanswerable in enumerate(flags):
            if unanswerable:
                text = _unanswerable_question(facts, omitted.pop())
                answer = Answer(unanswerable=True, annotation_id=f"{paper_id}-q{j}-a0", worker_id="generator")
            else:
                text, fields, evidence_facts = answerable.pop()
                evidence = tuple(facts.evidence[name] for name in evidence_facts)
                answer = Answer(
                    **fields,
                    evidence=evidence,
                    highlighted_evidence=evidence,
                    annotation_id=f"{paper_id}-q{j}-a0",
                    worker_id="generator",
                )
            questions.append(Question(id=f"{paper_id}-q{j}", paper_id=paper_id, text=text, answers=(answer,), question_writer="generator"))
    return from_parts(papers, questions, source=f"demo(papers={n}, seed={config.seed})")
