"""``explorer serve``'s HTTP API: typed questions about one document in, a probability for every
option out, each question with its confidence (FastAPI; /openapi.json and /docs describe it).

A question is scored as ``explorer decide`` scores it (``prompts.build``, ``Backend.score`` in
shared mode, ``likelihood.normalised``/``confidence``): the same prompt gives the same numbers.
One model serves every request: its scorer keeps one KV cache and is not thread-safe, so the
scoring of a request holds ``DecisionService.lock`` (the questions of one request run one after
another and share their document's cache) while FastAPI keeps accepting connections; the
endpoints are plain ``def``, run in its thread pool, so the event loop never waits on the model.
Parsing and tokenising happen outside the lock.

Every refusal is a JSON body of FastAPI's validation shape, ``{"detail": [{"loc", "msg",
"type"}]}``, naming the field: 422 for a malformed or unanswerable request (a field missing or of
the wrong type, a label not among the options, a document over the context with ``cut`` none),
413 for one over the server's limits (``ServeLimits``: body bytes, document tokens, questions).
A document is never cut unless the request's ``cut`` says where, and the reply says what was cut.

Why one module: the request and reply models, the limits, the refusals' shape and the scoring under
the lock are one API, and /openapi.json is generated from them together; split, a check the
handler relies on (a limit, a field's bound) could drift from the schema that documents it.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

from fastapi import FastAPI, HTTPException, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from paper_explorer.agent.errors import AgentError
from paper_explorer.agent.served import ids_sha256
from paper_explorer.decisions.backends import Backend
from paper_explorer.decisions.likelihood import confidence, normalised
from paper_explorer.decisions.prompts import Built, PromptTexts, build, indistinct, load_prompts
from paper_explorer.decisions.schema import DOCUMENT_CHARS, MAX_OPTIONS, DecisionQuestion, Text, too_long

API_VERSION = "1"
_UNREADABLE = {
    RecursionError: "nested too deeply",
    ValueError: "a number of too many digits",
    UnicodeDecodeError: "not UTF-8, UTF-16 or UTF-32",
}
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


@dataclass(frozen=True)
class ServeLimits:
    """What one request may hold; over any of them it is refused with 413, naming the field."""

    body_bytes: int = 16 * 2**20  # the request body as sent
    document_tokens: int = 1_048_576  # the document, tokenised (before any cut)
    questions: int = 64  # questions in one request


class DecisionRequest(BaseModel):
    """One document and the typed questions asked about it."""

    model_config = ConfigDict(extra="forbid")

    document: Text = Field(description="The document, verbatim (tokenised by the model's tokenizer).")
    questions: list[DecisionQuestion] = Field(
        min_length=1,
        description=(
            f"Typed questions (noul, choice, score), 2 to {MAX_OPTIONS} options each (noul: none, or yes, no, unknown). "
            "A label must be one of the options and comes back with `correct`; negation_of must name a noul question "
            "of this request. Ids are unique within the request."
        ),
    )
    cut: Literal["none", "start", "end"] = Field(
        default="none",
        description="A document over the context: none refuses the request (422); start or end drops the tokens over from there.",
    )
    order: Literal["given", "reversed"] = Field(
        default="given", description="reversed: list and score every question's options last first."
    )


class OptionAnswer(BaseModel):
    option: str
    probability: float = Field(description="Normalised over the question's options.")
    loglikelihood: float = Field(description="The sum of the log-probabilities of the option's continuation tokens.")
    tokens: int = Field(description="The continuation's length: the option's tokens and the end of turn.")


class CutMade(BaseModel):
    side: Literal["start", "end"]
    tokens: int = Field(description="Document tokens dropped.")
    kept: int = Field(description="Document tokens kept.")


class QuestionAnswer(BaseModel):
    id: str
    kind: Literal["noul", "choice", "score"]
    options: list[OptionAnswer] = Field(description="In the order listed and scored (reversed under order=reversed).")
    predicted: str = Field(description="The likeliest option.")
    p_max: float
    confidence: float = Field(description="(K * p_max - 1) / (K - 1): 0 when the K options are equally likely, 1 when one holds all.")
    log_mass: float = Field(description="The log of the options' total probability under the model.")
    prompt_tokens: int
    prompt_sha256: str = Field(description="Of the prompt's token ids, as explorer decide records it: the same prompt, the same numbers.")
    document_tokens: int = Field(description="The document's tokens before any cut.")
    cut: CutMade | None = Field(description="What was cut from the document to fit this question's prompt; null: nothing.")
    ordered: bool
    label: str | None
    correct: bool | None = Field(description="predicted == label, where a label was given.")
    negation_of: str | None


class DecisionReply(BaseModel):
    model: str
    context: int = Field(description="The most tokens a prompt and its longest option may take.")
    prompts_sha256: str
    questions: list[QuestionAnswer]


class Health(BaseModel):
    model: str
    context: int
    ready: bool = Field(description="The model is loaded and answers.")
    waiting: int = Field(description="Requests waiting for the model now.")


class ModelInfo(BaseModel):
    backend: str
    settings: dict[str, Any] = Field(description="The model's settings, as explorer decide records them in its manifest.")
    context: int
    prompts_sha256: str
    limits: dict[str, int]


class Refused(HTTPException):
    """A request refused with ``status``: one problem, at ``loc`` (FastAPI's location: "body", field, ...)."""

    def __init__(self, status: int, loc: tuple[str | int, ...], msg: str, kind: str) -> None:
        super().__init__(status_code=status, detail=msg)
        self.loc, self.msg, self.kind = loc, msg, kind

    def response(self) -> JSONResponse:
        return JSONResponse({"detail": [{"loc": list(self.loc), "msg": self.msg, "type": self.kind}]}, status_code=self.status_code)


class DecisionService:
    """The model, its prompts and the lock its scorer is used under."""

    def __init__(self, backend: Backend, limits: ServeLimits, texts: PromptTexts) -> None:
        self.backend, self.limits, self.texts = backend, limits, texts
        self.model = str(backend.settings().get("model", backend.name))
        self.lock = threading.Lock()
        self._count_lock = threading.Lock()
        self.waiting = 0

    def answer(self, request: DecisionRequest) -> DecisionReply:
        _check_questions(request, self.limits)
        if len(request.document) > DOCUMENT_CHARS:  # a larger --max-body-mb lets one through; tokenising it would take gigabytes
            raise Refused(413, ("body", "document"), too_long(len(request.document)), "too_large")
        try:
            document = self.backend.renderer.text(request.document)
        except AgentError as error:  # text the tokenizer cannot read (a lone surrogate)
            raise Refused(422, ("body", "document"), f"the document cannot be tokenised: {error}", "value_error") from None
        if len(document) > self.limits.document_tokens:
            raise Refused(
                413,
                ("body", "document"),
                f"the document is {len(document):,} tokens, over this server's limit of {self.limits.document_tokens:,}; send a shorter one",
                "too_large",
            )
        built = [self._built(index, question, document, request) for index, question in enumerate(request.questions)]
        with self._count_lock:
            self.waiting += 1
        with self.lock:
            with self._count_lock:
                self.waiting -= 1
            scored = [self._scored(index, made) for index, made in enumerate(built)]
        answers = [
            _answer(question, options, made, loglikelihoods)
            for question, (options, made), loglikelihoods in zip(request.questions, built, scored)
        ]
        return DecisionReply(model=self.model, context=self.backend.max_context, prompts_sha256=self.texts.sha256, questions=answers)

    def _built(self, index: int, question: DecisionQuestion, document: list[int], request: DecisionRequest) -> tuple[list[str], Built]:
        options = list(question.choices)
        if request.order == "reversed":
            options.reverse()
        context = self.backend.max_context
        where = ("body", "questions", index)
        try:
            problem = indistinct(self.backend.renderer, options)
            if problem is not None:
                raise Refused(422, (*where, "options"), f"question {question.id!r}: {problem}", "value_error")
            made = build(
                self.backend.renderer, self.texts, question.kind, question.text, document, options, context=context, cut=request.cut
            )
            if made.prompt is not None:
                return options, made
            # How far over: the cut ``cut=end`` would make (none when not even an empty document fits).
            trial = build(self.backend.renderer, self.texts, question.kind, question.text, document, options, context=context, cut="end")
        except AgentError as error:  # a question or option the tokenizer cannot read
            raise Refused(422, where, f"question {question.id!r} cannot be tokenised: {error}", "value_error") from None
        if trial.cut is None:
            raise Refused(
                422,
                where,
                f"question {question.id!r}: its prompt and longest option leave no room for the document in the context of {context} tokens; "
                "shorten its text or options",
                "context_overflow",
            )
        raise Refused(
            422,
            ("body", "document"),
            f"the document is {trial.cut.tokens:,} tokens over what the context of {context} leaves for question {question.id!r} "
            f"(its prompt and longest option); set cut to start or end to drop them there",
            "context_overflow",
        )

    def _scored(self, index: int, built: tuple[list[str], Built]) -> list[float]:
        _, made = built
        assert made.prompt is not None  # _built refused every question without a prompt
        try:
            return self.backend.score(made.prompt, made.options, "shared").loglikelihoods
        except (AgentError, RuntimeError, OSError) as error:  # the model failed (memory): the request, not the server
            raise Refused(
                500, ("body", "questions", index), f"scoring failed: {type(error).__name__}: {error}"[:300], "scoring_failed"
            ) from None


def _check_questions(request: DecisionRequest, limits: ServeLimits) -> None:
    """What one question's schema cannot see: the request's limit, unique ids, negations in it."""
    if len(request.questions) > limits.questions:
        raise Refused(
            413,
            ("body", "questions"),
            f"{len(request.questions)} questions, over this server's limit of {limits.questions} per request; send them in several requests",
            "too_large",
        )
    kinds: dict[str, str] = {}
    for index, question in enumerate(request.questions):
        if question.id in kinds:
            raise Refused(
                422, ("body", "questions", index, "id"), f"question id {question.id!r} is given twice; give each its own", "value_error"
            )
        kinds[question.id] = question.kind
    for index, question in enumerate(request.questions):
        if question.negation_of is not None and kinds.get(question.negation_of) != "noul":
            raise Refused(
                422,
                ("body", "questions", index, "negation_of"),
                f"question {question.id!r} negates {question.negation_of!r}, which is no noul question of this request",
                "value_error",
            )


def _answer(question: DecisionQuestion, options: list[str], built: Built, loglikelihoods: list[float]) -> QuestionAnswer:
    probabilities, log_mass = normalised(loglikelihoods)
    best = max(range(len(options)), key=probabilities.__getitem__)
    assert built.prompt is not None
    return QuestionAnswer(
        id=question.id,
        kind=question.kind,
        options=[
            OptionAnswer(option=option, probability=probability, loglikelihood=value, tokens=len(ids))
            for option, probability, value, ids in zip(options, probabilities, loglikelihoods, built.options)
        ],
        predicted=options[best],
        p_max=probabilities[best],
        confidence=confidence(probabilities),
        log_mass=log_mass,
        prompt_tokens=len(built.prompt),
        prompt_sha256=ids_sha256(built.prompt),
        document_tokens=built.document_tokens,
        cut=CutMade(side=built.cut.side, tokens=built.cut.tokens, kept=built.cut.kept) if built.cut else None,
        ordered=question.is_ordered,
        label=question.label,
        correct=None if question.label is None else options[best] == question.label,
        negation_of=question.negation_of,
    )


class BodyLimit:
    """Refuses a request body over ``limit`` bytes with 413: at once when its Content-Length says so,
    else as soon as the bytes received pass it (a chunked body), before it is parsed."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await self._refusal(int(declared)).response()(scope, receive, send)
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise self._refusal(received)  # inside FastAPI's body parsing: answered by its handler
            return message

        await self.app(scope, counted, send)

    def _refusal(self, size: int) -> Refused:
        return Refused(
            413,
            ("body",),
            f"the body is {size:,} bytes or more, over this server's limit of {self.limit:,}; send a smaller request",
            "too_large",
        )


def create_app(
    backend: Backend, limits: ServeLimits | None = None, texts: PromptTexts | None = None, on_ready: Callable[[], None] | None = None
) -> FastAPI:
    """The API over ``backend`` (loaded once, by the caller): POST /v1/decisions, GET /v1/health,
    GET /v1/model. ``on_ready`` is called once the server has started (it prints the address)."""
    service = DecisionService(backend, limits or ServeLimits(), texts or load_prompts())

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if on_ready is not None:
            on_ready()
        yield

    app = FastAPI(
        lifespan=lifespan,
        title="paper-explorer typed decisions",
        version=API_VERSION,
        description="Typed questions (noul, choice, score) about a document: a probability for every option, from its whole "
        "continuation's likelihood under the model, and each question's confidence. docs/decisions.md describes it.",
    )
    app.state.service = service
    app.add_middleware(BodyLimit, limit=service.limits.body_bytes)

    @app.exception_handler(Refused)
    async def refused(_: Request, error: Refused) -> JSONResponse:
        return error.response()

    @app.exception_handler(StarletteHTTPException)
    async def unparsed(request: Request, error: StarletteHTTPException) -> Response:
        # FastAPI answers a body json.loads raised other than JSONDecodeError on with a bare 400
        # ("There was an error parsing the body"): said here as every other malformed body is.
        if error.status_code == 400 and error.__cause__ is not None:
            why = _UNREADABLE.get(type(error.__cause__), type(error.__cause__).__name__)
            msg = f"the body cannot be read as JSON ({why}); send UTF-8 JSON as the OpenAPI schema at /openapi.json shows"
            return JSONResponse({"detail": [{"loc": ["body"], "msg": msg, "type": "json_invalid"}]}, status_code=422)
        return await http_exception_handler(request, error)

    @app.exception_handler(RequestValidationError)
    async def malformed(request: Request, error: RequestValidationError) -> JSONResponse:
        # loc, msg and type only: the input is not echoed back (it may be a whole document).
        detail = [{"loc": list(each["loc"]), "msg": each["msg"], "type": each["type"]} for each in error.errors()]
        content_type = request.headers.get("content-type", "")
        if [each["loc"] for each in detail] == [["body"]] and "json" not in content_type:  # FastAPI parses only a JSON body
            detail[0]["msg"] = (
                f"the body is read as JSON only, and its Content-Type is {content_type or 'not given'}; send application/json"
            )
        return JSONResponse({"detail": detail}, status_code=422)

    @app.post("/v1/decisions", response_model=DecisionReply, responses={413: {"description": "Over a limit"}})
    def decisions(request: DecisionRequest) -> DecisionReply:
        """Score every option of every question about the document."""
        return service.answer(request)

    @app.get("/v1/health", response_model=Health)
    async def health() -> Health:  # async: answered at once even when every worker thread waits on the model
        return Health(model=service.model, context=backend.max_context, ready=True, waiting=service.waiting)

    @app.get("/v1/model", response_model=ModelInfo)
    def model() -> ModelInfo:
        return ModelInfo(
            backend=backend.name,
            settings=backend.settings(),
            context=backend.max_context,
            prompts_sha256=service.texts.sha256,
            limits=asdict(service.limits),
        )

    return app


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to ``host``:``port`` and listening (port 0: a free one), for uvicorn to serve on;
    OSError when the address is taken or not this machine's."""
    family, kind, protocol, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    listener = socket.socket(family, kind, protocol)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(address)
        listener.listen(2048)
    except OSError:
        listener.close()
        raise
    listener.set_inheritable(True)
    return listener


__all__ = ["DecisionReply", "DecisionRequest", "QuestionAnswer", "ServeLimits", "create_app", "listening_socket"]
