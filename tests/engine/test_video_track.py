"""The idol's video track renders one frame ahead (engine/transport/video_out.py), on a scripted clock.

The frame source is a stand-in for the renderer (the boundary: a render that takes as long as the test
says); the track, its pacing, its drops and its pts are the real ones."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from av import VideoFrame

from engine.clock import ScriptedClock
from engine.transport.video_out import VIDEO_CLOCK, IdolVideoTrack

pytestmark = pytest.mark.unit

FPS = 30


class RecordingSource:
    """Renders a 16×16 frame whose first pixel is the frame's index; records when each render started."""

    fps = FPS

    def __init__(self, clock: ScriptedClock) -> None:
        self.clock = clock
        self.started: list[tuple[float, float]] = []  # (frame time, clock when the render started)
        self.busy = 0
        self.most_busy = 0
        self.release = asyncio.Event()
        self.hold_at: float | None = None  # the render of this frame waits for release
        self.fail_at: float | None = None

    async def frame_at(self, t: float) -> VideoFrame:
        self.started.append((t, self.clock.now()))
        self.busy += 1
        self.most_busy = max(self.most_busy, self.busy)
        try:
            if self.hold_at is not None and abs(t - self.hold_at) < 1e-9:
                await self.release.wait()
            if self.fail_at is not None and abs(t - self.fail_at) < 1e-9:
                raise RuntimeError("render failed")
            img = np.zeros((16, 16, 3), np.uint8)
            img[0, 0, 0] = round(t * FPS)
            return VideoFrame.from_ndarray(img, format="rgb24")
        finally:
            self.busy -= 1


async def _pull(track: IdolVideoTrack, clock: ScriptedClock, at: float) -> VideoFrame:
    """aiortc asks for the next frame at ``at``; the clock runs on to its due time."""
    frame = await _pull_any(track, clock, at)
    assert isinstance(frame, VideoFrame)
    return frame


async def _pull_any(track: IdolVideoTrack, clock: ScriptedClock, at: float) -> object:
    clock.set(max(clock.now(), at))
    task = asyncio.ensure_future(track.recv())
    for _ in range(5):
        await asyncio.sleep(0)
    while not task.done():
        clock.advance(0.001)
        await asyncio.sleep(0)
    return task.result()


def _index(frame: VideoFrame) -> int:
    return int(frame.to_ndarray(format="rgb24")[0, 0, 0])


async def test_the_next_frame_renders_while_this_one_is_encoded_and_comes_out_on_time() -> None:
    clock = ScriptedClock(1.0)
    source = RecordingSource(clock)
    track = IdolVideoTrack(clock, source, render_ahead_s=0.02)
    frames = [await _pull(track, clock, clock.now()) for _ in range(5)]
    t0 = 1.0
    assert [f.pts for f in frames] == [round((t0 + i / FPS) * VIDEO_CLOCK) for i in range(5)]
    assert [_index(f) for f in frames] == [round((t0 + i / FPS) * FPS) for i in range(5)]
    # the first frame is due when it is first asked for; each next one starts rendering when the one before is
    # handed over, i.e. a whole frame period ahead of its own time
    assert source.started[0] == pytest.approx((t0, t0))
    for i in range(1, 6):
        t, began = source.started[i]
        assert t == pytest.approx(t0 + i / FPS)
        assert began <= t0 + (i - 1) / FPS + 1e-9
    assert source.most_busy == 1  # one render at a time
    assert track.sent == 5 and track.dropped == 0
    track.stop()


async def test_behind_it_drops_the_late_frames_and_the_render_started_for_them() -> None:
    clock = ScriptedClock(0.0)
    source = RecordingSource(clock)
    track = IdolVideoTrack(clock, source)
    first = await _pull(track, clock, 0.0)
    assert _index(first) == 0
    # aiortc comes back 120 ms later (a stalled encode, past the 67 ms it catches up): frames 1 to 3 are
    # gone, frame 4 is sent, rendered anew
    late = await _pull(track, clock, 0.12)
    assert _index(late) == 4 and late.pts == round(4 / FPS * VIDEO_CLOCK)
    assert track.dropped == 3
    assert [round(t * FPS) for t, _ in source.started] == [0, 1, 4, 5]
    assert source.most_busy == 1
    track.stop()


async def test_a_frame_a_little_late_is_still_sent_and_the_next_follow_at_once() -> None:
    clock = ScriptedClock(0.0)
    source = RecordingSource(clock)
    track = IdolVideoTrack(clock, source, catch_up_s=2 / FPS)
    await _pull(track, clock, 0.0)
    # aiortc comes back 90 ms later (frame 1 was due at 33 ms: 57 ms late, under the 67 it catches up)
    late = await _pull(track, clock, 0.09)
    assert _index(late) == 1 and late.pts == round(1 / FPS * VIDEO_CLOCK)
    # frame 2 (due at 67 ms) is already due: it goes out now, without waiting
    asked = clock.now()
    following = await _pull(track, clock, asked)
    assert _index(following) == 2 and clock.now() == pytest.approx(asked, abs=0.002)
    assert track.dropped == 0 and track.sent == 3
    # with one frame period (the behaviour before) the same stall drops frame 1 and 2
    strict = IdolVideoTrack(clock, source, catch_up_s=0.0)
    await _pull(strict, clock, clock.now())
    start = clock.now()
    jumped = await _pull(strict, clock, start + 1 / FPS + 0.057)
    assert strict.dropped == 2 and _index(jumped) == round((start + 3 / FPS) * FPS)
    track.stop()
    strict.stop()


async def test_a_failed_render_sends_the_last_frame_again_and_a_stopped_track_leaves_no_render_behind() -> (
    None
):
    """aiortc's sender stops for good on an error from recv(): a frame whose render failed is the one before,
    at its own time; the very first frame has none before it, so its failure reaches the sender."""
    clock = ScriptedClock(0.0)
    source = RecordingSource(clock)
    source.fail_at = 0.0
    first = IdolVideoTrack(clock, source)
    with pytest.raises(RuntimeError, match="render failed"):
        await _pull(first, clock, 0.0)
    first.stop()
    track = IdolVideoTrack(clock, source)
    source.fail_at = 1 / FPS  # the frame rendered ahead fails
    await _pull(track, clock, 0.0)
    repeat = await _pull(track, clock, clock.now())
    assert _index(repeat) == 0 and repeat.pts == round(1 / FPS * VIDEO_CLOCK)
    assert track.failed == 1 and track.sent == 2
    source.fail_at = None
    source.hold_at = 3 / FPS  # frame 2 (rendered ahead) comes; frame 3's render, started ahead, hangs
    again = await _pull(track, clock, 2 / FPS)
    assert _index(again) == 2 and track.dropped == 0 and track.failed == 1
    for _ in range(5):
        await asyncio.sleep(0)
    assert source.busy == 1 and track._ahead is not None
    track.stop()  # the session ends: the render started ahead is cancelled, not left running
    for _ in range(5):
        await asyncio.sleep(0)
    assert source.busy == 0 and track._ahead is None


async def test_the_stall_watch_names_a_render_or_a_sender_that_holds_a_frame_past_its_time(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """engine/server/stalls.py reads the real track's phase from its own thread's view: a render past its
    frame's due time, then aiortc holding a frame (encoding, sending); the report carries the stacks of the
    busy threads (here a thread blocked in a function named for the test)."""
    import threading

    from engine.server.stalls import StallWatch

    clock = ScriptedClock(0.0)
    source = RecordingSource(clock)
    track = IdolVideoTrack(clock, source)
    watch = StallWatch(lambda: [("s1", track)], threshold_s=0.3, cooldown_s=0.0, now=clock.now)
    assert track.stalled() is None and watch.check() is None  # nothing asked for yet
    await _pull(track, clock, 0.0)
    # handed to the sender; within a frame period that is no stall
    clock.advance(0.02)
    assert track.stalled() is None
    # the sender holds it 400 ms
    clock.advance(0.38)
    assert track.stalled() == ("sender", pytest.approx(0.4))
    held = threading.Event()

    def a_native_call_that_holds_the_render() -> None:
        while not held.is_set():
            time.sleep(0.001)

    blocker = threading.Thread(target=a_native_call_that_holds_the_render, name="render_0")
    blocker.start()
    try:
        with caplog.at_level("WARNING", logger="engine.server.stalls"):
            report = watch.check()
        assert report is not None and "session s1: sender for 400 ms" in report
        assert "render_0" in report and "a_native_call_that_holds_the_render" in report
        assert watch.check() is None and watch.stalls == 1  # the same stall is reported once
    finally:
        held.set()
        blocker.join()
    clock.advance(5.0)  # no frame asked for in over 5 s: the sender stopped (its peer gone), no stall
    assert track.stalled() is None
    track.stop()
    assert track.stalled() is None
    # a render that hangs past its frame's due time (frame 1, started ahead when frame 0 was handed over)
    start = clock.now()
    source.hold_at = start + 1 / FPS
    held_render = IdolVideoTrack(clock, source)
    watch.tracks = lambda: [("s2", held_render)]
    await _pull(held_render, clock, start)
    task = asyncio.ensure_future(held_render.recv())
    for _ in range(5):
        await asyncio.sleep(0)
    due = held_render._due
    clock.set(due + 0.5)
    phase, seconds = held_render.stalled() or ("", 0.0)
    assert phase == "render" and seconds == pytest.approx(0.5)
    report = watch.check()
    assert report is not None and "session s2: render for 500 ms" in report and watch.stalls == 2
    assert source.busy == 1  # the render is still out
    source.release.set()
    await task
    held_render.stop()


async def test_frames_dropped_as_late_are_logged_with_how_far_behind(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = ScriptedClock(0.0)
    track = IdolVideoTrack(clock, RecordingSource(clock))
    await _pull(track, clock, 0.0)
    with caplog.at_level("WARNING", logger="engine.transport.video_out"):
        await _pull(track, clock, 0.5)  # aiortc back 500 ms later: frames 1 to 15 are gone
    assert track.dropped == 15
    [record] = [r.getMessage() for r in caplog.records if "dropped as late" in r.getMessage()]
    assert "15 frame(s)" in record and "467 ms behind" in record
    assert "the sender had held the frame before 500 ms" in record
    track.stop()
