"""A session talking through the persona memory bank: what a viewer says is remembered and recalled."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from engine.config import Settings
from engine.models import EngineModels
from tests.engine.conftest import LiveServer, connected, live_server

pytestmark = pytest.mark.integration


@pytest.fixture
async def persona_server(
    settings: Settings, models: EngineModels, tmp_path: Path
) -> AsyncIterator[LiveServer]:
    s = settings.model_copy(deep=True)
    s.persona.enabled = True
    s.persona.memory_db = str(tmp_path / "memory.sqlite3")
    async with live_server(s, models) as server:
        await server.engine.load_persona()
        yield server


async def test_a_viewer_fact_is_written_back_and_recalled(persona_server: LiveServer) -> None:
    engine = persona_server.engine
    async with connected(persona_server, with_video=False) as conn:
        session = engine.sessions[conn.session_id]
        assert session.prompt is engine.persona
        async with aiohttp.ClientSession(headers=persona_server.auth) as http:
            url = f"{persona_server.url}/api/sessions/{conn.session_id}/say"
            async with http.post(url, json={"text": "My favourite food is ramen.", "speaker": "kenji"}) as r:
                assert r.status == 202
            await conn.wait_event("turn_completed", 120)
            await engine.persona.flush()  # write-back runs after the turn, off the hot path
            async with http.get(f"{persona_server.url}/api/memory/search", params={"q": "ramen"}) as r:
                found = await r.json()
            assert r.status == 200, found
            assert any("ramen" in str(m).lower() for m in found), found
            async with http.post(url, json={"text": "What food do I like?", "speaker": "kenji"}) as r:
                assert r.status == 202
            await conn.wait_event("turn_completed", 120)
        recalled = " ".join(str(m) for m in engine.persona.last_memories).lower()
        assert "ramen" in recalled, recalled
    await asyncio.sleep(0)
