"""Sessions that cannot leak (issue 11): bad offers leave nothing behind, unconnected peers are reaped,
``latest`` is the newest *connected* host session."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiortc import RTCPeerConnection

from engine.bench.voice import EngineConnection
from engine.clock import MediaClock
from engine.models import EngineModels
from tests.surfaces.harness import base_settings, live_server, wait_for

pytestmark = pytest.mark.integration

# Offers that pass the first checks (v=0, an m= line) and then fail inside aiortc in different ways.
BAD_OFFERS = [
    "v=0\r\nm=audio\r\n",
    "v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\n",
    "v=0\r\no=- 0 0 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\na=rtpmap:111 opus/48000/2\r\n",
    "v=0\r\no=- 0 0 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\nm=video 9 UDP/TLS/RTP/SAVPF 96\r\na=setup:bogus\r\n",
]


async def test_bad_offers_are_400_each_and_the_host_still_connects(surface_models: EngineModels) -> None:
    settings = base_settings()
    settings.server.max_sessions = 2
    async with live_server(settings, surface_models) as server:
        sessions = server.engine.sessions
        async with aiohttp.ClientSession(headers=server.auth) as http:
            for _ in range(settings.server.max_sessions + 1):
                for sdp in BAD_OFFERS:
                    async with http.post(f"{server.url}/api/offer", json={"sdp": sdp, "type": "offer"}) as r:
                        body = await r.json()
                        assert r.status == 400, (sdp, body)
                        assert body["error"].startswith("malformed SDP"), body
                    assert not sessions and not server.surfaces.peers.peers
                    async with http.post(
                        f"{server.url}/api/whip",
                        data=sdp.encode(),
                        headers={"Content-Type": "application/sdp"},
                    ) as r:
                        assert r.status == 400, (sdp, await r.text())
                    assert not sessions and not server.surfaces.whip.ingests
        host = EngineConnection(server.url, MediaClock(), token=server.token)
        await host.open(with_video=False)
        try:
            assert list(sessions) == [host.session_id]
            async with aiohttp.ClientSession(headers=server.auth) as http:
                for sdp in BAD_OFFERS[:3]:  # WHEP into the live session: refused, no viewer left behind
                    async with http.post(
                        f"{server.url}/api/sessions/latest/whep",
                        data=sdp.encode(),
                        headers={"Content-Type": "application/sdp"},
                    ) as r:
                        assert r.status == 400, (sdp, await r.text())
                    assert not server.surfaces.whep.viewers
        finally:
            await host.close()


async def test_a_peer_that_never_connects_is_reaped_and_never_latest(surface_models: EngineModels) -> None:
    settings = base_settings()
    settings.server.connect_timeout_s = 2.0
    async with live_server(settings, surface_models) as server:
        host = EngineConnection(server.url, MediaClock(), token=server.token)
        await host.open(with_video=False)
        stranger = RTCPeerConnection()  # offers, is answered, and never completes the handshake
        try:
            stranger.addTransceiver("audio", direction="sendrecv")
            await stranger.setLocalDescription(await stranger.createOffer())
            async with aiohttp.ClientSession(headers=server.auth) as http:
                offer = {"sdp": stranger.localDescription.sdp, "type": "offer"}
                async with http.post(f"{server.url}/api/offer", json=offer) as r:
                    assert r.status == 200
                    ghost = (await r.json())["session_id"]
                assert ghost in server.engine.sessions
                # newer, but not connected: `latest` is still the host's session
                async with http.get(f"{server.url}/api/sessions/latest/clock") as r:
                    assert (await r.json())["session_id"] == host.session_id
                async with http.get(f"{server.url}/api/streams") as r:
                    listed = {s["id"]: s["connected"] for s in (await r.json())["sessions"]}
                assert listed == {ghost: False, host.session_id: True}
                await wait_for(
                    lambda: ghost not in server.engine.sessions, 6.0, "the unconnected session reaped"
                )
                assert ghost not in server.surfaces.peers.peers
                await asyncio.sleep(0.2)
                assert host.session_id in server.engine.sessions  # the host is untouched
        finally:
            await stranger.close()
            await host.close()
