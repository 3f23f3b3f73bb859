"""Fixtures of the surfaces tests (real models, a live server with MQTT on an embedded broker)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from engine.config import Settings
from engine.models import EngineModels
from tests.surfaces.harness import LiveServer, base_settings, free_port, live_server, shared_models


@pytest.fixture(scope="session")
def surface_models() -> EngineModels:
    return shared_models()


@pytest.fixture
def surface_settings() -> Settings:
    s = base_settings()
    s.mqtt.enabled = True
    s.mqtt.url = "embedded"
    s.mqtt.embedded_port = free_port()
    return s


@pytest.fixture
async def surface_server(
    surface_settings: Settings, surface_models: EngineModels
) -> AsyncIterator[LiveServer]:
    async with live_server(surface_settings, surface_models) as srv:
        yield srv
