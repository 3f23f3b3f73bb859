"""Is the host done? The end of turn decided by what was said, not only by silence.

When the host pauses, the speculative transcript of her words so far is scored by the reply LLM itself:
the probability it gives its end-of-turn marker right after them, in the conversation's own context
(system prompt, history, memory notes), so the evaluated prefix is the one the reply goes on from. A
finished utterance ("What is your favorite color?", "Tell me a joke.") scores high and ends the turn after
``vad.end_of_turn_finished_ms`` of silence; one that trails off ("so the thing about my brother is")
scores near zero and gets the whole ``vad.end_of_turn_silence_ms``. The bundled 135M model leans on
Whisper's punctuation, which Whisper also puts after cut-off words ("Where would you?"), so words that
end on a dangling function word ("... and", "... the", "... could") or on a comma or an ellipsis ("Wait,")
never count as finished whatever the score. Measured on a labelled set of synthesized utterances (``idolcast bench --turn-end``;
docs/PERFORMANCE.md): the combination made fewer false early ends than either signal alone.

Backends that cannot score (an OpenAI-compatible server) fall back to punctuation: a transcript ending in
``?`` or ``!`` counts as finished (``vad.turn_detector = "punctuation"`` forces that rule).
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from typing import Literal

from engine.events import UserTurn
from engine.llm.base import LLM, ScoredStreamer, TurnEndScorer
from engine.llm.prompt import PromptProvider
from engine.vad.config import VADConfig

log = logging.getLogger(__name__)

FINISHED_ENDINGS = ("?", "!")  # the punctuation rule's finished transcripts
# Words an English sentence does not end on: articles, conjunctions, prepositions, auxiliaries, ...
DANGLING = frozenset(
    [
        "a",
        "an",
        "the",
        "and",
        "or",
        "but",
        "so",
        "because",
        "if",
        "when",
        "that",
        "is",
        "are",
        "was",
        "were",
        "to",
        "of",
        "in",
        "on",
        "at",
        "for",
        "with",
        "about",
        "my",
        "your",
        "his",
        "her",
        "their",
        "our",
        "could",
        "would",
        "should",
        "can",
        "will",
        "do",
        "does",
        "did",
        "have",
        "has",
        "had",
        "be",
        "been",
        "like",
        "really",
        "then",
        "than",
        "as",
        "from",
        "by",
        "into",
        "what",
        "which",
        "who",
        "where",
        "how",
        "why",
        "i",
        "we",
        "they",
        "he",
        "she",
        "just",
        "maybe",
        "um",
        "uh",
        "this",
        "these",
        "those",
        "very",
    ]
)
_WORD = re.compile(r"[a-z']+")
# Whisper's own sign that more was coming: a clause mark or an ellipsis at the end ("Wait," before
# "stop for a second": with the pause judged finished, the idol answered "Wait" and was cut at once).
OPEN_ENDINGS = (",", ";", ":", "-", "\u2013", "\u2014", "...", "\u2026")


def ends_dangling(text: str) -> bool:
    """True when the words trail off: the last word is one a sentence does not end on, or the transcript
    ends on a clause mark or an ellipsis."""
    if text.rstrip().endswith(OPEN_ENDINGS):
        return True
    words = _WORD.findall(text.lower())
    return bool(words) and words[-1] in DANGLING


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
            built = time.perf_counter()
            p = await self.llm.end_of_turn_probability(messages, cache_key=self.cache_key)
            ms = (time.perf_counter() - start) * 1000
            log.debug("turn end: prompt %.0f ms, score %.0f ms, p %.3f", (built - start) * 1e3, ms, p)
            return self.judge(turn.text, p, ms)
        if self.method == "punctuation":
            finished = turn.text.rstrip().endswith(FINISHED_ENDINGS) and not ends_dangling(turn.text)
            return TurnEndDecision(finished, "punctuation")
        return TurnEndDecision(False, "off")

    @property
    def scores_in_reply(self) -> bool:
        """The LLM judges the words in the reply's own prefill (``ScoredStreamer``): an early reply started
        on them yields the decision as it starts, with no call of its own."""
        return self.method == "llm" and isinstance(self.llm, ScoredStreamer)

    def judge(self, text: str, probability: float, cost_ms: float = 0.0) -> TurnEndDecision:
        """The decision on ``text`` from the LLM's end-of-turn probability after it."""
        finished = probability >= self.config.end_of_turn_threshold and not ends_dangling(text)
        return TurnEndDecision(finished, "llm", probability, cost_ms)

    async def warm(self, turn: UserTurn) -> None:
        """While the host is still talking: put her words so far (a partial transcript) into the
        conversation's context, so the score at the pause, and the reply after it, prefill only the words
        that came since (~100 ms of prefill saved on two cores). Nothing is decided."""
        if self.method == "llm" and isinstance(self.llm, TurnEndScorer):
            messages = await self.prompt.build_prompt(turn)
            await self.llm.end_of_turn_probability(messages, cache_key=self.cache_key)
