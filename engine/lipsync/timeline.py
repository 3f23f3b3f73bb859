"""Mouth timelines for one speech chunk: continuous viseme weights at any chunk-relative time.

Two implementations of :class:`MouthTimeline`:

* :class:`VisemeTimeline` from phoneme alignments, with coarticulation. Each sounding
  phoneme becomes a segment aiming at its viseme target. At every boundary the
  outgoing segment ramps out while the incoming one ramps in, with a smoothstep of
  width ``blend_s`` (~60 ms) centred on the boundary, so neighbouring shapes overlap
  instead of swapping. A segment shorter than its ramps never reaches its target: it
  blends toward its neighbours. Lip closures (/p b m/, /f v/) use narrow ramps
  (``crisp_blend_s``) and last at least ``min_closure_s`` (stolen from the sound
  before: lips close before the burst), so the lips do touch, even at 30 fps.
  Word gaps shorter than ``min_pause_s`` do not close the mouth; pauses and
  punctuation do. Ramps at the chunk's edges lie inside the chunk: before 0 and
  after :attr:`duration_s` the mouth is exactly at rest (``sil`` = 1).

  With ramp values ``r_i(t)`` (one per boundary) segment ``i`` weighs
  ``r_i (1 - r_{i+1})``; the sum over segments plus the silence outside is always
  ≥ 1, and exactly 1 where ramps do not overlap, so the weights are normalised
  safely and stay continuous (bounded slope ``1.5 / ramp width``).

  Measured with the bundled Piper voice (through ``engine.tts``): openness from its
  alignments trails the audio envelope by about 10–25 ms (each token's span also
  owns the pad after it; durations come in 256-sample steps). The animator's default
  20 ms articulation lead brings the displayed mouth to within ~±10 ms of the sound.

* :class:`AmplitudeTimeline`, the fallback when a TTS gives no alignments: mouth
  openness from the RMS envelope of the chunk's audio, smoothed with attack/release,
  blended between ``aa`` (bright frames), ``O`` (dark frames) and ``sil``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from engine.events import PhonemeSpan
from engine.lipsync.visemes import (
    CRISP_VISEMES,
    NUM_VISEMES,
    SIL,
    VISEME_INDEX,
    VISEME_OPENNESS,
    classify,
    viseme_target,
)

_CRISP_IDX = [VISEME_INDEX[v] for v in CRISP_VISEMES]


class MouthTimeline(Protocol):
    """Viseme weights for one chunk; ``t`` in seconds from the chunk's first sample."""

    @property
    def duration_s(self) -> float: ...

    def weights_at(self, t: float | np.ndarray) -> np.ndarray:
        """float32 ``[..., NUM_VISEMES]`` weights summing to 1; ``sil`` outside the chunk."""
        ...


def openness(weights: np.ndarray) -> np.ndarray:
    """Jaw opening (0..1) of ``[..., NUM_VISEMES]`` viseme weights."""
    return np.asarray(weights @ VISEME_OPENNESS, dtype=np.float32)


def _smoothstep(x: np.ndarray) -> np.ndarray:
    x = np.clip(x, 0.0, 1.0)
    return x * x * (3.0 - 2.0 * x)


@dataclass
class _Seg:
    start: float
    end: float
    target: np.ndarray
    kind: str

    @property
    def crisp(self) -> bool:
        return bool(self.target[_CRISP_IDX].max() >= 0.5)

    @property
    def dur(self) -> float:
        return self.end - self.start


def _fold(spans: Sequence[PhonemeSpan]) -> list[_Seg]:
    """Spans → segments: marks folded into neighbours, ``h`` given the next shape, gaps as silence."""
    raw: list[_Seg] = []
    for sp in sorted(spans, key=lambda s: s.start_s):
        start = max(sp.start_s, raw[-1].end if raw else sp.start_s)
        end = max(start, sp.end_s)
        if raw and start - raw[-1].end > 1e-3:
            raw.append(_Seg(raw[-1].end, start, viseme_target(" "), "silence"))
        raw.append(_Seg(start, end, viseme_target(sp.phoneme), classify(sp.phoneme)))
    out: list[_Seg] = []
    carry: float | None = None  # start time of a stress mark waiting for its phoneme
    for seg in raw:
        if seg.kind == "stress":
            carry = seg.start if carry is None else carry
            continue
        if seg.kind == "length":
            if out:
                out[-1].end = seg.end
            else:
                carry = seg.start if carry is None else carry
            continue
        if carry is not None:
            seg.start, carry = carry, None
        out.append(seg)
    if carry is not None and out:
        out[-1].end = raw[-1].end
    for i, seg in enumerate(out):
        if seg.kind == "transparent":
            nxt = next((s for s in out[i + 1 :] if s.kind == "viseme"), None)
            seg.target = nxt.target.copy() if nxt is not None else viseme_target("ə")
            seg.kind = "viseme"
    return out


def _absorb_short_pauses(segs: list[_Seg], min_pause_s: float) -> list[_Seg]:
    out: list[_Seg] = []
    for i, seg in enumerate(segs):
        inner = 0 < i < len(segs) - 1
        if seg.kind == "silence" and inner and seg.dur < min_pause_s and out:
            mid = 0.5 * (seg.start + seg.end)
            out[-1].end = mid
            segs[i + 1].start = mid
            continue
        out.append(seg)
    merged: list[_Seg] = []
    for seg in out:
        if merged and np.array_equal(merged[-1].target, seg.target):
            merged[-1].end = seg.end
        else:
            merged.append(seg)
    return merged


def _hold_closures(segs: list[_Seg], min_closure_s: float) -> None:
    """Stretch short lip closures to ``min_closure_s``, mostly backwards into the sound before."""
    for i, seg in enumerate(segs):
        short = min_closure_s - seg.dur
        if not seg.crisp or short <= 0:
            continue
        if i > 0:
            take = min(short, 0.5 * segs[i - 1].dur)
            segs[i - 1].end -= take
            seg.start -= take
            short -= take
        if short > 0 and i + 1 < len(segs):
            take = min(short, 0.5 * segs[i + 1].dur)
            segs[i + 1].start += take
            seg.end += take


class VisemeTimeline:
    """Coarticulated viseme weights from a chunk's phoneme alignments."""

    def __init__(
        self,
        spans: Sequence[PhonemeSpan],
        *,
        blend_s: float = 0.06,
        crisp_blend_s: float = 0.03,
        min_closure_s: float = 0.045,
        min_pause_s: float = 0.06,
    ) -> None:
        segs = _absorb_short_pauses(_fold(spans), min_pause_s)
        _hold_closures(segs, min_closure_s)
        self._duration = max((s.end for s in segs), default=0.0)
        n = len(segs)
        self._targets = np.stack([s.target for s in segs]) if n else np.zeros((0, NUM_VISEMES), np.float32)
        bounds = np.array([s.start for s in segs] + [segs[-1].end] if n else [0.0], dtype=np.float64)
        widths = np.full(n + 1, blend_s, dtype=np.float64)
        for i, seg in enumerate(segs):
            if seg.crisp:
                w = max(0.01, min(crisp_blend_s, seg.dur))
                widths[i] = min(widths[i], w)
                widths[i + 1] = min(widths[i + 1], w)
        centres = bounds.copy()
        if n:  # ramps at the chunk's edges stay inside the chunk
            widths[0] = min(widths[0], max(segs[0].dur, 1e-3))
            widths[-1] = min(widths[-1], max(segs[-1].dur, 1e-3))
            centres[0] += 0.5 * widths[0]
            centres[-1] -= 0.5 * widths[-1]
        self._centres = centres
        self._widths = widths
        self._segments = tuple((s.start, s.end) for s in segs)

    @property
    def duration_s(self) -> float:
        return self._duration

    @property
    def segments(self) -> tuple[tuple[float, float], ...]:
        """(start, end) of each folded segment, for inspection."""
        return self._segments

    def weights_at(self, t: float | np.ndarray) -> np.ndarray:
        tt = np.asarray(t, dtype=np.float64)
        flat = tt.reshape(-1, 1)
        ramps = _smoothstep((flat - self._centres) / self._widths + 0.5)  # [T, n+1]
        env = ramps[:, :-1] * (1.0 - ramps[:, 1:])  # [T, n]
        out = env @ self._targets.astype(np.float64)
        out[:, SIL] += (1.0 - ramps[:, 0]) + ramps[:, -1]
        out /= out.sum(axis=1, keepdims=True)
        return out.astype(np.float32).reshape(*tt.shape, NUM_VISEMES)


class AmplitudeTimeline:
    """Mouth from the audio envelope, for a TTS without alignments.

    RMS over ``window_s`` every ``hop_s`` in dB, mapped to 0..1 between a floor
    (``range_db`` below the chunk's loud level) and that level, then smoothed with a
    one-pole attack/release both forwards and backwards and averaged: the chunk's
    audio is known in advance, so the smoothing need not lag: the mouth opens a
    little before a loud onset and closes a little after it, symmetric around the
    sound. A brightness measure (energy of the first difference over energy) shifts
    the open shape between ``aa`` (bright) and ``O`` (dark).
    """

    def __init__(
        self,
        pcm: np.ndarray,
        sample_rate: int = 48000,
        *,
        hop_s: float = 0.01,
        window_s: float = 0.03,
        attack_s: float = 0.02,
        release_s: float = 0.05,
        range_db: float = 35.0,
    ) -> None:
        x = np.asarray(pcm, dtype=np.float64).reshape(-1)
        if np.issubdtype(np.asarray(pcm).dtype, np.integer):
            x = x / 32768.0
        self._duration = len(x) / sample_rate
        hop = max(1, round(hop_s * sample_rate))
        half = max(1, round(window_s * sample_rate / 2))
        centres = np.arange(0, len(x) + 1, hop)
        energy = _window_mean(x * x, centres, half)
        dx = np.diff(x, prepend=x[:1] if len(x) else x)
        bright = _window_mean(dx * dx, centres, half) / np.maximum(energy, 1e-12)
        db = 10.0 * np.log10(np.maximum(energy, 1e-12))
        loud = float(np.percentile(db, 95)) if len(db) else -20.0
        loud = max(loud, -60.0)
        level = np.clip((db - (loud - range_db)) / range_db, 0.0, 1.0)
        a_up = 1.0 - np.exp(-hop / (attack_s * sample_rate))
        a_down = 1.0 - np.exp(-hop / (release_s * sample_rate))
        fwd = _attack_release(level, a_up, a_down)
        bwd = _attack_release(level[::-1], a_up, a_down)[::-1]
        self._times = centres / sample_rate
        self._open = np.clip(0.5 * (fwd + bwd), 0.0, 1.0)
        # brightness 0.05 (dark, rounded) .. 0.5 (bright, open); weight by level so silence stays neutral
        self._bright = np.clip((bright - 0.05) / 0.45, 0.0, 1.0)

    @property
    def duration_s(self) -> float:
        return self._duration

    def openness_at(self, t: float | np.ndarray) -> np.ndarray:
        return np.asarray(np.interp(t, self._times, self._open, left=0.0, right=0.0), dtype=np.float32)

    def weights_at(self, t: float | np.ndarray) -> np.ndarray:
        tt = np.asarray(t, dtype=np.float64)
        o = np.interp(tt, self._times, self._open, left=0.0, right=0.0)
        b = 0.3 + 0.7 * np.interp(tt, self._times, self._bright)
        out = np.zeros((*tt.shape, NUM_VISEMES), dtype=np.float32)
        out[..., SIL] = 1.0 - o
        out[..., VISEME_INDEX["aa"]] = o * b
        out[..., VISEME_INDEX["O"]] = o * (1.0 - b)
        return out


def _window_mean(y: np.ndarray, centres: np.ndarray, half: int) -> np.ndarray:
    """Mean of ``y`` over ``[c - half, c + half)`` for each centre (clipped at the ends)."""
    csum = np.concatenate([[0.0], np.cumsum(y)])
    lo = np.clip(centres - half, 0, len(y))
    hi = np.clip(centres + half, 0, len(y))
    return (csum[hi] - csum[lo]) / np.maximum(hi - lo, 1)


def _attack_release(x: np.ndarray, a_up: float, a_down: float) -> np.ndarray:
    out = np.empty_like(x)
    y = 0.0
    for i, v in enumerate(x):
        y += (a_up if v > y else a_down) * (v - y)
        out[i] = y
    return out


def spans_from_alignments(
    alignments: Sequence[tuple[str, int]], sample_rate: int, offset_s: float = 0.0
) -> tuple[PhonemeSpan, ...]:
    """(phoneme, num_samples) pairs (Piper's ``phoneme_alignments``) → contiguous spans."""
    spans: list[PhonemeSpan] = []
    t = offset_s
    for phoneme, n in alignments:
        d = int(n) / sample_rate
        spans.append(PhonemeSpan(phoneme, t, t + d))
        t += d
    return tuple(spans)
