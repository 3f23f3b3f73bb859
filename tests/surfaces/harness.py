"""Shared harness of the surfaces and browser tests: models loaded once, a live server with surfaces."""

from __future__ import annotations

import asyncio
import functools
import secrets
import shutil
import socket
import subprocess
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import web

from engine.app import create_app, new_engine
from engine.config import Settings, load_settings
from engine.models import EngineModels, load_models
from engine.server.credentials import Credentials
from engine.server.engine import Engine
from engine.surfaces.hub import Surfaces
from engine.surfaces.routes import SURFACES_KEY

MOSQUITTO = shutil.which("mosquitto") or shutil.which("/usr/sbin/mosquitto")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def base_settings() -> Settings:
    s = load_settings(environ={})
    s.avatar.enabled = False  # video only in the tests that look at it (it costs CPU)
    s.avatar.cpu_kernels = "off"  # eager, as in tests/conftest.py's settings (why there)
    s.mqtt.enabled = False
    s.server.secrets_dir = tempfile.mkdtemp(prefix="idolcast-test-secrets-")  # the MQTT users, not var/
    s.llm.temperature = 0.0
    s.llm.max_new_tokens = 24
    return s


@functools.lru_cache(maxsize=1)
def shared_models() -> EngineModels:
    """The real bundled models, loaded once per test process (by the surfaces and browser tests)."""
    return load_models(base_settings())


class LiveServer:
    def __init__(self, engine: Engine, url: str, surfaces: Surfaces, credentials: Credentials) -> None:
        self.engine = engine
        self.url = url
        self.surfaces = surfaces
        self.credentials = credentials
        self.token = credentials.host_token

    @property
    def auth(self) -> dict[str, str]:
        """Headers that carry the host credential."""
        return {"Authorization": f"Bearer {self.token}"}


@asynccontextmanager
async def live_server(settings: Settings, models: EngineModels) -> AsyncIterator[LiveServer]:
    engine = new_engine(settings, models)  # with its persona, as engine/app.py builds it
    # A host token of its own (nothing written under var/): clients get it from LiveServer.auth.
    credentials = Credentials(secrets.token_urlsafe(24), None)
    app = create_app(settings, engine, credentials)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    hub = app[SURFACES_KEY]
    try:
        if hub.mqtt is not None:
            await asyncio.wait_for(hub.mqtt.connected.wait(), 10)
        yield LiveServer(engine, f"http://127.0.0.1:{port}", hub, credentials)
    finally:
        await runner.cleanup()


@asynccontextmanager
async def mosquitto() -> AsyncIterator[int]:
    """A real mosquitto broker on a free port."""
    assert MOSQUITTO is not None
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        MOSQUITTO, "-p", str(port), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        for _ in range(100):
            try:
                _, w = await asyncio.open_connection("127.0.0.1", port)
                w.close()
                break
            except OSError:
                await asyncio.sleep(0.05)
        yield port
    finally:
        proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 5)
        except TimeoutError:
            proc.kill()
            await proc.wait()


async def wait_for(pred: Any, limit_s: float, what: str, step: float = 0.05) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + limit_s
    while not pred():
        if loop.time() > end:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(step)
