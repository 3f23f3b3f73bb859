"""What the viewer sees: frame rate, frame-interval jitter and lip sync, read from received frames.

The mouth is read from the pixels: the open mouth's dark interior is counted inside a
region found by rendering the same character with the mouth shut and wide open.
Both tracks are placed on the receiver's clock with a constant-delay model
(arrival − media time, 10th percentile per track), i.e. as a receiver that plays
each track as soon as it can.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from av import VideoFrame

from engine.bench.stats import summarize
from engine.clock import Clock


def _luma(rgb: np.ndarray) -> np.ndarray:
    return rgb[..., 0] * 0.299 + rgb[..., 1] * 0.587 + rgb[..., 2] * 0.114


@dataclass
class MouthProbe:
    """Where the mouth is in a frame of a given size, and how to read its openness.

    Calibrated on the character itself: the box covers what changes between a shut and a
    wide-open mouth (padded for head motion), and the darkness threshold sits halfway between
    the luma of those pixels shut (skin, lips) and open (the mouth's interior).
    """

    box: tuple[int, int, int, int]  # x, y, w, h
    dark_luma: float = 70.0

    @classmethod
    def for_size(cls, width: int, height: int, character: str = "builtin:default") -> MouthProbe:
        from engine.avatar.generator import FrameGenerator, rest_params
        from engine.avatar.loaders import load_character

        gen = FrameGenerator(load_character(character), (width, height)).eval()
        shut = gen.new_frames(1)
        gen.render_into(shut, rest_params(1))
        wide = gen.new_frames(1)
        gen.render_into(wide, rest_params(1, viseme_sil=0.0, viseme_aa=1.0))
        shut_l, wide_l = _luma(shut[0].astype(np.float32)), _luma(wide[0].astype(np.float32))
        diff = (shut_l - wide_l) > 30  # pixels that get darker when the mouth opens
        ys, xs = np.nonzero(diff)
        if len(xs) == 0:
            raise RuntimeError("could not find the mouth: open and shut frames are identical")
        pad_x = max(8, (xs.max() - xs.min()) // 2)
        pad_y = max(8, (ys.max() - ys.min()) // 2)
        x0, y0 = max(0, xs.min() - pad_x), max(0, ys.min() - pad_y)
        x1, y1 = min(width, xs.max() + pad_x), min(height, ys.max() + pad_y)
        dark = float((np.median(shut_l[diff]) + np.median(wide_l[diff])) / 2)
        return cls((int(x0), int(y0), int(x1 - x0), int(y1 - y0)), dark)

    def openness(self, luma: np.ndarray | _LumaPlane) -> float:
        x, y, w, h = self.box
        roi = luma[y : y + h, x : x + w]
        return float((roi < self.dark_luma).mean())


@dataclass
class ReceivedVideo:
    arrivals: list[float] = field(default_factory=list)
    pts: list[float] = field(default_factory=list)  # seconds (receiver-relative RTP time)
    mouth: list[float] = field(default_factory=list)
    size: tuple[int, int] | None = None
    probe: MouthProbe | None = None


async def record_video(track: MediaStreamTrack, clock: Clock, out: ReceivedVideo, character: str) -> None:
    import asyncio

    while True:
        try:
            frame = await track.recv()
        except MediaStreamError:
            return
        now = clock.now()
        assert isinstance(frame, VideoFrame)
        size = (frame.width, frame.height)
        if out.probe is None or out.size != size:
            out.size = size
            out.probe = await asyncio.to_thread(MouthProbe.for_size, frame.width, frame.height, character)
        out.arrivals.append(now)
        out.pts.append(frame.pts / 90000.0 if frame.pts is not None else now)
        out.mouth.append(out.probe.openness(_luma_plane(frame)))


class _LumaPlane:
    """A decoded yuv420p frame's luma read from its Y plane where the probe looks, instead of converting
    the whole frame to gray (~3 ms a 720p frame less on the client's loop, which also answers the
    engine's ICE consent checks): video range (16-235) mapped to full range, as the conversion does."""

    def __init__(self, frame: VideoFrame) -> None:
        plane = frame.planes[0]
        self._rows = np.frombuffer(memoryview(plane), np.uint8).reshape(plane.height, plane.line_size)[
            :, : plane.width
        ]

    def __getitem__(self, box: tuple[slice, slice]) -> np.ndarray:
        y = self._rows[box].astype(np.float32)
        return np.clip((y - 16.0) * (255.0 / 219.0), 0.0, 255.0)


def _luma_plane(frame: VideoFrame) -> np.ndarray | _LumaPlane:
    if frame.format.name == "yuv420p":
        return _LumaPlane(frame)
    return frame.to_ndarray(format="gray")


def frame_rate(arrivals: list[float], skip_s: float = 2.0, until: float | None = None) -> dict[str, Any]:
    """Delivered fps: the lowest count in any one-second window, the mean, and interval jitter. The windows
    run to ``until`` (the end of what was measured, on the same clock) where that is later than the last
    frame: video that stopped counts as 0 frames a second, not as the last second it sent."""
    t = np.asarray(arrivals, dtype=np.float64)
    if len(t) < 10:
        return {"fps_min_1s": None, "fps_mean": None, "frame_interval_ms": summarize([])}
    t = t[t >= t[0] + skip_s]
    if len(t) < 10 or t[-1] - t[0] < 1.0:
        return {"fps_min_1s": None, "fps_mean": None, "frame_interval_ms": summarize([])}
    end = max(t[-1], until or t[-1])
    starts = np.arange(t[0], end - 1.0, 0.1)
    counts = [int(np.searchsorted(t, s + 1.0) - np.searchsorted(t, s)) for s in starts]
    intervals = np.diff(t) * 1000.0
    return {
        "fps_min_1s": int(min(counts)),
        "fps_min_1s_at": float(starts[int(np.argmin(counts))]),  # the lowest window's start, on their clock
        "fps_mean": round(float((len(t) - 1) / (end - t[0])), 2),
        "frame_interval_ms": summarize(intervals.tolist()) | {"std": round(float(intervals.std()), 2)},
    }


@dataclass
class SenderReports:
    """RTCP sender reports the client received, per track kind: (NTP seconds, RTP timestamp) pairs.

    A browser plays audio and video in sync by these: both tracks' RTP times map to the sender's one
    wall clock (aiortc pairs the NTP time at which a packet left with that packet's RTP timestamp).
    """

    pairs: dict[str, list[tuple[float, int]]] = field(default_factory=lambda: {"audio": [], "video": []})
    receivers: dict[str, Any] = field(default_factory=dict)

    def attach(self, pc: Any) -> None:
        """Note the sender reports arriving at each of ``pc``'s receivers (the bench's own peer)."""
        from aiortc.rtp import RtcpSrPacket

        for receiver in pc.getReceivers():
            kind = receiver.track.kind if receiver.track is not None else None
            if kind not in self.pairs:
                continue
            self.receivers[kind] = receiver
            original = receiver._handle_rtcp_packet

            async def noting(packet: Any, original: Any = original, kind: str = kind) -> None:
                if isinstance(packet, RtcpSrPacket):
                    ntp = packet.sender_info.ntp_timestamp
                    self.pairs[kind].append(
                        ((ntp >> 32) + (ntp & 0xFFFFFFFF) / 2**32, packet.sender_info.rtp_timestamp)
                    )
                await original(packet)

            receiver._handle_rtcp_packet = noting

    def offset(self, kind: str, rate: int) -> float | None:
        """Sender wall time minus the received frames' pts in seconds (median over the reports), or None.

        aiortc's receiver hands frames out with pts counted from the track's first RTP timestamp
        (its ``TimestampMapper``); the reports carry raw RTP timestamps, so they are rebased the same way.
        """
        pairs = self.pairs[kind]
        mapper = getattr(self.receivers.get(kind), "_RTCRtpReceiver__timestamp_mapper", None)
        origin = getattr(mapper, "_origin", None)
        if not pairs or not isinstance(origin, int):
            return None

        def pts(rtp: int) -> int:  # as the mapper counts it (its origin moves down 2**32 on a wrap)
            mapped = rtp - origin
            return mapped + 2**32 if mapped < 0 else mapped

        return float(np.median([ntp - pts(rtp) / rate for ntp, rtp in pairs]))


@dataclass
class FrameArrivals:
    """When each video frame's last RTP packet (the marker bit) reached the client, on the bench's clock.

    ``ReceivedVideo.arrivals`` are the times frames came out of the client's decoder; on the 2-core machine the
    client decodes 720p beside the engine, so a busy second there bunches frames the network delivered on
    time. These times are the network's delivery, before the decoder: what a viewer on its own machine gets.
    """

    clock: Clock
    times: list[float] = field(default_factory=list)

    def attach(self, pc: Any) -> None:
        for receiver in pc.getReceivers():
            if receiver.track is None or receiver.track.kind != "video":
                continue
            original = receiver._handle_rtp_packet

            async def noting(packet: Any, arrival_time_ms: int, original: Any = original) -> None:
                if packet.marker:
                    self.times.append(self.clock.now())
                await original(packet, arrival_time_ms)

            receiver._handle_rtp_packet = noting


def receiver_timeline(arrivals: list[float], media_s: list[float]) -> float:
    """The constant delay that puts media time on the receiver's clock (10th percentile)."""
    d = np.asarray(arrivals) - np.asarray(media_s)
    return float(np.percentile(d, 10))
