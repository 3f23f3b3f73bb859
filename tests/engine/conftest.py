"""Engine fixtures: the real bundled models, loaded once per test run, and a live server."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import pytest

from engine.bench.voice import EngineConnection
from engine.clock import MediaClock
from engine.config import Settings
from engine.models import EngineModels
from tests.surfaces.harness import LiveServer, free_port, live_server

# One live-server harness for every test suite (tests/surfaces/harness.py); re-exported for these tests.
__all__ = ["LiveServer", "connected", "free_port", "live_server"]


@contextlib.asynccontextmanager
async def connected(server: LiveServer, with_video: bool = True) -> AsyncIterator[EngineConnection]:
    """The bench's client (a real aiortc peer), connected to the live ``server``; closed on exit."""
    c = EngineConnection(server.url, MediaClock(), token=server.token)
    await c.open(with_video=with_video)
    try:
        yield c
    finally:
        await c.close()


@pytest.fixture
async def server(settings: Settings, models: EngineModels) -> AsyncIterator[LiveServer]:
    async with live_server(settings, models) as s:
        yield s
