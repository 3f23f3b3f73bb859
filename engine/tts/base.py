"""The speech-synthesis seam."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from engine.events import PhonemeSpan, WordSpan

OUTPUT_RATE = 48000


@dataclass(frozen=True, slots=True)
class Synthesis:
    pcm: np.ndarray  # int16 mono at OUTPUT_RATE
    phonemes: tuple[PhonemeSpan, ...]  # empty when the voice gives no alignments
    words: tuple[WordSpan, ...]
    sample_rate: int = OUTPUT_RATE


class TTS(Protocol):
    async def synthesize(self, text: str, first: bool = False) -> Synthesis:
        """Synthesize in a worker thread; never blocks the event loop. ``first``: a reply's first chunk
        (the host waits in silence for it): where sessions share the voice it goes before their later ones."""
        ...

    def describe(self) -> str: ...
