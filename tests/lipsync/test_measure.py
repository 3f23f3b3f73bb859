"""Receiver-side lip-sync offset from synthetic shifted signals."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from engine.lipsync.measure import SyncOffset, estimate_offset, offsets_per_reply, summarize

pytestmark = pytest.mark.unit

RATE = 48000
FPS = 30.0


def syllable_envelope(t: np.ndarray, seed: int, duration: float) -> np.ndarray:
    """A speech-like loudness contour: bumps at ~4 per second, with pauses."""
    rng = np.random.default_rng(seed)
    env = np.zeros_like(t)
    onset = 0.2
    while onset < duration - 0.3:
        width = rng.uniform(0.06, 0.14)
        env += rng.uniform(0.4, 1.0) * np.exp(-0.5 * ((t - onset) / width) ** 2)
        onset += rng.uniform(0.18, 0.35) + (0.4 if rng.random() < 0.15 else 0.0)
    return np.clip(env, 0.0, 1.0)


@functools.lru_cache(maxsize=16)
def noisy_speech(seed: int, duration: float) -> np.ndarray:
    """Noise shaped by the syllable envelope, int16 at 48 kHz."""
    rng = np.random.default_rng(seed + 100)
    ta = np.arange(int(duration * RATE)) / RATE
    audio = rng.standard_normal(len(ta)) * 0.3 * syllable_envelope(ta, seed, duration)
    return (audio * 32767).astype(np.int16)


def scene(
    offset_s: float, seed: int = 0, duration: float = 4.0, audio_start: float = 10.0
) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """Audio starting at ``audio_start`` on the clock, and 30 fps mouth samples ``offset_s`` late."""
    rng = np.random.default_rng(seed + 200)
    audio = noisy_speech(seed, duration)
    pts = audio_start + np.arange(0.0, duration, 1 / FPS) + rng.uniform(0, 1 / FPS)
    mouth = syllable_envelope(pts - audio_start - offset_s, seed, duration)
    return pts, mouth, audio, audio_start


@pytest.mark.parametrize("offset_ms", [-66.0, -33.0, 0.0, 33.0, 66.0])
def test_recovers_known_offsets_within_5ms(offset_ms: float) -> None:
    for seed in (1, 2, 3):
        pts, mouth, audio, start = scene(offset_ms / 1000.0, seed)
        res = estimate_offset(pts, mouth, audio, start, RATE, fps=FPS)
        assert res.offset_ms == pytest.approx(offset_ms, abs=5.0), (seed, res)
        assert res.offset_frames == pytest.approx(offset_ms / 1000.0 * FPS, abs=0.15)
        assert res.confidence > 0.7
        assert res.n_frames == len(pts)


def test_flat_or_unrelated_video_has_no_confidence() -> None:
    pts, mouth, audio, start = scene(0.0, 4)
    assert estimate_offset(pts, np.zeros_like(mouth), audio, start, RATE).confidence == 0.0
    noise = np.random.default_rng(9).random(len(pts))
    assert estimate_offset(pts, noise, audio, start, RATE).confidence < 0.5


def test_per_reply_windows_and_summary() -> None:
    # two replies in one stream: the second with the video 50 ms late
    pts1, mouth1, audio1, _ = scene(0.0, 5, duration=3.0, audio_start=0.0)
    pts2, mouth2, audio2, _ = scene(0.05, 6, duration=3.0, audio_start=0.0)
    gap = np.zeros(RATE, dtype=np.int16)
    audio = np.concatenate([audio1, gap, audio2])
    pts = np.concatenate([pts1, pts2 + 4.0])
    mouth = np.concatenate([mouth1, mouth2])
    res = offsets_per_reply(pts, mouth, audio, 0.0, [(0.0, 3.0), (4.0, 7.0)], RATE, fps=FPS)
    assert [round(r.offset_ms / 10) for r in res] == [0, 5]
    summary = summarize(res)
    assert summary["n"] == 2
    assert summary["mean"] == pytest.approx(25.0, abs=5.0)
    assert summary["p95"] == pytest.approx(50.0, abs=5.0)


def test_summary_skips_unconfident_replies() -> None:
    rows = [SyncOffset(10.0, 0.3, 0.9, 90), SyncOffset(300.0, 9.0, 0.1, 90)]
    assert summarize(rows) == {"mean": 10.0, "p95": 10.0, "n": 1}
    assert summarize([])["n"] == 0
