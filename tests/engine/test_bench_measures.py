"""The bench's own bookkeeping: what counts as the reply being loud, and the engine's cut on our clock."""

from __future__ import annotations

import pytest

from engine.bench.peer import LOUD_RMS, ReceivedAudio
from engine.bench.voice import EngineConnection
from engine.clock import MediaClock

pytestmark = pytest.mark.unit


def _received(levels: list[float], start: float = 10.0) -> ReceivedAudio:
    a = ReceivedAudio(keep_pcm=False)
    for i, r in enumerate(levels):
        a.times.append(start + 0.02 * i)
        a.rms.append(r)
        a.onset.append(0.0 if r >= LOUD_RMS else float("nan"))
    return a


def test_loud_between_and_quiet_from() -> None:
    loud, quiet = 0.1, 0.001
    a = _received([loud] * 5 + [quiet] * 2 + [loud] * 3 + [quiet] * 60)  # a dip, then the real stop
    assert a.loud_between(10.0, 10.08) and not a.loud_between(10.10, 10.13)
    assert a.loud_between(10.13, 10.2)
    assert a.quiet_from(10.0, hold_s=1.0) == pytest.approx(10.2)  # the dip is too short to count
    assert not a.loud_between(10.5, 10.3)  # an empty span


async def test_interrupts_map_to_our_clock_only_on_one_host() -> None:
    clock = MediaClock(start=1000.0)
    conn = EngineConnection("http://127.0.0.1:1", clock)
    try:
        conn.engine_origin = 1002.5  # the engine's t = 0 came 2.5 s after ours
        conn.interrupts = [(1.0, 7), (3.0, 8)]  # (engine time, the turn cut)
        assert conn.interrupt_after(3.0) is None  # not known to share our clock
        conn.same_host = True
        assert conn.interrupt_after(3.0) == pytest.approx(3.5)
        assert conn.interrupt_after(4.0) == pytest.approx(5.5)
        assert conn.interrupt_after(5.6) is None
        # a barge-in round asks for the story's own cut, not the interjection's reply's
        assert conn.cut_turn_after(3.0, 8) == pytest.approx(5.5)
        assert conn.cut_turn_after(3.0, 7) == pytest.approx(3.5)
        assert conn.cut_turn_after(4.0, 7) is None
    finally:
        await conn.pc.close()


def test_the_mouth_reads_the_same_from_the_luma_plane_as_from_a_gray_conversion() -> None:
    import av
    import numpy as np

    from engine.bench.video import MouthProbe, _luma_plane

    probe = MouthProbe.for_size(640, 360)
    x, y, w, h = probe.box
    rgb = np.full((360, 640, 3), 200, np.uint8)
    rgb[y : y + h // 2, x : x + w] = 20  # half the box dark: a mouth half open
    rgb[y + h // 2 : y + h, x : x + w // 3] = int(probe.dark_luma) + 3  # just above the threshold
    frame = av.VideoFrame.from_ndarray(rgb, format="rgb24").reformat(format="yuv420p")
    assert frame.format.name == "yuv420p"  # what a VP8 decoder hands over
    from_plane = probe.openness(_luma_plane(frame))
    assert from_plane == pytest.approx(probe.openness(frame.to_ndarray(format="gray")), abs=0.01)
    assert 0.4 < from_plane < 0.6


def test_silences_inside_replies_are_counted_per_reply() -> None:
    from engine.bench.voice import TurnResult, silences_in_replies

    turns = [
        TurnResult("a", silences_ms=[]),
        TurnResult("b", silences_ms=[428.0, 120.5]),
        TurnResult("c", unanswered="no words"),
        TurnResult("d", silences_ms=[757.0]),
    ]
    assert silences_in_replies(turns) == {"replies": 2, "of": 3, "silences": 3, "longest_ms": 757.0}
    assert silences_in_replies([TurnResult("a")])["longest_ms"] is None


async def test_frame_arrivals_note_each_frame_s_last_packet_before_the_decoder() -> None:
    """A real aiortc pair: a 30 fps track of noisy 640x480 frames (many RTP packets each); the receiver's
    FrameArrivals notes one arrival per frame (not per packet), paced like the frames."""
    import asyncio

    import numpy as np
    from aiortc import RTCPeerConnection, VideoStreamTrack
    from av import VideoFrame

    from engine.bench.video import FrameArrivals
    from tests.engine.test_ice import connect_pair

    class Noise(VideoStreamTrack):
        async def recv(self) -> VideoFrame:
            pts, time_base = await self.next_timestamp()
            pixels = np.random.default_rng(pts).integers(0, 255, (480, 640, 3), dtype=np.uint8)
            frame = VideoFrame.from_ndarray(pixels, format="rgb24")
            frame.pts, frame.time_base = pts, time_base
            return frame

    clock = MediaClock()
    sender, receiver = RTCPeerConnection(), RTCPeerConnection()
    arrivals = FrameArrivals(clock)
    packets: list[int] = []
    decoded: list[float] = []
    readers: list[asyncio.Task[None]] = []
    sender.addTrack(Noise())

    @receiver.on("track")
    def on_track(track: object) -> None:
        async def read() -> None:
            while True:
                await track.recv()  # type: ignore[attr-defined]
                decoded.append(clock.now())

        readers.append(asyncio.ensure_future(read()))

    try:
        assert await connect_pair(sender, receiver) == "connected/connected"
        arrivals.attach(receiver)
        (video,) = [r for r in receiver.getReceivers() if r.track.kind == "video"]
        counted = video._handle_rtp_packet

        async def counting(packet: object, arrival_time_ms: int) -> None:
            packets.append(1)
            await counted(packet, arrival_time_ms)

        video._handle_rtp_packet = counting
        await asyncio.sleep(2.0)
    finally:
        for task in readers:
            task.cancel()
        await sender.close()
        await receiver.close()
    n = len(arrivals.times)
    assert n >= 30, n  # ~30 fps for ~2 s
    assert len(packets) > 3 * n  # frames of several packets each ...
    assert abs(n - len(decoded)) <= 3  # ... counted once each, like the decoder's frames
    assert arrivals.times == sorted(arrivals.times)
    assert 20 <= float(np.median(np.diff(arrivals.times))) * 1000 <= 50  # paced at ~33 ms


def test_video_that_stops_counts_as_no_frames_until_the_end_of_the_run() -> None:
    """A video track that died mid-run (the bench kept measuring the voice) reads as 0 frames a second, not as
    the last second it delivered."""
    from engine.bench.video import frame_rate

    steady = [i / 30.0 for i in range(30 * 8)]  # 8 s at 30 fps
    assert frame_rate(steady)["fps_min_1s"] in (29, 30)
    assert frame_rate(steady, until=7.9)["fps_min_1s"] in (29, 30)  # the last frame near the end: no gap
    died = frame_rate(steady, until=20.0)  # the replies went on 12 s after the last frame
    assert died["fps_min_1s"] == 0
    assert died["fps_mean"] < 15


def test_find_capacity_probes_the_counts_asked_for_in_order() -> None:
    from engine.bench.cli import probe_counts

    assert probe_counts(None, 4) == [1, 2, 3, 4]
    assert probe_counts("1,8,12,16", 4) == [1, 8, 12, 16]
    for bad in ("8,1", "1,1,2", "0,4", "1,x"):
        with pytest.raises(SystemExit, match="--probe"):
            probe_counts(bad, 8)
