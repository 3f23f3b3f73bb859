"""One synchronous Whisper decode over CTranslate2 with a short encoder window.

faster-whisper always pads the log-mel input to 30 s (3,000 frames); the
CTranslate2 encoder accepts shorter inputs, and a window of ~10 s (never
shorter than the audio) is several times faster with no loss of accuracy. This
module computes the features itself and calls ``ctranslate2.models.Whisper``
``encode``/``generate`` directly. It also trims silence and drops Whisper's
typical hallucinations on near-silent input. Nothing here is async: callers run
:meth:`WhisperDecoder.decode` in a worker thread.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, replace
from typing import Any

import ctranslate2
import numpy as np
from faster_whisper import WhisperModel
from faster_whisper.tokenizer import Tokenizer

from engine.asr.trim import loud_bounds
from engine.cores import usable_cores

SAMPLE_RATE = 16000
FRAMES_PER_S = 100  # log-mel frames (hop 160)
MAX_WINDOW_S = 30.0  # the encoder's positional range
PAD_S = 0.25  # kept around the loud part when trimming
NO_SPEECH_DROP = 0.6  # no-speech probability above which the text is dropped ...
UNSURE_LOGPROB = -1.0  # ... when the words are unsure too (Whisper's own rule: both, never one alone)
SUSPECT_NO_SPEECH = 0.25  # ... and above which a stock phrase is taken as a hallucination
SUSPECT_LOUD_S = 0.5  # stock phrases over less loud audio than this are dropped too

# Phrases Whisper is known to produce on silence or noise (normalised).
HALLUCINATIONS = frozenset(
    {
        "thank you",
        "thanks",
        "thank you very much",
        "thank you for watching",
        "thanks for watching",
        "thank you so much for watching",
        "please subscribe",
        "subscribe",
        "you",
        "bye",
        "bye bye",
        "okay",
        "oh",
        "so",
        "the end",
        "i'm sorry",
    }
)
_ANNOTATION = re.compile(r"\[[^\]]*\]|\([^)]*\)|\*[^*]*\*|♪+")
_NORMALISE = re.compile(r"[^\w\s']+")


@dataclass(frozen=True, slots=True)
class Decode:
    """The outcome of one decode (``text`` is empty for silence or a dropped hallucination)."""

    text: str
    audio_s: float  # seconds of input audio this decode covered
    no_speech_prob: float = 1.0
    avg_logprob: float = 0.0
    encode_ms: float = 0.0
    generate_ms: float = 0.0
    window_s: float = 0.0
    dropped: str = ""  # the text a filter dropped, for diagnostics


def resolve_device(device: str) -> str:
    """'auto' means CUDA when CTranslate2 sees a GPU, else the CPU."""
    if device == "auto":
        return "cuda" if ctranslate2.get_cuda_device_count() > 0 else "cpu"
    return device


def default_threads() -> int:
    """Half the cores, 1 to 4: CTranslate2's OpenMP threads slow down several-fold when
    other stages compete for the same cores (measured 5-7x on 2 busy cores)."""
    return max(1, min(4, usable_cores() // 2))


def normalise(text: str) -> str:
    return " ".join(_NORMALISE.sub(" ", text.lower()).split())


class WhisperDecoder:
    """A loaded Whisper model and its tokenizer; :meth:`decode` is thread-safe but blocking."""

    def __init__(
        self,
        model: WhisperModel,
        language: str = "en",
        beam_size: int = 1,
        window_s: float = 10.0,
    ) -> None:
        self.fw = model  # faster-whisper's wrapper, kept for the reference transcribe
        self.model: ctranslate2.models.Whisper = model.model
        self.beam_size = beam_size
        self.window_s = window_s
        self.language = language
        multilingual = bool(self.model.is_multilingual)
        self.tokenizer = Tokenizer(
            model.hf_tokenizer,
            multilingual,
            task="transcribe" if multilingual else None,
            language=language if multilingual else None,
        )
        self.prompt = [*self.tokenizer.sot_sequence, self.tokenizer.no_timestamps]
        self.suppress_tokens = [
            *self.tokenizer.non_speech_tokens,
            self.tokenizer.transcribe,
            self.tokenizer.translate,
            self.tokenizer.sot,
            self.tokenizer.sot_prev,
            self.tokenizer.sot_lm,
            self.tokenizer.no_speech,
        ]

    @classmethod
    def load(
        cls,
        path: str,
        device: str = "auto",
        compute_type: str = "default",
        cpu_threads: int = 0,
        language: str = "en",
        beam_size: int = 1,
        window_s: float = 10.0,
        workers: int = 1,
    ) -> WhisperDecoder:
        """Load a CTranslate2 Whisper folder on ``device`` ('auto', 'cpu' or 'cuda'); ``workers``
        decodes may run at once (each with ``cpu_threads`` threads)."""
        device = resolve_device(device)
        if compute_type == "auto":
            compute_type = "int8" if device == "cpu" else "default"
        model = WhisperModel(
            path,
            device=device,
            compute_type=compute_type,
            cpu_threads=cpu_threads or default_threads(),
            num_workers=workers,
            local_files_only=True,
        )
        return cls(model, language=language, beam_size=beam_size, window_s=window_s)

    @property
    def device(self) -> str:
        return str(self.model.device)

    def features(self, audio: np.ndarray, window_s: float) -> np.ndarray:
        """Log-mel features of ``audio`` padded with zeros to the window (never cut)."""
        mel: np.ndarray = self.fw.feature_extractor(audio)[:, :-1]
        frames = max(int(round(window_s * FRAMES_PER_S)), mel.shape[1])
        if frames > mel.shape[1]:
            mel = np.pad(mel, ((0, 0), (0, frames - mel.shape[1])))
        return np.ascontiguousarray(mel[None], dtype=np.float32)

    def decode(self, audio: np.ndarray, window_s: float | None = None, trim: bool = True) -> Decode:
        """Transcribe 16 kHz mono float32 audio; longer than 30 s goes in 30 s pieces."""
        audio = np.asarray(audio, dtype=np.float32).reshape(-1)
        audio_s = len(audio) / SAMPLE_RATE
        loud_s = audio_s
        if trim:
            bounds = loud_bounds(audio)
            if bounds is None:
                return Decode(text="", audio_s=audio_s)
            start, end, loud_s = bounds
            pad = int(PAD_S * SAMPLE_RATE)
            audio = audio[max(0, start - pad) : end + pad]
        piece = int(MAX_WINDOW_S * SAMPLE_RATE)
        parts = [self._decode_piece(audio[i : i + piece], window_s) for i in range(0, len(audio), piece)]
        text = " ".join(p.text for p in parts if p.text)
        first = parts[0]
        out = Decode(
            text=text,
            audio_s=audio_s,
            no_speech_prob=min(p.no_speech_prob for p in parts),
            avg_logprob=first.avg_logprob,
            encode_ms=sum(p.encode_ms for p in parts),
            generate_ms=sum(p.generate_ms for p in parts),
            window_s=first.window_s,
        )
        return self._filter(out, loud_s)

    def _decode_piece(self, audio: np.ndarray, window_s: float | None) -> Decode:
        audio_s = len(audio) / SAMPLE_RATE
        window = min(MAX_WINDOW_S, max(window_s or self.window_s, audio_s))
        mel = self.features(audio, window)
        t0 = time.perf_counter()
        encoded = self.model.encode(ctranslate2.StorageView.from_array(mel), to_cpu=False)
        t1 = time.perf_counter()
        # ~6 tokens/s is fast speech: the bound keeps a hallucinated repetition on noise short
        result = self._generate(encoded, int(audio_s * 6) + 8)
        t2 = time.perf_counter()
        tokens = result.sequences_ids[0]
        # CTranslate2 length-normalises the score; faster-whisper's average log-probability:
        avg_logprob = float(result.scores[0]) * len(tokens) / (len(tokens) + 1) if result.scores else 0.0
        return Decode(
            text=self.tokenizer.decode(tokens).strip(),
            audio_s=audio_s,
            no_speech_prob=float(result.no_speech_prob),
            avg_logprob=avg_logprob,
            encode_ms=(t1 - t0) * 1000,
            generate_ms=(t2 - t1) * 1000,
            window_s=mel.shape[2] / FRAMES_PER_S,
        )

    def _generate(self, encoded: ctranslate2.StorageView, max_new: int) -> Any:
        return self.model.generate(
            encoded,
            [self.prompt],
            beam_size=self.beam_size,
            max_length=min(448, len(self.prompt) + max_new),
            return_scores=True,
            return_no_speech_prob=True,
            suppress_blank=True,
            suppress_tokens=self.suppress_tokens,
        )[0]

    def _filter(self, d: Decode, loud_s: float) -> Decode:
        """Drop annotations, punctuation-only text and stock phrases on near-silence."""
        text = " ".join(_ANNOTATION.sub(" ", d.text).split())
        norm = normalise(text)
        drop = (
            not norm
            or (d.no_speech_prob > NO_SPEECH_DROP and d.avg_logprob < UNSURE_LOGPROB)
            or (norm in HALLUCINATIONS and (d.no_speech_prob > SUSPECT_NO_SPEECH or loud_s < SUSPECT_LOUD_S))
        )
        if drop:
            return replace(d, text="", dropped=d.text)
        return d if text == d.text else replace(d, text=text)
