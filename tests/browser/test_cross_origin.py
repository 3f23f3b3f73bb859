"""A page on another origin, in real Chromium, cannot change any state or read any data (issue 11).

The streamer has the console open (so her browser holds the host cookie: the worst case), then visits
a page served from another port of 127.0.0.1 (same site, other origin) and from ``localhost``. That page
tries every request the issue found working: no-cors text/plain POSTs (offer, host chat, say, memory,
RTMP to an attacker's URL, import with replace, forget-viewer, persona), CORS JSON requests, a DELETE,
the event WebSocket and reads of the memory export and the persona.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from engine.bench.voice import EngineConnection
from engine.clock import MediaClock
from engine.models import EngineModels
from tests.surfaces.harness import base_settings, free_port, live_server

pytestmark = [pytest.mark.browser, pytest.mark.integration]

ATTACK_JS = r"""
async (target) => {
  const out = {};
  const body = (o) => JSON.stringify(o);
  const posts = {
    offer: ["/api/offer", { sdp: "v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\n", type: "offer" }],
    chat_host: ["/api/sessions/latest/chat", { user: "evil", text: "obey me", role: "host" }],
    say: ["/api/sessions/latest/say", { text: "I hate all of my fans." }],
    memory: ["/api/memory", { text: "csrf-planted: the host is a liar" }],
    rtmp: ["/api/sessions/latest/rtmp", { url: "rtmp://127.0.0.1:1/live/stolen" }],
    import: ["/api/memory/import?replace=1", { format: "idolcast-persona", version: 1 }],
    forget: ["/api/memory/forget-viewer", { username: "kenji_77" }],
    persona: ["/api/persona", { card: "builtin:default" }],
    expression: ["/api/sessions/latest/expression", { name: "angry" }],
    token: ["/api/tokens", { label: "mine now" }],
  };
  for (const [name, [path, data]] of Object.entries(posts)) {
    // the CSRF form: no preflight, the response is opaque
    try {
      await fetch(target + path, { mode: "no-cors", method: "POST", credentials: "include",
        headers: { "Content-Type": "text/plain" }, body: body(data) });
      out[name + "_nocors"] = "sent";
    } catch (e) { out[name + "_nocors"] = "blocked"; }
    // the CORS form, with the JSON type: needs a preflight, which must fail
    try {
      const r = await fetch(target + path, { method: "POST", credentials: "include",
        headers: { "Content-Type": "application/json" }, body: body(data) });
      out[name + "_cors"] = "read:" + r.status;
    } catch (e) { out[name + "_cors"] = "blocked"; }
  }
  try {
    await fetch(target + "/api/sessions/latest", { method: "DELETE", credentials: "include" });
    out.delete = "sent";
  } catch (e) { out.delete = "blocked"; }
  for (const path of ["/api/memory/export", "/api/persona", "/api/streams", "/api/tokens"]) {
    try {
      const r = await fetch(target + path, { credentials: "include" });
      out["read " + path] = "read:" + (await r.text()).slice(0, 80);
    } catch (e) { out["read " + path] = "blocked"; }
  }
  out.ws = await new Promise((resolve) => {
    const ws = new WebSocket(target.replace("http", "ws") + "/api/sessions/latest/events");
    let got = "closed";
    ws.onmessage = (m) => { got = "message:" + String(m.data).slice(0, 60); };
    ws.onopen = () => { got = "open"; };
    ws.onclose = () => resolve(got);
    setTimeout(() => resolve(got + "(timeout)"), 4000);
  });
  return out;
}
"""


async def test_a_foreign_origin_page_changes_nothing_and_reads_nothing(
    launch: Any, surface_models: EngineModels, tmp_path: Path
) -> None:
    settings = base_settings()
    settings.persona.enabled = True
    settings.persona.memory_db = str(tmp_path / "memory.sqlite3")
    async with live_server(settings, surface_models) as server:
        engine = server.engine
        await engine.load_persona()
        bank = engine.persona.bank
        bank.add("kenji_77 lives in Osaka", kind="viewer_fact", subject="kenji_77")
        host = EngineConnection(server.url, MediaClock(), token=server.token)
        await host.open(with_video=False)
        attacker = web.Application()
        attacker.router.add_get(
            "/", lambda r: web.Response(text="<html><body>cute cats</body></html>", content_type="text/html")
        )
        runner = web.AppRunner(attacker)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            browser = await launch()
            context = await browser.new_context()
            console = await context.new_page()
            await console.goto(f"{server.url}/console/")  # the host cookie is now in this browser
            cookies = {c["name"] for c in await context.cookies(server.url)}
            assert "idolcast_host" in cookies
            results = {}
            for origin in (f"http://127.0.0.1:{port}", f"http://localhost:{port}"):
                page = await context.new_page()
                await page.goto(origin + "/")
                results[origin] = await page.evaluate(ATTACK_JS, server.url)
            for origin, out in results.items():
                for name, value in out.items():
                    assert not value.startswith("read:"), (origin, name, value)  # nothing readable
                    assert "message" not in value and value != "open", (origin, name, value)
            # and nothing changed
            assert list(engine.sessions) == [host.session_id]
            session = engine.sessions[host.session_id]
            assert not session.turns
            assert server.surfaces.chats[host.session_id].stats.get("accepted", 0) == 0
            assert not server.surfaces.rtmp
            texts = [m.text for m in bank.store.list_memories(bank.persona, limit=100)]
            assert texts == ["kenji_77 lives in Osaka"]
            assert engine.persona.card.id == "aiko"
            assert not server.credentials.viewers
            # the console itself still works with the same cookie (same origin)
            answer = await console.evaluate(
                "fetch('/api/memory/export').then((r) => r.json()).then((d) => d.memories.length)"
            )
            assert answer == 1
            async with aiohttp.ClientSession() as http:  # and a tool without the token gets 401
                async with http.get(f"{server.url}/api/memory/export") as r:
                    assert r.status == 401
        finally:
            await runner.cleanup()
            await host.close()
    assert json.dumps(results)  # the record of what was tried
