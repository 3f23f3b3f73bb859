"""The OBS page in a real Chromium, default configuration: transparent out of the box.

The session's own picture stays plain (``avatar.packed_alpha`` off, as shipped); the page, a WHEP viewer,
asks for the packed picture (colour | alpha side by side) on its own tap and recombines it on a transparent
WebGL canvas. The whole path runs for real: render → I420 → media tap → WHEP → VP8 → WebGL.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pytest
from PIL import Image

from engine.bench.voice import EngineConnection
from engine.clock import MediaClock
from engine.models import EngineModels
from tests.surfaces.harness import base_settings, live_server

pytestmark = [pytest.mark.browser, pytest.mark.integration]

W, H, FPS = 160, 120, 15


async def test_obs_page_is_transparent_where_the_idol_is_not(
    launch: Any, surface_models: EngineModels
) -> None:
    settings = base_settings()
    settings.avatar.enabled = True  # the real character; avatar.packed_alpha and the rest as shipped
    assert settings.avatar.packed_alpha is False
    settings.avatar.profile = "360p"
    async with live_server(settings, surface_models) as server:
        assert server.engine.render_pool is not None
        await server.engine.render_pool.prepare("360p")
        host = EngineConnection(server.url, MediaClock(), token=server.token)
        await host.open()
        try:
            browser = await launch()
            page = await browser.new_page(viewport={"width": 320, "height": 240})
            await page.goto(f"{server.url}/obs/?session={host.session_id}&status=0")
            await page.wait_for_function(
                "window.idolObs.connected && window.idolObs.renderer.frames > 5", timeout=20_000
            )
            shot = Image.open(io.BytesIO(await page.screenshot(omit_background=True))).convert("RGBA")
            px = np.asarray(shot)
            corner = px[5, 5]
            assert corner[3] == 0, f"transparent outside the idol, got {corner}"
            opaque = px[..., 3] >= 250
            assert opaque.mean() > 0.02, "the idol is drawn opaque"
            assert (px[..., 3] == 0).mean() > 0.1, "and the background is transparent"
            centre = px[px.shape[0] // 2, px.shape[1] // 2]
            assert centre[3] >= 250, f"the middle of the frame is the idol, opaque: {centre}"
            # the canvas shows the colour half only (the alpha half is not drawn)
            size = await page.evaluate(
                "[document.getElementById('canvas').width, document.getElementById('canvas').height,"
                " document.getElementById('video').videoWidth]"
            )
            assert size[2] == 2 * size[0], size
            # while the session's own picture (what the console shows) stays plain
            video = server.engine.sessions[host.session_id].video_source  # the SessionVideo
            assert video.pictures == {"own": (640, 360), "packed": (1280, 360)}, video.pictures
        finally:
            await host.close()
