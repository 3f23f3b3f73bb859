"""SIGTERM to a real ``idolcast serve`` mid-conversation: the turn in flight completes, new
sessions are refused with the reason, readiness turns false, what was said is written back,
and the process exits 0 (engine/server/drain.py)."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiortc import RTCPeerConnection

from engine.bench.voice import EngineConnection
from engine.clock import MediaClock
from engine.config import ServerConfig, Settings
from tests.surfaces.harness import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
TOKEN = "drain-test-host-token-0123456789abcdef"


def serve_env(tmp: Path, port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("IDOLCAST_")}
    env |= {
        "IDOLCAST_SERVER__PORT": str(port),
        "IDOLCAST_SERVER__DRAIN_TIMEOUT_S": "90",
        "IDOLCAST_MQTT__ENABLED": "false",
        "IDOLCAST_AVATAR__ENABLED": "false",
        "IDOLCAST_LLM__MAX_NEW_TOKENS": "24",
        "IDOLCAST_LLM__TEMPERATURE": "0",
        "IDOLCAST_PERSONA__MEMORY_DB": str(tmp / "memory.sqlite3"),
        "IDOLCAST_PERSONA_CACHE": str(ROOT / "var" / "cache" / "persona"),
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": str(ROOT),
    }
    if "capacity" in Settings.model_fields:  # a busy test machine must not refuse the one session
        env["IDOLCAST_CAPACITY__ADMISSION"] = "false"
    if "host_token" in ServerConfig.model_fields:  # the engine asks for a host credential
        env |= {"IDOLCAST_SERVER__HOST_TOKEN": TOKEN, "IDOLCAST_SERVER__SECRETS_DIR": str(tmp / "secrets")}
    return env


def start_serve(tmp: Path, port: int, log: Any) -> subprocess.Popen[bytes]:
    """The real command, in its own folder (var/ there), its output in ``log``."""
    return subprocess.Popen(
        [str(Path(sys.executable).parent / "idolcast"), "serve"],
        cwd=tmp,
        env=serve_env(tmp, port),
        stdout=log,
        stderr=subprocess.STDOUT,
    )


async def get_json(http: aiohttp.ClientSession, url: str) -> tuple[int, dict[str, Any]]:
    async with http.get(url) as r:
        return r.status, await r.json()


async def wait_ready(
    http: aiohttp.ClientSession, url: str, proc: subprocess.Popen[bytes], limit_s: float
) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"idolcast serve exited with {proc.returncode}"
        try:
            status, body = await get_json(http, f"{url}/api/health?ready=1")
            if status == 200:
                assert body["admitting"] is True and body["draining"] is False
                return
            assert body["state"] != "failed", body
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(1.0)
    raise AssertionError("the engine did not become ready")


async def an_offer() -> str:
    pc = RTCPeerConnection()
    pc.addTransceiver("audio", direction="sendrecv")
    await pc.setLocalDescription(await pc.createOffer())
    sdp = pc.localDescription.sdp
    await pc.close()
    return sdp


@pytest.mark.timeout(420)
async def test_sigterm_drains_mid_turn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = (tmp_path / "serve.log").open("wb")
    proc = start_serve(tmp_path, port, log)
    monkeypatch.setenv("IDOLCAST_TOKEN", TOKEN)  # the bench client's host credential
    auth = {"Authorization": f"Bearer {TOKEN}"}
    conn: EngineConnection | None = None
    try:
        async with aiohttp.ClientSession(headers=auth) as http:
            await wait_ready(http, url, proc, 300)
            conn = EngineConnection(url, MediaClock())
            await conn.open(with_video=False)
            said = "hi Aiko! I live in Sapporo, and my favourite anime is Mushishi. What do you like?"
            async with http.post(
                f"{url}/api/sessions/{conn.session_id}/say", json={"text": said, "speaker": "mika"}
            ) as r:
                assert r.status == 202, await r.text()
                turn_id = (await r.json())["turn_id"]
            proc.send_signal(signal.SIGTERM)  # the turn is in flight

            notice = await conn.wait_event("draining", 30)
            assert "no new sessions" in notice["message"] and notice["deadline_s"] == 90
            status, body = await get_json(http, f"{url}/api/health?ready=1")
            assert status == 503 and body["draining"] is True and body["admitting"] is False
            assert (await get_json(http, f"{url}/api/health"))[0] == 200  # alive: liveness holds
            async with http.post(f"{url}/api/offer", json={"sdp": await an_offer(), "type": "offer"}) as r:
                refusal = await r.text()
                assert r.status == 503 and "draining" in refusal, refusal

            done = await conn.wait_event("turn_completed", 120)
            assert done["turn_id"] == turn_id and not done["interrupted"] and done["played_text"].strip()
            assert proc.poll() is None  # still draining: the session is open
            await conn.close()  # the host ends the show: the drain is over
            conn = None
        rc = await asyncio.to_thread(proc.wait, 60)
    finally:
        if conn is not None:
            await conn.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    out = (tmp_path / "serve.log").read_text(errors="replace")
    assert rc == 0, out[-3000:]
    assert "drained in" in out
    db = sqlite3.connect(tmp_path / "memory.sqlite3")
    texts = [r[0] for r in db.execute("SELECT text FROM memories WHERE subject = 'mika'")]
    turns = db.execute("SELECT turns FROM viewer_profiles WHERE username = 'mika'").fetchall()
    db.close()
    assert any("Sapporo" in t for t in texts) and any("Mushishi" in t for t in texts), texts
    assert turns == [(1,)]
