"""What the session needs from a voice-activity detector (silero is the one implementation).

A detector is fed the host's 16 kHz audio with the clock time of its first sample and answers with
:mod:`engine.vad.results`: its own results, in the times of the samples fed. The session's listener
converts them once into the bus's events (:class:`~engine.events.SpeechStarted`,
:class:`~engine.events.SpeechEnded`) on the session clock.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from engine.vad.config import VADConfig
from engine.vad.results import VADResult


class VoiceActivity(Protocol):
    config: VADConfig

    @property
    def last_probability(self) -> float:
        """The speech probability of the latest window."""
        ...

    @property
    def voiced_since(self) -> float | None:
        """When the current run of speech windows began (None outside one): a barge-in fires once a run."""
        ...

    @property
    def voiced_s(self) -> float:
        """How long the current run of speech windows has lasted, in the audio's own time (barge-in)."""
        ...

    def feed(self, audio: np.ndarray, t: float) -> list[VADResult]:
        """Add ``audio`` (float32, 16 kHz) whose first sample is at time ``t``; return what happened."""
        ...

    def end_turn_sooner(self, silence_start: float, silence_ms: float) -> None:
        """Let the pause that began at ``silence_start`` end the turn after ``silence_ms`` (finished words)."""
        ...

    def reset(self) -> None: ...
