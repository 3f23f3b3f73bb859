"""Motion primitives and procedural idle motion."""

from __future__ import annotations

import numpy as np
import pytest

from engine.avatar.animator import Animator
from engine.avatar.motion import (
    GESTURE_LIBRARY,
    BlinkSchedule,
    BlinkShape,
    Keyframes,
    MotionPrimitive,
    Oscillation,
    register,
)
from engine.avatar.params import INDEX

pytestmark = pytest.mark.unit


def test_keyframes_ease_between_keys() -> None:
    curve = Keyframes(((0.0, 0.0), (1.0, 1.0), (2.0, 0.0)))
    assert curve(-1.0) == 0.0 and curve(1.0) == 1.0 and curve(3.0) == 0.0
    assert curve(0.5) == pytest.approx(0.5)
    assert curve(0.05) < 0.05  # eased: slow start
    wave = Oscillation(Keyframes(((0.0, 0.0), (1.0, 1.0))), freq_hz=2.0)
    assert wave(0.0) == 0.0 and abs(wave(0.875)) > 0.5


@pytest.mark.parametrize("name", ["nod", "tilt", "wave"])
def test_every_library_gesture_starts_and_ends_at_rest(name: str) -> None:
    prim = GESTURE_LIBRARY[name]
    assert prim.offsets(-0.01) == {} and prim.offsets(prim.duration_s + 0.01) == {}
    for value in prim.offsets(0.0).values():
        assert value == pytest.approx(0.0, abs=1e-6)
    for value in prim.offsets(prim.duration_s).values():
        assert value == pytest.approx(0.0, abs=1e-6)


def test_new_gestures_are_one_registration_away() -> None:
    shrug = MotionPrimitive("shrug_test", 1.0, {"body_x": Keyframes(((0, 0), (0.4, 0.3), (1.0, 0)))})
    register(shrug)
    try:
        anim = Animator(seed=1)
        anim.trigger_gesture("shrug_test", 0.0)
        assert anim.params_at(0.4)[INDEX["body_x"]] != Animator(seed=1).params_at(0.4)[INDEX["body_x"]]
    finally:
        del GESTURE_LIBRARY["shrug_test"]
    with pytest.raises(ValueError, match="unknown parameters"):
        MotionPrimitive("bad", 1.0, {"tail_wag": Keyframes(((0, 0),))})


def test_blink_intervals_have_a_natural_distribution() -> None:
    starts = np.array(BlinkSchedule(np.random.default_rng(42)).starts_until(1200.0))
    gaps = np.diff(starts)
    doubles = gaps < 0.4
    singles = gaps[~doubles]
    assert 0.05 < doubles.mean() < 0.2  # occasional double blinks
    assert 3.0 < singles.mean() < 5.0
    assert np.mean((singles >= 2.0) & (singles <= 6.5)) > 0.8
    assert singles.min() > 1.5 and singles.max() < 15.0
    assert singles.std() > 0.7  # irregular, not a metronome
    same = BlinkSchedule(np.random.default_rng(42)).starts_until(1200.0)
    np.testing.assert_array_equal(starts, same)


def test_a_blink_lasts_about_120ms() -> None:
    shape = BlinkShape()
    tau = np.arange(-0.05, 0.25, 0.001)
    closure = np.array([shape.closure(x) for x in tau])
    assert closure.max() == 1.0
    assert 0.1 <= shape.duration_s <= 0.15
    assert 0.05 < np.mean(closure > 0.5) * 0.3 < 0.1  # eyes mostly shut for 50-100 ms
    anim = Animator(seed=3)
    t = np.arange(0.0, 60.0, 1 / 30)
    eyes = anim.params_many(t)[:, INDEX["eye_open_l"]]
    assert eyes.min() < 0.3 and np.median(eyes) == 1.0


def test_breathing_near_quarter_hertz_and_smooth_sway() -> None:
    anim = Animator(seed=5)
    t = np.arange(0.0, 80.0, 1 / 30)
    p = anim.params_many(t)
    breath = p[:, INDEX["breath"]] - p[:, INDEX["breath"]].mean()
    spectrum = np.abs(np.fft.rfft(breath))
    freqs = np.fft.rfftfreq(len(breath), 1 / 30)
    assert 0.2 <= freqs[np.argmax(spectrum)] <= 0.3
    for name in ("head_yaw", "head_pitch", "head_roll", "gaze_x", "gaze_y", "body_x"):
        x = p[:, INDEX[name]]
        assert x.std() > 0.01, name  # it moves
        assert np.abs(x).max() < 0.5, name  # subtly
        assert np.abs(np.diff(x)).max() < 0.02, name  # smoothly
