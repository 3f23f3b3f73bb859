"""PiperTTS against the real bundled voice: alignments, word spans, resampling, the async seam."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.errors import ConfigError
from engine.progress import silent_progress
from engine.tts.alignment import PAUSE
from engine.tts.base import OUTPUT_RATE, Synthesis
from engine.tts.config import TTSConfig
from engine.tts.factory import load_tts
from engine.tts.piper_backend import (
    CUDA_OPTIONS,
    LEAD_KEEP_S,
    LEAD_QUIET,
    PiperTTS,
    SourceSpeech,
    resolve_voice,
    voice_providers,
)
from engine.tts.resample import output_length

pytestmark = pytest.mark.integration

TEXTS = [
    "Hello there, my friends!",
    "It costs 3.5 dollars, Mr. Smith. Really?",
    "Wow—that's cool; don't you think?",
]


@pytest.fixture(scope="module")
def tts() -> PiperTTS:
    loaded = load_tts(TTSConfig(), silent_progress)
    assert isinstance(loaded, PiperTTS)
    return loaded


_CACHE: dict[str, tuple[SourceSpeech, Synthesis]] = {}


def _speak(tts: PiperTTS, text: str) -> tuple[SourceSpeech, Synthesis]:
    """One synthesis per text for the whole module (Piper's durations are random per run)."""
    if text not in _CACHE:
        src = tts.speak_source(text)
        _CACHE[text] = (src, tts.to_output(src))
    return _CACHE[text]


def test_load_tts_factory_gives_the_seam(tts: PiperTTS) -> None:
    assert "joe" in tts.describe() and "with alignments" in tts.describe()


@pytest.mark.parametrize("text", TEXTS)
def test_alignments_sum_exactly_to_the_audio(tts: PiperTTS, text: str) -> None:
    src, syn = _speak(tts, text)
    pcm22 = src.pcm
    assert src.counted_samples == len(pcm22)
    assert src.units[0].start == 0 and src.units[-1].end == len(pcm22)
    assert syn.sample_rate == OUTPUT_RATE and syn.pcm.dtype == np.int16
    assert len(syn.pcm) == output_length(len(pcm22), tts.source_rate, OUTPUT_RATE)
    spans = syn.phonemes
    assert spans[0].start_s == 0.0
    assert abs(spans[-1].end_s - len(syn.pcm) / OUTPUT_RATE) <= 1 / OUTPUT_RATE
    for a, b in zip(spans, spans[1:], strict=False):
        assert a.end_s == b.start_s  # contiguous
        assert a.end_s >= a.start_s
    phones = [s.phoneme for s in spans if s.phoneme != PAUSE]
    assert phones and all("ˈ" not in p for p in phones)  # stress merged into the vowel


def test_word_spans_cover_the_words_in_order(tts: PiperTTS) -> None:
    text = TEXTS[1]
    _, syn = _speak(tts, text)
    assert [w.word for w in syn.words] == text.split()
    duration = len(syn.pcm) / OUTPUT_RATE
    for a, b in zip(syn.words, syn.words[1:], strict=False):
        assert a.end_s <= b.start_s
    for w in syn.words:
        assert 0.0 <= w.start_s < w.end_s <= duration
    # "3.5" is spoken as three words and spans them all: longer than "It"
    by_word = {w.word: w.end_s - w.start_s for w in syn.words}
    assert by_word["3.5"] > 2 * by_word["It"]


def test_word_spans_fall_back_when_counts_disagree(tts: PiperTTS) -> None:
    # espeak runs "Smith... really" together into one phoneme word: the proportional fallback
    text = "Hi. Mr. Smith... really?"
    syn = tts.synthesize_blocking(text)
    assert [w.word for w in syn.words] == text.split()
    for a, b in zip(syn.words, syn.words[1:], strict=False):
        assert a.start_s <= a.end_s <= b.start_s
    assert syn.words[-1].end_s <= len(syn.pcm) / OUTPUT_RATE


def _envelope(pcm: np.ndarray, rate: int, hop_s: float = 0.02) -> np.ndarray:
    hop = round(rate * hop_s)  # 20 ms: a whole number of samples at both rates
    n = len(pcm) // hop
    frames = pcm[: n * hop].astype(np.float64).reshape(n, hop)
    return np.sqrt((frames**2).mean(axis=1))


def test_resampled_audio_matches_the_source(tts: PiperTTS) -> None:
    text = TEXTS[0]
    src, syn = _speak(tts, text)
    pcm22 = src.pcm
    assert abs(len(syn.pcm) / OUTPUT_RATE - len(pcm22) / tts.source_rate) < 1 / tts.source_rate
    e22, e48 = _envelope(pcm22, tts.source_rate), _envelope(syn.pcm, OUTPUT_RATE)
    n = min(len(e22), len(e48))
    corr = np.corrcoef(e22[:n], e48[:n])[0, 1]
    assert corr > 0.99
    # no time shift: against a plain linear interpolation the best lag is within a sample
    ref = np.interp(np.arange(len(syn.pcm)) * tts.source_rate / OUTPUT_RATE, np.arange(len(pcm22)), pcm22)
    out = syn.pcm.astype(np.float64)
    mid = slice(100, len(out) - 100)
    lags = range(-20, 21)
    best = max(lags, key=lambda k: float(np.dot(ref[mid], np.roll(out, -k)[mid])))
    assert abs(best) <= 1
    assert 0.9 < np.sqrt((syn.pcm.astype(float) ** 2).mean() / (pcm22.astype(float) ** 2).mean()) < 1.1


@pytest.mark.parametrize("text", ["", "   ", "...", "?!", "— …"])
def test_unspeakable_text_gives_empty_synthesis(tts: PiperTTS, text: str) -> None:
    syn = tts.synthesize_blocking(text)
    assert len(syn.pcm) == 0 and syn.phonemes == () and syn.words == ()


async def test_synthesize_runs_off_the_event_loop_and_concurrently(tts: PiperTTS) -> None:
    loop_thread = threading.get_ident()
    seen: list[int] = []
    original = tts.synthesize_blocking

    def spy(text: str) -> Synthesis:
        seen.append(threading.get_ident())
        return original(text)

    tts.synthesize_blocking = spy  # type: ignore[method-assign]
    try:
        results = await asyncio.gather(tts.synthesize("One, two."), tts.synthesize("Three!"))
    finally:
        del tts.synthesize_blocking
    assert all(t != loop_thread for t in seen) and len(seen) == 2
    assert all(len(r.pcm) > 0 and r.words for r in results)
    assert [w.word for w in results[1].words] == ["Three!"]


class _Spy:
    """The texts the voice's worker synthesizes, in order (the real synthesis runs), and an event set as the
    worker takes its first job."""

    def __init__(self, tts: PiperTTS) -> None:
        self.order: list[str] = []
        self.taken = threading.Event()
        original = tts.synthesize_blocking

        def spy(text: str) -> Synthesis:
            self.order.append(text)
            self.taken.set()
            return original(text)

        tts.synthesize_blocking = spy  # type: ignore[method-assign]

    async def until_taken(self) -> None:
        assert await asyncio.to_thread(self.taken.wait, 10.0)


async def test_a_replys_first_chunk_goes_before_other_replies_later_chunks(tts: PiperTTS) -> None:
    """Sessions share the voice: while it speaks one reply's chunk, another's later chunk and a third's first
    chunk wait; the first chunk is synthesized next, though it was asked for last."""
    spy = _Spy(tts)
    try:
        running = asyncio.ensure_future(
            tts.synthesize("This is a longer sentence that keeps the voice busy for a while, surely.")
        )
        await spy.until_taken()
        later = asyncio.ensure_future(tts.synthesize("And then the rest of that answer."))
        first = asyncio.ensure_future(tts.synthesize("Oh, hi!", first=True))
        await asyncio.sleep(0)
        assert tts.waiting() == 2
        await asyncio.gather(running, later, first)
    finally:
        del tts.synthesize_blocking
    assert spy.order[1:] == ["Oh, hi!", "And then the rest of that answer."]


async def test_a_chunk_cancelled_before_the_voice_took_it_is_never_synthesized(tts: PiperTTS) -> None:
    """A barge-in cancels the reply: its chunk still waiting in the voice's queue is skipped."""
    spy = _Spy(tts)
    try:
        running = asyncio.ensure_future(tts.synthesize("Something to say for a little while, I think."))
        await spy.until_taken()
        cut = asyncio.ensure_future(tts.synthesize("Words nobody will hear."))
        after = asyncio.ensure_future(tts.synthesize("Next!"))
        await asyncio.sleep(0)
        cut.cancel()
        await asyncio.gather(running, after)
        assert cut.cancelled()
    finally:
        del tts.synthesize_blocking
    assert spy.order[1:] == ["Next!"]


def test_length_scale_slows_speech(tts: PiperTTS) -> None:
    slow = PiperTTS(tts._voice, "joe", length_scale=1.5)
    fast = PiperTTS(tts._voice, "joe", length_scale=0.8)
    text = "A test of speed."
    assert len(slow.synthesize_blocking(text).pcm) > 1.4 * len(fast.synthesize_blocking(text).pcm)


def test_bad_voice_settings_name_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="tts.voice"):
        resolve_voice("bundled:nobody")
    with pytest.raises(ConfigError, match="tts.voice"):
        resolve_voice(str(tmp_path / "missing.onnx"))


def test_opening_pause_is_trimmed_without_touching_the_first_phoneme(tts: PiperTTS) -> None:
    src = tts.speak_source("Hello there, friends.")
    loud = np.flatnonzero(np.abs(src.pcm.astype(np.int32)) > LEAD_QUIET)
    first_phoneme = next(u for u in src.units if u.group != -1)
    assert len(loud) and loud[0] < first_phoneme.end, "the first phoneme is audible"
    # the cut keeps LEAD_KEEP_S of the pause before the first sound or the first phoneme, whichever comes first:
    # the voice is stochastic, its first sound may come a few ms before the first phoneme's aligned start, or
    # (a quiet /h/) well after it, and a phoneme is never cut
    assert min(int(loud[0]), first_phoneme.start) == int(LEAD_KEEP_S * src.rate)
    assert src.units[0].group == -1 and first_phoneme.start == src.units[0].end
    assert src.units[-1].end == len(src.pcm) == src.counted_samples  # alignments still add up exactly


@pytest.mark.parametrize("spinning", [False, True])
def test_voice_pool_sleeps_between_ops_unless_asked_to_spin(spinning: bool) -> None:
    loaded = load_tts(TTSConfig(threads=2, spinning=spinning), silent_progress)
    assert isinstance(loaded, PiperTTS)
    options = loaded._voice.session.get_session_options()
    assert options.intra_op_num_threads == 2
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == ("1" if spinning else "0")
    assert len(loaded.synthesize_blocking("Still speaking.").pcm) > 0


def test_the_voice_runs_where_tts_device_says() -> None:
    cuda = ("CUDAExecutionProvider", CUDA_OPTIONS)
    assert voice_providers("cpu", ["CUDAExecutionProvider", "CPUExecutionProvider"]) == [
        "CPUExecutionProvider"
    ]
    assert voice_providers("auto", ["CPUExecutionProvider"]) == ["CPUExecutionProvider"]
    assert voice_providers("auto", ["CUDAExecutionProvider", "CPUExecutionProvider"]) == [
        cuda,
        "CPUExecutionProvider",
    ]
    assert voice_providers("cuda", ["CUDAExecutionProvider", "CPUExecutionProvider"])[0] == cuda
    with pytest.raises(ConfigError, match="onnxruntime-gpu"):
        voice_providers("cuda", ["CPUExecutionProvider"])


def test_asking_for_cuda_without_its_provider_is_a_clear_error(tts: PiperTTS) -> None:
    import onnxruntime

    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("this ONNX Runtime has the CUDA provider")
    with pytest.raises(ConfigError, match=r"tts.device = 'cuda'.*onnxruntime-gpu"):
        load_tts(TTSConfig(device="cuda"), silent_progress)
    assert tts.device == "cpu" and "(cpu," in tts.describe()  # 'auto' here: the CPU


def test_two_workers_synthesize_two_sessions_chunks_at_once() -> None:
    """``tts.workers = 2``: two chunks asked for together are synthesized side by side, each on its own
    ONNX session, and both keep their alignments (the phonemizer is shared under a lock)."""
    two = load_tts(TTSConfig(workers=2), silent_progress)
    assert isinstance(two, PiperTTS) and two.workers == 2
    # each of the voice's sessions timed where it runs the ONNX model (not the wait for a free one)
    runs: list[tuple[float, float, int, int]] = []  # began, ended, session, thread
    voices = [two._voices.get() for _ in range(two.workers)]
    for voice in voices:
        original = voice.phoneme_ids_to_audio

        def timed(
            *args: object, _run: Any = original, _session: int = id(voice.session), **kw: object
        ) -> Any:
            import time

            began = time.perf_counter()
            out = _run(*args, **kw)
            runs.append((began, time.perf_counter(), _session, threading.get_ident()))
            return out

        voice.phoneme_ids_to_audio = timed
        two._voices.put(voice)
    texts = ["This sentence keeps one worker busy for a good while, surely.", "And this one keeps the other."]

    async def both() -> list[Synthesis]:
        return list(await asyncio.gather(*(two.synthesize(t) for t in texts)))

    try:
        results = asyncio.run(both())
    finally:
        two.close()
    assert len(runs) == 2, runs  # one sentence each
    (a0, a1, sa, ta), (b0, b1, sb, tb) = runs
    assert sa != sb and ta != tb and a0 < b1 and b0 < a1  # two sessions on two threads, overlapping in time
    for text, syn in zip(texts, results, strict=True):
        assert len(syn.pcm) > 0 and [w.word for w in syn.words] == text.split()
        assert syn.phonemes and syn.phonemes[-1].end_s <= len(syn.pcm) / OUTPUT_RATE + 1e-6
