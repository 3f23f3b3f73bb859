"""The per-frame work left on the event loop is trivially cheap (the claim engine/transport/mic_in.py and
engine/transport/taps.py state): the mic's resample and an audio tap's copy, each well under a
millisecond per 20 ms frame; the video copy, the animator and the render run in worker threads."""

from __future__ import annotations

import fractions
import statistics
import time
from collections.abc import Callable

import numpy as np
import pytest
from av import AudioFrame

from engine.transport.mic_in import MIC_RATE, MicResampler
from engine.transport.taps import copy_frame

pytestmark = pytest.mark.unit

BOUND_S = 0.001  # 5 % of a 20 ms frame; measured ~46 µs (resample) and ~15 µs (copy)


def opus_frame(i: int) -> AudioFrame:
    """What aiortc's Opus decoder hands the mic: 20 ms of 48 kHz stereo s16 (a 440 Hz tone)."""
    t = (np.arange(960) + 960 * i) / 48000
    tone = (np.sin(2 * np.pi * 440 * t) * 8000).astype(np.int16)
    frame = AudioFrame.from_ndarray(np.repeat(tone, 2).reshape(1, -1), format="s16", layout="stereo")
    frame.sample_rate = 48000
    frame.pts = 960 * i
    frame.time_base = fractions.Fraction(1, 48000)
    return frame


def median_s(work: Callable[[int], object], n: int = 200) -> float:
    times = []
    for i in range(n):
        t = time.perf_counter()
        work(i)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def test_the_mic_resample_is_trivially_cheap() -> None:
    resampler = MicResampler()
    frames = [opus_frame(i) for i in range(200)]
    out = [resampler.convert(f) for f in frames[:10]]
    assert sum(len(a) for a in out) > 9 * MIC_RATE // 50  # 20 ms at 16 kHz a frame (after the first)
    assert median_s(lambda i: resampler.convert(frames[i])) < BOUND_S


def test_an_audio_taps_copy_is_trivially_cheap() -> None:
    frame = opus_frame(0)
    copy = copy_frame(frame)
    assert isinstance(copy, AudioFrame) and copy is not frame and copy.pts == frame.pts
    assert np.array_equal(copy.to_ndarray(), frame.to_ndarray())
    assert median_s(lambda i: copy_frame(frame)) < BOUND_S
