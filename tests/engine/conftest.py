"""Engine fixtures: the real bundled models, loaded once per test run, and a live server."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from engine.config import Settings, load_settings
from engine.models import EngineModels, load_models
from engine.server.app import create_app
from engine.server.engine import Engine


@pytest.fixture(scope="session")
def settings() -> Settings:
    s = load_settings(environ={})
    s.avatar.enabled = False
    s.mqtt.enabled = False
    s.llm.temperature = 0.0
    s.llm.max_new_tokens = 40
    return s


@pytest.fixture(scope="session")
def models(settings: Settings) -> EngineModels:
    return load_models(settings)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LiveServer:
    def __init__(self, engine: Engine, url: str) -> None:
        self.engine = engine
        self.url = url


@pytest.fixture
async def server(settings: Settings, models: EngineModels) -> AsyncIterator[LiveServer]:
    async with live_server(settings, models) as s:
        yield s


@contextlib.asynccontextmanager
async def live_server(settings: Settings, models: EngineModels) -> AsyncIterator[LiveServer]:
    """An engine serving HTTP on a free port (shares the loaded models)."""
    engine = Engine(settings, models)
    app = create_app(settings, engine)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    try:
        yield LiveServer(engine, f"http://127.0.0.1:{port}")
    finally:
        await runner.cleanup()
