"""Streaming speech recognition on faster-whisper's CTranslate2 model.

One :class:`FasterWhisperASR` per process holds the model and two single-worker
executors: partials queue on one, the speculative and final decodes on the other, so
a partial still in flight when the host pauses never delays the decode the reply waits for.
Each session gets a :class:`FasterWhisperStream`: ``partial`` re-decodes the
growing utterance and commits a stable prefix by LocalAgreement-2;
``speculate`` decodes everything when the host pauses; ``final`` reuses that
decode when no audio came in since.
"""

from __future__ import annotations

import asyncio
import logging

import numpy as np

from engine.asr.config import ASRConfig
from engine.asr.ct2_whisper import resolve_model_path
from engine.asr.stream import SpeculativeStream
from engine.asr.whisper_decoder import Decode, WhisperDecoder
from engine.native import model_executor

log = logging.getLogger(__name__)


class FasterWhisperASR:
    """The loaded model, shared by every session (implements ``ASRModel``)."""

    def __init__(self, decoder: WhisperDecoder, name: str = "whisper") -> None:
        self.decoder = decoder
        self.name = name
        self.executor = model_executor(1, "asr")  # partials
        self.final_executor = model_executor(1, "asr-final")

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
            workers=2,  # the partial and the final executor's decodes may overlap
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
        """Stop the worker threads (queued decodes are cancelled)."""
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.final_executor.shutdown(wait=False, cancel_futures=True)


class FasterWhisperStream(SpeculativeStream[Decode]):
    """The host's current utterance on the CTranslate2 decoder (see :mod:`engine.asr.stream`)."""
