"""Is the host done? The end of turn decided by what was said, not only by silence.

When the host pauses, the speculative transcript of her words so far is scored by the reply LLM itself:
the probability it gives its end-of-turn marker right after them, in the conversation's own context
(system prompt, history, memory notes), so the evaluated prefix is the one the reply goes on from. A
finished utterance ("What is your favorite color?", "Tell me a joke.") scores high and ends the turn after
``vad.end_of_turn_finished_ms`` of silence; one that trails off ("so the thing about my brother is")
scores near zero and gets the whole ``vad.end_of_turn_silence_ms``. Measured on a labelled set of
synthesized utterances (``idolcast bench --turn-end``; docs/PERFORMANCE.md).

Backends that cannot score (an OpenAI-compatible server) fall back to punctuation: a transcript ending in
``?`` or ``!`` counts as finished (``vad.turn_detector = "punctuation"`` forces that rule).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Literal

from engine.events import UserTurn
from engine.llm.base import LLM, TurnEndScorer
from engine.llm.prompt import PromptProvider
from engine.vad.config import VADConfig

log = logging.getLogger(__name__)

FINISHED_ENDINGS = ("?", "!")  # the punctuation rule's finished transcripts
Method = Literal["llm", "punctuation", "off"]


@dataclass(frozen=True)
class TurnEndDecision:
    finished: bool
    method: Method
    probability: float | None = None  # the LLM's P(end of turn), where it scored
    cost_ms: float = 0.0

    def to_dict(self) -> dict[str, object]:
        p = None if self.probability is None else round(self.probability, 4)
        return {"finished": self.finished, "method": self.method, "p": p, "ms": round(self.cost_ms, 1)}


def detector_method(config: VADConfig, llm: LLM) -> Method:
    """What ``vad.turn_detector`` means with this LLM: 'auto' scores with the LLM where it can."""
    if config.turn_detector == "auto":
        return "llm" if isinstance(llm, TurnEndScorer) and not _random_weights(llm) else "punctuation"
    if config.turn_detector == "llm" and not isinstance(llm, TurnEndScorer):
        log.warning("vad.turn_detector 'llm': %s cannot score turns; using punctuation", llm.describe())
        return "punctuation"
    return config.turn_detector


def _random_weights(llm: LLM) -> bool:
    source = getattr(llm, "source", None)
    return getattr(source, "kind", "") == "random"


class TurnEndDetector:
    """One session's end-of-turn decisions (the LLM's conversation context is the session's)."""

    def __init__(self, config: VADConfig, llm: LLM, prompt: PromptProvider, cache_key: str) -> None:
        self.config = config
        self.llm = llm
        self.prompt = prompt
        self.cache_key = cache_key
        self.method = detector_method(config, llm)

    async def decide(self, turn: UserTurn) -> TurnEndDecision:
        """Score the host's words so far (``turn.text``, the speculative transcript at a pause)."""
        start = time.perf_counter()
        if self.method == "llm" and isinstance(self.llm, TurnEndScorer):
            messages = await self.prompt.build_prompt(turn)
            p = await self.llm.end_of_turn_probability(messages, cache_key=self.cache_key)
            ms = (time.perf_counter() - start) * 1000
            return TurnEndDecision(p >= self.config.end_of_turn_threshold, "llm", p, ms)
        if self.method == "punctuation":
            return TurnEndDecision(turn.text.rstrip().endswith(FINISHED_ENDINGS), "punctuation")
        return TurnEndDecision(False, "off")
