"""The persona/system-prompt seam between a session and its language model.

A :class:`PromptProvider` turns the host's (or a viewer's) turn into the chat
messages for the LLM, remembers what was actually *played* of each reply, and
guards every reply chunk before it reaches TTS. The engine ships
:class:`SimplePromptProvider` (a fixed system prompt and a bounded history);
the ``persona`` package provides the full memory bank behind the same protocol.

Keep the prompt prefix-stable across turns (system prompt first, history next,
anything retrieved per turn last and short): the transformers backend reuses
the KV cache of the longest common prefix, so a stable prefix is never re-prefilled.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

from engine.events import UserTurn
from engine.llm.base import ChatMessage


class PromptProvider(Protocol):
    async def build_prompt(self, turn: UserTurn) -> list[ChatMessage]:
        """Messages for this turn. Must not add noticeable latency (it is on the hot path)."""
        ...

    def guard(self, text: str) -> str | None:
        """Check one reply chunk before TTS: return it (possibly repaired), or None to drop it."""
        ...

    async def record_turn(self, turn: UserTurn, played_reply: str, interrupted: bool) -> None:
        """After the turn: keep what was heard. Runs off the hot path."""
        ...

    def next_prefix(self) -> list[ChatMessage]:
        """What the next turn's messages will most likely start with (the system prompt and the history,
        without the next user message): the session has the LLM prefill it between turns."""
        ...


class SimplePromptProvider:
    """A fixed system prompt and the last exchanges: at most ``max_turns``.

    Once there are more, the oldest are dropped down to half of ``max_turns`` at once, not one a turn: every
    drop changes the prompt right after the system prompt, so the LLM's cached prefix is lost and the whole
    history prefilled again (on the H200, a sliding window re-prefilled ~420 tokens every turn: +150 ms to
    the first token). Trimmed in halves, the prefix then holds for ``max_turns // 2 + 1`` turns in a row.
    """

    def __init__(self, system_prompt: str, max_turns: int = 8) -> None:
        if max_turns < 1:
            raise ValueError("max_turns must be at least 1")
        self.system_prompt = system_prompt
        self.max_turns = max_turns
        self._history: deque[tuple[str, str]] = deque()

    async def build_prompt(self, turn: UserTurn) -> list[ChatMessage]:
        return [*self.next_prefix(), {"role": "user", "content": _speaker_prefixed(turn)}]

    def next_prefix(self) -> list[ChatMessage]:
        messages: list[ChatMessage] = [{"role": "system", "content": self.system_prompt}]
        for user, reply in self._history:
            messages.append({"role": "user", "content": user})
            messages.append({"role": "assistant", "content": reply})
        return messages

    def guard(self, text: str) -> str | None:
        return text

    async def record_turn(self, turn: UserTurn, played_reply: str, interrupted: bool) -> None:
        if played_reply.strip():
            self._history.append((_speaker_prefixed(turn), played_reply))
            if len(self._history) > self.max_turns:
                keep = max(1, self.max_turns // 2)
                while len(self._history) > keep:
                    self._history.popleft()

    @property
    def history(self) -> list[tuple[str, str]]:
        return list(self._history)


def _speaker_prefixed(turn: UserTurn) -> str:
    if turn.source == "chat":
        return f"{turn.speaker} (chat): {turn.text}"
    return turn.text
