"""Fan-out of a session's outgoing tracks to extra consumers (WHEP viewers, RTMP) without a second pull.

A session's audio (and video) track is pull-based and paced by the session clock: two consumers
calling ``recv`` on it would each get half the frames. aiortc's ``MediaRelay`` solves that with a
worker of its own between the track and *every* consumer, which would also hide the host sender's
encode time that the tracks measure for lip-phase compensation (``send_delay``). So instead:

* the host's peer keeps pulling the source through a :class:`TeeTrack` that passes ``recv`` straight
  through (same timing) and copies each frame into the taps;
* each extra consumer reads a :class:`TapTrack`: a buffer bounded in milliseconds of media (video keeps
  only the newest frame: late video is dropped, never queued);
* when nobody pulls the primary (a WHIP-ingest session sends no media back; a host offer without video),
  the taps drive the source themselves, one at a time, until the primary starts pulling again.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque

from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from av import AudioFrame, VideoFrame
from av.frame import Frame
from av.packet import Packet

from engine.session.session import Session

log = logging.getLogger(__name__)

Media = Frame | Packet

IDLE_PRIMARY_S = 0.25  # the primary consumer counts as gone after this long without a recv


def copy_frame(frame: Media) -> Media:
    """An independent copy: each consumer's encoder converts and encodes its frame in its own thread,
    and two threads working on one PyAV frame crashed the process (seen here with two VP8 encoders)."""
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


class TeeTrack(MediaStreamTrack):
    """The primary consumer's view of ``source``; copies every frame to the taps."""

    def __init__(self, source: MediaStreamTrack) -> None:
        super().__init__()
        self.kind = source.kind
        self.source = source
        self._taps: set[TapTrack] = set()
        self._pull_lock = asyncio.Lock()
        self._last_primary = float("-inf")
        self._ended = False

    async def recv(self) -> Media:
        if self.readyState != "live":
            raise MediaStreamError
        self._last_primary = asyncio.get_running_loop().time()
        return await self._pull()

    async def _pull(self) -> Media:
        async with self._pull_lock:
            try:
                frame = await self.source.recv()
            except MediaStreamError:
                self._end()
                raise
        for tap in list(self._taps):
            tap.push(copy_frame(self._picture(tap, frame)))
        return frame

    def _picture(self, tap: TapTrack, frame: Media) -> Media:
        """The frame in the picture ``tap`` asked for (its source's extra of the same frame), else itself."""
        if tap.variant is None:
            return frame
        extras: dict[str, Media] = getattr(self.source, "extras", {})
        return extras.get(tap.variant, frame)

    def primary_idle(self) -> bool:
        return asyncio.get_running_loop().time() - self._last_primary > IDLE_PRIMARY_S

    async def drive(self) -> None:
        """Pull one frame for the taps (only while no primary consumer pulls)."""
        if self._pull_lock.locked():  # someone else is pulling right now
            async with self._pull_lock:
                return
        await self._pull()

    def tap(self, max_ms: float = 500.0, variant: str | None = None) -> TapTrack:
        """A new consumer; ``variant`` asks the source for another picture of each frame (video: "packed")."""
        if self._ended:
            raise MediaStreamError("the source track has ended")
        if variant is not None:
            want = getattr(self.source, "want", None)
            if want is None or not want(variant, True):
                log.info("%s track: no %r picture here; the tap gets the track's own", self.kind, variant)
                variant = None
        tap = TapTrack(self, max_ms, variant)
        self._taps.add(tap)
        return tap

    def _end(self) -> None:
        self._ended = True
        for tap in list(self._taps):
            tap.end()

    def discard(self, tap: TapTrack) -> None:
        if tap in self._taps and tap.variant is not None:
            want = getattr(self.source, "want", None)
            if want is not None:
                want(tap.variant, False)
        self._taps.discard(tap)

    def stop(self) -> None:
        super().stop()
        self._end()
        self.source.stop()


class TapTrack(MediaStreamTrack):
    """An extra consumer of a :class:`TeeTrack`, with its own bounded buffer."""

    def __init__(self, tee: TeeTrack, max_ms: float, variant: str | None = None) -> None:
        super().__init__()
        self.kind = tee.kind
        self.variant = variant
        self._tee: TeeTrack | None = tee
        # audio: 20 ms frames; video: only the newest frame
        self._frames: deque[Media] = deque(maxlen=max(1, int(max_ms // 20)) if tee.kind == "audio" else 1)
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
            if self._ended or self.readyState != "live" or self._tee is None:
                raise MediaStreamError
            self._ready.clear()
            try:
                await asyncio.wait_for(self._ready.wait(), IDLE_PRIMARY_S)
            except TimeoutError:
                if self._tee is not None and self._tee.primary_idle():
                    await self._tee.drive()

    def stop(self) -> None:
        super().stop()
        if self._tee is not None:
            self._tee.discard(self)
            self._tee = None
        self.end()


class SessionMedia:
    """The tees of every session: installed when a session is created, before any peer pulls."""

    def __init__(self) -> None:
        self._tees: dict[str, dict[str, TeeTrack]] = {}

    async def on_session_created(self, session: Session) -> None:
        tees: dict[str, TeeTrack] = {}
        tee = TeeTrack(session.audio_track)
        session.audio_track = tee  # type: ignore[assignment]
        tees["audio"] = tee
        video = getattr(session, "video_track", None)
        if video is not None:
            vtee = TeeTrack(video)
            session.video_track = vtee  # type: ignore[attr-defined]
            tees["video"] = vtee
        self._tees[session.id] = tees

    async def on_session_closed(self, session: Session) -> None:
        for tee in self._tees.pop(session.id, {}).values():
            tee.stop()

    def tap(
        self, session: Session, kind: str, max_ms: float = 500.0, variant: str | None = None
    ) -> TapTrack | None:
        """A new consumer's track of ``kind`` for the session, or None if it has none; ``variant`` picks
        another picture of the video ("packed": colour | alpha, for the OBS page)."""
        tees = self._tees.get(session.id)
        if tees is None:
            return None
        if kind == "video" and "video" not in tees:
            video = getattr(session, "video_track", None)
            if video is None:
                return None
            if isinstance(video, TeeTrack):
                tees["video"] = video
            else:  # created after the session: it may already be pulled by the host's peer
                log.warning("session %s: video track appeared late; WHEP/RTMP share it unteed", session.id)
                return None
        tee = tees.get(kind)
        return tee.tap(max_ms, variant if kind == "video" else None) if tee is not None else None

    def has_video(self, session: Session) -> bool:
        return "video" in self._tees.get(session.id, {}) or getattr(session, "video_track", None) is not None
