"""The animator: speech on the clock, barge-in, expressions, gestures."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from engine.avatar.animator import Animator
from engine.avatar.motion import GESTURE_LIBRARY
from engine.avatar.params import EXPR_SLICE, INDEX, LOWER, NUM_PARAMS, UPPER, VISEME_SLICE
from engine.events import PhonemeSpan, SpeechAudio
from engine.lipsync.timeline import openness

pytestmark = pytest.mark.unit

FRAME = 1 / 30


def spans(*units: tuple[str, float]) -> tuple[PhonemeSpan, ...]:
    out, t = [], 0.0
    for ph, d in units:
        out.append(PhonemeSpan(ph, t, t + d))
        t += d
    return tuple(out)


LONG_AH = spans(("a", 2.0))
HELLO = spans(("h", 0.06), ("ə", 0.05), ("l", 0.07), ("ˈ", 0.05), ("oʊ", 0.2), ("_", 0.1))


def mouth(anim: Animator, t: float, comp: float = 0.0) -> float:
    """Jaw opening carried by the viseme weights."""
    return float(openness(anim.params_at(t, comp)[VISEME_SLICE]))


def test_output_vector_shape_type_and_bounds() -> None:
    anim = Animator(seed=3)
    anim.schedule_speech(0.5, HELLO, turn_id=1)
    anim.set_expression("surprised", 0.2)
    anim.trigger_gesture("wave", 0.0)
    batch = anim.params_many(np.arange(0.0, 3.0, FRAME))
    assert batch.shape == (90, NUM_PARAMS) and batch.dtype == np.float32
    assert np.all(batch >= LOWER) and np.all(batch <= UPPER)
    np.testing.assert_allclose(batch[:, VISEME_SLICE].sum(axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(batch[:, EXPR_SLICE].sum(axis=1), 1.0, atol=1e-5)


def test_mouth_opens_at_start_minus_lead_and_compensation_shifts_it() -> None:
    anim = Animator(seed=1, articulation_lead_s=0.02)
    anim.schedule_speech(1.0, LONG_AH, turn_id=1)
    assert anim.mouth_time(1.0) == pytest.approx(1.02)
    assert anim.mouth_time(1.0, compensation_s=0.05) == pytest.approx(1.07)
    t = np.arange(0.5, 1.2, 0.001)
    opening = np.array([mouth(anim, x) for x in t])
    first_open = t[np.argmax(opening > 0.0)]
    assert first_open == pytest.approx(1.0 - 0.02, abs=0.0015)  # lips lead the sound by the lead
    assert opening[t < 0.979].max() == 0.0
    assert mouth(anim, 1.2) == pytest.approx(1.0)
    # compensation D: the frame stamped t shows the mouth for t + lead + D
    for x in (0.95, 0.99, 1.01):
        np.testing.assert_allclose(
            anim.params_at(x, compensation_s=0.03)[VISEME_SLICE], anim.params_at(x + 0.03)[VISEME_SLICE]
        )


def test_interrupt_closes_within_80ms_and_nothing_reopens() -> None:
    for lead in (0.0, 0.02):
        anim = Animator(seed=2, articulation_lead_s=lead)
        anim.schedule_speech(1.0, LONG_AH, turn_id=7, index=0)
        anim.schedule_speech(3.0, LONG_AH, turn_id=7, index=1)  # pending: must be cancelled
        assert mouth(anim, 1.49) == pytest.approx(1.0)
        anim.interrupt(1.5)
        assert mouth(anim, 1.5 - lead - 0.001) == pytest.approx(1.0)  # the fade starts exactly at the cut
        fade = [mouth(anim, 1.5 - lead + k * 0.005) for k in range(17)]
        assert all(a >= b for a, b in zip(fade, fade[1:], strict=False))  # monotone
        assert mouth(anim, 1.5 + 0.08) == 0.0
        # a late chunk of the interrupted turn is refused
        assert not anim.schedule_speech(2.0, LONG_AH, turn_id=7, index=2)
        after = [mouth(anim, x) for x in np.arange(1.58, 6.0, FRAME)]
        assert max(after) == 0.0
        # a new turn speaks again
        assert anim.schedule_speech(6.5, LONG_AH, turn_id=8)
        assert mouth(anim, 7.0) == pytest.approx(1.0)


def test_interrupt_before_the_first_chunk_of_a_turn() -> None:
    anim = Animator(seed=2)
    anim.interrupt(1.0, turn_id=4)
    assert not anim.schedule_speech(1.2, LONG_AH, turn_id=4)
    anim.interrupt(3.0, turn_id=4)  # a second interrupt keeps the earliest cut
    assert not anim.schedule_speech(2.0, LONG_AH, turn_id=4)
    assert anim.schedule_speech(1.2, LONG_AH, turn_id=5)


def test_from_config_uses_the_articulation_lead() -> None:
    from engine.avatar.config import AvatarConfig

    anim = Animator.from_config(AvatarConfig(articulation_lead_ms=35.0), seed=1)
    assert anim.mouth_time(2.0) == pytest.approx(2.035)


def test_expression_cross_fade_is_monotone_and_takes_250ms() -> None:
    anim = Animator(seed=4)
    anim.set_expression("happy", 1.0)
    t = np.arange(0.9, 1.4, 0.005)
    happy = np.array([anim.params_at(x)[INDEX["expr_happy"]] for x in t])
    neutral = np.array([anim.params_at(x)[INDEX["expr_neutral"]] for x in t])
    assert np.all(np.diff(happy) >= 0) and np.all(np.diff(neutral) <= 0)
    assert happy[t < 1.0].max() == 0.0
    assert 0.3 < happy[np.argmin(abs(t - 1.125))] < 0.7
    assert happy[t >= 1.25].min() == pytest.approx(1.0)
    assert np.abs(np.diff(happy)).max() < 0.05  # 5 ms steps: no jump
    face = [INDEX[n] for n in ("mouth_smile", "mouth_open", "brow_l", "brow_r", "blush")]
    np.testing.assert_array_equal(anim.params_at(2.0)[face], Animator(seed=4).params_at(2.0)[face])


def test_expression_hold_returns_to_base_and_retarget_mid_fade_is_continuous() -> None:
    anim = Animator(seed=5)
    anim.set_expression("sad", 0.0)
    anim.set_expression("angry", 2.0, hold_s=1.0)
    assert anim.params_at(2.6)[INDEX["expr_angry"]] == pytest.approx(1.0)
    assert anim.params_at(3.5)[INDEX["expr_sad"]] == pytest.approx(1.0)  # back to the base
    before = anim.params_at(5.1)[EXPR_SLICE]
    anim.set_expression("surprised", 5.1)
    np.testing.assert_allclose(anim.params_at(5.1)[EXPR_SLICE], before, atol=1e-6)
    with pytest.raises(ValueError, match="unknown expression"):
        anim.set_expression("smug", 1.0)


@pytest.mark.parametrize("name", sorted(GESTURE_LIBRARY))
def test_gestures_move_and_return_to_rest(name: str) -> None:
    plain, anim = Animator(seed=6), Animator(seed=6)
    start = anim.trigger_gesture(name, 1.0)
    end = start + GESTURE_LIBRARY[name].duration_s
    times = np.arange(0.0, end + 1.0, FRAME)
    diff = anim.params_many(times) - plain.params_many(times)
    moving = np.abs(diff).max(axis=1)
    assert moving[times < 1.0].max() == 0.0
    assert moving[(times > 1.2) & (times < end - 0.2)].max() > 0.1
    assert moving[times > end].max() == 0.0
    steps = np.abs(np.diff(diff, axis=0))
    steps[:, INDEX["wave_phase"]] /= 2.5  # the hand swings at 2 Hz
    assert steps.max() < 0.2  # smooth at 30 fps


def test_same_gesture_queues_and_unknown_is_refused() -> None:
    anim = Animator(seed=7)
    assert anim.trigger_gesture("nod", 1.0) == 1.0
    assert anim.trigger_gesture("nod", 1.2) == pytest.approx(1.0 + GESTURE_LIBRARY["nod"].duration_s)
    with pytest.raises(ValueError, match="unknown gesture"):
        anim.trigger_gesture("backflip", 1.0)


def test_talking_adds_head_motion() -> None:
    quiet, talking = Animator(seed=8), Animator(seed=8)
    talking.schedule_speech(1.0, LONG_AH, turn_id=1)
    t = np.arange(0.0, 4.0, FRAME)
    head = slice(INDEX["head_yaw"], INDEX["head_roll"] + 1)
    diff = np.abs(talking.params_many(t)[:, head] - quiet.params_many(t)[:, head]).max(axis=1)
    assert diff[t < 0.8].max() == 0.0
    assert diff[(t > 1.3) & (t < 2.9)].max() > 0.02


def test_amplitude_fallback_without_alignments() -> None:
    rate = 48000
    tt = np.arange(rate) / rate
    pcm = (0.5 * np.sin(2 * np.pi * 200 * tt) * ((tt > 0.2) & (tt < 0.8)) * 32767).astype(np.int16)
    anim = Animator(seed=9, articulation_lead_s=0.0)
    audio = SpeechAudio(t=0.0, turn_id=1, index=0, text="ah", pcm=pcm, sample_rate=rate)
    assert anim.schedule_audio(2.0, audio)
    assert mouth(anim, 2.5) > 0.7
    assert mouth(anim, 2.05) < 0.05 and mouth(anim, 2.95) < 0.05
    assert not anim.schedule_speech(3.0, (), None, turn_id=1)  # nothing to animate


def test_deterministic_and_order_independent() -> None:
    a, b = Animator(seed=11), Animator(seed=11)
    for anim in (a, b):
        anim.schedule_speech(1.0, HELLO, turn_id=1)
    times = np.arange(0.0, 30.0, 0.1)
    forward = a.params_many(times)
    backward = b.params_many(times[::-1])[::-1]
    np.testing.assert_array_equal(forward, backward)
    assert not np.array_equal(forward, Animator(seed=12).params_many(times))


def test_render_thread_and_loop_thread_together() -> None:
    anim = Animator(seed=13)
    errors: list[BaseException] = []
    stop = threading.Event()

    def render() -> None:
        t = 0.0
        try:
            while not stop.is_set():
                p = anim.params_at(t)
                assert np.all(np.isfinite(p))
                t += FRAME
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    worker = threading.Thread(target=render)
    worker.start()
    for i in range(200):
        anim.schedule_speech(i * 0.3, HELLO, turn_id=i // 10, index=i % 10)
        anim.set_expression(("happy", "sad", "neutral")[i % 3], i * 0.3)
        if i % 25 == 0:
            anim.trigger_gesture("nod", i * 0.3)
            anim.interrupt(i * 0.3 + 0.1)
    stop.set()
    worker.join(timeout=5)
    assert not errors
