"""The idol's outgoing video track: frames rendered for their presentation time on the session clock.

Pull-based like the audio track: frame ``i`` is due at ``t0 + i / fps``; its pts is
``round(t × 90000)`` on the *same* session clock as the audio pts. Rendering runs off
the event loop, one frame ahead: when frame ``i`` is handed over, frame ``i + 1``'s
render starts, so it renders while aiortc encodes and sends frame ``i`` and is ready
when aiortc asks for it (the first frame starts ``render_ahead_s`` before it is due).
Each frame thus waits on the loop twice (its due time, its encode) instead of four
times, which is what a busy loop's lag multiplies. A frame asked for up to ``catch_up_s``
after its time (a stalled encode or loop) is still sent, at its own pts, and the ones after it
follow at once until the track is on time again: the viewer's jitter buffer plays them on their
timestamps, where a dropped frame is a visible hole. Later than that the frames in between are
dropped (the index jumps to the present), never queued.

Every session's frames fall on one grid: frame ``i`` is due at a whole number of frame periods of
``time.monotonic()`` (the session clock's origin says where that is on the session's own clock), so the
sessions of an engine ask for their frames at about the same moments and the render pool
(``engine/avatar/live.py``) renders them in one batched call instead of one call each.

The track also measures how long aiortc takes between handing it a frame and asking
for the next (encode + packetize + send) — with the audio track's own figure this
gives the lip-phase compensation (see ``engine/avatar/animator.py``).
"""

from __future__ import annotations

import asyncio
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
FAILURE_LOG_S = 5.0  # a render that keeps failing is logged at most this often
DROP_LOG_S = 5.0  # frames dropped as late are logged at most this often a track
SENDER_GONE_S = 5.0  # a sender that has not asked for a frame in this long has stopped (not a stall)


def on_grid(clock: Clock, fps: int) -> float:
    """The session time of the first frame: now, moved on to the process-wide grid of frame periods when the
    clock says where its zero is on ``time.monotonic()`` (a ``MediaClock``; a scripted clock: now)."""
    now = clock.now()
    origin = getattr(clock, "origin", None)
    if origin is None:
        return now
    return math.ceil((origin + now) * fps - 1e-6) / fps - origin


class FrameSource(Protocol):
    """Renders the session's idol for a presentation time (off the event loop)."""

    fps: int

    async def frame_at(self, t: float) -> VideoFrame: ...


class IdolVideoTrack(TappedTrack):
    """Tappable from birth (engine/transport/taps.py); each tap's copy of a frame is made off the loop."""

    kind = "video"
    copy_off_loop = True

    def __init__(
        self,
        clock: Clock,
        source: FrameSource,
        render_ahead_s: float = 0.02,
        catch_up_s: float = 2 / 30,
        name: str = "",
    ) -> None:
        super().__init__(clock)
        self.name = name  # the session's id, in its log lines
        encoders.install()  # this track's encoder (and every other session's) shares the cores by one policy
        self.source = source
        self.render_ahead_s = render_ahead_s
        self.catch_up_s = catch_up_s  # at least one frame period (see produce)
        self._t0: float | None = None
        self._index = 0
        self.dropped = 0
        self.sent = 0
        self.failed = 0  # frames whose render failed (the one before sent again)
        self._failure_logged = -math.inf
        self._last: tuple[VideoFrame, dict[str, VideoFrame]] | None = None
        self.send_delay = SendDelay()
        self.extras: dict[str, VideoFrame] = {}  # other pictures of the frame returned last (see want)
        # the next frame's render, started when the last one was handed over: (its time, the render)
        self._ahead: tuple[float, asyncio.Task[tuple[VideoFrame, dict[str, VideoFrame]]]] | None = None
        # where the frame in hand is, for engine/server/stalls.py (read from its thread): "render" (asked
        # for, due at ``_due``), "sender" (handed to aiortc at ``_handed``: encoding, sending) or "idle"
        self._phase = "idle"
        self._due = 0.0
        self._handed = 0.0
        self._drop_logged = -math.inf
        self._dropped_logged = 0

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
        now = self.clock.now()
        held = now - self._handed if self._phase == "sender" else 0.0
        self.send_delay.next_requested(now)
        fps = self.fps
        if self._t0 is None:
            self._t0 = on_grid(self.clock, fps)
        t = self._t0 + self._index / fps
        if now > t + max(self.catch_up_s, 1.0 / fps):  # too far behind: drop to the present
            skip = math.floor((now - self._t0) * fps) - self._index + 1
            self.dropped += skip
            self._index += skip
            self._log_drop(now - t, held)
            t = self._t0 + self._index / fps
        self._due = t  # before the phase: the stall watch reads the phase first
        self._phase = "render"
        try:
            frame, extras = await self._rendered(t)
        except Exception:
            # aiortc's sender stops for good on an error from recv(): a frame whose render failed is the
            # last one again (its time, its pts), and the video goes on
            if self._last is None:
                raise
            self.failed += 1
            if self.failed == 1 or now - self._failure_logged >= FAILURE_LOG_S:
                self._failure_logged = now
                log.exception(
                    "video: rendering the frame at %.3f s failed (%d so far); the last frame again",
                    t,
                    self.failed,
                )
            frame, extras = self._last
        self._last = (frame, extras)
        self._start_ahead(self._t0 + (self._index + 1) / fps)
        await self.clock.sleep_until(t)
        self._index += 1
        self.sent += 1
        for f in (frame, *extras.values()):
            f.pts = round(t * VIDEO_CLOCK)
            f.time_base = fractions.Fraction(1, VIDEO_CLOCK)
        self.extras = extras
        now = self.clock.now()
        self.send_delay.returned(now, now - t)
        self._handed = now
        self._phase = "sender"
        return frame

    def _log_drop(self, behind_s: float, held_s: float) -> None:
        """A WARNING for frames dropped as late, at most one every ``DROP_LOG_S`` (with the count since)."""
        now = self.clock.now()
        if now - self._drop_logged < DROP_LOG_S:
            return
        since, self._dropped_logged = self.dropped - self._dropped_logged, self.dropped
        self._drop_logged = now
        log.warning(
            "video%s: %d frame(s) dropped as late since the last report (%d in all): the track was %.0f ms "
            "behind, the sender had held the frame before %.0f ms",
            f" of session {self.name}" if self.name else "",
            since,
            self.dropped,
            behind_s * 1000.0,
            held_s * 1000.0,
        )

    def stalled(self) -> tuple[str, float] | None:
        """(phase, seconds) when the frame in hand is overdue: its render past its due time ("render"), or
        aiortc holding the frame before (encoding, sending) more than a frame period, up to ``SENDER_GONE_S``
        ("sender")."""
        phase, now = self._phase, self.clock.now()
        if phase == "render" and now > self._due:
            return phase, now - self._due
        held = now - self._handed
        if phase == "sender" and 1.0 / self.fps < held <= SENDER_GONE_S:
            return phase, held
        return None  # on time, or a sender that stopped asking (its peer gone, its session about to close)

    async def _render(self, t: float) -> tuple[VideoFrame, dict[str, VideoFrame]]:
        frame = await self.source.frame_at(t)
        return frame, dict(getattr(self.source, "extras", {}))

    async def _rendered(self, t: float) -> tuple[VideoFrame, dict[str, VideoFrame]]:
        """Frame ``t``: the render started ahead for it, else a render now. A render started for an
        earlier time (this track fell behind) is waited out and dropped first: one render at a time,
        in time order, as the animator and the source's ``extras`` expect."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            ahead_t, task = ahead
            if abs(ahead_t - t) < 1e-9:
                return await task
            try:
                await task
            except Exception:  # noqa: BLE001 - a stale frame's failure is not this frame's
                log.debug("stale frame render failed", exc_info=True)
        else:
            await self.clock.sleep_until(t - self.render_ahead_s)
        return await self._render(t)

    def _start_ahead(self, t: float) -> None:
        self._ahead = (t, asyncio.get_running_loop().create_task(self._render(t), name="video-render-ahead"))

    def stop(self) -> None:
        self._phase = "idle"
        if self._ahead is not None:
            task = self._ahead[1]
            self._ahead = None
            if task.done() and not task.cancelled():
                task.exception()  # retrieved: a failed render nobody will ask for is not an error
            task.cancel()
        super().stop()
