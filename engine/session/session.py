"""A session: one host connection, its media clock, and the conversation running on it.

Data flow (one task per stage, all owned by the session's :class:`TaskOwner`)::

    mic track ─► Listener: resample 16 kHz ─► VAD ─► ASR stream (partials, speculation)
                                            │
                          end of turn ──────┴─► turn queue ◄── text / chat turns
                                                    │
                          Conversation ─► reply task: LLM ─► chunker ─► guard ─► TTS
                                                                                   │
    audio track ◄── playout buffer (bounded, on the clock) ◄───────────────────────┘

Everything that happens goes out as a typed event on the session's :class:`EventBus` (the avatar, the
chat queue, MQTT and the event stream observe it). Barge-in: speech from the host while the idol
talks flushes the playout buffer (with a short fade) and cancels the reply task; the history keeps
only what was heard.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Protocol

from aiortc.mediastreams import MediaStreamTrack

from engine.clock import Clock, MediaClock
from engine.config import Settings
from engine.events import ExpressionCommand, GestureCommand, TurnSource
from engine.llm.prompt import PromptProvider, SimplePromptProvider
from engine.models import EngineModels
from engine.session.bus import EventBus
from engine.session.conversation import Conversation
from engine.session.listener import Listener
from engine.session.timings import TurnMetrics, TurnTimings
from engine.tasks import TaskOwner
from engine.transport.audio_out import LATE_S, IdolAudioTrack
from engine.transport.playout import PlayoutBuffer
from engine.transport.video_out import IdolVideoTrack

log = logging.getLogger(__name__)


class SessionClosed(Exception):
    pass


class VideoSource(Protocol):
    def set_profile(self, profile: str) -> None: ...


class Session:
    def __init__(
        self,
        session_id: str,
        settings: Settings,
        models: EngineModels,
        *,
        clock: Clock | None = None,
        prompt: PromptProvider | None = None,
        metrics: TurnMetrics | None = None,
    ) -> None:
        self.id = session_id
        self.settings = settings
        self.models = models
        self.clock: Clock = clock or MediaClock()
        self.prompt: PromptProvider = prompt or SimplePromptProvider(settings.persona.system_prompt)
        self.metrics = metrics
        self.bus = EventBus()
        self._owner = TaskOwner(f"session-{session_id}")
        self.playout = PlayoutBuffer()
        self.conversation = Conversation(self, self._owner)
        self.playout.observer = self.conversation
        self.listener = Listener(self, self.conversation)
        self.audio_track = IdolAudioTrack(self.clock, self.playout)
        self.video_track: MediaStreamTrack | None = None
        self.video_source: VideoSource | None = None  # set by the avatar when the session has a face
        self._closed = False
        self._owner.spawn(self.conversation.run(), "conversation")

    @property
    def turns(self) -> deque[TurnTimings]:
        """The completed turns' timings, oldest first (the last 500)."""
        return self.conversation.history

    @property
    def early_replies(self) -> dict[str, int]:
        """How many early replies started, were confirmed at the end of the turn, were cancelled."""
        return self.conversation.early.counts

    def speaking(self) -> bool:
        """The idol is talking, or about to (a reply is being generated)."""
        return self.conversation.speaking()

    def attach_mic(self, track: MediaStreamTrack) -> None:
        self._owner.spawn(self.listener.run(track), "mic")

    async def submit_text(self, text: str, speaker: str = "host", source: TurnSource = "host_text") -> int:
        """A typed or chat message becomes a turn like speech does; returns its turn id."""
        if self._closed:
            raise SessionClosed(self.id)
        text = text.strip()
        if not text:
            raise ValueError("empty message")
        turn = self.conversation.new_turn(text, source, speaker)
        turn.timings.end_of_turn = turn.timings.asr_final = turn.user.t
        self.conversation.queue(turn)
        return turn.id

    async def interrupt(self, reason: str = "host") -> bool:
        """Stop the idol now: flush queued audio (with a short fade) and cancel the reply."""
        return await self.conversation.interrupt(reason)

    def command(self, cmd: ExpressionCommand | GestureCommand) -> None:
        """A face command (the host's): the avatar and the pages see it on the bus."""
        self.bus.publish(cmd)

    def set_output_profile(self, name: str) -> None:
        """Switch the video size live: no model reload, no renegotiation (the encoder follows the size)."""
        if self.video_source is None:
            raise ValueError("this session has no video")
        self.video_source.set_profile(name)

    async def set_persona(self, name: str) -> None:
        """Switch who she is, live (needs a prompt provider that supports it: the persona bank)."""
        switch = getattr(self.prompt, "switch_persona", None)
        if switch is None:
            raise ValueError("persona switching needs the persona memory bank (persona.enabled)")
        result = switch(name)
        if asyncio.iscoroutine(result):
            await result

    def late_frames(self) -> int:
        """Video frames this session dropped as late so far (0 without a paced video track)."""
        v = self.video_track
        return v.dropped if isinstance(v, IdolVideoTrack) else 0

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self.conversation.close()
        await self._owner.cancel_all()
        self.audio_track.stop()
        a = self.audio_track
        log.info(
            "session %s audio: %d frames asked for more than %.0f ms late, the latest %.0f ms",
            self.id,
            a.late_frames,
            LATE_S * 1e3,
            a.most_late_s * 1e3,
        )
        if self.video_track is not None:
            self.video_track.stop()
            if isinstance(self.video_track, IdolVideoTrack):  # late frames are dropped, never queued
                v = self.video_track
                log.info("session %s video: %d frames sent, %d dropped (late)", self.id, v.sent, v.dropped)
        self.listener.close()
        self.bus.close()
