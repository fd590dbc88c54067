"""What ``explorer rl`` needs of a served sampler (the ``openai`` policy on vLLM): the ids each
completion drew with their log-probabilities, the temperature those log-probabilities are at, and
the weights the server samples from.

* **The draw.** Asked with ``return_token_ids`` and ``logprobs=0``, vLLM returns the completion's
  ids (``choices[0].token_ids``, the stop token included when it stopped on one) and one
  log-probability per id (``choices[0].logprobs.token_logprobs``). ``drawn`` checks them and that
  they decode to the text the server returned: a server that omits them, or whose ids are not its
  text, is a policy error in one line (nothing can be trained on it), never a silent fallback.
  While it records, a request stops on the renderer's stop tokens (``stop_token_ids``) instead of
  stop strings, as the hf policy stops: so a completion that stopped ends with its stop token and
  one cut by ``max_tokens`` does not. It also sends every sampling setting vLLM would otherwise
  take from the model's generation_config (``top_k``, ``min_p``, penalties): the distribution drawn
  from is then the logits at the policy's temperature, which is what the trainer computes.
* **The temperature.** vLLM's log-probabilities follow its server-wide ``--logprobs-mode``: the
  default ``raw_logprobs`` are of the logits themselves (temperature 1), whatever the request's
  temperature; ``processed_logprobs`` are after the temperature and the top-k/top-p cut. A request
  cannot ask which, so ``ServerLogprobs`` finds out once per policy: the top log-probabilities of
  one prompt at temperature 0.5 and at 1, whose spread doubles at 0.5 only when they are processed.
  A draw records the temperature they are at (``Sampled.temperature``); processed ones cut by top-p
  or top-k are no log-softmax at any temperature and are refused.
* **The weights.** ``served_weights``: the directory (or hub id) the server lists as the served
  model's ``root`` (vLLM: its ``--model``), which the update loads, so the trainer's base is the
  sampler's. vLLM loads each round's adapter from a path too (``agent.policies.adapters``): the
  server and the trainer share a filesystem.
"""

from __future__ import annotations

import http.client
import math
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from paper_explorer.agent.errors import AgentError
from paper_explorer.agent.policies.base import PolicyError, Sampling
from paper_explorer.agent.policies.servers import HTTPStatus, ServerPool, api_key
from paper_explorer.agent.renderer import ChatRenderer
from paper_explorer.agent.trajectory import Sampled
from paper_explorer.corpus.setting_names import setting

LOGPROB_SLACK = 1e-3  # a log-softmax rounded in float32 may come back a hair above 0
MODE_PROBE_TOP = 5  # top log-probabilities compared to tell raw ones from processed ones
MODE_PROBE_TEMPERATURE = 0.5  # processed log-probabilities spread twice as wide here as at 1; raw ones alike
MODELS_LISTING_BYTES = 4 << 20
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
# What vLLM takes from the model's generation_config for a setting a request leaves out: sent, so
# that no repetition penalty or top-k of the model's changes the distribution drawn from.
NEUTRAL_SAMPLING: dict[str, Any] = {"min_p": 0.0, "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}


def recording(body: dict[str, Any], sampling: Sampling, renderer: ChatRenderer) -> dict[str, Any]:
    """``body`` (a completions request) asking for what a draw records (see the module docstring)."""
    asked = {key: value for key, value in body.items() if key != "stop"}
    return {
        **asked,
        "stop_token_ids": sorted(renderer.stop_ids),
        "return_token_ids": True,  # vLLM: the completion's ids in choices[0].token_ids (and the prompt's)
        "logprobs": 0,  # vLLM: the drawn token's own log-probability, no alternatives
        "skip_special_tokens": False,  # the text is then the ids' whole decoding, as the hf policy's is
        "top_p": sampling.top_p,
        "top_k": sampling.top_k,  # vLLM: 0 is off
        **NEUTRAL_SAMPLING,
    }


def _number(value: Any) -> float | None:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def drawn(choice: dict[str, Any], renderer: ChatRenderer, temperature: float, server: str, retries: int = 0) -> tuple[Sampled, str]:
    """The draw of one completion (``choice``, asked with ``recording``) and the text its ids decode
    to, the stop token aside: the server's own text, once found to be that. ``temperature``: the
    temperature the server's log-probabilities are at (``ServerLogprobs``). Anything missing or
    contradicting is a PolicyError naming ``server`` and what it lacks."""

    def refused(what: str) -> PolicyError:
        return PolicyError(f"{server} {what}, so its draws cannot be recorded (explorer rl trains on them)", retries)

    ids = choice.get("token_ids")
    vocabulary = renderer.tokenizer.get_vocab_size(with_added_tokens=True)
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < vocabulary for i in ids):
        shown = "none" if ids is None else f"{str(ids)[:60]!r}"
        raise refused(
            f"returned no completion token ids of this tokenizer (choices[0].token_ids: {shown}) though asked with return_token_ids"
        )
    logprobs = choice.get("logprobs")
    values = logprobs.get("token_logprobs") if isinstance(logprobs, dict) else None
    if not isinstance(values, list) or len(values) != len(ids):
        shown = f"{len(values)}" if isinstance(values, list) else "no"
        raise refused(
            f"returned {shown} log-probabilities (choices[0].logprobs.token_logprobs) for {len(ids)} completion ids though asked with logprobs=0"
        )
    numbers = [_number(value) for value in values]
    bad = next((position for position, value in enumerate(numbers) if value is None or value > LOGPROB_SLACK), None)
    if bad is not None:
        raise refused(
            f"returned {str(values[bad])[:40]!r} as the log-probability of completion token {bad + 1}, which is no log-probability"
        )
    finish = choice.get("finish_reason")
    if finish not in ("stop", "length") or (finish == "stop" and not ids):
        raise refused(
            f"ended a completion of {len(ids)} ids with finish_reason {str(finish)[:40]!r}, so whether it ends on a stop token is unknown"
        )
    text = renderer.decode(ids[:-1] if finish == "stop" else ids)
    said = choice.get("text")
    # A cut (max_tokens) can end inside a character's bytes: a server's streaming decoder holds them
    # back, a whole decoding writes U+FFFD for them; the recorded text is the whole decoding's.
    held_back = finish == "length" and isinstance(said, str) and text.startswith(said) and not text[len(said) :].strip("\ufffd")
    if said != text and not held_back:
        position = next((i for i, (a, b) in enumerate(zip(text, str(said))) if a != b), min(len(text), len(str(said))))
        raise refused(
            f"returned completion ids that decode to other text than it wrote (from character {position}: "
            f"{text[position : position + 20]!r} against {str(said)[position : position + 20]!r}); its ids are not what it sampled"
        )
    return Sampled(ids=list(ids), logprobs=numbers, temperature=temperature, source="server"), text


@dataclass
class ServerLogprobs:
    """Which log-probabilities a server returns for the tokens it draws, found once per policy (the
    copies its episodes in flight use share it; replicas are taken to be started alike): "raw" (of
    the logits: temperature 1) or "processed" (after the temperature and any top-k/top-p cut)."""

    mode: str | None = None
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def temperature(self, sampling: Sampling, top_logprobs_at: Callable[[float], dict[int, float]], server: str) -> float:
        """The temperature of the log-probabilities the server returns for a draw with ``sampling``.
        ``top_logprobs_at(t)``: the server's top log-probabilities of one prompt's next token at temperature t."""
        if sampling.greedy:
            return 1.0  # both modes give a greedy draw the log-softmax of the logits themselves
        cut = sampling.top_p < 1 or sampling.top_k > 0
        if sampling.temperature == 1 and not cut:
            return 1.0  # both modes agree: there is nothing to tell apart
        with self.lock:
            if self.mode is None:
                self.mode = logprobs_mode(top_logprobs_at, server)
        if self.mode == "raw":
            return 1.0
        if cut:
            raise PolicyError(
                f"{server} returns log-probabilities after the top-p/top-k cut (vLLM --logprobs-mode processed_logprobs), which are "
                f"no log-softmax of the logits the trainer computes: serve with the default --logprobs-mode raw_logprobs, or sample "
                f"without {setting('policy.top_p')} and {setting('policy.top_k')}"
            )
        return sampling.temperature


def logprobs_mode(top_logprobs_at: Callable[[float], dict[int, float]], server: str) -> str:
    """ "raw" or "processed": whether the spread of the top log-probabilities of one next token
    widens at temperature 0.5 (processed: divided by 0.5, it doubles) or not (raw)."""
    at_half, at_one = top_logprobs_at(MODE_PROBE_TEMPERATURE), top_logprobs_at(1.0)
    for found in (at_half, at_one):
        if found and (max(found.values()) > LOGPROB_SLACK or math.log(sum(math.exp(v) for v in found.values())) > LOGPROB_SLACK):
            raise PolicyError(
                f"{server} returns values that are no log-probabilities (their probabilities sum above 1: logits, vLLM --logprobs-mode "
                "raw_logits or processed_logits?); serve with the default --logprobs-mode raw_logprobs"
            )
    common = sorted(at_half.keys() & at_one.keys())
    spread_half = max((at_half[i] for i in common), default=0.0) - min((at_half[i] for i in common), default=0.0)
    spread_one = max((at_one[i] for i in common), default=0.0) - min((at_one[i] for i in common), default=0.0)
    if len(common) < 2 or spread_one < 1e-6:
        raise PolicyError(
            f"{server} returned top log-probabilities that cannot tell at which temperature its log-probabilities are "
            f"({len(common)} tokens in common at temperatures {MODE_PROBE_TEMPERATURE} and 1, spread {spread_one:.2g})"
        )
    return "raw" if spread_half / spread_one < (1 + 1 / MODE_PROBE_TEMPERATURE) / 2 else "processed"


def served_weights(base_urls: list[str], model: str, timeout: float = 30.0) -> str:
    """The weights every replica serves ``model`` from (its ``root`` in ``/v1/models``; vLLM: the
    ``--model`` it was started with), as a directory or hub id this machine can load: the base the
    update trains, so that it is the base the server samples. One line (AgentError) otherwise."""
    pool = ServerPool(base_urls, api_key(), timeout, retries=0)
    roots: dict[str, str] = {}
    for base in pool.bases:
        url = base + "/models"
        try:
            listing = pool.get(base, "/models", MODELS_LISTING_BYTES, min(timeout, 30))
        except (HTTPStatus, OSError, http.client.HTTPException, ValueError) as error:
            raise AgentError(
                f"{url} gave no model list ({type(error).__name__}: {str(error)[:80]}), so the weights explorer rl trains cannot be "
                f"found; start the server (vLLM) or fix {setting('policy.base_url')}"
            ) from None
        data = listing.get("data") if isinstance(listing, dict) else None
        entry = (
            next((item for item in data if isinstance(item, dict) and item.get("id") == model), None) if isinstance(data, list) else None
        )
        if entry is None:
            raise AgentError(f"{setting('policy.model')} {model!r}: {url} does not list it; pass the name the server serves the base under")
        if entry.get("parent") is not None:
            raise AgentError(
                f"{setting('policy.model')} {model!r} is an adapter {url} serves on {entry['parent']!r}: explorer rl trains an adapter "
                f"on the base; pass the base's served name as {setting('policy.model')} and this adapter's directory as {setting('policy.adapter')}"
            )
        root = entry.get("root")
        if not isinstance(root, str) or not root:
            raise AgentError(f"{url} lists no root for {model!r}, so the weights it samples are unknown; use a vLLM server (it lists them)")
        roots[base] = root
    if len(set(roots.values())) > 1:
        raise AgentError(
            f"the replicas serve {model!r} from different weights ({', '.join(sorted(set(roots.values())))}); serve one model on all"
        )
    root = next(iter(roots.values()))
    if not Path(root).is_dir() and (root.startswith((".", "/")) or not HUB_ID.fullmatch(root)):
        raise AgentError(
            f"{pool.bases[0]}/models serves {model!r} from {root}, which is no directory on this machine: explorer rl trains the weights "
            "the server samples, so the server and the trainer must see the same path (or serve the model by its hub id)"
        )
    return root
