"""The host's microphone: frames from a WebRTC audio track, as 16 kHz mono float32 on the session clock."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass

import numpy as np
from aiortc import RTCPeerConnection
from aiortc.jitterbuffer import JitterBuffer
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from av import AudioFrame
from av.audio.resampler import AudioResampler

from engine.clock import Clock

log = logging.getLogger(__name__)

MIC_RATE = 16000
_RECEIVER_JITTER = "_RTCRtpReceiver__jitter_buffer"  # aiortc's own, private


def set_receive_jitter(pc: RTCPeerConnection, track: MediaStreamTrack, frames: int) -> bool:
    """Hold a received audio track (the host's mic) in a jitter buffer of ``frames`` 20 ms frames, not aiortc's 4.

    aiortc releases an audio packet only once ``prefetch`` later frames have arrived: 80 ms before
    the VAD hears the host stop (or start) speaking. On a LAN one frame is enough; a packet that
    arrives later than that is dropped and the VAD sees a 20 ms gap. Returns False (and keeps aiortc's
    buffer) if this aiortc keeps its receiver's buffer elsewhere.
    """
    for transceiver in pc.getTransceivers():
        receiver = transceiver.receiver
        if receiver.track is not track:
            continue
        if not isinstance(getattr(receiver, _RECEIVER_JITTER, None), JitterBuffer):
            log.warning("this aiortc has no receiver jitter buffer where expected; keeping its default")
            return False
        setattr(receiver, _RECEIVER_JITTER, JitterBuffer(capacity=16, prefetch=frames))
        return True
    return False


@dataclass(frozen=True, slots=True)
class MicChunk:
    t: float  # media time of the first sample (continuous, from the RTP pts)
    audio: np.ndarray  # float32 mono at 16 kHz
    arrived: float  # clock time the frame arrived

    @property
    def end_t(self) -> float:
        return self.t + len(self.audio) / MIC_RATE


class ArrivalMap:
    """Media time of the host's audio → the clock time that audio reached the engine.

    The VAD runs on continuous media time (a late sender must not look like silence);
    turn timestamps are reported as when the audio actually arrived.
    """

    def __init__(self, keep_s: float = 10.0) -> None:
        self._chunks: deque[tuple[float, float]] = deque()  # (media end, arrival)
        self.keep_s = keep_s

    def add(self, chunk: MicChunk) -> None:
        self._chunks.append((chunk.end_t, chunk.arrived))
        while self._chunks and self._chunks[0][0] < chunk.end_t - self.keep_s:
            self._chunks.popleft()

    def clock_time(self, media_t: float) -> float:
        for end, arrived in self._chunks:
            if end >= media_t:
                return arrived - (end - media_t)
        if self._chunks:
            end, arrived = self._chunks[-1]
            return arrived + (media_t - end)
        return media_t


class MicResampler:
    """Any incoming frame layout/rate → 16 kHz mono float32 (libswresample through PyAV).

    It runs on the event loop, deliberately: one 20 ms frame (48 kHz stereo, what aiortc's Opus decoder
    gives) takes ~46 µs (0.2 % of a core per session, measured on the 2-core dev box), while handing it to
    a worker thread and back costs ~130 µs, more than the work. tests/engine/test_loop_work.py keeps it
    under a bound; the heavy mic work (VAD, ASR) runs in the models' worker threads.
    """

    def __init__(self) -> None:
        self._resampler = AudioResampler(format="flt", layout="mono", rate=MIC_RATE)

    def convert(self, frame: AudioFrame) -> np.ndarray:
        frame.pts = None  # let the resampler run on a plain sample stream
        out = [f.to_ndarray().reshape(-1) for f in self._resampler.resample(frame)]
        return np.concatenate(out).astype(np.float32) if out else np.zeros(0, np.float32)


async def mic_chunks(track: MediaStreamTrack, clock: Clock) -> AsyncIterator[MicChunk]:
    """Yield the host's audio until the track ends.

    Media time comes from the RTP pts (gaps included), anchored to the clock when the first
    frame arrives; each chunk also carries its arrival time on the clock.
    """
    resampler = MicResampler()
    anchor_t: float | None = None
    anchor_pts = 0
    while True:
        try:
            frame = await track.recv()
        except MediaStreamError:
            return
        assert isinstance(frame, AudioFrame)
        now = clock.now()
        rate = frame.sample_rate
        pts = frame.pts if frame.pts is not None else anchor_pts
        if anchor_t is None:
            anchor_t, anchor_pts = now - frame.samples / rate, pts
        audio = resampler.convert(frame)
        if len(audio):
            yield MicChunk(anchor_t + (pts - anchor_pts) / rate, audio, now)
