"""The memory reader's prompts: the file's checks, prompts built as ids, answers and the keep sentinel."""

import hashlib
import json
import tomllib

import pytest

from paper_explorer.agent.errors import AgentError
from paper_explorer.agent.memory_reader.prompts import (
    PROMPTS_FILE,
    ReaderPrompts,
    build,
    final_prompt,
    is_keep,
    memory_ids,
    parse_answer,
    update_prompt,
)
from paper_explorer.agent.renderer import ChatRenderer


@pytest.fixture(scope="module")
def renderer(tiny_tokenizer):
    return ChatRenderer.from_directory(tiny_tokenizer)


@pytest.fixture(scope="module")
def prompts():
    return ReaderPrompts.load()


def chat_text(renderer, content):
    """The text of one user turn then the generation prompt, as the ids should decode."""
    return f"<|im_start|>user\n{content}<|im_end|>\n" + renderer.decode(renderer.generation_prompt())


def test_the_packaged_prompts_load_and_are_hashed_by_their_bytes(prompts):
    assert prompts.path == PROMPTS_FILE
    assert prompts.sha256 == hashlib.sha256(PROMPTS_FILE.read_bytes()).hexdigest()
    assert prompts.update.rstrip().endswith("Updated memory:")
    assert prompts.final.rstrip().endswith("Your answer:") and "\\boxed{{}}" in prompts.final
    assert prompts.no_memory == "No previous memory"


def write_prompts(tmp_path, drop=None, **replace):
    """A copy of the packaged prompts file with one key dropped or replaced."""
    table = tomllib.loads(PROMPTS_FILE.read_text(encoding="utf-8"))
    table.pop(drop, None)
    table.update(replace)
    path = tmp_path / "prompts.toml"
    # A JSON string or number is a TOML basic string or integer.
    path.write_text("".join(f"{key} = {json.dumps(value, ensure_ascii=False)}\n" for key, value in table.items()), encoding="utf-8")
    return path


def test_a_changed_byte_changes_the_hash(tmp_path, prompts):
    path = write_prompts(tmp_path, no_memory="Nothing remembered yet")
    changed = ReaderPrompts.load(path)
    assert changed.no_memory == "Nothing remembered yet"
    assert changed.sha256 != prompts.sha256


@pytest.mark.parametrize(
    ("drop", "replace", "expected"),
    [
        ("final", {}, "missing key 'final'"),
        (None, {"update": "{problem} {memory} {section} {keep_instruction} {page}"}, "key 'update' has an unknown placeholder {page}"),
        (None, {"final": "{problem} only"}, "key 'final' lacks the placeholder {memory}"),
        (None, {"outline_line": "- {heading!r}"}, "placeholder {heading} takes no format spec"),
        (None, {"final": "{problem} {memory} \\boxed{}"}, "key 'final' has an unknown placeholder {}"),
        (None, {"final": "{problem} {memory} {"}, "key 'final' is not a valid template"),
        (None, {"no_memory": 3}, "key 'no_memory' must be a string"),
        (None, {"preamble": "hello"}, "unknown key 'preamble'"),
    ],
)
def test_a_bad_prompts_file_is_one_line_naming_the_file_and_key(tmp_path, drop, replace, expected):
    path = write_prompts(tmp_path, drop=drop, **replace)
    with pytest.raises(AgentError) as error:
        ReaderPrompts.load(path)
    message = str(error.value)
    assert expected in message and str(path) in message and "\n" not in message


def test_an_unreadable_prompts_file_is_one_line(tmp_path):
    path = tmp_path / "broken.toml"
    path.write_text("update = \n", encoding="utf-8")
    with pytest.raises(AgentError, match="cannot read the memory reader's prompts"):
        ReaderPrompts.load(path)
    with pytest.raises(AgentError, match="cannot read"):
        ReaderPrompts.load(tmp_path / "absent.toml")


def test_build_splices_ids_unchanged_and_decodes_to_the_filled_template(renderer):
    page = renderer.text("Table 2 reports 87.5 F1 on the test set.")
    template = "Read this:\n{page}\nThen say {word}."
    ids = build(renderer, template, {"page": page, "word": "done"})
    prefix = [renderer.tokenizer.token_to_id("<|im_start|>"), *renderer.text("user\nRead this:\n")]
    assert ids[: len(prefix)] == prefix
    assert ids[len(prefix) : len(prefix) + len(page)] == page
    assert ids[len(prefix) + len(page) :] == [
        *renderer.text("\nThen say done."),
        renderer.end_of_turn,
        *renderer.text("\n"),
        *renderer.generation_prompt(),
    ]
    assert renderer.decode(ids) == chat_text(renderer, "Read this:\nTable 2 reports 87.5 F1 on the test set.\nThen say done.")
    assert build(renderer, template, {"page": page, "word": "done"}) == ids


def test_build_with_text_values_is_the_renderers_own_user_turn(renderer):
    content = "What does {this} mean?"
    ids = build(renderer, "What does {{this}} {verb}?", {"verb": "mean"})
    assert ids == renderer.prompt([{"role": "user", "content": content}])


def test_build_refuses_a_placeholder_without_a_value(renderer):
    with pytest.raises(AgentError, match=r"placeholder \{page\} that was given no value"):
        build(renderer, "{page}", {})


def test_an_update_prompt_holds_problem_memory_outline_and_page_in_that_order(renderer, prompts):
    problem, memory = renderer.text("Which dataset is used?"), renderer.text("The paper studies QuantLens.")
    outline, page = renderer.text("Sections on this page:\n- Method\n\n"), renderer.text("Method\n\nWe train on SQuAD.")
    ids = update_prompt(renderer, prompts, problem_ids=problem, memory_ids=memory, outline_ids=outline, page_ids=page, sentinel=None)
    text = renderer.decode(ids)
    assert text == chat_text(
        renderer,
        prompts.update.format(
            problem="Which dataset is used?",
            memory="The paper studies QuantLens.",
            section="Sections on this page:\n- Method\n\nMethod\n\nWe train on SQuAD.",
            keep_instruction="",
        ),
    )
    assert text.index("Which dataset") < text.index("QuantLens") < text.index("- Method") < text.index("SQuAD")
    assert "<KEEP_MEMORY>" not in text
    kept = renderer.decode(
        update_prompt(renderer, prompts, problem_ids=problem, memory_ids=memory, outline_ids=[], page_ids=page, sentinel="<KEEP_MEMORY>")
    )
    assert prompts.keep_instruction.format(sentinel="<KEEP_MEMORY>") in kept
    assert "Sections on this page" not in kept


def test_the_final_prompt_holds_the_memory_and_no_page(renderer, prompts):
    problem, memory = renderer.text("Which dataset is used?"), renderer.text("They train on SQuAD.")
    text = renderer.decode(final_prompt(renderer, prompts, problem_ids=problem, memory_ids=memory))
    assert text == chat_text(renderer, prompts.final.format(problem="Which dataset is used?", memory="They train on SQuAD."))
    assert "<section>" not in text and "\\boxed{}" in text


def test_the_memory_is_the_no_memory_text_then_its_text_cut_to_the_cap(renderer, prompts):
    assert memory_ids(renderer, prompts, None, cap=1000) == renderer.text(prompts.no_memory)
    assert memory_ids(renderer, prompts, None, cap=2) == renderer.text(prompts.no_memory)[:2]  # the cap holds from the first prompt
    long = "The model is trained on SQuAD and evaluated on the held out test set. " * 5
    assert memory_ids(renderer, prompts, long, cap=7) == renderer.text(long)[:7]
    assert memory_ids(renderer, prompts, "short", cap=1000) == renderer.text("short")
    with pytest.raises(AgentError, match="at least 1 token"):
        memory_ids(renderer, prompts, "x", cap=0)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The answer is \\boxed{SQuAD}.", ("SQuAD", "boxed")),
        ("\\boxed{\\frac{1}{2}} of them", ("\\frac{1}{2}", "boxed")),
        ("first \\boxed{A}, then \\boxed{ B }", ("B", "boxed")),
        ("\\boxed{A} then \\boxed{B is cut", ("A", "boxed")),
        ("\\boxed{outer \\boxed{inner}}", ("outer \\boxed{inner}", "boxed")),
        ("\\boxed{never closed \\boxed{inner}", ("inner", "boxed")),
        ("\\boxed{  }", (None, "boxed")),
        ("\\boxed{unclosed", ("\\boxed{unclosed", "plain")),
        ("  plain answer \n", ("plain answer", "plain")),
        ("", (None, "plain")),
        (" \n ", (None, "plain")),
    ],
)
def test_the_answer_is_the_last_complete_box_else_the_text(text, expected):
    assert parse_answer(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("} \\boxed{a}} }", ("a", "boxed")),  # a stray closing brace closes nothing
        ("\\boxed{a{b}c} and \\boxed{{d}", ("a{b}c", "boxed")),
        ("\\boxed{x \\boxed{y} \\boxed{z", ("y", "boxed")),
    ],
)
def test_unbalanced_braces_leave_the_last_box_that_closes(text, expected):
    assert parse_answer(text) == expected


def test_a_text_of_many_unclosed_boxes_is_read_in_one_pass():
    """A server may write far past the answer cap: 20,000 unclosed boxes then one that closes. Read
    once per box, as the parser did, this took minutes (each box scanned to the text's end); now one pass."""
    text = "\\boxed{" * 20_000 + "\\boxed{the answer}"
    assert parse_answer(text) == ("the answer", "boxed")


def test_the_keep_sentinel_is_the_whole_stripped_text():
    assert is_keep("<KEEP_MEMORY>", "<KEEP_MEMORY>")
    assert is_keep("  <KEEP_MEMORY>\n", "<KEEP_MEMORY>")
    assert not is_keep("<KEEP_MEMORY> and a new fact", "<KEEP_MEMORY>")
    assert not is_keep("<KEEP_MEMORY>", None)
    assert not is_keep("", "")


def test_prompts_decode_to_their_text_with_the_real_qwen3_tokenizer(qwen3_tokenizer, prompts):
    renderer = ChatRenderer.from_directory(qwen3_tokenizer)
    page = renderer.text("Résumé: 数据集 «QASPER» — 5 000 questions 😀")
    problem = renderer.text("Quel jeu de données ?")
    ids = update_prompt(
        renderer,
        prompts,
        problem_ids=problem,
        memory_ids=memory_ids(renderer, prompts, None, 64),
        outline_ids=[],
        page_ids=page,
        sentinel="<KEEP_MEMORY>",
    )
    expected = prompts.update.format(
        problem="Quel jeu de données ?",
        memory=prompts.no_memory,
        section="Résumé: 数据集 «QASPER» — 5 000 questions 😀",
        keep_instruction=prompts.keep_instruction.format(sentinel="<KEEP_MEMORY>"),
    )
    assert renderer.decode(ids) == chat_text(renderer, expected)
    # The sentinel's spelling is text, never a control token, and the prompt is a Qwen3 user turn.
    assert (
        ids[0] == renderer.tokenizer.token_to_id("<|im_start|>")
        and ids.count(renderer.tokenizer.token_to_id("<|im_start|>")) == 2
        and ids.count(renderer.end_of_turn) == 1
    )
