"""The idol's speech playout buffer: synthesized chunks waiting to be played, on the media clock.

Audio is one continuous sample stream: sample ``n`` of the outgoing track plays at
``t0 + n / rate`` on the session clock. A chunk queued here therefore has an exact
start time as soon as it is queued, which the animator uses to move the lips for
it ahead of time. The buffer is bounded in milliseconds of media: ``wait_for_room``
applies back-pressure to TTS. ``flush`` cuts playback (barge-in) with a short fade
and reports what was actually heard.

One observer (the session) hears of each chunk three times: when its start time is known
(``chunk_scheduled``), when its first sample is pulled (``chunk_started``) and when it has played
out (``chunk_finished``). Everything here runs on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from engine.events import SpeechAudio

log = logging.getLogger(__name__)
GAPS_KEPT = 100


@dataclass
class _Queued:
    audio: SpeechAudio
    start_sample: int  # position in the track's sample timeline
    played: int = 0  # samples of this chunk already taken

    @property
    def end_sample(self) -> int:
        return self.start_sample + len(self.audio.pcm)


@dataclass(frozen=True, slots=True)
class HeardChunk:
    """What the audience heard of one chunk: ``played_s`` of ``audio``."""

    audio: SpeechAudio
    played_s: float

    @property
    def complete(self) -> bool:
        return self.played_s >= self.audio.duration_s - 1e-6

    def heard_text(self) -> str:
        if self.complete or not self.audio.words:
            return self.audio.text if self.complete else _prefix_by_ratio(self.audio.text, self.ratio)
        return " ".join(w.word for w in self.audio.words if w.end_s <= self.played_s + 0.02)

    @property
    def ratio(self) -> float:
        d = self.audio.duration_s
        return 1.0 if d <= 0 else min(1.0, self.played_s / d)


def _prefix_by_ratio(text: str, ratio: float) -> str:
    words = text.split()
    return " ".join(words[: int(len(words) * ratio)])


class PlayoutObserver(Protocol):
    def chunk_scheduled(self, audio: SpeechAudio, start_t: float) -> None:
        """``audio``'s first sample will play at clock time ``start_t``."""

    def chunk_started(self, audio: SpeechAudio, t: float) -> None:
        """The track pulled ``audio``'s first sample (``t``: its nominal clock time)."""

    def chunk_finished(self, heard: HeardChunk) -> None:
        """``audio`` played out in full."""


class PlayoutBuffer:
    def __init__(
        self,
        sample_rate: int = 48000,
        max_buffered_ms: int = 20000,
        fade_ms: int = 15,
        observer: PlayoutObserver | None = None,
    ) -> None:
        self.rate = sample_rate
        self.max_buffered = sample_rate * max_buffered_ms // 1000
        self.fade_samples = sample_rate * fade_ms // 1000
        self._queue: deque[_Queued] = deque()
        self._cursor = 0  # next sample to be pulled
        self._t0: float | None = None  # clock time of sample 0
        self._fade_tail: np.ndarray | None = None
        self._room = asyncio.Event()  # set whenever samples leave the buffer
        self.observer = observer
        self._played_out: tuple[int, int] | None = None  # the last chunk played in full: its turn, end sample
        # silences inside a reply (a chunk that came after the one before had ended): the latest ones,
        # as (turn id, ms)
        self.gaps: deque[tuple[int, float]] = deque(maxlen=GAPS_KEPT)

    # ---- producer side (event loop) ---------------------------------------------------

    @property
    def buffered_samples(self) -> int:
        if not self._queue:
            return 0
        return self._queue[-1].end_sample - self._cursor

    @property
    def active(self) -> bool:
        """True while speech is queued or playing."""
        return bool(self._queue)

    def _end_sample(self) -> int:
        if self._queue:
            return self._queue[-1].end_sample
        return self._cursor + (len(self._fade_tail) if self._fade_tail is not None else 0)

    def next_sample_time(self) -> float | None:
        """Clock time of the next sample the track will pull (where a cut takes effect)."""
        return self.start_time_of(self._cursor)

    def start_time_of(self, sample: int) -> float | None:
        return None if self._t0 is None else self._t0 + sample / self.rate

    def gaps_of(self, turn_id: int) -> list[float]:
        """The silences inside turn ``turn_id``'s reply so far, in ms (among the latest ``GAPS_KEPT``)."""
        return [ms for turn, ms in self.gaps if turn == turn_id]

    async def wait_for_room(self) -> None:
        while self.buffered_samples >= self.max_buffered:
            self._room.clear()
            await self._room.wait()

    def enqueue(self, audio: SpeechAudio) -> float | None:
        """Queue a chunk; returns the clock time its first sample will play (None before the track starts)."""
        if audio.sample_rate != self.rate:
            raise ValueError(f"playout expects {self.rate} Hz audio, got {audio.sample_rate}")
        if len(audio.pcm) == 0:
            return None
        item = _Queued(audio, self._end_sample())
        last = self._played_out
        if not self._queue and last is not None and last[0] == audio.turn_id and audio.index > 0:
            gap_ms = (item.start_sample - last[1]) * 1000.0 / self.rate
            self.gaps.append((audio.turn_id, gap_ms))
            log.info(
                "turn %d: %.0f ms of silence before chunk %d (it was late)",
                audio.turn_id,
                gap_ms,
                audio.index,
            )
        self._queue.append(item)
        start = self.start_time_of(item.start_sample)
        if start is not None and self.observer is not None:
            self.observer.chunk_scheduled(audio, start)
        return start

    def flush(self) -> list[HeardChunk]:
        """Drop everything queued (barge-in). The chunk playing fades out over ``fade_ms``."""
        heard: list[HeardChunk] = []
        if self._queue:
            cur = self._queue[0]
            if cur.played > 0:
                tail = cur.audio.pcm[cur.played : cur.played + self.fade_samples].astype(np.float32)
                ramp = np.linspace(1.0, 0.0, len(tail), endpoint=False, dtype=np.float32)
                self._fade_tail = (tail * ramp).astype(np.int16)
            for q in self._queue:
                if q.played > 0:
                    heard.append(HeardChunk(q.audio, q.played / self.rate))
        self._queue.clear()
        self._room.set()
        return heard

    # ---- consumer side (the audio track) ------------------------------------------------

    def start(self, t0: float) -> None:
        """The track's sample 0 plays at clock time ``t0``."""
        if self._t0 is not None:
            return
        self._t0 = t0
        for q in self._queue:
            if self.observer is not None:
                self.observer.chunk_scheduled(q.audio, t0 + q.start_sample / self.rate)

    def pull(self, n: int) -> np.ndarray:
        """The next ``n`` samples (int16): speech, the fade after a flush, or silence."""
        out = np.zeros(n, dtype=np.int16)
        pos = 0
        if self._fade_tail is not None:
            k = min(n, len(self._fade_tail))
            out[:k] = self._fade_tail[:k]
            self._fade_tail = self._fade_tail[k:] if k < len(self._fade_tail) else None
            pos = k
        while pos < n and self._queue:
            q = self._queue[0]
            frame_sample = self._cursor + pos
            if q.start_sample > frame_sample:  # a gap before this chunk: silence
                pos += min(n - pos, q.start_sample - frame_sample)
                continue
            if q.played == 0 and self.observer is not None:
                t = self.start_time_of(q.start_sample)
                self.observer.chunk_started(q.audio, t if t is not None else 0.0)
            k = min(n - pos, len(q.audio.pcm) - q.played)
            out[pos : pos + k] = q.audio.pcm[q.played : q.played + k]
            q.played += k
            pos += k
            if q.played >= len(q.audio.pcm):
                self._queue.popleft()
                self._played_out = (q.audio.turn_id, q.end_sample)
                if self.observer is not None:
                    self.observer.chunk_finished(HeardChunk(q.audio, q.played / self.rate))
        self._cursor += n
        self._room.set()  # samples left: a producer waiting for room re-checks
        return out
