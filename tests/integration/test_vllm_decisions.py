"""explorer decide --backend openai against a real vLLM (its CPU build, float32) serving the tiny
model: its prompt log-probabilities give every option the log-likelihood the local hf backend
gives it, for all three kinds and options of different lengths, shared, separate or chunked, and
with the prompts sent as text.

The tolerance: both sides run the same float32 weights on the CPU, but with other kernels (vLLM's
CPU attention and its batched, prefix-cached prompt against transformers' eager pass), so each
token's log-probability differs in its last float32 digits (about 1e-6 relative, 1e-5 absolute at
the tiny model's near-uniform -9); an option of up to a dozen tokens sums a dozen of them. 2e-3 on
a log-likelihood and 1e-3 on a probability is two orders above that noise and far below any real
difference (one token taken for another changes a log-likelihood by more than 0.1).

Its own module and its own server, started without LoRA: vLLM 0.32's CPU build, with
--enable-lora, fails in its LoRA logits path (punica_cpu's bgmv_shrink: "einsum(): subscript b has
size 2 ... 281") on prompt_logprobs for several prompts in one batch, and its engine dies.
"""

import json

import pytest

from paper_explorer.decisions.run import read_records
from tests.conftest import run_cli
from tests.decisions.decision_files import write_decisions
from tests.integration.conftest import running_vllm, vllm_python

pytestmark = pytest.mark.vllm

LOGLIKELIHOOD_TOLERANCE = 2e-3
PROBABILITY_TOLERANCE = 1e-3

DOCUMENTS = [
    {
        "id": "d1",
        "text": "The package is released under the MIT licence. Its documentation covers every public function with examples. " * 6,
        "questions": [
            {"id": "n1", "kind": "noul", "text": "Is the code open source?", "label": "yes"},
            {
                "id": "c1",
                "kind": "choice",
                "text": "Which licence?",
                "options": ["MIT", "BSD", "the GNU General Public License, version three or any later version", "none stated"],
                "label": "MIT",
            },
            {
                "id": "s1",
                "kind": "score",
                "text": "How complete is the documentation?",
                "options": [str(n) for n in range(1, 11)],
                "label": "9",
            },
        ],
    },
    {
        "id": "d2",
        "text": "We measure the speed of the parser. It parses a megabyte in a second.",
        "questions": [
            {"id": "n2", "kind": "noul", "text": "Does it report memory use?", "label": "unknown"},
            {
                "id": "c2",
                "kind": "choice",
                "text": "How severe is the slowdown?",
                "options": ["minor", "major, as every user notices it", "critical"],
                "ordered": True,
            },
        ],
    },
]


@pytest.fixture(scope="module")
def vllm_server(tiny_model, tmp_path_factory):
    vllm_python()  # skip (or fail under CI) before starting anything
    with running_vllm(tiny_model, tmp_path_factory.mktemp("vllm-decisions") / "server.log", lora=False) as server:
        yield server


def scored(run) -> dict:
    return {record.question_id: record for record in read_records(run)}


def test_the_servers_option_likelihoods_are_the_local_models(vllm_server, tmp_path):
    file = write_decisions(tmp_path / "decisions.jsonl", DOCUMENTS)
    served = ["--backend", "openai", "--base-url", vllm_server.url, "--model", vllm_server.model, "--tokenizer", str(vllm_server.model_dir)]
    runs = {
        "local": ["--model", str(vllm_server.model_dir)],
        "shared": served,
        "separate": [*served, "--mode", "separate"],
        "chunked": [*served, "--chunk", "3"],
        "text": [*served, "--prompt-format", "text"],  # the server tokenizes; the ids it read are checked against ours
    }
    for name, flags in runs.items():
        result = run_cli("decide", str(file), *flags, "--out", str(tmp_path / name))
        assert result.returncode == 0, result.stderr
    local = scored(tmp_path / "local")
    assert set(local) == {"n1", "c1", "s1", "n2", "c2"} and all(record.measured for record in local.values())
    for name in ("shared", "separate", "chunked", "text"):
        server = scored(tmp_path / name)
        for question, record in server.items():
            mine = local[question]
            assert record.measured, (name, record.not_measured)
            assert record.prompt_sha256 == mine.prompt_sha256 and record.option_tokens == mine.option_tokens
            assert record.loglikelihoods == pytest.approx(mine.loglikelihoods, abs=LOGLIKELIHOOD_TOLERANCE), (name, question)
            assert record.probabilities == pytest.approx(mine.probabilities, abs=PROBABILITY_TOLERANCE), (name, question)
    assert len(set(local["c1"].option_tokens)) > 2  # options of different lengths were scored
    assert [scored(tmp_path / "chunked")[q].forward_passes for q in ("n1", "c1", "s1")] == [1, 2, 4]  # 3, 4 and 10 options in threes
    assert scored(tmp_path / "separate")["s1"].forward_passes == 10
    manifest = json.loads((tmp_path / "shared" / "manifest.json").read_text())
    assert manifest["backend"] == "openai" and manifest["model"]["server_prompt_ids"] is True
    assert manifest["context"] == vllm_server.models()["data"][0]["max_model_len"] - 1
