"""The language-model seam."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Literal, Protocol, TypedDict


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
