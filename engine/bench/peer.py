"""The bench's client peer: a real aiortc connection that speaks questions and records the reply.

Its microphone track plays questions in real time (silence otherwise) and notes the
client-clock time at which each question's speech starts and ends as sent; the
receiver notes, for every reply audio frame, its arrival time and loudness.
"""

from __future__ import annotations

import asyncio
import fractions
from collections import deque
from dataclasses import dataclass, field

import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from av import AudioFrame

from engine.clock import Clock

RATE = 48000
FRAME = 960
LOUD_RMS = 0.01  # −40 dBFS: "audio above threshold"


@dataclass
class Clip:
    pcm: np.ndarray  # int16 mono 48 kHz
    speech_start: int  # first loud sample
    speech_end: int  # last loud sample + 1
    sent_start: float | None = None
    sent_end: float | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)


def speech_bounds(pcm: np.ndarray, threshold: float = 0.02) -> tuple[int, int]:
    x = np.abs(pcm.astype(np.float32) / 32768.0)
    loud = np.flatnonzero(x > threshold)
    if len(loud) == 0:
        return 0, len(pcm)
    return int(loud[0]), int(loud[-1]) + 1


class QuestionTrack(MediaStreamTrack):
    """The bench's microphone."""

    kind = "audio"

    def __init__(self, clock: Clock) -> None:
        super().__init__()
        self.clock = clock
        self._clips: deque[tuple[Clip, int]] = deque()
        self._t0: float | None = None
        self._frames = 0

    def play(self, pcm: np.ndarray, bounds: tuple[int, int] | None = None) -> Clip:
        """Queue ``pcm``; ``bounds`` (samples) says where its speech is, when its level cannot (a quiet or
        noisy host: the speech's end is then measured on the clean voice, not on the noise)."""
        start, end = bounds if bounds is not None else speech_bounds(pcm)
        clip = Clip(pcm.astype(np.int16), start, end)
        self._clips.append((clip, 0))
        return clip

    async def recv(self) -> AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        if self._t0 is None:
            self._t0 = self.clock.now()
        t = self._t0 + self._frames * FRAME / RATE
        await self.clock.sleep_until(t)
        out = np.zeros(FRAME, dtype=np.int16)
        if self._clips:
            clip, pos = self._clips[0]
            k = min(FRAME, len(clip.pcm) - pos)
            out[:k] = clip.pcm[pos : pos + k]
            if clip.sent_start is None and pos <= clip.speech_start < pos + k:
                clip.sent_start = t + (clip.speech_start - pos) / RATE
            if clip.sent_end is None and pos < clip.speech_end <= pos + k:
                clip.sent_end = t + (clip.speech_end - pos) / RATE
            pos += k
            if pos >= len(clip.pcm):
                self._clips.popleft()
                clip.done.set()
            else:
                self._clips[0] = (clip, pos)
        self._frames += 1
        frame = AudioFrame(format="s16", layout="mono", samples=FRAME)
        frame.planes[0].update(out.tobytes())
        frame.pts = self._frames * FRAME
        frame.sample_rate = RATE
        frame.time_base = fractions.Fraction(1, RATE)
        return frame


@dataclass
class ReceivedAudio:
    """Arrival times and levels of the reply frames, plus the audio itself (bounded)."""

    times: list[float] = field(default_factory=list)
    pts_s: list[float] = field(default_factory=list)  # receiver-relative RTP time of each frame
    rms: list[float] = field(default_factory=list)
    onset: list[float] = field(default_factory=list)  # first loud sample time within the frame, or nan
    pcm: list[np.ndarray] = field(default_factory=list)
    keep_pcm: bool = True

    def first_loud_after(self, t: float) -> float | None:
        for ti, onset in zip(self.times, self.onset, strict=True):
            if ti >= t and not np.isnan(onset):
                return ti + onset
        return None

    def loud_now(self, now: float, within_s: float = 0.05) -> bool:
        """The latest frame arrived in the last ``within_s`` and was loud."""
        return bool(self.times) and now - self.times[-1] <= within_s and self.rms[-1] >= LOUD_RMS

    def loud_for(self, now: float, span_s: float, within_s: float = 0.05) -> bool:
        """Every frame of the last ``span_s`` was loud, the latest arriving in the last ``within_s``: the
        reply is in the middle of its words, not at the tail of one before a pause."""
        if not self.loud_now(now, within_s):
            return False
        i = len(self.times) - 1
        while i >= 0 and self.times[i] >= now - span_s:
            if self.rms[i] < LOUD_RMS:
                return False
            i -= 1
        return i >= 0

    def loud_between(self, t0: float, t1: float) -> bool:
        """Some frame arriving in ``[t0, t1]`` was loud."""
        return any(t0 <= ti <= t1 and r >= LOUD_RMS for ti, r in zip(self.times, self.rms, strict=True))

    def quiet_from(self, t: float, hold_s: float = 0.4) -> float | None:
        """Start of the first stretch of at least ``hold_s`` of silence after ``t``."""
        quiet_start: float | None = None
        for ti, r in zip(self.times, self.rms, strict=True):
            if ti < t:
                continue
            if r < LOUD_RMS:
                if quiet_start is None:
                    quiet_start = ti
                elif ti - quiet_start >= hold_s:
                    return quiet_start
            else:
                quiet_start = None
        return None


async def record_audio(track: MediaStreamTrack, clock: Clock, out: ReceivedAudio) -> None:
    while True:
        try:
            frame = await track.recv()
        except MediaStreamError:
            return
        now = clock.now()
        assert isinstance(frame, AudioFrame)
        data = frame.to_ndarray().astype(np.float32) / 32768.0
        channels = len(frame.layout.channels)
        mono = data.reshape(-1, channels).mean(axis=1) if channels > 1 else data.reshape(-1)
        rms = float(np.sqrt(np.mean(mono**2))) if len(mono) else 0.0
        loud = np.flatnonzero(np.abs(mono) > LOUD_RMS * 3)
        out.times.append(now)
        out.pts_s.append(frame.pts / frame.sample_rate if frame.pts is not None else now)
        out.rms.append(rms)
        out.onset.append(float(loud[0]) / RATE if rms >= LOUD_RMS and len(loud) else float("nan"))
        if out.keep_pcm:
            out.pcm.append((mono * 32767).astype(np.int16))
