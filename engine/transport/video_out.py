"""The idol's outgoing video track: frames rendered for their presentation time on the session clock.

Pull-based like the audio track: frame ``i`` is due at ``t0 + i / fps``; its pts is
``round(t × 90000)`` on the *same* session clock as the audio pts. Rendering runs off
the event loop and starts ``render_ahead_s`` before the frame is due; a frame that
would go out more than one frame period late is dropped (the index jumps to the
present), never queued.

The track also measures how long aiortc takes between handing it a frame and asking
for the next (encode + packetize + send) — with the audio track's own figure this
gives the lip-phase compensation (see ``engine/avatar/animator.py``).
"""

from __future__ import annotations

import fractions
import logging
import math
from typing import Protocol

from aiortc.mediastreams import MediaStreamError
from av import VideoFrame

from engine.clock import Clock
from engine.transport import encoders
from engine.transport.send_delay import SendDelay
from engine.transport.taps import Media, TappedTrack

log = logging.getLogger(__name__)

VIDEO_CLOCK = 90000


class FrameSource(Protocol):
    """Renders the session's idol for a presentation time (off the event loop)."""

    fps: int

    async def frame_at(self, t: float) -> VideoFrame: ...


class IdolVideoTrack(TappedTrack):
    """Tappable from birth (engine/transport/taps.py); each tap's copy of a frame is made off the loop."""

    kind = "video"
    copy_off_loop = True

    def __init__(self, clock: Clock, source: FrameSource, render_ahead_s: float = 0.02) -> None:
        super().__init__(clock)
        encoders.install()  # this track's encoder (and every other session's) shares the cores by one policy
        self.source = source
        self.render_ahead_s = render_ahead_s
        self._t0: float | None = None
        self._index = 0
        self.dropped = 0
        self.sent = 0
        self.send_delay = SendDelay()
        self.extras: dict[str, VideoFrame] = {}  # other pictures of the frame returned last (see want)

    def want(self, variant: str, on: bool) -> bool:
        """Ask the source for another picture of every frame (e.g. "packed" for the OBS page), or stop;
        False when the source makes none (its consumers then get the frame itself)."""
        want = getattr(self.source, "want", None)
        if want is None:
            return False
        want(variant, on)
        return True

    def picture(self, frame: Media, variant: str | None) -> Media:
        return self.extras.get(variant, frame) if variant is not None else frame

    @property
    def fps(self) -> int:
        return self.source.fps

    async def produce(self) -> VideoFrame:
        if self.readyState != "live":
            raise MediaStreamError
        self.send_delay.next_requested(self.clock.now())
        fps = self.fps
        if self._t0 is None:
            self._t0 = self.clock.now()
        t = self._t0 + self._index / fps
        now = self.clock.now()
        if now > t + 1.0 / fps:  # behind: drop the frames we can no longer send on time
            skip = math.floor((now - self._t0) * fps) - self._index + 1
            self.dropped += skip
            self._index += skip
            t = self._t0 + self._index / fps
        await self.clock.sleep_until(t - self.render_ahead_s)
        frame = await self.source.frame_at(t)
        extras: dict[str, VideoFrame] = dict(getattr(self.source, "extras", {}))
        await self.clock.sleep_until(t)
        self._index += 1
        self.sent += 1
        for f in (frame, *extras.values()):
            f.pts = round(t * VIDEO_CLOCK)
            f.time_base = fractions.Fraction(1, VIDEO_CLOCK)
        self.extras = extras
        now = self.clock.now()
        self.send_delay.returned(now, now - t)
        return frame
