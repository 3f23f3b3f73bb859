"""Session fixtures: the real bundled models, loaded once per test run (no server)."""

from __future__ import annotations

import pytest

from engine.config import Settings, load_settings
from engine.models import EngineModels, load_models


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
