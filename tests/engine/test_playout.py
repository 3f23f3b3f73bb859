"""The playout buffer and the audio track, driven by a scripted clock."""

import asyncio

import numpy as np
import pytest

from engine.clock import ScriptedClock
from engine.events import SpeechAudio, WordSpan
from engine.transport.audio_out import IdolAudioTrack
from engine.transport.playout import HeardChunk, PlayoutBuffer

pytestmark = pytest.mark.unit


def _speech(seconds: float, turn: int = 1, index: int = 0, text: str = "one two three four") -> SpeechAudio:
    n = int(48000 * seconds)
    pcm = (np.sin(np.arange(n) * 2 * np.pi * 220 / 48000) * 10000).astype(np.int16)
    words = text.split()
    step = seconds / len(words)
    spans = tuple(WordSpan(w, i * step, (i + 1) * step) for i, w in enumerate(words))
    return SpeechAudio(t=0.0, turn_id=turn, index=index, text=text, pcm=pcm, words=spans)


class Seen:
    """A playout observer that records what it was told."""

    def __init__(self) -> None:
        self.scheduled: list[float] = []
        self.started: list[float] = []
        self.finished: list[HeardChunk] = []

    def chunk_scheduled(self, audio: SpeechAudio, start_t: float) -> None:
        self.scheduled.append(start_t)

    def chunk_started(self, audio: SpeechAudio, t: float) -> None:
        self.started.append(t)

    def chunk_finished(self, heard: HeardChunk) -> None:
        self.finished.append(heard)


async def _pull(track: IdolAudioTrack, clock: ScriptedClock) -> np.ndarray:
    task = asyncio.ensure_future(track.recv())
    await asyncio.sleep(0)
    clock.advance(0.02)
    frame = await task
    return frame.to_ndarray().reshape(-1)


async def test_track_paces_on_the_clock_and_pts_follow_clock_time() -> None:
    clock = ScriptedClock(1.0)
    track = IdolAudioTrack(clock, PlayoutBuffer())
    first = await track.recv()  # frame 0 is due at t0 = 1.0
    assert first.pts == 48000
    task = asyncio.ensure_future(track.recv())
    await asyncio.sleep(0.01)
    assert not task.done(), "frame 1 must wait for its clock time"
    clock.advance(0.02)
    second = await asyncio.wait_for(task, 1)
    assert second.pts == 48000 + 960 and second.samples == 960


async def test_a_sender_behind_the_clock_is_counted_with_its_worst_lateness() -> None:
    clock = ScriptedClock(1.0)
    track = IdolAudioTrack(clock, PlayoutBuffer())
    await track.recv()  # frame 0, on time
    clock.advance(0.5)  # the sender asks for frame 1 (due at 1.02) at 1.5
    await track.recv()
    await track.recv()  # frame 2 (due at 1.04), asked at once: still late, and it catches up by bursting
    assert track.late_frames == 2
    assert track.most_late_s == pytest.approx(0.48)


async def test_silence_when_idle_then_speech_with_exact_start_time() -> None:
    clock = ScriptedClock(0.0)
    buf = PlayoutBuffer()
    track = IdolAudioTrack(clock, buf)
    assert not (await track.recv()).to_ndarray().any()
    seen = Seen()
    buf.observer = seen
    start = buf.enqueue(_speech(0.1))
    assert start == pytest.approx(0.02)
    frame = await _pull(track, clock)
    assert frame.any() and seen.scheduled == [pytest.approx(0.02)] and seen.started == [pytest.approx(0.02)]


async def test_chunks_play_back_to_back_and_report_what_was_heard() -> None:
    clock = ScriptedClock(0.0)
    buf = PlayoutBuffer()
    track = IdolAudioTrack(clock, buf)
    await track.recv()
    seen = Seen()
    buf.observer = seen
    heard = seen.finished
    buf.enqueue(_speech(0.1, index=0))
    second_start = buf.enqueue(_speech(0.1, index=1))
    assert second_start == pytest.approx(0.02 + 0.1)
    for _ in range(10):
        await _pull(track, clock)
    assert [h.audio.index for h in heard] == [0, 1] and all(h.complete for h in heard)
    assert not buf.active


async def test_flush_fades_and_keeps_only_the_played_words() -> None:
    clock = ScriptedClock(0.0)
    buf = PlayoutBuffer(fade_ms=10)
    track = IdolAudioTrack(clock, buf)
    await track.recv()
    buf.enqueue(_speech(0.4, text="alpha beta gamma delta"))
    buf.enqueue(_speech(0.4, index=1))
    for _ in range(11):  # 220 ms played: "alpha" and "beta" (each 100 ms) were heard
        await _pull(track, clock)
    heard = buf.flush()
    assert [h.audio.index for h in heard] == [0]
    assert heard[0].heard_text() == "alpha beta"
    fade = await _pull(track, clock)
    assert np.abs(fade[:240]).max() > 0, "the cut fades out rather than clicking"
    assert not fade[480:].any(), "after the fade there is silence"
    assert not (await _pull(track, clock)).any()
    assert not buf.active


async def test_back_pressure_is_bounded_in_milliseconds() -> None:
    buf = PlayoutBuffer(max_buffered_ms=300)
    buf.start(0.0)
    buf.enqueue(_speech(0.4))
    waiter = asyncio.ensure_future(buf.wait_for_room())
    await asyncio.sleep(0.01)
    assert not waiter.done()
    buf.pull(48000 // 10 * 2)  # 200 ms consumed: 200 ms left < 300 ms
    await asyncio.wait_for(waiter, 1)


def test_a_late_chunk_inside_a_reply_is_counted_as_a_gap() -> None:
    buf = PlayoutBuffer()
    buf.enqueue(_speech(0.1, turn=1, index=0))
    buf.enqueue(_speech(0.1, turn=1, index=1))  # queued in time: no gap
    buf.pull(9600)
    buf.pull(960)  # 20 ms of silence: chunk 2 is late
    buf.enqueue(_speech(0.1, turn=1, index=2))
    buf.pull(4800)
    buf.pull(4800)  # the reply ended; a new turn after a pause is not a gap
    buf.enqueue(_speech(0.1, turn=2, index=0))
    assert list(buf.gaps) == [(1, 20.0)]
    assert buf.gaps_of(1) == [20.0] and buf.gaps_of(2) == []
