"""A stage for one session, in the spirit of pipecat's ``run_test``: no server, no WebRTC peer.

The harness is the host's microphone and the audience's ears. Time is a :class:`ScriptedClock` moved
20 ms per :meth:`Stage.tick`: each tick puts the host's next 20 ms of audio (a recording, or silence) into
the session's mic track and pulls one 20 ms frame from its audio track, so the session's listener,
conversation and playout run exactly as they do behind a peer, with the real models. ``pace_s`` is the
real time each tick leaves the models (0.02: they see real time; the turn-taking thresholds are real-time
figures); what the session published is in ``events``, what the audience heard in ``heard``.
"""

from __future__ import annotations

import asyncio
import contextlib
import fractions
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import TypeVar

import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from av import AudioFrame

from engine.clock import ScriptedClock
from engine.config import Settings
from engine.events import Event
from engine.llm.prompt import PromptProvider
from engine.models import EngineModels
from engine.session.session import Session
from tests.conftest import resample_linear, synthesize_speech

RATE = 48000
FRAME = RATE // 50  # 20 ms
E = TypeVar("E", bound=Event)


def speech_48k(text: str, lead_s: float = 0.1) -> np.ndarray:
    """``text`` in the bundled voice at 48 kHz int16, after ``lead_s`` of silence (the recorded-audio boundary)."""
    pcm, rate = synthesize_speech(text)
    pcm48 = resample_linear(pcm, rate, RATE).astype(np.int16)
    return np.concatenate([np.zeros(int(RATE * lead_s), np.int16), pcm48])


class ScriptedMic(MediaStreamTrack):
    """The host's microphone: 20 ms frames with continuous pts, as a receiver track hands them over."""

    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self._frames: asyncio.Queue[AudioFrame | None] = asyncio.Queue()
        self._pts = 0

    def push(self, pcm: np.ndarray) -> None:
        frame = AudioFrame(format="s16", layout="mono", samples=len(pcm))
        frame.planes[0].update(np.ascontiguousarray(pcm, dtype=np.int16).tobytes())
        frame.sample_rate = RATE
        frame.time_base = fractions.Fraction(1, RATE)
        frame.pts = self._pts
        self._pts += len(pcm)
        self._frames.put_nowait(frame)

    @property
    def pending(self) -> int:
        return self._frames.qsize()

    def end(self) -> None:
        self._frames.put_nowait(None)

    async def recv(self) -> AudioFrame:
        frame = await self._frames.get()
        if frame is None:
            raise MediaStreamError
        return frame


class Stage:
    def __init__(
        self,
        settings: Settings,
        models: EngineModels,
        *,
        prompt: PromptProvider | None = None,
        pace_s: float = 0.02,
        listen: bool = True,
    ) -> None:
        self.clock = ScriptedClock(0.0)
        self.session = Session("stage", settings, models, clock=self.clock, prompt=prompt)
        self.pace_s = pace_s
        self.events: list[Event] = []
        self.session.bus.add_observer(self.events.append)
        self.heard: list[tuple[float, np.ndarray]] = []  # (clock time of the frame, its samples)
        self._host: deque[np.ndarray] = deque()  # what the host is still to say, in 20 ms frames
        self.mic = ScriptedMic()
        if listen:
            self.session.attach_mic(self.mic)

    # ---- the host ----------------------------------------------------------------------------

    def say(self, pcm: np.ndarray, then_silence_s: float = 0.0) -> float:
        """Queue the host's audio after what she is already saying; returns the clock time it starts."""
        start = self.clock.now() + len(self._host) * FRAME / RATE
        silence = np.zeros(int(then_silence_s * RATE), np.int16)
        audio = np.concatenate([pcm.astype(np.int16), silence])
        audio = np.concatenate([audio, np.zeros(-len(audio) % FRAME, np.int16)])
        self._host.extend(audio.reshape(-1, FRAME))
        return start

    @property
    def host_done(self) -> bool:
        return not self._host

    # ---- time --------------------------------------------------------------------------------

    async def tick(self) -> None:
        """20 ms: the host's next frame into the mic, the clock forward, one frame out to the audience."""
        self.mic.push(self._host.popleft() if self._host else np.zeros(FRAME, np.int16))
        for _ in range(200):  # the listener takes the frame (it reads one at a time)
            if not self.mic.pending:
                break
            await asyncio.sleep(0.001)
        self.clock.advance(FRAME / RATE)
        frame = await asyncio.wait_for(self.session.audio_track.recv(), 5)
        self.heard.append((float(frame.pts) / RATE, frame.to_ndarray().reshape(-1)))
        await asyncio.sleep(self.pace_s)

    async def run_until(self, done: Callable[[], bool], limit_s: float = 60.0) -> None:
        """Tick until ``done()`` (checked after each tick); fails after ``limit_s`` of clock time."""
        end = self.clock.now() + limit_s
        while not done():
            if self.clock.now() >= end:
                raise TimeoutError(f"not done after {limit_s} s on the clock; events: {self.kinds()}")
            await self.tick()

    async def run_for(self, seconds: float) -> None:
        end = self.clock.now() + seconds
        while self.clock.now() < end - 1e-9:
            await self.tick()

    async def until_event(self, kind: type[E], limit_s: float = 60.0, after: int = 0) -> E:
        """Tick until the session publishes a ``kind`` event (the ``after``-th one on, counting from 0)."""
        await self.run_until(lambda: len(self.of(kind)) > after, limit_s)
        return self.of(kind)[after]

    # ---- what happened -------------------------------------------------------------------------

    def of(self, kind: type[E]) -> list[E]:
        return [e for e in self.events if isinstance(e, kind)]

    def kinds(self) -> list[str]:
        return [e.kind or type(e).__name__ for e in self.events]

    def loud_at(self, threshold: int = 500) -> list[float]:
        """Clock times of the audience's frames that carried the idol's voice."""
        return [t for t, pcm in self.heard if np.abs(pcm).max(initial=0) > threshold]

    async def close(self) -> None:
        self.mic.end()
        await self.session.close()


@contextlib.asynccontextmanager
async def stage(
    settings: Settings, models: EngineModels, *, prompt: PromptProvider | None = None, pace_s: float = 0.02
) -> AsyncIterator[Stage]:
    """A :class:`Stage`, closed on exit."""
    s = Stage(settings, models, prompt=prompt, pace_s=pace_s)
    try:
        yield s
    finally:
        await s.close()
