"""The bus's typed events serialize to the JSON of docs/api.md (the event stream, MQTT and the pages)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.events import (
    ChunkPlaybackStarted,
    ChunkScheduled,
    Event,
    FinalTranscript,
    Interruption,
    PartialTranscript,
    ReplyChunk,
    ReplyToken,
    SpeechAudio,
    StageError,
    TurnCompleted,
    UserTurn,
    WordSpan,
    to_wire,
)
from engine.session.bus import EventBus

pytestmark = pytest.mark.unit


def _audio() -> SpeechAudio:
    words = (WordSpan("hi", 0.0, 0.2), WordSpan("chat", 0.25, 0.5))
    return SpeechAudio(t=0.0, turn_id=3, index=1, text="hi chat", pcm=np.zeros(24000, np.int16), words=words)


def test_the_wire_shapes_stay_those_of_the_api() -> None:
    assert to_wire(UserTurn(t=1.0, text="hi", source="voice", turn_id=2, speech_end_t=0.5)) == {
        "type": "user_turn",
        "turn_id": 2,
        "text": "hi",
        "source": "voice",
        "speaker": "host",
        "t": 1.0,
    }
    assert to_wire(PartialTranscript(t=1.0, text="hi the", stable_text="hi")) == {
        "type": "partial",
        "text": "hi the",
        "stable": "hi",
        "t": 1.0,
    }
    assert to_wire(FinalTranscript(t=2.0, text="hi", turn_id=4)) == {
        "type": "final",
        "text": "hi",
        "turn_id": 4,
        "t": 2.0,
    }
    unanswered = FinalTranscript(t=2.0, text="", unanswered="no words recognised", speech_s=0.8)
    assert to_wire(unanswered) == {
        "type": "final",
        "text": "",
        "t": 2.0,
        "unanswered": "no words recognised",
        "speech_s": 0.8,
    }
    assert to_wire(ReplyToken(t=0.0, turn_id=1, text="Hi!")) == {
        "type": "reply_token",
        "turn_id": 1,
        "text": "Hi!",
    }
    caption = to_wire(ChunkPlaybackStarted(t=10.0, audio=_audio()))
    assert caption == {
        "type": "caption",
        "turn_id": 3,
        "index": 1,
        "text": "hi chat",
        "t": 10.0,
        "duration": 0.5,
        "words": [{"w": "hi", "start": 10.0, "end": 10.2}, {"w": "chat", "start": 10.25, "end": 10.5}],
    }
    assert to_wire(ChunkScheduled(t=10.0, audio=_audio())) == caption | {"type": "caption_scheduled"}
    assert to_wire(Interruption(t=3.0, reason="host", cut_t=3.01, turn_id=2)) == {
        "type": "interrupted",
        "t": 3.0,
        "reason": "host",
        "turn_id": 2,
    }
    assert "turn_id" not in to_wire(Interruption(t=3.0, reason="host"))  # nothing was being said
    done = TurnCompleted(
        t=4.0, turn_id=2, played_text="Hi", interrupted=False, timings={"a": 1}, clock_origin=None
    )
    assert to_wire(done) == {
        "type": "turn_completed",
        "turn_id": 2,
        "played_text": "Hi",
        "interrupted": False,
        "timings": {"a": 1},
        "clock_origin": None,
    }
    assert to_wire(StageError(t=0.0, stage="tts", message="boom", turn_id=2)) == {
        "type": "error",
        "stage": "tts",
        "message": "boom",
        "turn_id": 2,
    }


def test_pipeline_items_never_go_on_the_wire() -> None:
    for item in (_audio(), ReplyChunk(t=0.0, turn_id=1, index=0, text="x")):
        with pytest.raises(TypeError):
            to_wire(item)


async def test_an_interruption_drops_the_queued_reply_tokens_not_the_control_events() -> None:
    bus = EventBus()
    seen: list[Event] = []
    bus.add_observer(seen.append)
    async with bus.subscribe() as sub:
        bus.publish(UserTurn(t=0.0, text="hi", source="chat", turn_id=1))
        bus.publish(ReplyToken(t=0.1, turn_id=1, text="Hello"))
        bus.publish(Interruption(t=0.2, reason="host"))
        bus.close()
        got = [await sub.get() for _ in range(sub.qsize())]
    assert [e and e["type"] for e in got] == ["user_turn", "interrupted", None]
    assert len(seen) == 3  # observers see everything, as it happens
