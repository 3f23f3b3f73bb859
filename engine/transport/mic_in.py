"""The host's microphone: frames from a WebRTC audio track, as 16 kHz mono float32 on the session clock."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from av import AudioFrame
from av.audio.resampler import AudioResampler

from engine.clock import Clock

MIC_RATE = 16000


@dataclass(frozen=True, slots=True)
class MicChunk:
    t: float  # clock time of the first sample
    audio: np.ndarray  # float32 mono at 16 kHz


class MicResampler:
    """Any incoming frame layout/rate → 16 kHz mono float32 (libswresample through PyAV)."""

    def __init__(self) -> None:
        self._resampler = AudioResampler(format="flt", layout="mono", rate=MIC_RATE)

    def convert(self, frame: AudioFrame) -> np.ndarray:
        frame.pts = None  # let the resampler run on a plain sample stream
        out = [f.to_ndarray().reshape(-1) for f in self._resampler.resample(frame)]
        return np.concatenate(out).astype(np.float32) if out else np.zeros(0, np.float32)


async def mic_chunks(track: MediaStreamTrack, clock: Clock) -> AsyncIterator[MicChunk]:
    """Yield the host's audio until the track ends.

    Time comes from the RTP-derived pts (gaps included), anchored to the clock when the first
    frame arrives, so a late packet does not shift the timeline.
    """
    resampler = MicResampler()
    anchor_t: float | None = None
    anchor_pts = 0
    samples_out = 0
    while True:
        try:
            frame = await track.recv()
        except MediaStreamError:
            return
        assert isinstance(frame, AudioFrame)
        pts, rate = frame.pts, frame.sample_rate
        if anchor_t is None:
            anchor_t = clock.now() - frame.samples / rate
            anchor_pts = pts or 0
        t_frame = anchor_t + ((pts or 0) - anchor_pts) / rate if pts is not None else None
        audio = resampler.convert(frame)
        t = t_frame if t_frame is not None else anchor_t + samples_out / MIC_RATE
        samples_out += len(audio)
        if len(audio):
            yield MicChunk(t, audio)
