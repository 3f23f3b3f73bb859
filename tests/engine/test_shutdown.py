"""Engine.shutdown closes the models the engine loaded (and leaves alone the models it was handed)."""

from __future__ import annotations

import pytest

from engine.app import new_engine
from engine.config import Settings
from engine.models import EngineModels
from engine.server.engine import Engine
from tests.surfaces.harness import wait_for

pytestmark = pytest.mark.integration


async def test_shutdown_closes_the_models_it_loaded(settings: Settings) -> None:
    engine = new_engine(settings)
    engine.start_loading()
    await wait_for(lambda: engine.status.state != "loading", 120, "the models to load")
    assert engine.status.state == "ready", engine.status.error
    models = engine.models
    assert models is not None
    assert len((await models.tts.synthesize("Hello.")).pcm) > 0
    await engine.shutdown()
    with pytest.raises(RuntimeError, match="shutdown"):  # the TTS's worker thread is gone
        await models.tts.synthesize("Hello again.")


async def test_shutdown_leaves_the_models_it_was_handed(settings: Settings, models: EngineModels) -> None:
    engine = Engine(settings, models)
    await engine.shutdown()
    assert len((await models.tts.synthesize("Still here.")).pcm) > 0
