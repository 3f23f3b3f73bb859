"""Viseme timelines: coarticulated weights from alignments, and the amplitude fallback."""

from __future__ import annotations

import numpy as np
import pytest

from engine.events import PhonemeSpan
from engine.lipsync.timeline import AmplitudeTimeline, VisemeTimeline, openness, spans_from_alignments
from engine.lipsync.visemes import SIL, VISEME_INDEX

pytestmark = pytest.mark.unit

PP, AA, I_ = VISEME_INDEX["PP"], VISEME_INDEX["aa"], VISEME_INDEX["I"]


def spans(*units: tuple[str, float]) -> tuple[PhonemeSpan, ...]:
    out, t = [], 0.0
    for ph, d in units:
        out.append(PhonemeSpan(ph, t, t + d))
        t += d
    return tuple(out)


# "map the pig" roughly as Piper times it, stress marks included
MAP = spans(("^", 0.06), ("m", 0.07), ("ˈ", 0.05), ("æ", 0.08), ("p", 0.06), (" ", 0.035), ("ð", 0.05),
            ("ə", 0.04), (" ", 0.035), ("p", 0.03), ("ˈ", 0.04), ("ɪ", 0.06), ("ɡ", 0.07), (".", 0.1))  # fmt: skip


def test_weights_sum_to_one_and_are_nonnegative() -> None:
    tl = VisemeTimeline(MAP)
    t = np.arange(-0.1, tl.duration_s + 0.1, 0.001)
    w = tl.weights_at(t)
    assert w.shape == (len(t), 15)
    assert np.all(w >= 0)
    np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=1e-5)


def test_weights_are_continuous() -> None:
    tl = VisemeTimeline(MAP)
    dt = 0.001
    w = tl.weights_at(np.arange(-0.05, tl.duration_s + 0.05, dt))
    slope = np.abs(np.diff(w, axis=0)).max() / dt
    assert slope < 100.0  # per second: a 30 ms ramp at most, never a swap
    frames = tl.weights_at(np.arange(0.0, tl.duration_s, 1 / 30))
    assert np.abs(np.diff(frames, axis=0)).max() <= 1.0 + 1e-6


def test_lips_close_fully_mid_p_even_when_short() -> None:
    tl = VisemeTimeline(MAP)
    for sp in (s for s in MAP if s.phoneme in ("m", "p")):
        mid = 0.5 * (sp.start_s + sp.end_s)
        assert tl.weights_at(mid)[PP] >= 0.9, sp
        assert openness(tl.weights_at(mid)) < 0.1


def test_map_sequence_pp_aa_pp() -> None:
    tl = VisemeTimeline(spans(("m", 0.08), ("ˈ", 0.06), ("æ", 0.1), ("p", 0.08)))
    seq = [int(np.argmax(tl.weights_at(t))) for t in np.arange(0.0, tl.duration_s, 0.005)]
    collapsed = [v for i, v in enumerate(seq) if i == 0 or v != seq[i - 1]]
    assert [v for v in collapsed if v != SIL] == [PP, AA, PP]
    assert tl.weights_at(0.04 + 0.07)[AA] == pytest.approx(1.0)  # stress time belongs to the vowel


def test_short_vowel_blends_toward_neighbours() -> None:
    tl = VisemeTimeline(spans(("s", 0.1), ("ɪ", 0.02), ("s", 0.1)))
    peak = tl.weights_at(np.linspace(0.1, 0.12, 21))[:, I_].max()
    assert 0.2 < peak < 0.9


def test_rest_outside_the_chunk_and_at_its_edges() -> None:
    tl = VisemeTimeline(spans(("a", 0.2)))
    for t in (-1.0, -0.001, 0.0, tl.duration_s, tl.duration_s + 0.5):
        assert tl.weights_at(t)[SIL] == pytest.approx(1.0)
    assert tl.weights_at(0.1)[AA] == pytest.approx(1.0)


def test_word_gaps_stay_open_pauses_close() -> None:
    gap = VisemeTimeline(spans(("a", 0.15), (" ", 0.035), ("a", 0.15)))
    assert openness(gap.weights_at(0.1675)) > 0.9
    pause = VisemeTimeline(spans(("a", 0.15), (",", 0.2), ("a", 0.15)))
    assert pause.weights_at(0.25)[SIL] == pytest.approx(1.0)


def test_tts_adapter_units() -> None:
    # engine.tts.alignment merges marks into units ("iː") and writes pauses as "_"
    tl = VisemeTimeline(spans(("_", 0.05), ("s", 0.08), ("iː", 0.15), ("_", 0.1)))
    assert tl.weights_at(0.2)[I_] == pytest.approx(1.0)
    assert tl.weights_at(0.34)[SIL] == pytest.approx(1.0)


def test_spans_from_piper_sample_counts() -> None:
    sp = spans_from_alignments([("^", 1280), ("m", 768), ("ˈ", 1536)], 22050, offset_s=1.0)
    assert sp[0].start_s == 1.0 and sp[-1].end_s == pytest.approx(1.0 + 3584 / 22050)
    assert all(a.end_s == b.start_s for a, b in zip(sp, sp[1:], strict=False))


def test_empty_timeline_is_silent() -> None:
    tl = VisemeTimeline(())
    assert tl.duration_s == 0.0
    assert tl.weights_at(0.3)[SIL] == 1.0


def _burst_audio(rate: int = 48000) -> np.ndarray:
    t = np.arange(int(1.2 * rate)) / rate
    loud = (t >= 0.3) & (t < 0.7)
    tone = 0.5 * np.sin(2 * np.pi * 220 * t) * loud
    return (tone * 32767).astype(np.int16)


def test_amplitude_fallback_opens_with_loud_audio_and_closes_in_silence() -> None:
    tl = AmplitudeTimeline(_burst_audio())
    assert tl.duration_s == pytest.approx(1.2)
    w = tl.weights_at(np.array([0.1, 0.5, 1.0]))
    np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=1e-5)
    quiet1, loud, quiet2 = openness(w)
    assert loud > 0.7
    assert quiet1 < 0.02 and quiet2 < 0.02
    assert w[1, AA] + w[1, VISEME_INDEX["O"]] > 0.8


def test_amplitude_fallback_is_smooth_and_not_lagging() -> None:
    tl = AmplitudeTimeline(_burst_audio())
    t = np.arange(0.0, 1.2, 0.001)
    o = openness(tl.weights_at(t))
    assert np.abs(np.diff(o)).max() < 0.05  # attack ≥ ~20 ms
    half = t[np.argmax(o > 0.5)], t[len(o) - 1 - np.argmax(o[::-1] > 0.5)]
    assert abs(half[0] - 0.3) < 0.04 and abs(half[1] - 0.7) < 0.06  # symmetric around the burst
    assert tl.weights_at(2.0)[SIL] == 1.0
