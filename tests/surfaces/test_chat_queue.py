"""The chat queue between two real parts: a session-shaped harness (real EventBus, scripted clock)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from engine.clock import ScriptedClock
from engine.config import ChatQueueConfig
from engine.events import FinalTranscript, SpeechStarted, TurnCompleted, TurnSource, UserTurn
from engine.session.bus import EventBus
from engine.surfaces.chat_queue import ChatQueue
from engine.surfaces.payloads import ChatIn

pytestmark = pytest.mark.unit


class SessionHarness:
    """What the chat queue sees of a session: its bus, its clock and ``submit_text``.

    Turns are recorded and announced on the bus like the real session does; ``finish`` completes one.
    """

    def __init__(self) -> None:
        self.id = "s1"
        self.clock = ScriptedClock()
        self.bus = EventBus()
        self.turns: list[tuple[str, str, str]] = []

    async def submit_text(self, text: str, speaker: str = "host", source: TurnSource = "host_text") -> int:
        self.turns.append((text, speaker, source))
        self.bus.publish(
            UserTurn(
                t=self.clock.now(),
                turn_id=len(self.turns),
                text=text,
                source=source,
                speaker=speaker,
            )
        )
        return len(self.turns)

    def finish(self) -> None:
        self.bus.publish(
            TurnCompleted(t=self.clock.now(), turn_id=len(self.turns), played_text="", interrupted=False)
        )


def msg(user: str, text: str, role: str = "chat", **kw: Any) -> ChatIn:
    return ChatIn.model_validate({"user": user, "text": text, "role": role, **kw})


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def make(**cfg: Any) -> tuple[SessionHarness, ChatQueue]:
    s = SessionHarness()
    config = ChatQueueConfig.model_validate({"min_turn_gap_s": 0, **cfg})
    return s, ChatQueue(s, config)  # type: ignore[arg-type]


async def test_priority_host_then_members_then_chat() -> None:
    s, q = make()
    s.bus.publish(UserTurn(t=0, text="", source="voice"))  # busy: a voice turn is being answered
    assert q.offer(msg("ann", "first from chat")) == "accepted"
    assert q.offer(msg("bob", "a member speaks", "member")) == "accepted"
    assert q.offer(msg("host", "host text", "host")) == "accepted"
    await settle()
    assert [t[0] for t in s.turns] == ["host text"], "the host does not wait for idle"
    s.finish()  # the host's text turn is done
    s.finish()  # and the voice turn
    await asyncio.sleep(0.01)
    assert [t[0] for t in s.turns][1:] == ["a member speaks"], "one chat turn at a time, members first"
    assert s.turns[1][1:] == ("bob", "chat")
    s.finish()
    await asyncio.sleep(0.01)
    assert [t[0] for t in s.turns][2:] == ["first from chat"]
    await q.close()


async def test_moderation_verdicts() -> None:
    s, q = make(blocklist_users=["troll"], blocklist_words=["spoiler"], user_cooldown_s=10, max_chars=20)
    s.bus.publish(UserTurn(t=0, text="", source="voice"))  # keep everything queued
    assert q.offer(msg("troll", "hello")) == "blocked"
    assert q.offer(msg("ann", "big SPOILER ahead")) == "blocked"
    assert q.offer(msg("ann", "x" * 21)) == "too_long"
    assert q.offer(msg("ann", "hello there")) == "accepted"
    assert q.offer(msg("ann", "again")) == "cooldown"
    assert q.offer(msg("bob", "Hello   THERE")) == "duplicate"
    s.clock.advance(11)
    assert q.offer(msg("ann", "again")) == "accepted"
    assert q.offer(msg("cat", "other", id="m1")) == "accepted"
    assert q.offer(msg("dan", "different text", id="m1")) == "duplicate"
    assert q.stats["accepted"] == 3
    await q.close()


async def test_flood_is_capped_and_bounded() -> None:
    s, q = make(flood_rate_per_s=5, flood_burst=10, max_pending=8, user_cooldown_s=0)
    s.bus.publish(UserTurn(t=0, text="", source="voice"))
    verdicts = [q.offer(msg(f"u{i}", f"message number {i}")) for i in range(1000)]
    assert verdicts.count("accepted") == 8 and q.pending == 8
    assert verdicts.count("flood") == 990 and verdicts.count("queue_full") == 2
    # a member's message still gets in, evicting the newest plain chat
    s.clock.advance(1)
    assert q.offer(msg("vip", "member here", "member")) == "accepted"
    assert q.pending == 8 and q.stats["evicted"] == 1
    await q.close()


async def test_chat_waits_while_the_host_speaks_and_expires() -> None:
    s, q = make(max_age_s=5)
    s.bus.publish(SpeechStarted(t=0))
    q.offer(msg("ann", "hi idol"))
    await asyncio.sleep(0.01)
    assert s.turns == [], "chat is held while the host is speaking"
    s.bus.publish(FinalTranscript(t=0, text=""))
    await asyncio.sleep(0.01)
    assert [t[0] for t in s.turns] == ["hi idol"]
    s.finish()
    s.bus.publish(UserTurn(t=0, text="", source="voice"))
    q.offer(msg("bob", "too late"))
    s.clock.advance(6)
    s.finish()
    await asyncio.sleep(0.01)
    assert len(s.turns) == 1 and q.stats["expired"] == 1
    await q.close()


def test_twitch_bridge_parses_irc_privmsg() -> None:
    from examples.twitch_bridge import parse_privmsg

    line = (
        "@badge-info=;badges=subscriber/12;display-name=Mika;id=abc-1;mod=0 "
        ":mika!mika@mika.tmi.twitch.tv PRIVMSG #idol :hi Aiko!"
    )
    assert parse_privmsg(line) == {
        "user": "Mika",
        "text": "hi Aiko!",
        "role": "member",
        "id": "abc-1",
        "platform": "twitch",
    }
    assert parse_privmsg(":tmi.twitch.tv 001 justinfan1 :Welcome") is None
    parsed = parse_privmsg("@badges=broadcaster/1;display-name=Idol :idol!idol@x PRIVMSG #idol :go")
    assert parsed is not None and parsed["role"] == "member"  # a viewers' bridge never claims the host
    ChatIn.model_validate(parsed)  # what the bridge sends is what the engine accepts
