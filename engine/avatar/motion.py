"""Motion primitives: gestures as parameter curves, and procedural idle motion.

A :class:`MotionPrimitive` is a duration plus, per parameter (names from
:mod:`engine.avatar.params`), a curve giving an *offset* from the rest pose at each
local time. Curves start and end at 0, so every gesture returns to rest. Adding a
gesture is one entry::

    register(MotionPrimitive("shrug", 1.0, {"body_x": Keyframes(((0, 0), (0.3, 0.2), (1.0, 0)))}))

Idle motion (breathing, blinking, head sway, gaze drift, talking head motion) is a
pure function of time and a seeded RNG: no wall clock, deterministic in tests.
"""

from __future__ import annotations

import bisect
import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from engine.avatar.params import INDEX


def ease_in_out(x: float) -> float:
    """Smoothstep: 0 → 1 with zero slope at both ends."""
    x = min(1.0, max(0.0, x))
    return x * x * (3.0 - 2.0 * x)


class Curve(Protocol):
    def __call__(self, tau: float) -> float:
        """Offset at ``tau`` seconds into the primitive."""
        ...


@dataclass(frozen=True)
class Keyframes:
    """(time_s, value) keys, eased in and out between each pair (zero slope at every key)."""

    keys: tuple[tuple[float, float], ...]

    def __call__(self, tau: float) -> float:
        keys = self.keys
        if tau <= keys[0][0]:
            return keys[0][1]
        for (t0, v0), (t1, v1) in zip(keys, keys[1:], strict=False):
            if tau <= t1:
                return v0 + (v1 - v0) * ease_in_out((tau - t0) / max(t1 - t0, 1e-9))
        return keys[-1][1]


@dataclass(frozen=True)
class Oscillation:
    """``envelope(tau) * sin(2π freq tau + phase)``: swings inside a gesture (a hand waving)."""

    envelope: Keyframes
    freq_hz: float
    phase: float = 0.0

    def __call__(self, tau: float) -> float:
        return self.envelope(tau) * math.sin(2.0 * math.pi * self.freq_hz * tau + self.phase)


@dataclass(frozen=True)
class MotionPrimitive:
    name: str
    duration_s: float
    curves: Mapping[str, Curve] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = [p for p in self.curves if p not in INDEX]
        if unknown:
            raise ValueError(f"gesture {self.name!r} drives unknown parameters {unknown}")

    def offsets(self, tau: float) -> dict[str, float]:
        """Parameter offsets ``tau`` seconds in; empty outside ``[0, duration_s]``."""
        if tau < 0.0 or tau > self.duration_s:
            return {}
        return {name: curve(tau) for name, curve in self.curves.items()}


GESTURE_LIBRARY: dict[str, MotionPrimitive] = {}


def register(primitive: MotionPrimitive) -> MotionPrimitive:
    GESTURE_LIBRARY[primitive.name] = primitive
    return primitive


def _k(*keys: tuple[float, float]) -> Keyframes:
    return Keyframes(tuple(keys))


register(
    MotionPrimitive(
        "nod",
        0.9,
        {
            "head_pitch": _k((0, 0), (0.22, 0.55), (0.42, -0.08), (0.62, 0.3), (0.9, 0)),
            "gaze_y": _k((0, 0), (0.22, -0.15), (0.62, -0.08), (0.9, 0)),
        },
    )
)
register(
    MotionPrimitive(
        "tilt",
        1.6,
        {
            "head_roll": _k((0, 0), (0.35, 0.6), (1.1, 0.55), (1.6, 0)),
            "head_yaw": _k((0, 0), (0.35, 0.1), (1.1, 0.08), (1.6, 0)),
            "brow_l": _k((0, 0), (0.35, 0.25), (1.1, 0.2), (1.6, 0)),
            "brow_r": _k((0, 0), (0.35, 0.1), (1.1, 0.1), (1.6, 0)),
        },
    )
)
register(
    MotionPrimitive(
        "wave",
        2.2,
        {
            "arm_wave": _k((0, 0), (0.35, 1.0), (1.85, 1.0), (2.2, 0)),
            "wave_phase": Oscillation(_k((0, 0), (0.4, 0.9), (1.7, 0.9), (2.0, 0)), freq_hz=2.0),
            "head_roll": _k((0, 0), (0.4, -0.15), (1.8, -0.15), (2.2, 0)),
            "mouth_smile": _k((0, 0), (0.4, 0.3), (1.8, 0.3), (2.2, 0)),
        },
    )
)


# ---- procedural idle -----------------------------------------------------------------


@dataclass(frozen=True)
class BlinkShape:
    close_s: float = 0.045
    hold_s: float = 0.015
    open_s: float = 0.07

    @property
    def duration_s(self) -> float:
        return self.close_s + self.hold_s + self.open_s

    def closure(self, tau: float) -> float:
        """0 (open) → 1 (shut) → 0 over the blink."""
        if tau <= 0.0 or tau >= self.duration_s:
            return 0.0
        if tau < self.close_s:
            return ease_in_out(tau / self.close_s)
        if tau < self.close_s + self.hold_s:
            return 1.0
        return 1.0 - ease_in_out((tau - self.close_s - self.hold_s) / self.open_s)


class BlinkSchedule:
    """Blink start times from t = 0 on, drawn lazily but always in the same order (seeded).

    Intervals are 1.6 s plus a gamma(2, 1.1 s) draw (mean ≈ 3.8 s, most in 2–6 s, rarely
    up to ~10 s); with probability ``double_p`` a second blink follows 0.22–0.3 s later.
    Thread-safe; answers for any ``t``, in any order.
    """

    def __init__(self, rng: np.random.Generator, *, double_p: float = 0.12, shape: BlinkShape | None = None):
        self._rng = rng
        self._double_p = double_p
        self.shape = shape or BlinkShape()
        self._starts: list[float] = []
        self._next = 0.4 + float(rng.uniform(0.0, 2.0))
        self._lock = threading.Lock()

    def _extend(self, t: float) -> None:
        while self._next <= t + 1.0:
            self._starts.append(self._next)
            gap = 1.6 + float(self._rng.gamma(2.0, 1.1))
            if self._rng.random() < self._double_p:
                self._starts.append(self._next + float(self._rng.uniform(0.22, 0.3)))
                gap += 0.3
            self._next += gap

    def starts_until(self, t: float) -> list[float]:
        with self._lock:
            self._extend(t)
            return [s for s in self._starts if s <= t]

    def closure_at(self, t: float) -> float:
        with self._lock:
            self._extend(t)
            i = bisect.bisect_right(self._starts, t)
            recent = self._starts[max(0, i - 2) : i]
        return max((self.shape.closure(t - s) for s in recent), default=0.0)


class SmoothNoise:
    """Sum of sines with incommensurate frequencies and random phases: smooth, never repeating."""

    def __init__(self, rng: np.random.Generator, freqs_hz: tuple[float, ...], amplitude: float) -> None:
        self._freqs = np.asarray(freqs_hz, dtype=np.float64) * rng.uniform(0.85, 1.15, len(freqs_hz))
        self._phases = rng.uniform(0.0, 2.0 * math.pi, len(freqs_hz))
        weights = 1.0 / np.arange(1, len(freqs_hz) + 1)
        self._weights = amplitude * weights / weights.sum()

    def __call__(self, t: float) -> float:
        return float(np.dot(self._weights, np.sin(2.0 * math.pi * self._freqs * t + self._phases)))


class IdleMotion:
    """Breathing (~0.25 Hz), blinks, head sway and gaze drift, and extra head motion while talking."""

    def __init__(self, rng: np.random.Generator, *, breath_hz: float = 0.25) -> None:
        self.blinks = BlinkSchedule(rng)
        self._breath_hz = breath_hz * float(rng.uniform(0.9, 1.1))
        self._breath_phase = float(rng.uniform(0.0, 2.0 * math.pi))
        self._channels: dict[str, SmoothNoise] = {
            "head_yaw": SmoothNoise(rng, (0.07, 0.13, 0.29), 0.18),
            "head_pitch": SmoothNoise(rng, (0.05, 0.11, 0.23), 0.1),
            "head_roll": SmoothNoise(rng, (0.06, 0.17), 0.12),
            "body_x": SmoothNoise(rng, (0.04, 0.09), 0.25),
            "gaze_x": SmoothNoise(rng, (0.09, 0.21, 0.43), 0.3),
            "gaze_y": SmoothNoise(rng, (0.08, 0.19), 0.15),
        }
        self._talk: dict[str, SmoothNoise] = {
            "head_yaw": SmoothNoise(rng, (0.45, 0.8, 1.3), 0.12),
            "head_pitch": SmoothNoise(rng, (0.55, 0.95, 1.6), 0.1),
            "head_roll": SmoothNoise(rng, (0.35, 0.7), 0.08),
            "brow_l": SmoothNoise(rng, (0.4, 0.9), 0.12),
        }

    def apply(self, params: np.ndarray, t: float, talking: float) -> None:
        """Add idle motion at ``t`` to ``params`` in place; ``talking`` 0..1 scales the speech motion."""
        params[INDEX["breath"]] = 0.5 + 0.5 * math.sin(
            2.0 * math.pi * self._breath_hz * t + self._breath_phase
        )
        for name, noise in self._channels.items():
            params[INDEX[name]] += noise(t)
        if talking > 0.0:
            for name, noise in self._talk.items():
                params[INDEX[name]] += talking * noise(t)
            params[INDEX["brow_r"]] += talking * self._talk["brow_l"](t) * 0.8
        shut = self.blinks.closure_at(t)
        params[INDEX["eye_open_l"]] *= 1.0 - shut
        params[INDEX["eye_open_r"]] *= 1.0 - shut
