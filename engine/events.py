"""Every event that flows through a session, defined once.

Each event class says how it behaves on interruption (barge-in):

* ``interruptible = True``: reply data (tokens, chunks, synthesized audio). On
  barge-in every queue holding such events is flushed and they are dropped.
* ``interruptible = False``: control and input events (VAD, transcripts, turn
  boundaries, errors, host commands). They are never dropped.

Times (``t`` and friends) are seconds on the session :class:`~engine.clock.MediaClock`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

import numpy as np

TurnSource = Literal["voice", "chat", "host_text"]


@dataclass(frozen=True, slots=True)
class PhonemeSpan:
    """One phoneme of synthesized speech, relative to the start of its audio chunk."""

    phoneme: str
    start_s: float
    end_s: float


@dataclass(frozen=True, slots=True)
class WordSpan:
    """One spoken word, relative to the start of its audio chunk (for captions)."""

    word: str
    start_s: float
    end_s: float


@dataclass(frozen=True, kw_only=True)
class Event:
    t: float
    interruptible: ClassVar[bool] = False


# ---- input side -----------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class SpeechStarted(Event):
    """VAD: the host started speaking (also the barge-in trigger while she talks)."""


@dataclass(frozen=True, kw_only=True)
class EndOfTurn(Event):
    """VAD: the host has been silent long enough; ``speech_end_t`` is when speech stopped."""

    speech_end_t: float


@dataclass(frozen=True, kw_only=True)
class PartialTranscript(Event):
    text: str
    stable_text: str = ""


@dataclass(frozen=True, kw_only=True)
class UserTurn(Event):
    """A complete turn from the host's voice (final transcript) or from text/chat."""

    text: str
    source: TurnSource
    speaker: str = "host"
    turn_id: int = 0
    speech_end_t: float | None = None


# ---- reply side (interruptible) ----------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ReplyToken(Event):
    interruptible: ClassVar[bool] = True
    turn_id: int
    text: str


@dataclass(frozen=True, kw_only=True)
class ReplyChunk(Event):
    """A span of reply text ready for TTS (clause or sentence), tags already parsed out."""

    interruptible: ClassVar[bool] = True
    turn_id: int
    index: int
    text: str
    expressions: tuple[str, ...] = ()
    gestures: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class SpeechAudio(Event):
    """Synthesized speech for one chunk: 48 kHz mono int16, with its alignments."""

    interruptible: ClassVar[bool] = True
    turn_id: int
    index: int
    text: str
    pcm: np.ndarray = field(repr=False)
    sample_rate: int = 48000
    phonemes: tuple[PhonemeSpan, ...] = ()
    words: tuple[WordSpan, ...] = ()
    expressions: tuple[str, ...] = ()
    gestures: tuple[str, ...] = ()

    @property
    def duration_s(self) -> float:
        return len(self.pcm) / self.sample_rate


# ---- playback and control ------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ChunkPlaybackStarted(Event):
    """The audio track sent the first frame of a chunk; ``t`` is that frame's pts on the clock."""

    turn_id: int
    index: int
    duration_s: float


@dataclass(frozen=True, kw_only=True)
class Interruption(Event):
    """Barge-in or the host's interrupt button: cut the reply at what was heard."""

    reason: Literal["barge_in", "host", "new_turn", "shutdown"] = "barge_in"


@dataclass(frozen=True, kw_only=True)
class TurnCompleted(Event):
    turn_id: int
    user_text: str
    played_text: str
    interrupted: bool


@dataclass(frozen=True, kw_only=True)
class ExpressionCommand(Event):
    name: str
    source: Literal["host", "llm"] = "host"


@dataclass(frozen=True, kw_only=True)
class GestureCommand(Event):
    name: str
    source: Literal["host", "llm"] = "host"


@dataclass(frozen=True, kw_only=True)
class StageError(Event):
    """A stage failed on one turn; the turn ends, the session goes on."""

    stage: str
    message: str
    turn_id: int | None = None
