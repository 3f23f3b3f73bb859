"""Right to be forgotten: every row about the viewer is gone, from the tables, the files and the export."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.events import UserTurn
from persona import api
from persona.bank import MemoryBank
from persona.card import PersonaCard
from persona.prompt import PersonaPromptProvider

pytestmark = pytest.mark.integration


def chat(text: str, who: str) -> UserTurn:
    return UserTurn(t=0, text=text, source="chat", speaker=who)


async def test_forget_viewer_removes_everything(card: PersonaCard, bank: MemoryBank, tmp_path: Path) -> None:
    p = PersonaPromptProvider(card, bank)
    for text in [
        "my name is Quentin",
        "I'm from Zanzibar",
        "I love xylophones",
        "my favourite colour is vermilion",
    ]:
        await p.record_turn(chat(text, "Quux_42"), "Nice to meet you!", False)
    await p.record_turn(chat("I'm from Oslo", "maria"), "Hi Maria!", False)
    await p.flush()
    bank.add("Quux_42 won the karaoke contest on stream", kind="stream_event", subject="stream")
    bank.add("Quentin sent a fan letter", kind="stream_event", subject="stream")  # by display name
    with bank.write() as conn:
        bank.store.add_episode(
            conn, "aiko", 0, 1, 3, "Earlier: talked with quux_42 (zanzibar)", "quux_42,maria"
        )
    assert api.viewer_rows(bank, "quux_42") > 0
    bank.save_index()
    db = Path(bank.store.path)

    report = await p.forget_viewer("@Quux_42")

    assert report["profiles"] == 1 and report["memories"] >= 6 and report["episodes"] == 1
    rows = bank.store._read(
        "SELECT COUNT(*) FROM memories WHERE subject = 'quux_42' OR text LIKE '%quux%' OR text LIKE '%Quentin%' "
        "OR text LIKE '%Zanzibar%'"
    )
    assert rows[0][0] == 0
    assert bank.store._read("SELECT COUNT(*) FROM viewer_profiles WHERE username = 'quux_42'")[0][0] == 0
    assert bank.store._read("SELECT COUNT(*) FROM episodes WHERE summary LIKE '%quux%'")[0][0] == 0
    assert api.viewer_rows(bank, "quux_42") == 0
    assert bank.store.list_memories("aiko", subject="maria")  # others are untouched
    export = json.dumps(api.export_persona(bank, card)).lower()
    for needle in ("quux", "quentin", "zanzibar", "xylophone", "vermilion"):
        assert needle not in export
    assert all("zanzibar" not in s.memory.text.lower() for s in bank.search("who is from Zanzibar?", 10))
    assert all(e.speaker != "quux_42" for e in p.history)
    # truly gone from the disk: no trace in the database, its WAL, or a saved index
    for f in db.parent.iterdir():
        data = f.read_bytes()
        for needle in (b"Zanzibar", b"xylophones", b"vermilion", b"quux_42"):
            assert needle not in data, f"{needle!r} still in {f.name}"
    assert bank.store.integrity_check() == "ok"
    await p.close()
