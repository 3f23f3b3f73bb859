"""Outgoing tracks with taps: one pull, many consumers (the host's peer, WHEP viewers, RTMP).

A session's audio and video tracks are pull-based and paced by the session clock: two consumers calling
``recv`` on one would each get half the frames. aiortc's ``MediaRelay`` solves that with a worker of its
own between the track and *every* consumer, which would also hide the host sender's encode time that the
tracks measure for lip-phase compensation (``send_delay``). So the tracks are born tappable instead
(:class:`TappedTrack`, the base of ``IdolAudioTrack`` and ``IdolVideoTrack``), when the session is:

* the host's peer pulls the track itself (``recv``: same timing), and each frame is copied into the taps;
* each extra consumer reads a :class:`TapTrack`: a buffer bounded in milliseconds of media (video keeps
  only the newest frame: late video is dropped, never queued);
* when nobody pulls the track (a WHIP-ingest session sends no media back; a host offer without video),
  the taps drive it themselves, one at a time, until the primary starts pulling again. "Nobody pulls"
  is read on the session clock.

Copies: each consumer's encoder converts and encodes its frame in its own thread, and two threads on one
PyAV frame crashed the process, so each tap gets its own copy. A video frame's copy (3.5 ms for 720p,
measured on the 2-core dev box) is made in a worker thread; an audio frame's (20 ms of mono s16: 15 µs)
is trivially cheap and made inline.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Protocol

from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from av import AudioFrame, VideoFrame
from av.frame import Frame
from av.packet import Packet

from engine.clock import Clock

log = logging.getLogger(__name__)

Media = Frame | Packet

IDLE_PRIMARY_S = 0.25  # the primary consumer counts as gone after this long without a recv


def copy_frame(frame: Media) -> Media:
    """An independent copy of ``frame`` (see the module docstring)."""
    copy: Media
    if isinstance(frame, VideoFrame):
        copy = VideoFrame.from_ndarray(frame.to_ndarray(), format=frame.format.name)
    elif isinstance(frame, AudioFrame):
        copy = AudioFrame.from_ndarray(frame.to_ndarray(), format=frame.format.name, layout=frame.layout.name)
        copy.sample_rate = frame.sample_rate
    else:
        return frame
    copy.pts = frame.pts
    copy.time_base = frame.time_base
    return copy


class TappedTrack(MediaStreamTrack):
    """A track whose frames (from :meth:`produce`) also go to its taps."""

    copy_off_loop = False  # True: the taps' copies are made in a worker thread (video)

    def __init__(self, clock: Clock) -> None:
        super().__init__()
        self.clock = clock
        self._taps: set[TapTrack] = set()
        self._pull_lock = asyncio.Lock()
        self._last_primary = float("-inf")
        self._taps_ended = False

    async def produce(self) -> Media:
        """The next frame (raises MediaStreamError when the track has ended)."""
        raise NotImplementedError

    def want(self, variant: str, on: bool) -> bool:
        """Start (``on``) or stop making another picture of each frame; False if there is none."""
        return False

    def picture(self, frame: Media, variant: str | None) -> Media:
        """``frame`` in the picture ``variant`` (another picture of the same frame), else itself."""
        return frame

    async def recv(self) -> Media:
        if self.readyState != "live":
            raise MediaStreamError
        self._last_primary = self.clock.now()
        return await self._pull()

    async def _pull(self) -> Media:
        async with self._pull_lock:
            try:
                frame = await self.produce()
            except MediaStreamError:
                self._end_taps()
                raise
            taps = list(self._taps)
            if taps:
                pictures = [self.picture(frame, tap.variant) for tap in taps]
                if self.copy_off_loop:
                    copies = await asyncio.to_thread(lambda: [copy_frame(p) for p in pictures])
                else:
                    copies = [copy_frame(p) for p in pictures]
                for tap, copy in zip(taps, copies, strict=True):
                    tap.push(copy)
        return frame

    def primary_idle(self) -> bool:
        return self.clock.now() - self._last_primary > IDLE_PRIMARY_S

    async def drive(self) -> None:
        """Pull one frame for the taps (only while no primary consumer pulls)."""
        if self._pull_lock.locked():  # someone else is pulling right now
            async with self._pull_lock:
                return
        await self._pull()

    def tap(self, max_ms: float = 500.0, variant: str | None = None) -> TapTrack:
        """A new consumer; ``variant`` asks for another picture of each frame (video: "packed")."""
        if self._taps_ended or self.readyState != "live":
            raise MediaStreamError("the track has ended")
        if variant is not None and not self.want(variant, True):
            log.info("%s track: no %r picture here; the tap gets the track's own", self.kind, variant)
            variant = None
        tap = TapTrack(self, max_ms, variant)
        self._taps.add(tap)
        return tap

    def discard(self, tap: TapTrack) -> None:
        if tap in self._taps and tap.variant is not None:
            self.want(tap.variant, False)
        self._taps.discard(tap)

    def _end_taps(self) -> None:
        self._taps_ended = True
        for tap in list(self._taps):
            tap.end()

    def stop(self) -> None:
        super().stop()
        self._end_taps()


class TapTrack(MediaStreamTrack):
    """An extra consumer of a :class:`TappedTrack`, with its own bounded buffer."""

    def __init__(self, source: TappedTrack, max_ms: float, variant: str | None = None) -> None:
        super().__init__()
        self.kind = source.kind
        self.variant = variant
        self._source: TappedTrack | None = source
        # audio: 20 ms frames; video: only the newest frame
        self._frames: deque[Media] = deque(maxlen=max(1, int(max_ms // 20)) if source.kind == "audio" else 1)
        self._ready = asyncio.Event()
        self._ended = False
        self.dropped = 0

    def push(self, frame: Media) -> None:
        if self._frames.maxlen is not None and len(self._frames) == self._frames.maxlen:
            self.dropped += 1
        self._frames.append(frame)
        self._ready.set()

    def end(self) -> None:
        self._ended = True
        self._ready.set()

    async def recv(self) -> Media:
        while True:
            if self._frames:
                return self._frames.popleft()
            if self._ended or self.readyState != "live" or self._source is None:
                raise MediaStreamError
            self._ready.clear()
            try:
                await asyncio.wait_for(self._ready.wait(), IDLE_PRIMARY_S)
            except TimeoutError:
                if self._source is not None and self._source.primary_idle():
                    await self._source.drive()

    def stop(self) -> None:
        super().stop()
        if self._source is not None:
            self._source.discard(self)
            self._source = None
        self.end()


class Outgoing(Protocol):
    """What has outgoing media (a session)."""

    @property
    def audio_track(self) -> MediaStreamTrack: ...

    @property
    def video_track(self) -> MediaStreamTrack | None: ...


def tap(outgoing: Outgoing, kind: str, max_ms: float = 500.0, variant: str | None = None) -> TapTrack | None:
    """A new consumer's track of ``kind`` ("audio" | "video"), or None where there is no such track;
    ``variant`` picks another picture of the video ("packed": colour | alpha, for the OBS page)."""
    track = outgoing.audio_track if kind == "audio" else outgoing.video_track if kind == "video" else None
    if not isinstance(track, TappedTrack):
        return None
    try:
        return track.tap(max_ms, variant if kind == "video" else None)
    except MediaStreamError:
        return None
