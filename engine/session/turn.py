"""One turn of the conversation: what the host said, the reply's task, its timings and what was heard."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Protocol

from engine.clock import Clock
from engine.config import Settings
from engine.events import UserTurn
from engine.llm.prompt import PromptProvider
from engine.models import EngineModels
from engine.session.bus import EventBus
from engine.session.reply import ReplyResult
from engine.session.timings import TurnMetrics, TurnTimings
from engine.transport.playout import HeardChunk, PlayoutBuffer


class SessionParts(Protocol):
    """What the listener and the conversation run on: the session's settings, models (read at each use:
    a test may swap one), prompt, clock, bus and playout buffer."""

    id: str
    settings: Settings
    models: EngineModels
    prompt: PromptProvider
    clock: Clock
    bus: EventBus
    playout: PlayoutBuffer
    metrics: TurnMetrics | None


@dataclass
class Turn:
    """A turn from its words (voice or text) to the end of its reply.

    ``user`` is the turn as announced (a voice turn gets its final transcript and end of speech at the
    end of the turn); ``task`` is its reply (started early on a pause, or when the turn comes up);
    ``heard`` the chunks the audience heard, whole or cut.
    """

    user: UserTurn
    timings: TurnTimings
    task: asyncio.Task[None] | None = None
    result: ReplyResult = field(default_factory=ReplyResult)
    heard: list[HeardChunk] = field(default_factory=list)
    chunks_finished: int = 0
    interrupted: bool = False
    continued: bool = False  # the host went on talking after it: a later turn answers its words with his next

    @property
    def id(self) -> int:
        return self.user.turn_id

    @property
    def replying(self) -> bool:
        return self.task is not None and not self.task.done()

    @property
    def played_out(self) -> bool:
        """Every chunk queued so far has played (or the reply was cut)."""
        return self.interrupted or self.chunks_finished >= self.result.queued

    def played_text(self) -> str:
        return " ".join(h.heard_text() for h in sorted(self.heard, key=lambda h: h.audio.index)).strip()

    def remembered(self, played: str) -> str:
        """What the history keeps. Heard in full: the model's own words (tags included), so the next prompt
        starts with exactly the tokens the LLM already holds in its KV cache. Cut short: only what was heard."""
        if played and not self.interrupted and not self.timings.error and self.result.written.strip():
            return self.result.written.strip()
        return played
