"""PersonaPromptProvider: layout, memory through a conversation, write-back rules, close()."""

from __future__ import annotations

import asyncio
import time

import pytest

from engine.events import UserTurn
from persona.bank import MemoryBank
from persona.card import PersonaCard
from persona.prompt import PersonaPromptProvider, ProviderSettings

pytestmark = pytest.mark.integration


def chat(text: str, who: str = "Kenji_77", t: float = 0.0) -> UserTurn:
    return UserTurn(t=t, text=text, source="chat", speaker=who)


async def test_remembers_a_viewer_across_turns(card: PersonaCard, bank: MemoryBank) -> None:
    p = PersonaPromptProvider(card, bank)
    prefix = card.system_prompt()
    await p.build_prompt(chat("hi Aiko! my name is Kenji and I'm from Osaka"))
    await p.record_turn(chat("hi Aiko! my name is Kenji and I'm from Osaka"), "Welcome Kenji!", False)
    await p.record_turn(chat("I love ramen, and my favourite anime is Mushishi", who="maria"), "Nice!", False)
    await p.flush()

    msgs = await p.build_prompt(chat("do you remember where I'm from?", t=5))
    assert msgs[0]["content"] == prefix  # stable system prefix (no summaries yet)
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant", "user"]
    last = msgs[-1]["content"]
    assert "Osaka" in last.split("<chat")[0]  # retrieved note, placed late, before the turn
    assert '<chat user="Kenji_77">do you remember where I\'m from?</chat>' in last
    assert "Mushishi" not in last  # maria's facts are not kenji's
    assert p.stats["last_retrieval_ms"] < 1000
    profile = bank.store.profile("aiko", "kenji_77")
    assert profile is not None and profile.display_name == "Kenji" and profile.turns == 1
    await p.close()


async def test_contradiction_and_duplicates(card: PersonaCard, bank: MemoryBank) -> None:
    p = PersonaPromptProvider(card, bank)
    await p.record_turn(chat("I'm from Lisbon"), "Lisbon!", False)
    await p.record_turn(chat("I'm from Lisbon, did I say that?"), "You did!", False)
    await p.record_turn(chat("I moved, now I live in Porto"), "Porto is lovely.", False)
    await p.flush()
    homes = bank.store.list_memories("aiko", subject="kenji_77", include_superseded=True)
    home = [m for m in homes if m.slot == "home"]
    active = [m for m in home if m.superseded_by is None]
    assert len(active) == 1 and "Porto" in active[0].text
    old = [m for m in home if m.superseded_by is not None]
    assert len(old) == 1 and "Lisbon" in old[0].text and old[0].mentions == 2  # merged, then superseded
    assert old[0].superseded_by == active[0].id
    assert [m.id for m in bank.store.history_of(active[0].id)] == [old[0].id]
    found = bank.search("where is kenji_77 from?", 5)
    assert found and "Porto" in found[0].memory.text and all("Lisbon" not in s.memory.text for s in found)
    await p.close()


async def test_close_cancels_slow_writeback_within_timeout(card: PersonaCard, hash_bank: MemoryBank) -> None:
    class Slow:
        def extract(self, turn: UserTurn, reply: str, card: PersonaCard) -> list:  # type: ignore[type-arg]
            time.sleep(0.3)
            return []

    p = PersonaPromptProvider(
        card, hash_bank, extractor=Slow(), settings=ProviderSettings(close_timeout_s=0.5)
    )
    for i in range(20):
        await p.record_turn(chat(f"message {i}"), "ok", False)
    t0 = time.perf_counter()
    await p.close()
    assert time.perf_counter() - t0 < 2.5
    assert p._worker is None and not [t for t in asyncio.all_tasks() if t.get_name().startswith("persona:")]


async def test_switch_persona_live(card: PersonaCard, hash_bank: MemoryBank, tmp_path) -> None:  # type: ignore[no-untyped-def]
    f = tmp_path / "mia.yaml"
    f.write_text("id: mia\nname: Mia\nself_description: a calm virtual DJ\n", encoding="utf-8")
    p = PersonaPromptProvider(card, hash_bank)
    await p.record_turn(chat("I like jazz"), "Jazz!", False)
    await p.switch_persona(str(f))
    msgs = await p.build_prompt(chat("who are you?"))
    assert msgs[0]["content"].startswith("You are Mia") and len(msgs) == 2
    said = p.guard("My name is Aiko!")  # her old name is now another identity: dropped, deflected
    assert said is None or "aiko" not in said.lower()
    assert p.guard("My name is Mia!") == "My name is Mia!"
    await p.close()


async def test_consolidation_only_drops_the_oldest_exchanges(
    card: PersonaCard, hash_bank: MemoryBank
) -> None:
    """The prompt's start never moves: the system message stays the card's, consolidation removes the oldest
    exchanges and nothing else (the rest stays where a KV-moving runtime finds it), and its summary is told
    once, in the next turn's message, then kept with that exchange."""
    p = PersonaPromptProvider(card, hash_bank)
    before: list[dict[str, str]] = []
    for i in range(40):
        turn = chat(f"tell me about the planet number {i} and its moons", t=float(i))
        msgs = await p.build_prompt(turn)
        assert msgs[0]["content"] == p.prefix
        if p._earlier:  # consolidated after the last turn: the history is what it was, less its front
            history = msgs[1:-1]
            assert history == before[len(before) - len(history) :]
            assert msgs[-1]["content"].startswith("(Earlier in this stream: Earlier (")
            maria = chat(f"tell me about the planet number {i} and its moons", who="maria", t=float(i))
            await p.record_turn(maria, f"Planet {i} has {i} moons!", False)
            assert not p._earlier
            told = (await p.build_prompt(chat("and then?", t=i + 0.5)))[-3]
            assert told["role"] == "user" and told["content"].startswith("(Earlier in this stream: ")
            assert f"planet number {i} " in told["content"]
            await p.forget_viewer("Kenji_77")  # his name leaves the summary maria's turn carried
            assert [e.speaker for e in p.history] == ["maria"] and not p.summaries
            assert (
                p.history[0].user
                == '<chat user="maria">' + f"tell me about the planet number {i} and its moons</chat>"
            )
            break
        await p.record_turn(turn, f"Planet {i} has {i} moons!", False)
        said = {"role": "user", "content": msgs[-1]["content"].split("\n\n")[-1]}  # without the notes
        before = [*msgs[1:-1], said, {"role": "assistant", "content": f"Planet {i} has {i} moons!"}]
    else:
        raise AssertionError("40 turns and the history never consolidated")
    await p.close()
