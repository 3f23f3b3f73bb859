"""`idolcast bench --browser-jitter`: Chromium's own receive-buffer figure for the idol's audio."""

from __future__ import annotations

import pytest

from engine.bench.browser_receiver import measure_browser_jitter
from engine.bench.chromium import CHROMIUM, HAVE_CHROMIUM
from engine.models import EngineModels
from tests.surfaces.harness import base_settings, live_server

pytestmark = pytest.mark.integration


async def test_chromium_reports_its_audio_jitter_buffer(surface_models: EngineModels) -> None:
    if not HAVE_CHROMIUM:
        pytest.skip(f"Chromium is not installed at {CHROMIUM}")
    settings = base_settings()
    settings.avatar.enabled = False
    async with live_server(settings, surface_models) as server:
        report = await measure_browser_jitter(
            server.url, prompts=("Say hello to the chat.",), reply_wait_s=6.0
        )
    assert report["samples_emitted"] > 48000 // 2, report  # it played at least half a second of her voice
    # A real figure: more than nothing, less than anything a browser would hold on loopback.
    assert 5.0 < report["jitter_buffer_delay_ms"] < 500.0, report
