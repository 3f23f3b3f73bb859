"""End to end with the real bundled models and two real aiortc peers (the bench's client and the engine)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

from engine.asr.wer import wer
from engine.bench.voice import EngineConnection
from engine.config import Settings
from engine.llm.base import ChatMessage
from engine.models import EngineModels, load_vad_factory
from tests.conftest import resample_linear, synthesize_speech
from tests.engine.conftest import LiveServer, connected, live_server

pytestmark = pytest.mark.integration


def speech_48k(text: str, pad_s: float = 1.0) -> np.ndarray:
    pcm, rate = synthesize_speech(text)
    pcm48 = resample_linear(pcm, rate, 48000).astype(np.int16)
    pad = np.zeros(int(48000 * pad_s), np.int16)
    return np.concatenate([pad[:4800], pcm48, pad])


@pytest.fixture
async def conn(server: LiveServer) -> AsyncIterator[EngineConnection]:
    async with connected(server) as c:
        yield c


async def next_event(c: EngineConnection, kind: str, limit_s: float = 60) -> dict[str, Any]:
    return await c.wait_event(kind, limit_s)


async def test_spoken_question_gets_a_spoken_reply(conn: EngineConnection, server: LiveServer) -> None:
    question = "What is your favorite color?"
    clip = conn.mic.play(speech_48k(question))
    await clip.done.wait()
    final = await next_event(conn, "final")
    assert wer(question, final["text"]) <= 0.25, final["text"]
    done = await next_event(conn, "turn_completed")
    assert done["played_text"].strip(), "the idol said something"
    assert clip.sent_end is not None
    assert conn.received.first_loud_after(clip.sent_end) is not None, "reply audio reached the client"
    stages = done["timings"]["relative_ms"]
    order = [
        "speech_end",
        "end_of_turn",
        "asr_final",
        "llm_first_token",
        "first_chunk_text",
        "tts_first_audio",
        "first_audio_sent",
    ]
    assert [s for s in order if s in stages] == order, stages
    if done["timings"]["early_reply"]:  # the reply started in the silence; it was heard only after the final
        order.remove("end_of_turn")
        order.remove("asr_final")
        assert stages["asr_final"] <= stages["first_audio_sent"], stages
    assert all(stages[a] <= stages[b] for a, b in zip(order, order[1:], strict=False)), stages
    # the timings are exported to Prometheus
    import aiohttp

    async with aiohttp.ClientSession(headers=server.auth) as http, http.get(f"{server.url}/metrics") as r:
        text = await r.text()
    assert 'idolcast_turn_stage_ms_count{source="voice",stage="first_audio_sent"}' in text


async def test_text_turn_and_history_keeps_what_was_played(
    conn: EngineConnection, server: LiveServer
) -> None:
    await conn.say("Say hello to the viewers.")
    done = await conn.wait_event("turn_completed", 120)
    assert not done["interrupted"] and done["played_text"]
    session = server.engine.sessions[conn.session_id]
    user, remembered = session.prompt.history[-1]  # type: ignore[attr-defined]
    assert user == "Say hello to the viewers."
    # heard in full: the model's own words are kept (so its KV cache stays valid for the next turn)
    assert " ".join(done["played_text"].split()[:3]) in " ".join(remembered.split())


async def test_barge_in_stops_the_reply_and_history_keeps_only_the_heard_part(
    conn: EngineConnection, server: LiveServer
) -> None:
    session = server.engine.sessions[conn.session_id]
    session.settings.llm.max_new_tokens = 120
    await conn.say("Tell me a long story about a dragon who loves to sing, with many details.")
    started = await next_event(conn, "caption")
    await asyncio.sleep(0.8)
    over = conn.mic.play(speech_48k("Wait, stop please."))
    interrupted = await next_event(conn, "interrupted", 10)
    assert interrupted["reason"] == "barge_in"
    done = await next_event(conn, "turn_completed")
    assert done["interrupted"]
    await over.done.wait()
    assert over.sent_start is not None
    stop = conn.received.quiet_from(over.sent_start, hold_s=0.3)
    assert stop is not None and stop - over.sent_start < 1.0, "the reply audio stopped at the client"
    history = session.prompt.history  # type: ignore[attr-defined]
    played = history[-1][1] if history else ""
    assert done["played_text"] == played
    assert started["turn_id"] == done["turn_id"]


class _FailingOnce:
    """Fault injection at the LLM boundary: the real model, except one call raises."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.fail_next = True

    def stream(self, messages: list[ChatMessage], cache_key: str | None = None) -> Any:
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("injected LLM failure")
        return self.real.stream(messages, cache_key)

    async def prewarm(self, messages: list[ChatMessage], cache_key: str | None = None) -> int:
        return int(await self.real.prewarm(messages, cache_key))

    def describe(self) -> str:
        return "failing-once"


async def test_a_stage_crash_ends_the_turn_not_the_session_nor_another(server: LiveServer) -> None:
    async with connected(server) as a, connected(server) as b:
        session_a = server.engine.sessions[a.session_id]
        session_a.models = dataclasses.replace(session_a.models, llm=_FailingOnce(session_a.models.llm))
        await a.say("Hello?")
        await b.say("Hi there!")
        err = await next_event(a, "error")
        assert err["stage"] == "llm" and "injected LLM failure" in err["message"]
        done_a = await next_event(a, "turn_completed")
        assert done_a["timings"]["error"]
        done_b = await next_event(b, "turn_completed")
        assert done_b["played_text"] and not done_b["timings"]["error"]
        await a.say("Are you still there?")
        again = await next_event(a, "turn_completed")
        assert again["played_text"] and not again["timings"]["error"]


# ---- early replies: started on the pause, silent until the end of the turn confirms them ----------


@pytest.fixture
async def slow_eot_server(settings: Settings, models: EngineModels) -> AsyncIterator[LiveServer]:
    """A server whose end of turn comes 4 s into the silence: the speculative transcript and its
    end-of-turn score are ready long before it (a loaded 2-core box scored in 3.6 s), so an early reply
    always starts, and a pause shorter than that can cancel it."""
    slow = settings.model_copy(deep=True)
    slow.vad.end_of_turn_silence_ms = 4000
    slow.vad.end_of_turn_finished_ms = 0  # finished words wait the whole silence too
    async with live_server(slow, dataclasses.replace(models, new_vad=load_vad_factory(slow.vad))) as s:
        yield s


@pytest.fixture
async def question_server(settings: Settings, models: EngineModels) -> AsyncIterator[LiveServer]:
    """End of turn after 2.5 s of silence, or 0.2 s once the LLM reads the speculative transcript as finished."""
    cfg = settings.model_copy(deep=True)
    cfg.vad.end_of_turn_silence_ms = 2500
    cfg.vad.end_of_turn_finished_ms = 200
    async with live_server(cfg, dataclasses.replace(models, new_vad=load_vad_factory(cfg.vad))) as s:
        yield s


async def collect_turn(c: EngineConnection, limit_s: float = 90) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    while not events or events[-1].get("type") != "turn_completed":
        events.append(await asyncio.wait_for(c.events.get(), limit_s))
    return events


async def test_early_reply_is_confirmed_at_the_end_of_turn_and_only_then_heard(
    slow_eot_server: LiveServer,
) -> None:
    async with connected(slow_eot_server, with_video=False) as c:
        clip = c.mic.play(speech_48k("What is your favorite color?", pad_s=5.0))
        events = await collect_turn(c)
        session = slow_eot_server.engine.sessions[c.session_id]
        assert session.early_replies["confirmed"] == 1, session.early_replies
        kinds = [e["type"] for e in events]
        assert kinds.count("user_turn") == 1
        # nothing of the reply is shown before the turn is confirmed
        assert "reply_token" in kinds and kinds.index("user_turn") < kinds.index("reply_token")
        timings = events[-1]["timings"]
        assert timings["early_reply"] is True
        stages = timings["relative_ms"]
        assert stages["llm_first_token"] < stages["end_of_turn"], stages  # it started in the silence
        assert stages["first_audio_sent"] >= stages["asr_final"], stages  # but spoke only after it
        assert clip.sent_end is not None
        heard = c.received.first_loud_after(clip.sent_end)
        assert heard is not None and heard - clip.sent_end >= 4.0, "no reply audio during the silence"


async def test_early_reply_is_dropped_when_the_host_goes_on_speaking(slow_eot_server: LiveServer) -> None:
    async with connected(slow_eot_server, with_video=False) as c:
        session = slow_eot_server.engine.sessions[c.session_id]
        first = c.mic.play(speech_48k("What is your favorite", pad_s=0.0))
        await first.done.wait()
        for _ in range(200):  # the pause (silence from the mic) lets an early reply start, within 4 s
            if session.early_replies["started"]:
                break
            await asyncio.sleep(0.02)
        assert session.early_replies["started"] == 1, "no early reply started in the pause"
        c.mic.play(speech_48k("color in the whole world?", pad_s=5.0))  # ... then the host goes on
        events = await collect_turn(c)
        assert session.early_replies["cancelled"] == 1, session.early_replies
        assert session.early_replies["confirmed"] == 1, session.early_replies
        turns = [e for e in events if e["type"] == "user_turn"]
        assert len(turns) == 1, turns  # the dropped reply's turn was never announced
        assert "world" in turns[0]["text"].lower(), turns[0]["text"]
        kinds = [e["type"] for e in events]
        assert kinds.index("user_turn") < kinds.index("reply_token")
        assert events[-1]["played_text"].strip()
        assert session.conversation.early.pending is None


async def test_finished_words_end_the_turn_sooner_trailing_words_wait(
    question_server: LiveServer,
) -> None:
    async with connected(question_server, with_video=False) as c:
        gaps, judged = {}, {}
        for kind, text in (
            ("finished", "What is your favorite color?"),
            ("trailing", "So the thing about my brother is"),
        ):
            c.mic.play(speech_48k(text, pad_s=4.0))
            timings = (await collect_turn(c))[-1]["timings"]
            gaps[kind] = timings["relative_ms"]["end_of_turn"]
            judged[kind] = timings["turn_end"]
            # the final transcript's costs reach the turn's timings (the pause's decode, reused)
            assert timings["asr"]["speculated"] is True and timings["asr"]["decode_ms"] > 0, timings["asr"]
        assert judged["finished"]["method"] == "llm" and judged["finished"]["finished"] is True, judged
        assert judged["trailing"]["finished"] is False, judged
        # the finished question ends as soon as it is judged, before the 2.5 s silence (how soon is the
        # judgement's speed: `idolcast bench --turn-end`, not asserted here); the trailing words wait it out
        assert 200 <= gaps["finished"] < 2500, gaps
        # at least the whole silence, to within one 32 ms VAD window (the end is counted from the refined
        # speech end, the silence in whole windows: 2,494 ms was measured once)
        assert gaps["trailing"] >= 2500 - 32, gaps
