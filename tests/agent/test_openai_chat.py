"""A teacher behind /v1/chat/completions, over real HTTP: it sees our messages, one action per
turn is kept, usage is recorded, the key never is, and its trajectories build and pass parity."""

import json

import pytest

from paper_explorer.agent.policies import make_config, make_policy
from paper_explorer.agent.runner import EpisodeRunner
from paper_explorer.agent.trajectory import EpisodeConfig
from paper_explorer.corpus import BM25Index
from tests.agent.test_openai_policy import FakeServer
from tests.conftest import run_cli

SCRIPT = [
    'I will search first.\n\n```python\nhits = search("learning rate", k=3)\n[h["paper_id"] for h in hits]\n```\nThen I will read.',
    'Now I answer.\n\n```python\nsubmit("3e-5", evidence=[])\n```\n```python\nprint("a second block")\n```',
]


def chat_server(script: list[str]) -> FakeServer:
    """A scripted chat model: its n-th answer (a thought, a block, chatter after it) for the n-th turn."""

    def respond(body):
        turn = sum(1 for m in body["messages"] if m["role"] == "assistant")
        text = script[min(turn, len(script) - 1)]
        return 200, {
            "choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1234, "completion_tokens": 56},
        }

    return FakeServer(respond=respond)


@pytest.fixture
def chat():
    server = chat_server(SCRIPT)
    yield server
    server.server.shutdown()


def test_a_chat_teacher_sees_our_messages_and_writes_one_action_per_turn(chat, small_demo, tiny_tokenizer, monkeypatch, tmp_path):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret-key")
    policy = make_policy(make_config("openai", api="chat", base_url=chat.url, model="teacher-70b", tokenizer=tiny_tokenizer))
    question = next(q for q in small_demo.questions if q.answerable)
    trajectory = EpisodeRunner(small_demo, BM25Index.build(small_demo), policy, EpisodeConfig(max_steps=4)).run(question.text, question)
    assert trajectory.outcome.status == "submitted" and len(trajectory.steps) == 2
    assert chat.requests[0]["path"] == "/v1/chat/completions" and chat.requests[0]["model"] == "teacher-70b"
    assert chat.requests[1]["messages"] == trajectory.messages(upto=1)  # exactly the messages the renderer trains on
    assert trajectory.steps[0].action_text.endswith("```") and "Then I will read" not in trajectory.steps[0].action_text
    assert "a second block" not in trajectory.steps[1].action_text and trajectory.steps[1].generation.cut_chars > 0
    generation = trajectory.steps[0].generation
    assert (generation.api, generation.usage_prompt_tokens, generation.generated_tokens) == ("chat", 1234, 56)
    assert chat.headers[0]["Authorization"] == "Bearer sk-secret-key"
    assert "sk-secret-key" not in trajectory.model_dump_json() and trajectory.policy.settings["model"] == "teacher-70b"
    assert trajectory.steps[0].served.source == "renderer"  # what the student would be served

    path = tmp_path / "teacher.jsonl"
    path.write_text(trajectory.model_dump_json() + "\n")
    held = run_cli("check-parity", "-t", str(path), "--tokenizer", str(tiny_tokenizer))
    assert held.returncode == 0, held.stderr
    from paper_explorer.corpus.writing import write_jsonl

    write_jsonl(small_demo, tmp_path / "corpus.jsonl")
    built = run_cli(
        "sft",
        "build",
        "-t",
        str(path),
        "--tokenizer",
        str(tiny_tokenizer),
        "--out",
        str(tmp_path / "data"),
        "--corpus",
        str(tmp_path / "corpus.jsonl"),
        "--evaluation-split",
        "none",
        "--validation-share",
        "0",
        "--min-answer-f1",
        "0",
    )
    assert built.returncode == 0, built.stderr
    example = json.loads((tmp_path / "data" / "train.jsonl").read_text())
    assert [turn["type"] for turn in example["turns"]] == ["tool", "final"]
    checked = run_cli("check-parity", "-t", str(path), "--tokenizer", str(tiny_tokenizer), "--data", str(tmp_path / "data"))
    assert checked.returncode == 0, checked.stderr


def test_a_chat_teachers_data_trains_the_tiny_student(chat, small_demo, tiny_model, tmp_path):
    from paper_explorer.corpus.writing import write_jsonl

    write_jsonl(small_demo, tmp_path / "corpus.jsonl")
    taught = run_cli(
        "eval",
        "--policy",
        "openai",
        "--api",
        "chat",
        "--base-url",
        chat.url,
        "--model",
        "teacher",
        "--tokenizer",
        str(tiny_model),
        "--corpus",
        str(tmp_path / "corpus.jsonl"),
        "--split",
        "all",
        "--limit",
        "6",
        "--out",
        str(tmp_path / "teacher"),
    )
    assert taught.returncode == 0, taught.stderr
    log = str(tmp_path / "teacher" / "trajectories.jsonl")
    built = run_cli(
        "sft",
        "build",
        "-t",
        log,
        "--tokenizer",
        str(tiny_model),
        "--corpus",
        str(tmp_path / "corpus.jsonl"),
        "--out",
        str(tmp_path / "data"),
        "--evaluation-split",
        "none",
        "--validation-share",
        "0",
        "--min-answer-f1",
        "0",
    )
    assert built.returncode == 0, built.stderr
    trained = run_cli(
        "train",
        "--model",
        str(tiny_model),
        "--data",
        str(tmp_path / "data"),
        "--corpus",
        str(tmp_path / "corpus.jsonl"),
        "--out",
        str(tmp_path / "student"),
        "--max-steps",
        "1",
        "--validation-episodes",
        "0",
        "--quantization",
        "none",
    )
    assert trained.returncode == 0, trained.stderr
    assert list((tmp_path / "student").glob("checkpoint-*/adapter_model.safetensors"))
    held = run_cli("check-parity", "-t", log, "--tokenizer", str(tiny_model), "--data", str(tmp_path / "data"), "--model", str(tiny_model))
    assert held.returncode == 0, held.stderr


def test_a_chat_teacher_without_a_student_tokenizer_still_runs(chat, small_demo):
    policy = make_policy(make_config("openai", api="chat", base_url=chat.url, model="teacher"))
    question = small_demo.questions[0]
    trajectory = EpisodeRunner(small_demo, BM25Index.build(small_demo), policy, EpisodeConfig(max_steps=4)).run(question.text, question)
    assert trajectory.outcome.status == "submitted" and trajectory.steps[0].served is None


@pytest.mark.parametrize(
    "answer, kept",
    [
        (
            "I'll write a ```python block:\n\n```python\nprint(12345)\n```\nthen more",
            "I'll write a ```python block:\n\n```python\nprint(12345)\n```",
        ),
        ("```py\nprint(1)\n```\n```py\nprint(2)\n```", "```py\nprint(1)\n```"),
    ],
)
def test_the_action_kept_is_the_block_that_runs(small_demo, answer, kept):
    from paper_explorer.agent.actions import extract_code

    chat = chat_server([answer])
    policy = make_policy(make_config("openai", api="chat", base_url=chat.url, model="teacher", temperature=0.5, top_k=7))
    question = small_demo.questions[0]
    trajectory = EpisodeRunner(small_demo, BM25Index.build(small_demo), policy, EpisodeConfig(max_steps=1)).run(question.text, question)
    assert trajectory.steps[0].action_text == kept and extract_code(kept) == extract_code(answer)
    chat.server.shutdown()
    assert chat.requests[0]["top_k"] == 7 and chat.requests[0]["temperature"] == 0.5
