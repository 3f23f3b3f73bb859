"""Unfamiliar hosts for the benches: one Piper voice made into many (speed, pitch, level, noise).

The idol's own voice reading the questions is the easiest case there is. These styles make it harder in
the ways a real host differs: faster and slower speech, a higher and a lower voice (resampled, like tape:
the formants move with the pitch, which makes another-sounding speaker), a quiet microphone, a hot one
that clips, and a noisy room. Everything is deterministic (seeded), so a run can be repeated.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import gcd

import numpy as np

RATE = 48000


@dataclass(frozen=True)
class VoiceStyle:
    name: str
    length_scale: float = 1.0  # Piper's speed (above 1 = slower)
    semitones: float = 0.0  # pitch shift by resampling (the speed change is undone by length_scale)
    peak_dbfs: float = -3.0  # the loudest sample's level
    noise_snr_db: float | None = None  # pink-ish noise this far under the speech's RMS
    clip: bool = False  # drive past full scale and clip (a hot microphone)


STYLES = (
    VoiceStyle("plain"),
    VoiceStyle("fast", length_scale=0.78),
    VoiceStyle("high", semitones=4.0),
    VoiceStyle("quiet", peak_dbfs=-32.0),
    VoiceStyle("slow", length_scale=1.3),
    VoiceStyle("noisy", noise_snr_db=12.0),
    VoiceStyle("low", semitones=-4.0),
    VoiceStyle("loud", peak_dbfs=2.0, clip=True),
    VoiceStyle("fast-noisy", length_scale=0.85, noise_snr_db=15.0, peak_dbfs=-12.0),
    VoiceStyle("high-quiet", semitones=3.0, peak_dbfs=-26.0),
)
BY_NAME = {s.name: s for s in STYLES}


def pitch_factor(style: VoiceStyle) -> float:
    return float(2.0 ** (style.semitones / 12.0))


def synthesis_scale(style: VoiceStyle) -> float:
    """Piper's length scale for ``style``: its own, times the pitch factor (resampling up speeds it up)."""
    return style.length_scale * pitch_factor(style)


def apply_style(pcm: np.ndarray, style: VoiceStyle, seed: int = 0) -> np.ndarray:
    """``pcm`` (int16 mono at 48 kHz, synthesized with :func:`synthesis_scale`) as ``style`` sounds."""
    from scipy.signal import resample_poly

    x = pcm.astype(np.float64) / 32768.0
    factor = pitch_factor(style)
    if factor != 1.0:  # play it faster (higher) or slower (lower): take fewer / more samples
        up, down = _ratio(1.0 / factor)
        x = resample_poly(x, up, down)
    peak = float(np.max(np.abs(x))) or 1.0
    x *= 10 ** (style.peak_dbfs / 20.0) / peak
    if style.noise_snr_db is not None:
        x = x + _room_noise(len(x), _speech_rms(x), style.noise_snr_db, seed)
    if style.clip:
        x = np.clip(x, -1.0, 1.0)
    return np.clip(np.round(x * 32767.0), -32768, 32767).astype(np.int16)


def _ratio(r: float, precision: int = 1000) -> tuple[int, int]:
    up, down = round(r * precision), precision
    g = gcd(up, down)
    return up // g, down // g


def _speech_rms(x: np.ndarray) -> float:
    voiced = x[np.abs(x) > 0.05 * np.max(np.abs(x))] if len(x) else x
    return float(np.sqrt(np.mean(voiced**2))) if len(voiced) else 0.01


def _room_noise(samples: int, speech_rms: float, snr_db: float, seed: int) -> np.ndarray:
    """Noise tilted towards the lows, like a room's, ``snr_db`` under ``speech_rms`` (float, full scale 1)."""
    from scipy.signal import lfilter

    noise = lfilter([1.0], [1.0, -0.95], np.random.default_rng(seed).standard_normal(samples))
    return np.asarray(noise * speech_rms / (float(np.sqrt(np.mean(noise**2))) or 1.0) / 10 ** (snr_db / 20.0))


def noise_bed(samples: int, style: VoiceStyle, reference: np.ndarray, seed: int = 1) -> np.ndarray:
    """The style's room noise alone (for the silence around a noisy host's words), at the level it has
    under ``reference`` (a styled utterance); zeros for a quiet room."""
    if style.noise_snr_db is None:
        return np.zeros(samples, dtype=np.int16)
    noise = _room_noise(
        samples, _speech_rms(reference.astype(np.float64) / 32768.0), style.noise_snr_db, seed
    )
    return np.clip(np.round(noise * 32767.0), -32768, 32767).astype(np.int16)
