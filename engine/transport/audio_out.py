"""The idol's outgoing audio track: 20 ms frames paced by the session media clock."""

from __future__ import annotations

import fractions
import logging

from aiortc.mediastreams import MediaStreamError
from av import AudioFrame

from engine.clock import Clock
from engine.transport.playout import PlayoutBuffer
from engine.transport.send_delay import SendDelay
from engine.transport.taps import TappedTrack

log = logging.getLogger(__name__)

PTIME_S = 0.020
LATE_S = 0.1  # a frame asked for this long after its time counts as late (the sender fell behind the clock)


class IdolAudioTrack(TappedTrack):
    """Pull-based: each ``recv`` waits for the frame's clock time, then takes 20 ms from the buffer.

    Frame ``i`` carries pts ``round(t_i * rate)`` where ``t_i`` is its clock time, so the
    audio pts and the video pts (``round(t * 90000)``) live on one timeline. Tappable from birth
    (engine/transport/taps.py): WHEP viewers and RTMP read taps, the host's peer the track.
    """

    kind = "audio"

    def __init__(self, clock: Clock, playout: PlayoutBuffer) -> None:
        super().__init__(clock)
        self.playout = playout
        self.rate = playout.rate
        self.samples_per_frame = int(self.rate * PTIME_S)
        self._t0: float | None = None
        self._frames = 0
        self.late_frames = 0  # frames asked for more than LATE_S after their clock time
        self.most_late_s = 0.0  # the latest any frame was asked for (its audio reaches the viewer that late)
        self.send_delay = SendDelay()

    async def produce(self) -> AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        self.send_delay.next_requested(self.clock.now())
        if self._t0 is None:
            # Align to the frame grid so pts are exact multiples of a frame.
            self._t0 = round(self.clock.now() / PTIME_S) * PTIME_S
            self.playout.start(self._t0)
        t = self._t0 + self._frames * PTIME_S
        await self.clock.sleep_until(t)
        late = self.clock.now() - t
        if late > LATE_S:
            self.late_frames += 1
        self.most_late_s = max(self.most_late_s, late)
        pcm = self.playout.pull(self.samples_per_frame)
        self._frames += 1
        frame = AudioFrame(format="s16", layout="mono", samples=self.samples_per_frame)
        frame.planes[0].update(pcm.tobytes())
        frame.pts = round(t * self.rate)
        frame.sample_rate = self.rate
        frame.time_base = fractions.Fraction(1, self.rate)
        now = self.clock.now()
        self.send_delay.returned(now, now - t)
        return frame
