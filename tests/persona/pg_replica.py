"""One engine replica's memory, as a separate process over a shared PostgreSQL (for the tests).

Reads one JSON command a line on stdin, answers one JSON line on stdout:
``{"op": "tell", "who": ..., "text": ...}`` (a chat turn, written back), ``{"op": "recall",
"who": ..., "text": ...}`` (the prompt a turn would get, and the search hits), ``{"op":
"forget", "who": ...}``, ``{"op": "indexed", "ids": [...]}`` (which ids the local index holds).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from engine.events import UserTurn  # noqa: E402
from engine.native import preload_native_modules  # noqa: E402


async def main(dsn: str) -> None:
    preload_native_modules()
    from persona.bank import MemoryBank
    from persona.card import load_card
    from persona.embed import MiniLMEmbedder
    from persona.prompt import PersonaPromptProvider

    card = load_card("builtin:default")
    bank = MemoryBank.open_postgres(dsn, MiniLMEmbedder(), card.id)
    provider = PersonaPromptProvider(card, bank)
    print(json.dumps({"ready": True, "indexed": len(bank.index)}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        out: dict[str, Any] = {}
        if cmd["op"] == "tell":
            turn = UserTurn(t=0.0, text=cmd["text"], source="chat", speaker=cmd["who"])
            await provider.build_prompt(turn)
            await provider.record_turn(turn, "Oh, nice!", False)
            await provider.flush()
            out["ids"] = [m.id for m in bank.store.list_memories(card.id, subject=cmd["who"].lower())]
        elif cmd["op"] == "recall":
            turn = UserTurn(t=1.0, text=cmd["text"], source="chat", speaker=cmd["who"])
            msgs = await provider.build_prompt(turn)
            out["prompt"] = msgs[-1]["content"]
            out["hits"] = [
                s.memory.text for s in await asyncio.to_thread(bank.search, cmd["text"], 5, cmd["who"])
            ]
        elif cmd["op"] == "forget":
            out = dict(await asyncio.to_thread(bank.forget_viewer, cmd["who"]))
        elif cmd["op"] == "indexed":
            await asyncio.to_thread(bank.sync)
            out["indexed"] = [i for i in cmd["ids"] if int(i) in bank.index]
        print(json.dumps(out, default=str), flush=True)
    await provider.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
