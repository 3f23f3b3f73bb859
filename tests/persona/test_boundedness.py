"""1,000 turns: the prompt never exceeds its budget and memory stays flat."""

from __future__ import annotations

import gc
import random
import tracemalloc

import pytest

from engine.events import UserTurn
from persona.bank import MemoryBank
from persona.card import PersonaCard
from persona.prompt import PersonaPromptProvider, ProviderSettings
from persona.tokens import MESSAGE_OVERHEAD, approx_tokens

pytestmark = pytest.mark.integration

TEMPLATES = [
    "my favourite {x} is {y}",
    "I'm from {y}",
    "I love {x}",
    "what do you think about {x}?",
    "lol that's so {y}",
    "Aiko can you sing something about {x}?",
    "I hate {x} honestly",
    "I work as a {y}",
    "good morning chat!",
    "how was your day Aiko? mine was full of {x}",
]
XS = ["food", "anime", "rain", "cats", "music", "games", "coffee", "tea"]
YS = ["Osaka", "Lima", "teacher", "cute", "ramen", "blue", "Oslo", "nurse"]


async def test_thousand_turn_session_is_bounded(card: PersonaCard, bank: MemoryBank) -> None:
    budget = 1536
    # the embedding cache is an LRU bounded by cache_size: keep the bound small here so it is reached
    # well before the measured window (at the default 4,096 it would still be filling up)
    cache_size = bank.embedder.cache_size  # type: ignore[attr-defined]
    bank.embedder.cache_size = 128  # type: ignore[attr-defined]
    p = PersonaPromptProvider(card, bank, settings=ProviderSettings(token_budget=budget))
    rng = random.Random(1)
    speakers = [f"viewer{i}" for i in range(25)]
    samples: dict[int, int] = {}
    max_history = 0
    for i in range(1000):
        text = rng.choice(TEMPLATES).format(x=rng.choice(XS), y=rng.choice(YS))
        turn = UserTurn(
            t=float(i), text=text, source="chat" if i % 7 else "voice", speaker=rng.choice(speakers)
        )
        msgs = await p.build_prompt(turn)
        total = sum(approx_tokens(m["content"]) + MESSAGE_OVERHEAD for m in msgs)
        assert total <= budget, f"turn {i}: {total} tokens"
        assert msgs[0]["content"].startswith(p.prefix)
        reply = f"Oh nice, {turn.speaker}! " + "That sounds really fun, tell me more. " * rng.randint(1, 4)
        await p.record_turn(turn, reply, interrupted=i % 11 == 0)
        max_history = max(max_history, len(p.history))
        if i == 250:
            tracemalloc.start()  # traces what is allocated from here on (and costs less before)
        if i % 50 == 49 and i > 250:
            await p.flush()
            gc.collect()
            samples[i] = tracemalloc.get_traced_memory()[0]
    await p.flush()
    tracemalloc.stop()
    assert max_history <= 40 and len(p.summaries) <= p.settings.max_summaries
    assert p.stats["writeback_dropped"] == 0
    growth = samples[999] - samples[299]
    assert growth < 1_000_000, f"Python heap grew {growth} bytes from turn 300 to 1000"
    assert len(bank.store.episodes("aiko")) > 10  # consolidation happened and was persisted
    await p.close()
    bank.embedder.cache_size = cache_size  # type: ignore[attr-defined]
