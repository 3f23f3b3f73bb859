"""Engine fixtures: the real bundled models, loaded once per test run, and a live server."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from engine.config import Settings, load_settings
from engine.models import EngineModels, load_models
from tests.surfaces.harness import LiveServer, free_port, live_server


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


# One live-server harness for every test suite (tests/surfaces/harness.py); re-exported for these tests.
__all__ = ["LiveServer", "free_port", "live_server"]


@pytest.fixture
async def server(settings: Settings, models: EngineModels) -> AsyncIterator[LiveServer]:
    async with live_server(settings, models) as s:
        yield s
