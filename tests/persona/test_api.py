"""The HTTP API and the CLI over the same operations."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from engine.config import Settings
from persona.bank import MemoryBank
from persona.card import PersonaCard
from persona.cli import register
from persona.http import register_routes
from persona.prompt import PersonaPromptProvider

pytestmark = pytest.mark.integration


async def test_http_api(card: PersonaCard, bank: MemoryBank) -> None:
    provider = PersonaPromptProvider(card, bank)
    app = web.Application()
    register_routes(app, lambda: provider)
    async with TestClient(TestServer(app)) as client:
        r = await client.post("/api/memory", json={"text": "kenji likes ramen", "subject": "kenji"})
        assert r.status == 200
        mid = (await r.json())["id"]
        r = await client.get("/api/memory", params={"subject": "kenji"})
        assert [m["id"] for m in await r.json()] == [mid]
        r = await client.get("/api/memory/search", params={"q": "what food do I like?", "speaker": "kenji"})
        assert (await r.json())[0]["id"] == mid
        r = await client.patch(f"/api/memory/{mid}", json={"text": "kenji likes udon", "importance": 0.9})
        assert (await r.json())["text"] == "kenji likes udon"
        r = await client.get("/api/memory/export")
        exported = await r.json()
        assert exported["card"]["name"] == "Aiko" and len(exported["memories"]) == 1
        r = await client.post("/api/memory/import", data=b"{not json")
        assert r.status == 400 and "not valid JSON" in (await r.json())["error"]
        r = await client.post("/api/memory", json={"text": "x", "kind": "gossip"})
        assert r.status == 400 and "kind" in (await r.json())["error"]
        r = await client.patch("/api/memory/999999", json={"text": "x"})
        assert r.status == 404
        r = await client.post("/api/memory/import", json={"format": "nope"})
        assert r.status == 400
        r = await client.post("/api/memory/forget-viewer", json={"username": "kenji"})
        body = await r.json()
        assert r.status == 200 and body["memories"] == 1 and body["remaining_rows"] == 0
        r = await client.post("/api/memory/import?replace=1", json=exported)
        assert (await r.json())["memories"] == 1
        [restored] = await (await client.get("/api/memory")).json()
        assert restored["text"] == "kenji likes udon" and restored["importance"] == 0.9
        r = await client.delete(f"/api/memory/{restored['id']}")
        assert (await r.json())["deleted"] == [restored["id"]]
        r = await client.delete(f"/api/memory/{restored['id']}")
        assert r.status == 404
        r = await client.get("/api/persona")
        assert (await r.json())["card"]["id"] == "aiko"
        r = await client.post("/api/persona", json={"card": "builtin:nope"})
        assert r.status == 400
    await provider.close()


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="idolcast")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args, Settings()))


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = str(tmp_path / "m.sqlite3")
    assert _run(["persona", "validate", "builtin:default"]) == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text("id: x\nname: X\n", encoding="utf-8")
    assert _run(["persona", "validate", str(bad)]) == 1
    assert "self_description" in capsys.readouterr().err
    assert _run(["persona", "show"]) == 0
    assert "You are Aiko" in capsys.readouterr().out
    assert _run(["memory", "list", "--db", db]) == 0
    assert json.loads(capsys.readouterr().out) == []
    out = tmp_path / "export.json"
    assert _run(["memory", "export", "--db", db, "-o", str(out)]) == 0
    assert json.loads(out.read_text())["format"] == "idolcast-persona"
    assert _run(["memory", "import", "--db", db, str(out)]) == 0
    assert _run(["memory", "forget-viewer", "--db", db, "kenji"]) == 0
    assert '"remaining_rows": 0' in capsys.readouterr().out
    assert _run(["memory", "edit", "--db", db, "12345", "--importance", "0.3"]) == 2
    assert "no memory 12345" in capsys.readouterr().err
