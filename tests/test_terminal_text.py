"""Text a worker, a model or a file wrote is data on the terminal: never markup, never a terminal
command, never a crash. Unit tests of ``agent.terminal_text``, then hostile text fuzzed through
``show``, ``inspect``, ``compare`` and ``run`` (in-process, typer's CliRunner)."""

import functools
import io
import json
import re
import shutil
import unicodedata
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console
from typer.testing import CliRunner

from paper_explorer.agent.terminal_text import json_visible, untrusted, visible
from tests.conftest import rescored, run_cli

SHOWN = {"Cc", "Cf", "Zl", "Zp", "Cs"}  # control, format, line and paragraph separators, surrogates

# (character, how it is shown): one of each class the module docstring names
CLASSES = [
    ("\x1b", "\\x1b"),
    ("\x00", "\\x00"),
    ("\x07", "\\x07"),
    ("\x08", "\\x08"),
    ("\r", "\\x0d"),
    ("\x0b", "\\x0b"),
    ("\x7f", "\\x7f"),  # DEL
    ("\x85", "\\x85"),
    ("\x9b", "\\x9b"),
    ("\x9d", "\\x9d"),
    ("\x80", "\\x80"),
    ("\x9f", "\\x9f"),  # C1
    ("\u202a", "<U+202A>"),
    ("\u202e", "<U+202E>"),
    ("\u2066", "<U+2066>"),
    ("\u2069", "<U+2069>"),  # bidi
    ("\u200e", "<U+200E>"),
    ("\u200f", "<U+200F>"),
    ("\u061c", "<U+061C>"),
    ("\u200b", "<U+200B>"),
    ("\u200d", "<U+200D>"),
    ("\ufeff", "<U+FEFF>"),
    ("\u00ad", "<U+00AD>"),  # other format
    ("\U000e0041", "<U+E0041>"),  # a tag character (invisible text)
    ("\u2028", "<U+2028>"),
    ("\u2029", "<U+2029>"),  # line and paragraph separators
    ("\ud800", "<U+D800>"),
    ("\udfff", "<U+DFFF>"),  # lone surrogates
]

ORDINARY = [
    "plain ASCII, with (brackets) and a\ttab\nand a newline",
    "déjà vu, Straße, naïve, Ελληνικά, русский",
    "日本語のテキスト, 한국어, 中文",
    "العربية and עברית letters (right-to-left letters are not controls)",
    "emoji 😀 🚀 👍🏽 ✔️",
    "non-breaking\u00a0space and ideographic\u3000space",
    "code: print(x[0]); s = 'a\\nb'; d = {'k': [1, 2]}",
]

MARKUP = ["[/x]", "[/]", "[bold red]loud[/bold red]", "[link=https://evil.example]click[/link]", ":smile:", "[dim]\\[not[/dim]"]


@pytest.mark.parametrize("character, shown", CLASSES)
def test_each_class_of_character_is_shown_visibly(character, shown):
    assert visible(f"a{character}b") == f"a{shown}b"


@pytest.mark.parametrize("text", ORDINARY)
def test_ordinary_text_is_unchanged(text):
    assert visible(text) == text


def render(renderable, color: bool = True) -> str:
    """What a (colour) terminal would receive."""
    out = io.StringIO()
    Console(file=out, force_terminal=color, color_system="truecolor" if color else None, width=300).print(renderable)
    return out.getvalue()


SGR = re.compile(r"\x1b\[[0-9;]*m")  # rich's own colours


def controls(text: str) -> list[str]:
    """The characters of ``text`` a terminal could act on."""
    return sorted({c for c in text if c not in "\n\t" and unicodedata.category(c) in SHOWN})


def acted_on(output: str) -> list[str]:
    """Characters of ``output`` a terminal would act on, rich's own colour sequences aside."""
    return controls(SGR.sub("", output))


@pytest.mark.parametrize("text", MARKUP)
def test_markup_is_shown_literally(text):
    output = render(untrusted(text, style="bold"))
    assert SGR.sub("", output) == text + "\n"
    assert not acted_on(output)  # no OSC 8 hyperlink from [link=...]


def test_escape_sequences_are_shown_as_their_characters():
    hyperlink = "\x1b]8;;https://evil.example\x1b\\click\x1b]8;;\x1b\\"
    output = render(untrusted(f"{hyperlink} \x1b[31mred \x1b]0;title\x07 \x9b2J \u202eevil"))
    assert not acted_on(output) and "\x1b[31m" not in output
    assert "\\x1b]8;;https://evil.example\\x1b\\click" in output and "<U+202E>evil" in output


TOKENS = [
    "[/x]",
    "[/]",
    "[link=https://evil.example]click[/link]",
    "[bold red]",
    "[",
    "]",
    "\\",
    ":smile:",
    "\\x1b",
    "\x1b[31m",
    "\x1b[2J",
    "\x1b]0;owned\x07",
    "\x1b]8;;https://evil.example\x1b\\here\x1b]8;;\x1b\\",
    "\x1bc",
    "\x9b31m",
    "\x9d8;;https://evil.example\x9c",
    "\x85",
    "\x90",
    "\x9f",
    "\u202e",
    "\u202a",
    "\u2066",
    "\u2069",
    "\u200e",
    "\u200f",
    "\u061c",
    "\u200b",
    "\ufeff",
    "\U000e0041",
    "\u2028",
    "\u2029",
    "\r",
    "\x08",
    "\x00",
    "\x7f",
    "\t",
    "\n",
    "é",
    "😀",
    "日本",
]
# Text as a policy or a file might hold it: hostile pieces among arbitrary characters. No lone
# surrogates (st.text leaves them out): JSON writers cannot encode them, so no log holds one.
hostile = st.lists(st.one_of(st.sampled_from(TOKENS), st.text(max_size=6)), min_size=1, max_size=8).map("".join)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x10FFFF)))  # surrogates included
def test_nothing_a_terminal_acts_on_survives_and_showing_twice_changes_nothing(text):
    shown = visible(text)
    assert not controls(shown)
    assert visible(shown) == shown
    assert (shown == text) == (not controls(text))


@settings(max_examples=200, deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x10FFFF)),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
        max_leaves=8,
    ),
    st.booleans(),
)
def test_json_visible_keeps_the_value_and_shows_nothing_a_terminal_acts_on(value, pretty):
    text = json_visible(json.dumps(value, ensure_ascii=False, indent=2 if pretty else None))
    assert json.loads(text) == value
    assert not controls(text)
    assert pretty or "\n" not in text  # one value, one line


# -- the commands ------------------------------------------------------------------------------

runner = CliRunner()


@pytest.fixture(scope="module")
def base_run(tmp_path_factory):
    """A scripted run of three questions on the demo corpus, as explorer eval writes it."""
    directory = tmp_path_factory.mktemp("terminal-text")
    done = run_cli("eval", "--split", "all", "--limit", "3", "--policy", "scripted", "--out", str(directory / "base"))
    assert done.returncode == 0, done.stderr
    return directory / "base"


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_bytes().split(b"\n") if line]


def write_lines(path: Path, records: list[dict]) -> None:
    path.write_bytes(b"".join(json.dumps(record).encode() + b"\n" for record in records))


def hostile_run(base: Path, out: Path, texts: list[str]) -> None:
    """``base`` copied to ``out`` with ``texts`` in every field an episode's text reaches the terminal from."""
    question, thought, code, observation, answer, reason, flag = texts
    shutil.copytree(base, out)
    episodes = lines(base / "trajectories.jsonl")
    for episode in episodes:
        episode["question"] = question
        step = episode["steps"][0]
        step["action_text"] = f"{thought}\n```python\n{code}\n```"
        step["reasoning"] = thought  # a thinking-mode step's think block
        step["code"] = code
        step["observation"] = observation
        step["error"] = reason
        step["limit_hit"] = flag
        step["policy_info"] = {
            "replayed_step": 0,
            "previous_observation_matches": False,
            "drift": {"position": 0, "recorded": observation, "current": answer},
        }
        for call in step["tool_calls"]:
            call["arguments"] = {thought: code, "query": answer}
            call["error"] = reason
        episode["outcome"].update(  # submitted: the base run's abstentions (F1 1) now score otherwise, so compare lists them
            status="submitted",
            answer=answer,
            reason=reason,
            evidence=[{"paper_id": flag, "section": 0, "paragraph": 0, "text": observation}],
        )
    write_lines(out / "trajectories.jsonl", episodes)
    rescored(out, demo_corpus())  # scores.jsonl and metrics.json from these episodes, as eval writes them (Run.load checks them)


@functools.cache
def demo_corpus():
    from paper_explorer.evaluation.run import load_corpus

    return load_corpus(None)


@contextmanager
def terminal(color: bool):
    """The commands' consoles on a wide terminal, in colour or not; CliRunner captures what they print."""
    consoles = {
        "paper_explorer.cli.run_commands.console",
        "paper_explorer.cli.inspect_commands.console",
        "paper_explorer.cli.corpus_commands.console",
    }
    with pytest.MonkeyPatch.context() as patch:
        for name in consoles:
            patch.setattr(name, Console(force_terminal=color, color_system="truecolor" if color else None, width=200))
        yield


def invoke(*args: str, color: bool):
    from paper_explorer.cli.main import app

    with terminal(color):
        result = runner.invoke(app, [str(arg) for arg in args])
    output = result.stdout + result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit), f"{args}: {result.exception!r}"
    assert result.exit_code == 0, f"{args}: exit {result.exit_code}: {output[-2000:]}"
    assert "Traceback" not in output and "MarkupError" not in output
    assert not acted_on(output), f"{args}: {acted_on(output)} reached the terminal"
    if not color:
        assert "\x1b" not in output  # no colours asked for: any escape at all came from the data
    return result


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(texts=st.lists(hostile, min_size=7, max_size=7), color=st.booleans())
def test_show_inspect_and_compare_show_any_text_as_data(base_run, tmp_path_factory, texts, color):
    run = tmp_path_factory.mktemp("hostile") / "run"
    hostile_run(base_run, run, texts)
    episode = lines(run / "trajectories.jsonl")[0]["episode_id"]
    invoke("show", run / "trajectories.jsonl", color=color)  # the list of episodes
    invoke("show", run / "trajectories.jsonl", "--line", "1", color=color)
    invoke("inspect", run, color=color)
    invoke("inspect", run, "--episode", episode, color=color)
    invoke("inspect", run, "--flag", "ungrounded_answer", color=color)
    invoke("compare", base_run, run, color=color)
    compared = invoke("compare", base_run, run, "--json", color=color)
    assert {row["b"] for row in json.loads(compared.stdout)["largest_differences"]} == {texts[4]}


def test_a_closing_tag_in_an_answer_no_longer_crashes_show(base_run, tmp_path):
    hostile_run(base_run, tmp_path / "run", ["q [/x]", "[/bold]", "x = '[/]'", "[/x]", "[/x] answer", "[/dim]", "[/red]"])
    shown = invoke("show", tmp_path / "run" / "trajectories.jsonl", "--line", "1", color=False)
    assert "'[/x] answer'" in shown.stdout and "Question" in shown.stdout


def replay_recording(base: Path, out: Path, thought: str, printed: str, answer: str) -> str:
    """A one-step recording of the base run's first question whose action prints ``printed`` and
    submits ``answer``; returns the question id."""
    episode = lines(base / "trajectories.jsonl")[0]
    code = f"print({printed!r})\nsubmit({answer!r})"
    step = {
        **episode["steps"][0],
        "index": 0,
        "action_text": f"{thought}\n```python\n{code}\n```",
        "code": code,
        "observation": printed,
        "tool_calls": [],
    }
    episode["steps"] = [step]
    write_lines(out, [episode])
    return episode["question_id"]


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(thought=hostile, printed=hostile, answer=hostile.filter(str.strip), color=st.booleans())
def test_run_shows_what_a_replayed_policy_prints_and_submits_as_data(base_run, tmp_path_factory, thought, printed, answer, color):
    directory = tmp_path_factory.mktemp("run")
    question = replay_recording(base_run, directory / "recording.jsonl", thought, printed, answer)
    invoke(
        "run",
        "--policy",
        "replay",
        "--replay",
        directory / "recording.jsonl",
        "--question-id",
        question,
        "--out",
        directory / "out",
        color=color,
    )
    episode = lines(directory / "out" / "trajectories.jsonl")[0]
    assert episode["outcome"]["status"] == "submitted" and episode["outcome"]["answer"] == answer


def test_exec_prints_what_the_worker_printed_as_escaped_json(tmp_path):
    printed = "\x1b]8;;https://evil.example\x1b\\x\x1b]8;;\x1b\\ \x9b2J \x85 \u202e \u2028 \x7f [/x]"
    (tmp_path / "a.py").write_text(f"print({printed!r})\nsubmit({printed!r})\n")
    for pretty in ((), ("--pretty",)):
        result = invoke("exec", tmp_path / "a.py", *pretty, color=False)
        shown = json.loads(result.stdout)
        assert shown["stdout"] == printed + "\n" and shown["outcome"]["answer"] == printed


def test_corpus_search_shows_paper_text_as_data(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    invoke("corpus", "generate", "--papers", "3", "--out", corpus, color=False)
    records = lines(corpus)
    hostile_words = "quokka \x1b[2J\x1b]0;owned\x07 [/x] [link=https://evil.example]quokka[/link] \u202e\x85"
    section = records[0]["paper"]["sections"][0]
    section["name"] = "\x1b[31m[/section]"
    section["paragraphs"][0] = hostile_words
    write_lines(corpus, records)
    for color in (False, True):
        shown = invoke("corpus", "search", "quokka", "--corpus", corpus, color=color)
        assert "quokka" in shown.stdout
    found = json.loads(invoke("corpus", "search", "quokka", "--corpus", corpus, "--json", color=False).stdout)
    assert found[0]["text"] == hostile_words and found[0]["section"] == "\x1b[31m[/section]"


def test_an_error_line_shows_the_controls_it_quotes(tmp_path):
    empty = tmp_path / "a\x1b]0;owned\x07\u202e.jsonl"
    empty.write_bytes(b"")
    done = run_cli("show", str(empty))
    assert done.returncode == 2 and "holds no episodes" in done.stderr
    assert "a\\x1b]0;owned\\x07<U+202E>.jsonl" in done.stderr and not acted_on(done.stderr)


def test_log_lines_show_the_controls_they_quote():
    import logging

    from paper_explorer.cli.main import VisibleFormatter

    record = logging.LogRecord("corpus", logging.WARNING, __file__, 1, "load warning: %s", ("paper \x1b[31m\u2028x",), None)
    assert VisibleFormatter("%(levelname)s: %(message)s").format(record) == "WARNING: load warning: paper \\x1b[31m<U+2028>x"
