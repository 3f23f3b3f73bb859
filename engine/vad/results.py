"""What the voice-activity detector reports: internal to the VAD and the session's listener.

These are not bus events. ``t`` is in the times of the samples fed (the mic's arrival timeline);
the listener converts each result once, onto the session clock, into the events the bus carries
(:class:`~engine.events.SpeechStarted`, :class:`~engine.events.SpeechEnded`) or into its own
decisions (a pause speculates the transcript, speech resuming cancels an early reply).

``t`` is when the thing happened (derived from the samples fed); ``detected_t``
is the end of the window in which the detector could tell, so
``detected_t - t`` is the detector's own latency.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class VADSpeechStarted:
    """Speech began at ``t`` and has lasted ``min_speech_ms``."""

    t: float
    detected_t: float


@dataclass(frozen=True, slots=True)
class VADSpeechPaused:
    """Silence began at ``t`` and has lasted ``pause_ms``: speculate the decode now."""

    t: float
    detected_t: float


@dataclass(frozen=True, slots=True)
class VADSpeechResumed:
    """Speech came back at ``t`` before the end of the turn."""

    t: float
    detected_t: float


@dataclass(frozen=True, slots=True)
class VADEndOfTurn:
    """Silence lasted ``end_of_turn_silence_ms``; speech ran ``speech_start_t``..``speech_end_t``."""

    t: float
    detected_t: float
    speech_start_t: float
    speech_end_t: float


VADResult = VADSpeechStarted | VADSpeechPaused | VADSpeechResumed | VADEndOfTurn
