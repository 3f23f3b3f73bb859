"""The silero voice-activity detector on synthesized speech, silence and noise."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from engine.vad import VADEndOfTurn, VADResult, VADSpeechPaused, VADSpeechResumed, VADSpeechStarted
from engine.vad.config import VADConfig
from engine.vad.silero import SAMPLE_RATE, WINDOW, SileroModel, VoiceActivityDetector, shared_silero_model
from tests.conftest import speech_16k

pytestmark = pytest.mark.integration

SR = SAMPLE_RATE
SENTENCE = "What are we going to play on stream today?"


def silence(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * SR), dtype=np.float32)


def loud_span(audio: np.ndarray) -> tuple[float, float]:
    """Where the signal is audible (|x| > 0.02), in seconds."""
    idx = np.flatnonzero(np.abs(audio) > 0.02)
    return idx[0] / SR, (idx[-1] + 1) / SR


BLOCK = 64  # 4 ms


def block_levels_db(audio: np.ndarray) -> np.ndarray:
    """Each 4 ms block's RMS in dB under the loudest block's."""
    blocks = audio[: len(audio) // BLOCK * BLOCK].reshape(-1, BLOCK).astype(np.float64)
    rms = np.sqrt((blocks**2).mean(axis=1)) + 1e-12
    return np.asarray(20.0 * np.log10(rms / rms.max()))


def feed_in_pieces(
    det: VoiceActivityDetector, audio: np.ndarray, t0: float = 0.0, seed: int = 0
) -> list[VADResult]:
    """Feed ``audio`` in random-length pieces, each stamped with its clock time."""
    rng = np.random.default_rng(seed)
    out: list[VADResult] = []
    i = 0
    while i < len(audio):
        n = int(rng.integers(80, 2000))
        out += det.feed(audio[i : i + n], t0 + i / SR)
        i += n
    return out


def of_type(results: list[VADResult], kind: type) -> list[VADResult]:
    return [r for r in results if isinstance(r, kind)]


@pytest.fixture(scope="module")
def sentence() -> np.ndarray:
    return speech_16k(SENTENCE)


def test_speech_start_and_end_times(sentence: np.ndarray) -> None:
    audio = np.concatenate([silence(1.0), sentence, silence(1.5)])
    on, off = loud_span(audio)
    results = feed_in_pieces(VoiceActivityDetector(), audio, t0=50.0)

    starts = of_type(results, VADSpeechStarted)
    ends = of_type(results, VADEndOfTurn)
    assert len(starts) == 1 and len(ends) == 1
    assert isinstance(results[0], VADSpeechStarted) and isinstance(results[-1], VADEndOfTurn)
    start, end = starts[0], ends[0]
    assert isinstance(start, VADSpeechStarted) and isinstance(end, VADEndOfTurn)
    assert start.t == pytest.approx(50.0 + on, abs=0.1)
    assert end.speech_start_t == start.t
    assert end.speech_end_t == pytest.approx(50.0 + off, abs=0.15)
    # the end of turn comes after exactly the configured silence (to one window)
    assert end.t - end.speech_end_t == pytest.approx(0.4, abs=WINDOW / SR + 1e-6)
    # a pause always precedes the end of turn, at the same silence start
    pauses = of_type(results, VADSpeechPaused)
    assert pauses and pauses[-1].t == end.speech_end_t
    assert pauses[-1].detected_t <= end.detected_t


def test_piece_sizes_do_not_change_results(sentence: np.ndarray) -> None:
    audio = np.concatenate([silence(0.5), sentence, silence(1.0)])
    whole = VoiceActivityDetector().feed(audio, 0.0)
    pieces = feed_in_pieces(VoiceActivityDetector(), audio, seed=7)
    assert whole == pieces


def test_end_of_turn_only_after_configured_silence() -> None:
    a, b = speech_16k("Wait a moment."), speech_16k("Okay, now I am ready.")
    audio = np.concatenate([silence(0.5), a, silence(0.3), b, silence(1.0)])

    patient = feed_in_pieces(VoiceActivityDetector(VADConfig(end_of_turn_silence_ms=600)), audio)
    assert len(of_type(patient, VADEndOfTurn)) == 1
    assert len(of_type(patient, VADSpeechStarted)) == 1
    assert of_type(patient, VADSpeechResumed), "the gap between the phrases is a pause, then a resume"

    eager = feed_in_pieces(VoiceActivityDetector(VADConfig(end_of_turn_silence_ms=150)), audio)
    assert len(of_type(eager, VADEndOfTurn)) >= 2
    for r in of_type(eager, VADEndOfTurn):
        assert isinstance(r, VADEndOfTurn) and r.t - r.speech_end_t >= 0.15 - 1e-9


@pytest.mark.parametrize("kind", ["silence", "white_noise", "hum"])
def test_no_speech_in_silence_or_noise(kind: str) -> None:
    rng = np.random.default_rng(1)
    n = 3 * SR
    audio = {
        "silence": np.zeros(n),
        "white_noise": rng.standard_normal(n) * 0.01,
        "hum": 0.05 * np.sin(2 * np.pi * 100 * np.arange(n) / SR),
    }[kind].astype(np.float32)
    det = VoiceActivityDetector()
    assert feed_in_pieces(det, audio) == []
    assert not det.in_turn


def test_short_burst_is_not_speech(sentence: np.ndarray) -> None:
    on, _ = loud_span(sentence)
    burst = sentence[int(on * SR) : int(on * SR) + int(0.1 * SR)]
    audio = np.concatenate([silence(0.5), burst, silence(1.0)])
    det = VoiceActivityDetector(VADConfig(min_speech_ms=300))
    assert feed_in_pieces(det, audio) == []


def test_state_is_per_detector_and_matches_silero(sentence: np.ndarray) -> None:
    """Interleaved detectors do not share state; probabilities equal silero's own wrapper."""
    import torch
    from silero_vad import load_silero_vad

    audio = np.concatenate([silence(0.3), sentence[: SR * 2]])
    reference = load_silero_vad(onnx=True)
    a, b = VoiceActivityDetector(), VoiceActivityDetector()
    rng = np.random.default_rng(3)
    for k in range(len(audio) // WINDOW):
        window = audio[k * WINDOW : (k + 1) * WINDOW]
        a.feed(window, k * WINDOW / SR)
        b.feed(rng.standard_normal(WINDOW).astype(np.float32) * 0.1, k * WINDOW / SR)
        expected = float(reference(torch.from_numpy(window), SR).item())
        assert a.last_probability == pytest.approx(expected, abs=1e-5)


def test_discontinuity_reanchors_time(sentence: np.ndarray) -> None:
    det = VoiceActivityDetector()
    det.feed(silence(0.01), 0.0)  # a partial window, then a jump in time
    results = det.feed(np.concatenate([silence(0.5), sentence]), 10.0)
    start = of_type(results, VADSpeechStarted)[0]
    assert start.t == pytest.approx(10.0 + loud_span(np.concatenate([silence(0.5), sentence]))[0], abs=0.1)


def test_model_is_shared_and_torch_threads_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    assert VoiceActivityDetector().model is VoiceActivityDetector().model is shared_silero_model()
    # import silero_vad afresh (it sets torch's threads to 1 at import) and check ours survive
    for name in [m for m in sys.modules if m == "silero_vad" or m.startswith("silero_vad.")]:
        monkeypatch.delitem(sys.modules, name)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        SileroModel.load()
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)


def _turn_end(audio: np.ndarray, **config: float) -> VADEndOfTurn:
    ends = of_type(feed_in_pieces(VoiceActivityDetector(VADConfig(**config)), audio), VADEndOfTurn)
    assert len(ends) == 1
    end = ends[0]
    assert isinstance(end, VADEndOfTurn)
    return end


def test_end_of_speech_placed_where_the_voice_fell_silent() -> None:
    """Silero's probability lags the voice; the end of speech is placed on the loudness instead, so the
    pause and the end of turn come that much sooner (and still after the configured silence)."""
    lags_silero, lags_placed = [], []
    for text in ("What is your favorite color?", "Do you like music?", "What did you eat for breakfast?"):
        audio = np.concatenate([silence(0.5), speech_16k(text), silence(1.0)])
        _, off = loud_span(audio)
        flagged = _turn_end(audio, end_refine_ms=0)
        placed = _turn_end(audio)
        lags_silero.append(flagged.speech_end_t - off)
        lags_placed.append(placed.speech_end_t - off)
        assert placed.speech_end_t <= flagged.speech_end_t
        assert placed.t - placed.speech_end_t == pytest.approx(0.4, abs=WINDOW / SR + 1e-6)
        # not inside the voice: every 4 ms block within 20 dB of the loudest ends before it, and what is left
        # after it (a final stop's release burst, say) is at least 30 dB under the loudest
        level = block_levels_db(audio)
        cut = int(placed.speech_end_t * SR) // BLOCK
        assert np.flatnonzero(level > -20.0)[-1] < cut, "the end of speech is placed inside the voice"
        assert level[cut + 1 :].max() < -30.0, "a loud sound is left after the end of speech"
    assert np.mean(lags_silero) - np.mean(lags_placed) > 0.05, f"not sooner: {lags_silero} vs {lags_placed}"
    assert max(lags_placed) < 0.04, f"placed ends lag the voice: {lags_placed}"


def test_end_of_speech_in_a_noisy_room_stays_at_silero(sentence: np.ndarray) -> None:
    """Noise above the quiet level: no block is quiet, so the end is not moved before silero's flag."""
    rng = np.random.default_rng(5)
    audio = np.concatenate([silence(0.5), sentence, silence(1.0)])
    audio = audio + (rng.standard_normal(len(audio)) * 0.01).astype(np.float32)
    flagged = _turn_end(audio, end_refine_ms=0)
    placed = _turn_end(audio)
    assert flagged.speech_end_t <= placed.speech_end_t <= flagged.speech_end_t + WINDOW / SR


def test_voiced_time_counts_the_windows_of_one_run(sentence: np.ndarray) -> None:
    """Barge-in reads how long speech has run: whole 32 ms windows from the run's first speech window,
    one run while the probability stays at or above the threshold, nothing once it falls below."""
    audio = np.concatenate([silence(0.5), sentence, silence(0.6)])
    det = VoiceActivityDetector()
    assert det.voiced_since is None and det.voiced_s == 0.0
    runs: set[float] = set()
    longest = 0.0
    for k in range(len(audio) // WINDOW):
        det.feed(audio[k * WINDOW : (k + 1) * WINDOW], k * WINDOW / SR)
        if det.last_probability >= det.config.threshold:
            assert det.voiced_since is not None
            runs.add(det.voiced_since)
            windows = det.voiced_s / (WINDOW / SR)
            assert windows == pytest.approx(round(windows), abs=1e-6) and windows >= 1
            longest = max(longest, det.voiced_s)
        else:
            assert det.voiced_since is None and det.voiced_s == 0.0
    on, off = loud_span(audio)
    assert runs and min(runs) == pytest.approx(on, abs=0.1)  # the first run starts with the voice
    assert 0.3 <= longest <= off - on + 0.1
    assert det.voiced_since is None  # the trailing silence ended the run
