"""The host's current utterance, decoded by any Whisper decoder: partials, speculation, final.

``partial`` re-decodes the growing buffer and commits a stable prefix by local agreement;
``speculate`` decodes the whole buffer when the host pauses; ``final`` reuses that speculation
when no audio arrived since, so no decode is paid after the end-of-turn silence. Decodes run on
the model's single worker thread, never on the event loop. (No CTranslate2 import here: the torch
backend shares this stream on machines without it.)
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

import numpy as np

from engine.asr.agreement import agree, hypothesis_text
from engine.asr.base import Transcript

log = logging.getLogger(__name__)

SAMPLE_RATE = 16000
MAX_UTTERANCE_S = 120.0  # audio appended beyond this is ignored (a turn this long is a bug upstream)
EMPTY = Transcript(text="", stable_text="", audio_s=0.0)


class DecodeResult(Protocol):
    @property
    def text(self) -> str: ...


D = TypeVar("D", bound=DecodeResult)
D_co = TypeVar("D_co", bound=DecodeResult, covariant=True)


class Decoder(Protocol[D_co]):
    def decode(self, audio: np.ndarray) -> D_co: ...


class DecodingModel(Protocol[D_co]):
    """What a stream needs of its model: the decoder and the worker thread it runs on (a model may
    also have a ``final_executor`` for the speculative and final decodes, so partials never delay them)."""

    @property
    def decoder(self) -> Decoder[D_co]: ...

    @property
    def executor(self) -> Executor: ...


@dataclass(slots=True)
class _Wait:
    """One decode's wait for a worker and its run there, ms (filled in by the worker)."""

    submitted: float = field(default_factory=time.perf_counter)
    queued_ms: float | None = None
    decode_ms: float | None = None


def _decode_chunks(decoder: Decoder[D], chunks: Sequence[np.ndarray], wait: _Wait) -> D:
    """The worker's side of a decode: the chunks as one buffer, decoded and timed into ``wait``."""
    began = time.perf_counter()
    wait.queued_ms = (began - wait.submitted) * 1000
    try:
        return decoder.decode(chunks[0] if len(chunks) == 1 else np.concatenate(chunks))
    finally:
        wait.decode_ms = (time.perf_counter() - began) * 1000


# what a backend's decode may say of itself (the transformers backend's TorchDecode), copied into final_cost
DECODE_COSTS = ("encode_ms", "generate_ms", "tokens", "window_s")


@dataclass(slots=True)
class _Speculation(Generic[D]):
    samples: int  # buffer length it decoded
    generation: int
    future: asyncio.Future[D]
    wait: _Wait


class SpeculativeStream(Generic[D]):
    """The host's current utterance (implements ``TranscriptStream``).

    ``decodes`` counts the model decodes this stream has started (an observable
    for tests and metrics). ``partial`` returns the last result instead of
    decoding while another decode of this stream is in flight. ``final_cost``: where the last
    ``final``'s time went (see :meth:`final`).
    """

    def __init__(self, asr: DecodingModel[D]) -> None:
        self._asr = asr
        self.decodes = 0
        self.last_decode: D | None = None
        self.final_cost: dict[str, float | bool] | None = None
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
        self._speculation: _Speculation[D] | None = None
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

    def _submit(self, final: bool = False) -> tuple[asyncio.Future[D], _Wait]:
        loop = asyncio.get_running_loop()
        chunks = tuple(self._chunks)
        self.decodes += 1
        self._in_flight += 1
        executor = getattr(self._asr, "final_executor", self._asr.executor) if final else self._asr.executor
        wait = _Wait()
        future = loop.run_in_executor(executor, _decode_chunks, self._asr.decoder, chunks, wait)
        generation = self._generation

        def done(_: asyncio.Future[D]) -> None:
            if generation == self._generation:
                self._in_flight -= 1

        future.add_done_callback(done)
        return future, wait

    async def partial(self) -> Transcript:
        """Decode the growing buffer and extend the stable prefix (skipped while busy)."""
        if self._samples == 0 or self.busy or self._samples == self._last_samples:
            return self._last
        samples, generation = self._samples, self._generation
        decode = await asyncio.shield(self._submit()[0])
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
            spec = _Speculation(self._samples, self._generation, *self._submit(final=True))
            self._speculation = spec
        try:
            await asyncio.shield(spec.future)
        except Exception:
            log.exception("asr: speculative decode failed")

    def settled(self) -> Transcript | None:
        """The finished speculative decode of exactly the current buffer, or None (not asked for, still
        running, failed, or audio arrived since): what ``final`` would return right now."""
        spec = self._speculation
        if (
            spec is None
            or spec.samples != self._samples
            or spec.generation != self._generation
            or not spec.future.done()
            or spec.future.cancelled()
            or spec.future.exception() is not None
        ):
            return None
        text = " ".join(spec.future.result().text.split())
        return Transcript(text=text, stable_text=text, audio_s=spec.samples / SAMPLE_RATE)

    async def final(self) -> Transcript:
        """The end of the turn: reuse the speculative decode if no audio arrived since.

        ``final_cost`` then says where its time went, ms: ``waited_ms`` (this call, from the end of the turn
        to the transcript), ``speculated`` (the pause's decode was reused) and ``asked_ms`` (how long before
        this call that decode was asked for), the decode's ``queued_ms`` (waiting for a worker: other
        sessions' decodes) and ``decode_ms``, and what the backend tells of it (``encode_ms``,
        ``generate_ms``, ``tokens``, ``window_s``)."""
        samples, generation = self._samples, self._generation
        if samples == 0:
            return EMPTY
        called = time.perf_counter()
        spec = self._speculation
        decode: D | None = None
        wait: _Wait | None = None
        if spec is not None and spec.samples == samples and spec.generation == generation:
            try:
                decode, wait = await asyncio.shield(spec.future), spec.wait
            except Exception:
                log.warning("asr: speculative decode failed; decoding again")
        speculated = decode is not None
        if decode is None:
            future, wait = self._submit(final=True)
            decode = await asyncio.shield(future)
        self.last_decode = decode
        self.final_cost = _final_cost(decode, wait, called, speculated)
        text = " ".join(decode.text.split())
        return Transcript(text=text, stable_text=text, audio_s=samples / SAMPLE_RATE)


def _final_cost(
    decode: DecodeResult, wait: _Wait | None, called: float, speculated: bool
) -> dict[str, float | bool]:
    cost: dict[str, float | bool] = {
        "waited_ms": round((time.perf_counter() - called) * 1000, 1),
        "speculated": speculated,
    }
    if wait is not None:
        if speculated:
            cost["asked_ms"] = round((called - wait.submitted) * 1000, 1)
        for name in ("queued_ms", "decode_ms"):
            value = getattr(wait, name)
            if value is not None:
                cost[name] = round(value, 1)
    for name in DECODE_COSTS:
        value = getattr(decode, name, None)
        if isinstance(value, int | float):
            cost[name] = round(float(value), 1)
    return cost
