"""The OBS page in a real Chromium: a packed-alpha stream recombined on a transparent canvas.

Until the avatar's video track lands, the session gets a synthetic track in the same packed format
(colour | alpha side by side, yuv420p) so the whole path — session video → media tap → WHEP → WebGL —
runs for real. When ``session.video_track`` exists the real one is used instead.
"""

from __future__ import annotations

import fractions
import io
import os
from typing import Any

import numpy as np
import pytest
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from av import VideoFrame
from PIL import Image

from engine.bench.voice import EngineConnection
from engine.clock import Clock, MediaClock
from engine.models import EngineModels
from engine.session.session import Session
from tests.surfaces.harness import base_settings, live_server

pytestmark = [pytest.mark.browser, pytest.mark.integration]

W, H, FPS = 160, 120, 15
COLOUR = (230, 40, 200)


class PackedDiscTrack(MediaStreamTrack):
    """A magenta disc (colour half) with its alpha (grey half): the avatar's packed-alpha format."""

    kind = "video"

    def __init__(self, clock: Clock) -> None:
        super().__init__()
        self.clock = clock
        yy, xx = np.mgrid[0:H, 0:W]
        disc = (xx - W / 2) ** 2 + (yy - H / 2) ** 2 < (H / 3) ** 2
        img = np.zeros((H, 2 * W, 3), np.uint8)
        img[:, :W][disc] = COLOUR
        img[:, W:][disc] = 255
        self.image = img
        self.index = 0
        self.t0: float | None = None

    async def recv(self) -> VideoFrame:
        if self.readyState != "live":
            raise MediaStreamError
        if self.t0 is None:
            self.t0 = self.clock.now()
        t = self.t0 + self.index / FPS
        await self.clock.sleep_until(t)
        self.index += 1
        frame = VideoFrame.from_ndarray(self.image, format="rgb24").reformat(format="yuv420p")
        frame.pts = round(t * 90000)
        frame.time_base = fractions.Fraction(1, 90000)
        return frame


async def test_obs_page_is_transparent_where_the_idol_is_not(
    launch: Any, surface_models: EngineModels
) -> None:
    settings = base_settings()
    # The real avatar track (IDOLCAST_TEST_AVATAR=1) crashed the test process natively (SIGSEGV) on the
    # 2-core CI box; until that is found the synthetic track in the same packed format stands in.
    settings.avatar.enabled = os.environ.get("IDOLCAST_TEST_AVATAR") == "1"
    settings.avatar.packed_alpha = True
    settings.avatar.profile = "360p"
    async with live_server(settings, surface_models) as server:
        if server.engine.render_pool is not None:
            await server.engine.render_pool.prepare("360p")

        async def give_video(session: Session) -> None:  # only while sessions have no video of their own
            if getattr(session, "video_track", None) is None:
                session.video_track = PackedDiscTrack(session.clock)  # type: ignore[attr-defined]

        hooks = server.engine.on_session_created
        hooks.insert(len(hooks) - 1, give_video)  # after the avatar's hook, before the surfaces' (the last)
        host = EngineConnection(server.url, MediaClock())
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
            synthetic = isinstance(server.engine.sessions[host.session_id].video_track, PackedDiscTrack)
            opaque = px[..., 3] >= 250
            assert opaque.mean() > 0.02, "the idol is drawn opaque"
            assert (px[..., 3] == 0).mean() > 0.1, "and the background is transparent"
            if synthetic:
                centre = px[px.shape[0] // 2, px.shape[1] // 2]
                assert centre[3] >= 250 and np.abs(centre[:3].astype(int) - COLOUR).max() < 40, centre
            # the canvas shows the colour half only (the alpha half is not drawn)
            size = await page.evaluate(
                "[document.getElementById('canvas').width, document.getElementById('canvas').height,"
                " document.getElementById('video').videoWidth]"
            )
            assert size[2] == 2 * size[0], size
        finally:
            await host.close()
