"""The language-model seam."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Literal, Protocol, TypedDict, runtime_checkable


class ChatMessage(TypedDict):
    role: Literal["system", "user", "assistant"]
    content: str


class LLM(Protocol):
    def stream(self, messages: list[ChatMessage], cache_key: str | None = None) -> AsyncIterator[str]:
        """Stream reply text pieces. Closing the iterator (or cancelling its consumer) stops generation
        promptly. ``cache_key`` names a conversation whose KV cache the backend may keep and reuse
        across calls (the persona prefix and history are stable, so only the new tail is prefilled)."""
        ...

    def describe(self) -> str: ...

    async def prewarm(self, messages: list[ChatMessage], cache_key: str | None = None) -> int:
        """Between turns: put ``messages`` (what the next prompt starts with: the system prompt and the
        history) into the KV cache the next call on ``cache_key`` will reuse, so that call prefills only the
        new user message. Returns the tokens prefilled (0 where the backend keeps no cache). Cancelling it
        stops the work at the next prefill chunk and keeps what was done."""
        ...


class LLMError(Exception):
    """The model or endpoint failed; the message says which and why."""


@runtime_checkable
class TurnEndScorer(Protocol):
    """An in-process LLM that can say how finished the host's words sound (llama.cpp, transformers)."""

    async def end_of_turn_probability(
        self, messages: list[ChatMessage], cache_key: str | None = None
    ) -> float:
        """The probability the model gives its end-of-turn marker right after the last message's text
        (LiveKit's turn detector reads a small LM this way). The conversation's context keeps what was
        evaluated, so the reply that follows prefills only the marker and its own opening."""
        ...


@runtime_checkable
class ScoredStreamer(Protocol):
    """An LLM that judges the host's words in the reply's own prefill (llama.cpp)."""

    def stream_scored(
        self, messages: list[ChatMessage], cache_key: str | None, scored: Callable[[float], None]
    ) -> AsyncIterator[str]:
        """``stream``, and on the way ``scored(p)``, called on the event loop as soon as the prefill holds
        the last message's text, with the probability ``end_of_turn_probability`` would give: the reply
        and the judgement of whether the host is done come out of one prefill, with no second call."""
        ...
