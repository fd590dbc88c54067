"""`--preset memagent`: MemAgent's own prompt texts, chat wrapping, answer rule and recipe, checked
against upstream's code (copied below as references, Apache-2.0, BytedTsinghua-SIA/MemAgent at
76b7a65: recurrent/impls/memory.py and taskutils/memory_eval/utils/__init__.py)."""

import json
import random
import shutil

import pytest

from paper_explorer.agent.chat_template import render
from paper_explorer.agent.memory_reader.paging import page_document, verbatim_document
from paper_explorer.agent.memory_reader.prompts import ReaderPrompts, boxed_only, final_prompt, memory_ids, problem_text, update_prompt
from paper_explorer.agent.memory_reader.settings import ReaderRecipe, presets
from paper_explorer.agent.renderer import ChatRenderer

# -- upstream, verbatim (recurrent/impls/memory.py) -----------------------------------------------
TEMPLATE = """You are presented with a problem, a section of an article that may contain the answer to the problem, and a previous memory. Please read the provided section carefully and update the memory with the new information that helps to answer the problem. Be sure to retain all relevant details from the previous memory while adding any new, useful information.

<problem> 
{prompt}
</problem>

<memory>
{memory}
</memory>

<section>
{chunk}
</section>

Updated memory:
"""  # noqa: W291 (upstream's "<problem> " ends in a space)

TEMPLATE_FINAL_BOXED = """You are presented with a problem and a previous memory. Please answer the problem based on the previous memory and put the answer in \\boxed{{}}.

<problem> 
{prompt}
</problem>

<memory>
{memory}
</memory>

Your answer:
"""  # noqa: W291

NO_MEMORY = "No previous memory"


# -- upstream, verbatim (taskutils/memory_eval/utils/__init__.py) ---------------------------------
def last_boxed_only_string(string):
    idx = string.rfind("\\boxed")
    if "\\boxed " in string:
        return "\\boxed " + string.split("\\boxed ")[-1].split("$")[0]
    if idx < 0:
        idx = string.rfind("\\fbox")
        if idx < 0:
            return None

    i = idx
    right_brace_idx = None
    num_left_braces_open = 0
    while i < len(string):
        if string[i] == "{":
            num_left_braces_open += 1
        if string[i] == "}":
            num_left_braces_open -= 1
            if num_left_braces_open == 0:
                right_brace_idx = i
                break
        i += 1

    if right_brace_idx is None:
        retval = None
    else:
        retval = string[idx : right_brace_idx + 1]

    return retval


def extract_boxed_answer(string):
    s = last_boxed_only_string(string)
    if s is None:
        return None
    else:
        if "\\boxed " in s:
            left = "\\boxed "
            assert s[: len(left)] == left
            return s[len(left) :]

        left = "\\boxed{"

        assert s[: len(left)] == left
        assert s[-1] == "}"

        return s[len(left) : -1]


def upstream_answer(text):
    """What ruler_hqa.py scores: extract_solution (no </think>: the text), then the boxed answer;
    an assertion upstream would crash on, and an empty answer, score 0 (None here)."""
    if "</think>" in text:
        text = text.split("</think>")[-1].strip()
    try:
        answer = extract_boxed_answer(text)
    except AssertionError:
        return None
    return answer.strip() or None if answer is not None else None


@pytest.fixture(scope="module")
def qwen3(qwen3_tokenizer):
    return ChatRenderer.from_directory(qwen3_tokenizer)


@pytest.fixture(scope="module")
def memagent():
    return ReaderPrompts.named("memagent")


def upstream_chat(renderer, message):
    """MemAgent's chat wrapping (recurrent/utils.py chat_template): the tokenizer's own template
    around one user message, then the generation prompt (ours is the non-thinking one)."""
    return render(renderer.template, [{"role": "user", "content": message}], generation=True, thinking=False)


def test_the_update_and_final_prompts_are_memagents_words_in_the_models_own_chat_wrapping(qwen3, memagent):
    question, memory = "  Which river runs through the city of Zed?  ", "The city of Zed lies in the north."
    page = qwen3.text("Document 1:\nZed\nThe river Ash runs through Zed, a city of the north.")
    problem = qwen3.text(problem_text(question, "memagent"))
    held = memory_ids(qwen3, memagent, memory, 1024)
    update = update_prompt(qwen3, memagent, problem_ids=problem, memory_ids=held, outline_ids=[], page_ids=page, sentinel=None)
    expected = TEMPLATE.format(prompt=question.strip(), memory=memory, chunk=qwen3.decode(page))
    assert qwen3.decode(update) == upstream_chat(qwen3, expected)
    first = update_prompt(
        qwen3,
        memagent,
        problem_ids=problem,
        memory_ids=memory_ids(qwen3, memagent, None, 1024),
        outline_ids=[],
        page_ids=page,
        sentinel=None,
    )
    assert qwen3.decode(first) == upstream_chat(qwen3, TEMPLATE.format(prompt=question.strip(), memory=NO_MEMORY, chunk=qwen3.decode(page)))
    final = final_prompt(qwen3, memagent, problem_ids=problem, memory_ids=held)
    assert qwen3.decode(final) == upstream_chat(qwen3, TEMPLATE_FINAL_BOXED.format(prompt=question.strip(), memory=memory))
    assert "\\boxed{}." in qwen3.decode(final)  # str.format's one pair of braces, as upstream's evaluation sends it


def test_a_template_that_adds_a_system_turn_wraps_the_prompt_with_it(qwen3_tokenizer, tmp_path, memagent):
    """MemAgent's base models (Qwen2.5-Instruct) add a default system turn to a conversation of one
    user message; the reader's prompt carries it, as their template renders it."""
    directory = tmp_path / "qwen2.5-style"
    shutil.copytree(qwen3_tokenizer, directory)
    config = json.loads((directory / "tokenizer_config.json").read_text())
    config["chat_template"] = (
        "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
        "{%- else %}{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}{%- endif %}"
        "{%- for message in messages %}{%- if message.role != 'system' or not loop.first %}"
        "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}{%- endif %}{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    )
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    renderer = ChatRenderer.from_directory(directory)
    problem = renderer.text("Who wrote it?")
    final = final_prompt(renderer, memagent, problem_ids=problem, memory_ids=memory_ids(renderer, memagent, None, 1024))
    expected = TEMPLATE_FINAL_BOXED.format(prompt="Who wrote it?", memory=NO_MEMORY)
    assert renderer.decode(final) == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        f"<|im_start|>user\n{expected}<|im_end|>\n<|im_start|>assistant\n"
    )


ANSWERS = [
    "The answer is \\boxed{Paris}.",
    "no box at all",
    "\\boxed{a} and then \\boxed{b",
    "\\boxed 42$ and more",
    "<think>\\boxed{no}</think> so \\boxed{yes}",
    "\\boxed{}",
    "\\boxed{  }",
    "\\fbox{x}",
    "\\boxed{\\frac{1}{2}}",
    "\\boxed{a}\\boxed{b}",
    "}\\boxed{x}{",
    "\\boxedx{y}",
    "",
]


@pytest.mark.parametrize("text", ANSWERS)
def test_the_boxed_answer_is_memagents(text):
    assert boxed_only(text) == upstream_answer(text)


def test_the_boxed_answer_agrees_with_upstream_on_generated_texts():
    rng = random.Random(34)
    alphabet = ["\\boxed", "\\boxed ", "\\fbox", "{", "}", "$", "a", "b", " ", "</think>", "\n", "x y"]
    for _ in range(5000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
        assert boxed_only(text) == upstream_answer(text), text


def test_the_preset_is_the_released_recipe():
    policy, episode = ReaderRecipe.run_defaults({"preset": "memagent"}, {})
    recipe = ReaderRecipe.model_validate({name: value for name, value in policy.items() if name != "temperature"})  # the backend's
    assert (recipe.prompts, recipe.page_tokens, recipe.memory_tokens, recipe.answer_tokens) == ("memagent", 5000, 1024, 1024)
    assert (recipe.answer_from, recipe.keep_sentinel, recipe.document, recipe.outline_fill) == ("boxed", "", "auto", "balanced")
    assert (recipe.outline_sections, policy["temperature"], episode["seed"]) == (24, 0.0, 801)
    assert presets()["memagent"]["policy"]["passes"] == 1
    twice, _ = ReaderRecipe.run_defaults({"preset": "memagent", "passes": 2}, {})
    assert twice["passes"] == 2  # ReadTwice: a setting given wins over the preset


def test_memagents_prompts_with_a_keep_sentinel_are_refused():
    with pytest.raises(ValueError, match="empty keep sentinel"):
        ReaderRecipe(prompts="memagent")


def test_a_verbatim_document_is_the_contexts_own_token_stream_paged_exactly(qwen3):
    context = "\n  Document 1:\nAsh\nA river.\n\nDocument 2:\nZed\nA city on the Ash, founded in 1204.  \n"
    document = verbatim_document(context, qwen3)
    assert document.text == context.strip() and document.ids == qwen3.text(context.strip())
    paging = page_document(
        document, page_tokens=5, outlines=False, outline_sections=24, renderer=qwen3, prompts=ReaderPrompts.named("memagent")
    )
    assert [page.tokens for page in paging.pages[:-1]] == [5] * (len(paging.pages) - 1)
    assert [i for page in paging.pages for i in page.ids(document)] == document.ids  # every token, once, in order
    assert paging.unread_tokens == 0
