"""Receiver-side lip-sync measurement: how far the mouth is from the sound.

Input: ``(pts_s, mouth_openness)`` samples read from received video frames and the
received audio (mono, with the pts of its first sample), both on one timeline
(the bench maps each track's RTP timestamps to the sender's clock through RTCP
sender reports, or uses the media clock directly in-process). For each candidate
lag on a fine grid (2 ms, within ±``max_lag_s``) the audio's RMS envelope is
evaluated at every frame's ``pts - lag`` and correlated (Pearson) with the mouth
openness of those frames: no interpolation of the coarse 30 fps signal, so irregular
or dropped frames are fine. The lag of the peak, refined by a parabola through its
neighbours, is the offset:

* ``offset_ms > 0``: video late (the mouth moves after the sound);
* ``offset_ms < 0``: video early. The animator's deliberate articulation lead
  shows up here as about ``-articulation_lead_ms``.

``confidence`` is the peak correlation (0..1), 0 when the peak sits at the edge of
the searched range (no real optimum found). :func:`summarize` gives the bench's
``lipsync_offset_ms`` fields.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np


@dataclass(frozen=True, slots=True)
class SyncOffset:
    offset_ms: float  # positive = video late
    offset_frames: float  # offset_ms in frames at ``fps``
    confidence: float  # peak correlation, 0..1
    n_frames: int  # video samples used


def audio_envelope(
    audio: np.ndarray,
    sample_rate: int,
    times_s: np.ndarray,
    *,
    window_s: float = 0.03,
    scale: Literal["linear", "db"] = "linear",
    range_db: float = 35.0,
) -> np.ndarray:
    """Loudness at ``times_s`` (seconds from the first sample; 0 outside the audio).

    Windowed RMS, as a fraction of the loud (95th percentile) level; with ``scale="db"``
    mapped in dB instead, ``range_db`` below the loud level → 0. Linear RMS tracks mouth
    openness better (higher correlation, no bias from the compression) and is the default.
    """
    x = np.asarray(audio, dtype=np.float64).reshape(-1)
    if np.issubdtype(np.asarray(audio).dtype, np.integer):
        x = x / 32768.0
    csum = np.concatenate([[0.0], np.cumsum(x * x)])
    half = max(1, round(window_s * sample_rate / 2))
    centre = np.round(np.asarray(times_s, dtype=np.float64) * sample_rate).astype(np.int64)
    lo = np.clip(centre - half, 0, len(x))
    hi = np.clip(centre + half, 0, len(x))
    rms = np.sqrt((csum[hi] - csum[lo]) / (2 * half))
    inside = hi > lo
    if scale == "linear":
        loud = float(np.percentile(rms[inside], 95)) if inside.any() else 1.0
        return np.asarray(np.clip(rms / max(loud, 1e-9), 0.0, 1.5))
    db = 20.0 * np.log10(np.maximum(rms, 1e-6))
    loud_db = float(np.percentile(db[inside], 95)) if inside.any() else -20.0
    return np.asarray(np.clip((db - (loud_db - range_db)) / range_db, 0.0, 1.0))


def estimate_offset(
    video_pts: Sequence[float] | np.ndarray,
    mouth_open: Sequence[float] | np.ndarray,
    audio: np.ndarray,
    audio_start_pts: float,
    sample_rate: int = 48000,
    *,
    fps: float = 30.0,
    max_lag_s: float = 0.25,
    grid_s: float = 0.002,
) -> SyncOffset:
    """Offset between the mouth-openness signal and the audio envelope (see module docstring)."""
    pts = np.asarray(video_pts, dtype=np.float64)
    mouth = np.asarray(mouth_open, dtype=np.float64)
    order = np.argsort(pts)
    pts, mouth = pts[order], mouth[order]
    if len(pts) < 4 or np.ptp(mouth) < 1e-6:
        return SyncOffset(0.0, 0.0, 0.0, len(pts))
    # Correlate at the frames' own pts (no interpolation of the coarse video signal):
    # the audio envelope is evaluated at ``pts - lag`` for every lag on a fine grid.
    k = int(round(max_lag_s / grid_s))
    lags = np.arange(-k, k + 1)
    when = pts[None, :] - audio_start_pts - lags[:, None] * grid_s  # [lags, frames]
    env = audio_envelope(audio, sample_rate, when.reshape(-1)).reshape(when.shape)
    vz = (mouth - mouth.mean()) / (mouth.std() + 1e-12)
    ez = env - env.mean(axis=1, keepdims=True)
    sd = env.std(axis=1)
    corr = np.where(sd > 1e-9, (ez @ vz) / (len(pts) * np.maximum(sd, 1e-12)), 0.0)
    best = int(np.argmax(corr))
    frac = 0.0
    if 0 < best < len(lags) - 1:
        y0, y1, y2 = corr[best - 1], corr[best], corr[best + 1]
        denom = y0 - 2.0 * y1 + y2
        frac = 0.5 * (y0 - y2) / denom if abs(denom) > 1e-12 else 0.0
        confidence = float(np.clip(y1, 0.0, 1.0))
    else:
        confidence = 0.0
    offset_s = (lags[best] + frac) * grid_s
    return SyncOffset(offset_s * 1000.0, offset_s * fps, confidence, len(pts))


def offsets_per_reply(
    video_pts: Sequence[float] | np.ndarray,
    mouth_open: Sequence[float] | np.ndarray,
    audio: np.ndarray,
    audio_start_pts: float,
    replies: Sequence[tuple[float, float]],
    sample_rate: int = 48000,
    *,
    fps: float = 30.0,
    max_lag_s: float = 0.25,
) -> list[SyncOffset]:
    """:func:`estimate_offset` over each reply's ``(start_pts, end_pts)`` window (padded by the lag range)."""
    pts = np.asarray(video_pts, dtype=np.float64)
    mouth = np.asarray(mouth_open, dtype=np.float64)
    out = []
    for start, end in replies:
        sel = (pts >= start - max_lag_s) & (pts <= end + max_lag_s)
        out.append(
            estimate_offset(
                pts[sel], mouth[sel], audio, audio_start_pts, sample_rate, fps=fps, max_lag_s=max_lag_s
            )
        )
    return out


def summarize(offsets: Sequence[SyncOffset], min_confidence: float = 0.3) -> dict[str, float | int]:
    """``{"mean", "p95", "n"}`` in ms over confident replies; p95 is of the absolute offset."""
    ms = np.array([o.offset_ms for o in offsets if o.confidence >= min_confidence], dtype=np.float64)
    if not len(ms):
        return {"mean": float("nan"), "p95": float("nan"), "n": 0}
    return {"mean": float(ms.mean()), "p95": float(np.percentile(np.abs(ms), 95)), "n": len(ms)}
