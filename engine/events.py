"""Every event that flows through a session, defined once.

Each event class says how it behaves on interruption (barge-in):

* ``interruptible = True``: reply data (tokens, chunks, synthesized audio). On
  barge-in they are dropped wherever they wait: the bus drops the queued ones of every
  subscriber when it publishes the :class:`Interruption` (by this flag), the playout
  buffer (only :class:`SpeechAudio`) is flushed and the reply task, with its queue of
  :class:`ReplyChunk`, cancelled.
* ``interruptible = False``: control and input events (VAD, transcripts, turn
  boundaries, errors, host commands). They are never dropped.

Times (``t`` and friends) are seconds on the session :class:`~engine.clock.MediaClock`.

Events are also the wire format: a class with a ``kind`` is published on the session's bus, and
:func:`to_wire` (the one serializer, used by the event stream, MQTT and the pages) turns it into the
JSON object of docs/api.md, with the fields its ``wire`` names. Classes without a ``kind``
(:class:`ReplyChunk`, :class:`SpeechAudio`) are pipeline items that never leave the session.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

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
    kind: ClassVar[str] = ""  # the wire ``type``; empty: never published
    # The fields on the wire, in order: ``name``, ``name=attribute``, or ``name?`` (left out when None).
    wire: ClassVar[tuple[str, ...]] = ("t",)


def to_wire(event: Event) -> dict[str, Any]:
    """The JSON object an event is on the event stream, MQTT and the pages (docs/api.md)."""
    if not event.kind:
        raise TypeError(f"{type(event).__name__} is not published")
    out: dict[str, Any] = {"type": event.kind}
    for spec in event.wire:
        name, _, attr = spec.partition("=")
        optional = name.endswith("?")
        name = name.rstrip("?")
        value = getattr(event, attr or name)
        if value is None and optional:
            continue
        out[name] = list(value) if isinstance(value, tuple) else value
    return out


# ---- input side -----------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class SpeechStarted(Event):
    """VAD: the host started speaking (also the barge-in trigger while she talks)."""

    kind: ClassVar[str] = "speech_started"


@dataclass(frozen=True, kw_only=True)
class SpeechEnded(Event):
    """VAD: the host has been silent long enough to end the turn; ``t`` is when her speech stopped."""

    kind: ClassVar[str] = "speech_ended"


@dataclass(frozen=True, kw_only=True)
class PartialTranscript(Event):
    kind: ClassVar[str] = "partial"
    wire: ClassVar[tuple[str, ...]] = ("text", "stable=stable_text", "t")
    text: str
    stable_text: str = ""


@dataclass(frozen=True, kw_only=True)
class FinalTranscript(Event):
    """The final transcript of a voice turn, or (``unanswered``) speech in which no words were recognised."""

    kind: ClassVar[str] = "final"
    wire: ClassVar[tuple[str, ...]] = ("text", "turn_id?", "t", "unanswered?", "speech_s?")
    text: str
    turn_id: int | None = None
    unanswered: str | None = None
    speech_s: float | None = None


@dataclass(frozen=True, kw_only=True)
class UserTurn(Event):
    """A complete turn from the host's voice (final transcript) or from text/chat."""

    kind: ClassVar[str] = "user_turn"
    wire: ClassVar[tuple[str, ...]] = ("turn_id", "text", "source", "speaker", "t", "continues?")
    text: str
    source: TurnSource
    speaker: str = "host"
    turn_id: int = 0
    speech_end_t: float | None = None
    continues: int | None = None  # the turn whose words this one repeats and goes on from (its answer cut)


@dataclass(frozen=True, kw_only=True)
class ChatPosted(Event):
    """A chat message was admitted to the session's chat queue (the overlay's chat feed)."""

    kind: ClassVar[str] = "chat"
    wire: ClassVar[tuple[str, ...]] = ("user", "text", "role", "platform", "id", "t")
    user: str
    text: str
    role: str
    platform: str
    id: str | None = None


# ---- reply side (interruptible) ----------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ReplyToken(Event):
    """A piece of the reply as the persona guard let it through (never the model's raw text)."""

    interruptible: ClassVar[bool] = True
    kind: ClassVar[str] = "reply_token"
    wire: ClassVar[tuple[str, ...]] = ("turn_id", "text")
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
class _ChunkTimed(Event):
    """One chunk of the reply at a time on the clock (``t``), with its words at their clock times."""

    wire: ClassVar[tuple[str, ...]] = (
        "turn_id",
        "index",
        "text",
        "t",
        "duration=duration_s",
        "words=word_times",
    )
    audio: SpeechAudio = field(repr=False)

    @property
    def turn_id(self) -> int:
        return self.audio.turn_id

    @property
    def index(self) -> int:
        return self.audio.index

    @property
    def text(self) -> str:
        return self.audio.text

    @property
    def duration_s(self) -> float:
        return self.audio.duration_s

    @property
    def word_times(self) -> list[dict[str, Any]]:
        """Each word's start and end on the clock."""
        return [{"w": w.word, "start": self.t + w.start_s, "end": self.t + w.end_s} for w in self.audio.words]


@dataclass(frozen=True, kw_only=True)
class ChunkScheduled(_ChunkTimed):
    """A chunk's start time on the clock is known (``t``), before it plays: overlays time their
    highlights ahead, the animator moves the lips for it."""

    kind: ClassVar[str] = "caption_scheduled"


@dataclass(frozen=True, kw_only=True)
class ChunkPlaybackStarted(_ChunkTimed):
    """The audio track sent the first sample of a chunk; ``t`` is that sample's time on the clock."""

    kind: ClassVar[str] = "caption"


@dataclass(frozen=True, kw_only=True)
class Interruption(Event):
    """Barge-in or the host's interrupt button: cut the reply at what was heard.

    ``cut_t`` is when the audio stops (the animator closes the mouth then); ``turn_id`` the reply cut.
    Publishing it drops every interruptible event still queued for a subscriber.
    """

    kind: ClassVar[str] = "interrupted"
    wire: ClassVar[tuple[str, ...]] = ("t", "reason", "turn_id?")
    reason: str = "barge_in"
    cut_t: float | None = None
    turn_id: int | None = None


@dataclass(frozen=True, kw_only=True)
class TurnCompleted(Event):
    """The reply ended; ``played_text`` is what the audience heard, ``timings`` the turn's figures."""

    kind: ClassVar[str] = "turn_completed"
    wire: ClassVar[tuple[str, ...]] = (
        "turn_id",
        "played_text",
        "interrupted",
        "timings",
        "clock_origin",
        "continued?",
    )
    turn_id: int
    played_text: str
    interrupted: bool
    timings: dict[str, Any] = field(default_factory=dict)
    clock_origin: float | None = (
        None  # time.monotonic() at t = 0: a client on the same host lines its clock up
    )
    continued: Literal[True] | None = None  # the host went on talking: a later turn holds these words too


@dataclass(frozen=True, kw_only=True)
class ExpressionCommand(Event):
    kind: ClassVar[str] = "expression"
    wire: ClassVar[tuple[str, ...]] = ("name", "source", "t")
    name: str
    source: Literal["host", "llm"] = "host"


@dataclass(frozen=True, kw_only=True)
class GestureCommand(Event):
    kind: ClassVar[str] = "gesture"
    wire: ClassVar[tuple[str, ...]] = ("name", "source", "t")
    name: str
    source: Literal["host", "llm"] = "host"


@dataclass(frozen=True, kw_only=True)
class StageError(Event):
    """A stage failed on one turn; the turn ends, the session goes on."""

    kind: ClassVar[str] = "error"
    wire: ClassVar[tuple[str, ...]] = ("stage", "message", "turn_id")
    stage: str
    message: str
    turn_id: int | None = None


# ---- the session's surroundings --------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ConnectionChanged(Event):
    """The host's WebRTC connection changed state."""

    kind: ClassVar[str] = "connection"
    wire: ClassVar[tuple[str, ...]] = ("state",)
    state: str


@dataclass(frozen=True, kw_only=True)
class Draining(Event):
    """The engine got SIGTERM: this session may run ``deadline_s`` more seconds."""

    kind: ClassVar[str] = "draining"
    wire: ClassVar[tuple[str, ...]] = ("deadline_s", "message")
    deadline_s: float
    message: str


@dataclass(frozen=True, kw_only=True)
class RTMPState(Event):
    kind: ClassVar[str] = "rtmp"
    wire: ClassVar[tuple[str, ...]] = ("state", "error")
    state: str
    error: str = ""


@dataclass(frozen=True, kw_only=True)
class ProfileChanged(Event):
    """The video output profile was switched live."""

    kind: ClassVar[str] = "profile"
    wire: ClassVar[tuple[str, ...]] = ("name", "t")
    name: str


@dataclass(frozen=True, kw_only=True)
class PersonaChanged(Event):
    kind: ClassVar[str] = "persona"
    wire: ClassVar[tuple[str, ...]] = ("name", "t")
    name: str
