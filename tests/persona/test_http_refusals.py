"""The memory and persona HTTP API refuses what it must, without echoing or losing anything (issue 11)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from persona.bank import MemoryBank
from persona.card import PersonaCard
from persona.http import register_routes
from persona.prompt import PersonaPromptProvider

pytestmark = pytest.mark.integration
SECRET = "hunter2-very-private-value"


@pytest.fixture
async def client(card: PersonaCard, bank: MemoryBank, tmp_path: Path) -> TestClient:  # type: ignore[misc]
    cards = tmp_path / "cards"
    cards.mkdir()
    (cards / "mika.yaml").write_text("name: Mika\nid: mika\nself_description: a calm idol who loves jazz\n")
    (cards / "broken.yaml").write_text(f"name: 12\nid: [{SECRET}]\n")
    provider = PersonaPromptProvider(card, bank)
    app = web.Application()
    register_routes(app, lambda: provider, cards)
    async with TestClient(TestServer(app)) as c:
        yield c
    await provider.close()


async def test_persona_card_paths_are_refused_without_echo(client: TestClient, tmp_path: Path) -> None:
    private = tmp_path / "private.json"
    private.write_text(json.dumps({"name": 1, "id": SECRET, "api_key": SECRET}))
    outside = tmp_path / "cards" / ".." / "private"
    for ref in (str(private), "../private", str(outside), "/etc/passwd", "cards/mika", "mika.yaml", "~/x"):
        r = await client.post("/api/persona", json={"card": ref})
        text = await r.text()
        assert r.status == 400, ref
        assert SECRET not in text and str(tmp_path) not in text, text
    # a file's existence is not told either: an unknown name and a path read the same
    r = await client.post("/api/persona", json={"card": "nosuchcard"})
    assert r.status == 400 and "no persona card 'nosuchcard'" in (await r.json())["error"]
    r = await client.post("/api/persona", json={"card": "broken"})
    text = await r.text()
    assert r.status == 400 and "field" in text and SECRET not in text and str(tmp_path) not in text
    r = await client.post("/api/persona", json={"card": "mika"})
    assert r.status == 200 and (await r.json())["persona"] == "mika"
    r = await client.get("/api/persona")
    assert (await r.json())["card"]["name"] == "Mika"


async def test_persona_card_upload_is_capped_and_parsed(client: TestClient) -> None:
    r = await client.post(
        "/api/persona", json={"card": {"name": "Rin", "id": "rin", "self_description": "a dancer"}}
    )
    assert r.status == 200 and (await r.json())["persona"] == "rin"
    r = await client.post("/api/persona", json={"card": {"name": SECRET * 0, "id": [SECRET]}})
    assert r.status == 400 and SECRET not in await r.text()
    big = {"name": "Big", "id": "big", "self_description": "x" * 70_000}
    r = await client.post("/api/persona", json={"card": big})
    assert r.status == 400 and "too large" in (await r.json())["error"]


async def test_forget_viewer_refuses_a_blank_username(client: TestClient) -> None:
    r = await client.post("/api/memory", json={"text": "kenji lives in Osaka", "subject": "kenji"})
    assert r.status == 200
    for blank in ("", "   ", "\t"):
        r = await client.post("/api/memory/forget-viewer", json={"username": blank})
        assert r.status == 400 and "username" in (await r.json())["error"]
    r = await client.get("/api/memory", params={"subject": "kenji"})
    assert len(await r.json()) == 1  # nothing was lost


async def test_huge_ids_and_deep_json_are_400_not_500(client: TestClient) -> None:
    for mid in ("1" * 24, "-" + "9" * 30):
        r = await client.delete(f"/api/memory/{mid}")
        assert r.status == 400, (mid, await r.text())
        r = await client.patch(f"/api/memory/{mid}", json={"text": "x"})
        assert r.status == 400
    r = await client.delete(f"/api/memory/{2**63 - 1}")
    assert r.status == 404
    deep = ("[" * 100_000 + "]" * 100_000).encode()
    for path in ("/api/memory", "/api/memory/import", "/api/persona", "/api/memory/forget-viewer"):
        r = await client.post(path, data=deep, headers={"Content-Type": "application/json"})
        assert r.status == 400, (path, r.status)
