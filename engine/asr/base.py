"""The speech-recognition seam: a model loaded once, a stream per session."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np


@dataclass(frozen=True, slots=True)
class Transcript:
    text: str  # everything decoded so far
    stable_text: str  # the prefix that local agreement has committed
    audio_s: float  # seconds of audio this decode covered


class TranscriptStream(Protocol):
    """The host's current utterance. Audio is 16 kHz mono float32 in [-1, 1].

    ``append`` is cheap and may be called on the event loop; ``partial`` and
    ``final`` run their decode in a worker thread and may be awaited from the loop.
    """

    def reset(self) -> None: ...

    def append(self, audio: np.ndarray) -> None: ...

    @property
    def busy(self) -> bool:
        """A decode of this utterance is in flight."""
        ...

    async def partial(self) -> Transcript: ...

    async def speculate(self) -> None:
        """The host paused: decode the whole buffer now so ``final`` can reuse it."""
        ...

    def settled(self) -> Transcript | None:
        """The finished speculative decode of exactly the current buffer, or None."""
        ...

    async def final(self) -> Transcript:
        """The end of the turn: reuse the speculative decode if no audio arrived since."""
        ...

    @property
    def final_cost(self) -> dict[str, float | bool] | None:
        """Where the last ``final``'s time went, ms (``engine/asr/stream.py``); None before one."""
        ...


class ASRModel(Protocol):
    def new_stream(self) -> TranscriptStream: ...

    def describe(self) -> str: ...
