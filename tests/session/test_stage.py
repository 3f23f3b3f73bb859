"""The session's pipeline on a stage (tests/session/harness.py): a scripted clock, the host's recorded
voice into the mic track, the real models, and no server or peer. The end-to-end versions of these are
in tests/engine/test_conversation.py."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from engine.asr.base import Transcript
from engine.config import Settings
from engine.events import (
    ChunkPlaybackStarted,
    FinalTranscript,
    Interruption,
    ReplyToken,
    SpeechEnded,
    SpeechStarted,
    TurnCompleted,
    UserTurn,
)
from engine.models import EngineModels, load_vad_factory
from tests.session.harness import speech_48k, stage

pytestmark = pytest.mark.integration

EOT_MS = 4000


def _slow_end_of_turn(settings: Settings, models: EngineModels) -> tuple[Settings, EngineModels]:
    """The end of the turn 4 s into the silence: the speculative transcript and its end-of-turn score are
    ready long before it (even on a loaded machine), so an early reply always starts, and a pause shorter
    than that can cancel it."""
    slow = settings.model_copy(deep=True)
    slow.vad.end_of_turn_silence_ms = EOT_MS
    slow.vad.end_of_turn_finished_ms = 0
    return slow, dataclasses.replace(models, new_vad=load_vad_factory(slow.vad))


async def test_turn_taking_she_answers_after_the_host_stops_and_not_before(
    settings: Settings, models: EngineModels
) -> None:
    async with stage(settings, models) as s:
        s.say(speech_48k("What is your favorite color?"), then_silence_s=1.0)
        done = await s.until_event(TurnCompleted)
        kinds = s.kinds()
        assert kinds.index("speech_started") < kinds.index("speech_ended") < kinds.index("user_turn")
        turn = s.of(UserTurn)[0]
        final = s.of(FinalTranscript)[0]
        assert turn.source == "voice" and "color" in turn.text.lower() and final.turn_id == turn.turn_id
        assert done.turn_id == turn.turn_id and done.played_text and not done.interrupted
        speech_end = s.of(SpeechEnded)[0].t
        loud = s.loud_at()
        assert loud and loud[0] > speech_end, "the idol spoke over the host"
        assert s.of(ChunkPlaybackStarted)[0].t >= speech_end
        assert len(s.session.turns) == 1 and s.session.turns[0].first_audio_sent is not None


async def test_barge_in_cuts_the_reply_where_the_host_spoke(settings: Settings, models: EngineModels) -> None:
    long = settings.model_copy(deep=True)
    long.llm.max_new_tokens = 120
    async with stage(long, models) as s:
        await s.session.submit_text(
            "Tell me a long story about a dragon who loves to sing, with many details."
        )
        await s.until_event(ChunkPlaybackStarted)
        await s.run_for(0.8)
        start = s.say(speech_48k("Wait, stop please."), then_silence_s=1.0)
        cut = await s.until_event(Interruption, limit_s=10)
        assert cut.reason == "barge_in" and cut.cut_t is not None
        assert cut.t - start < 1.0, "barge-in took more than a second of the host's speech"
        done = await s.until_event(TurnCompleted)
        assert done.interrupted and done.played_text
        # the playout's silences inside this reply travel with the turn (the bench counts them)
        assert done.timings["silences_ms"] == [round(ms, 1) for ms in s.session.playout.gaps_of(done.turn_id)]
        await s.run_for(0.3)
        after = [t for t in s.loud_at() if t > cut.cut_t + 0.05]  # the fade is 15 ms
        assert not after, f"the idol went on after the cut at {cut.cut_t:.2f}: {after[:3]}"
        history = s.session.prompt.history  # type: ignore[attr-defined]
        assert history and history[-1][1] == done.played_text  # she remembers only what was heard


async def test_an_early_reply_is_confirmed_at_the_end_of_the_turn_and_only_then_heard(
    settings: Settings, models: EngineModels
) -> None:
    slow, slow_models = _slow_end_of_turn(settings, models)
    async with stage(slow, slow_models) as s:
        s.say(speech_48k("What is your favorite color?"), then_silence_s=EOT_MS / 1000 + 1)
        done = await s.until_event(TurnCompleted)
        assert s.session.early_replies == {"started": 1, "confirmed": 1, "cancelled": 0}
        kinds = s.kinds()
        assert kinds.count("user_turn") == 1
        assert kinds.index("user_turn") < kinds.index("reply_token")  # nothing shown before it is confirmed
        stages = done.timings["relative_ms"]
        assert done.timings["early_reply"] is True
        assert stages["llm_first_token"] < stages["end_of_turn"], stages  # it started in the silence
        speech_end = s.of(SpeechEnded)[0].t
        assert s.loud_at()[0] - speech_end >= EOT_MS / 1000, "reply audio during the silence"


async def test_an_early_reply_is_dropped_when_the_host_goes_on(
    settings: Settings, models: EngineModels
) -> None:
    slow, slow_models = _slow_end_of_turn(settings, models)
    async with stage(slow, slow_models) as s:
        s.say(speech_48k("What is your favorite"))
        await s.run_until(
            lambda: s.session.early_replies["started"] == 1 and s.host_done, limit_s=EOT_MS / 1000
        )
        s.say(speech_48k("color in the whole world?", lead_s=0.0), then_silence_s=EOT_MS / 1000 + 1)
        done = await s.until_event(TurnCompleted)
        # the first reply was cancelled; the pause after the whole question started the one confirmed
        assert s.session.early_replies == {"started": 2, "confirmed": 1, "cancelled": 1}
        turns = s.of(UserTurn)
        assert len(turns) == 1 and "world" in turns[0].text.lower()  # the dropped reply was never announced
        tokens = s.of(ReplyToken)
        assert tokens and all(t.turn_id == turns[0].turn_id for t in tokens)
        assert done.played_text and s.session.conversation.early.pending is None


class _HearsNothing:
    """The ASR boundary: the real model's stream, except that the recogniser finds no words."""

    def __init__(self, real: Any) -> None:
        self.real = real

    def new_stream(self) -> Any:
        stream = self.real.new_stream()
        empty = Transcript(text="", stable_text="", audio_s=0.0)

        class Stream:
            def append(self, audio: np.ndarray) -> None:
                stream.append(audio)

            def reset(self) -> None:
                stream.reset()

            @property
            def busy(self) -> bool:
                return bool(stream.busy)

            async def partial(self) -> Transcript:
                return empty

            async def speculate(self) -> None:
                return None

            def settled(self) -> Transcript | None:
                return empty

            final_cost = None

            async def final(self) -> Transcript:
                return empty

        return Stream()

    def describe(self) -> str:
        return "hears-nothing"


async def test_speech_without_words_is_reported_and_not_answered(
    settings: Settings, models: EngineModels
) -> None:
    deaf = dataclasses.replace(models, asr=_HearsNothing(models.asr))
    async with stage(settings, deaf) as s:
        s.say(speech_48k("Mm hmm, uh."), then_silence_s=1.0)
        final = await s.until_event(FinalTranscript)
        assert final.text == "" and final.unanswered == "no words recognised" and final.speech_s
        await s.run_for(1.0)
        assert not s.of(UserTurn) and not s.of(ReplyToken) and not s.session.speaking()
        assert s.session.early_replies["started"] == 0
        # and she still listens: the next words are a turn
        s.session.models = models
        s.say(speech_48k("Hello there!"), then_silence_s=1.0)
        turn = await s.until_event(UserTurn)
        assert turn.source == "voice" and len(s.of(SpeechStarted)) == 2


@pytest.mark.parametrize("full_silence", [True, False], ids=["holds-the-floor", "finished-words-shortcut"])
async def test_after_a_barge_in_the_host_keeps_the_floor_through_a_pause(
    settings: Settings, models: EngineModels, full_silence: bool
) -> None:
    """The host cuts in with a question, pauses, and goes on. His first words read as finished, but he has
    taken the floor: his turn ends on the whole silence and holds both halves. With the finished-words
    shortcut after a barge-in (the setting off) the first half is answered in the pause and the rest becomes
    a turn of its own. The silences are long (finished 1 s, whole 3 s, the pause 1.5 s), so the pause's
    judgement is in before the shortcut's silence on any machine."""
    floor = settings.model_copy(deep=True)
    floor.llm.max_new_tokens = 120
    floor.vad.end_of_turn_finished_ms, floor.vad.end_of_turn_silence_ms = 1000, 3000
    floor.vad.barge_in_full_silence = full_silence
    floor_models = dataclasses.replace(models, new_vad=load_vad_factory(floor.vad))
    async with stage(floor, floor_models) as s:
        await s.session.submit_text(
            "Tell me a long story about a dragon who loves to sing, with many details."
        )
        await s.until_event(ChunkPlaybackStarted)
        await s.run_for(0.8)
        s.say(speech_48k("What is your favorite color?"), then_silence_s=1.5)
        s.say(speech_48k("And what is your favorite food?", lead_s=0.0), then_silence_s=4.0)
        cut = await s.until_event(Interruption, limit_s=10)
        assert cut.reason == "barge_in"
        await s.run_until(lambda: s.host_done, limit_s=20)
        await s.run_until(lambda: not s.session.conversation.speaking(), limit_s=30)
        heard = [t.text.lower() for t in s.of(UserTurn) if t.source == "voice"]
        if full_silence:
            assert len(heard) == 1 and "color" in heard[0] and "food" in heard[0], heard
        else:
            assert len(heard) == 2 and "color" in heard[0] and "food" in heard[1], heard


@pytest.mark.parametrize("within_ms", [2500, 0], ids=["continued", "continuing-off"])
async def test_the_host_going_on_after_a_finished_sounding_pause_continues_his_turn(
    settings: Settings, models: EngineModels, within_ms: int
) -> None:
    """His first words read as finished, so the turn ends at the short silence and she starts answering;
    he goes on ("cats or dogs?" after "which one do you like better,") and cuts that answer. The words he
    goes on with continue his turn: one turn answers both halves, the cut one is marked ``continued`` and
    the history keeps his words once. With continuing off (``continue_within_ms = 0``) the second half is a
    turn of its own. Silences are long (finished 1 s, the pause 1.6 s), so the pause's judgement is in
    before the short silence on any machine."""
    cont = settings.model_copy(deep=True)
    cont.vad.end_of_turn_finished_ms, cont.vad.end_of_turn_silence_ms = 1000, 3000
    cont.vad.continue_within_ms = within_ms
    async with stage(cont, dataclasses.replace(models, new_vad=load_vad_factory(cont.vad))) as s:
        s.say(speech_48k("What is your favorite color?"), then_silence_s=1.6)
        s.say(speech_48k("And what is your favorite food?", lead_s=0.0), then_silence_s=4.0)
        await s.run_until(lambda: s.host_done, limit_s=20)
        await s.run_until(lambda: len(s.of(TurnCompleted)) >= 2, limit_s=30)
        await s.run_for(0.2)  # the history is recorded after the turn completes
        first, second = [t for t in s.of(UserTurn) if t.source == "voice"]
        assert "color" in first.text.lower() and "food" not in first.text.lower()
        assert "food" in second.text.lower() and s.of(Interruption)[0].turn_id == first.turn_id
        done = {c.turn_id: c for c in s.of(TurnCompleted)}
        if not within_ms:
            assert second.continues is None and "color" not in second.text.lower(), second
            assert not any(c.continued for c in done.values())
            return
        assert second.continues == first.turn_id and second.text.lower().startswith(first.text.lower()), (
            second
        )
        assert done[first.turn_id].continued and done[first.turn_id].interrupted
        assert done[second.turn_id].continued is None and done[second.turn_id].played_text
        said = [user for user, _ in s.session.prompt.history]  # type: ignore[attr-defined]
        assert said == [second.text], said
