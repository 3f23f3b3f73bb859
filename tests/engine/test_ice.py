"""Reachable media: WebRTC host candidates bound inside server.ice_port_min..max, a connection
made through them, a full range refused loudly, the ICE servers the pages are given, and a
connection relayed by a real coturn with the configured TURN credentials."""

from __future__ import annotations

import asyncio
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from aiortc import RTCConfiguration, RTCIceTransportPolicy, RTCPeerConnection

from engine.config import ServerConfig
from engine.transport import ice

pytestmark = pytest.mark.integration


def free_udp_range(n: int) -> tuple[int, int]:
    """``n`` consecutive UDP ports free right now on 127.0.0.1 (searched above 20000)."""
    for lo in range(20000, 60000, n):
        socks = []
        try:
            for p in range(lo, lo + n):
                s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                socks.append(s)
                s.bind(("0.0.0.0", p))
            return lo, lo + n - 1
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise AssertionError("no free UDP range")


@pytest.fixture
def port_range() -> Iterator[tuple[int, int]]:
    lo, hi = free_udp_range(16)
    ice.use_port_range(lo, hi)
    yield lo, hi
    ice.use_port_range(0, 0)


def candidate_ports(sdp: str) -> list[int]:
    return [int(m.group(1)) for m in re.finditer(r"a=candidate:\S+ \d+ udp \d+ \S+ (\d+) typ host", sdp)]


async def test_candidates_bind_in_the_range_and_connect(port_range: tuple[int, int]) -> None:
    lo, hi = port_range
    caller, callee = RTCPeerConnection(), RTCPeerConnection()
    try:
        caller.createDataChannel("x")
        await caller.setLocalDescription(await caller.createOffer())
        await callee.setRemoteDescription(caller.localDescription)
        await callee.setLocalDescription(await callee.createAnswer())
        await caller.setRemoteDescription(callee.localDescription)
        ports = candidate_ports(caller.localDescription.sdp) + candidate_ports(callee.localDescription.sdp)
        assert ports and all(lo <= p <= hi for p in ports), (ports, lo, hi)
        for _ in range(100):
            if caller.connectionState == callee.connectionState == "connected":
                break
            await asyncio.sleep(0.1)
        assert caller.connectionState == "connected" and callee.connectionState == "connected"
    finally:
        await caller.close()
        await callee.close()


async def test_a_full_range_gives_no_candidate_and_says_why(caplog: pytest.LogCaptureFixture) -> None:
    lo, _ = free_udp_range(1)
    held = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    held.bind(("0.0.0.0", lo))
    held6 = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    held6.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    held6.bind(("::", lo))
    ice.use_port_range(lo, lo)
    pc = RTCPeerConnection()
    try:
        pc.createDataChannel("x")
        await pc.setLocalDescription(await pc.createOffer())
        assert candidate_ports(pc.localDescription.sdp) == []
        assert any(f"every UDP port in {lo}..{lo} is in use" in r.getMessage() for r in caplog.records)
    finally:
        ice.use_port_range(0, 0)
        held.close()
        held6.close()
        await pc.close()


def test_a_bad_range_is_refused() -> None:
    with pytest.raises(ValueError, match="ice_port_min..ice_port_max"):
        ice.use_port_range(50010, 50000)


async def test_the_pages_get_the_ice_servers_with_turn_credentials() -> None:
    cfg = ServerConfig(
        ice_servers=["stun:stun.example.org:3478", "turn:turn.example.org:3478?transport=udp"],
        ice_username="idol",
        ice_credential="s3cret",
    )
    app = web.Application()
    ice.register_ice_routes(app, cfg)
    async with TestClient(TestServer(app)) as client:
        r = await client.get("/api/ice-servers")
        assert r.status == 200
        assert (await r.json()) == {
            "iceServers": [
                {"urls": "stun:stun.example.org:3478"},
                {
                    "urls": "turn:turn.example.org:3478?transport=udp",
                    "username": "idol",
                    "credential": "s3cret",
                },
            ]
        }
    servers = ice.rtc_ice_servers(cfg)
    assert servers[1].username == "idol" and servers[1].credential == "s3cret"


@pytest.fixture
def coturn() -> Iterator[str]:
    """A real TURN relay (Debian's coturn) on 127.0.0.1; yields its turn: URL."""
    exe = shutil.which("turnserver")
    if exe is None:
        pytest.skip("coturn is not installed (apt-get install coturn)")
    port = free_udp_range(1)[0]
    relay_lo, relay_hi = free_udp_range(16)
    proc = subprocess.Popen(
        [
            exe,
            "-n",
            "--listening-ip=127.0.0.1",
            "--relay-ip=127.0.0.1",
            f"--listening-port={port}",
            f"--min-port={relay_lo}",
            f"--max-port={relay_hi}",
            "--lt-cred-mech",
            "--user=idol:s3cret",
            "--realm=idolcast.test",
            "--fingerprint",
            "--no-tls",
            "--no-dtls",
            "--no-cli",
            "--allow-loopback-peers",
            "--log-file=stdout",
            "--simple-log",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        time.sleep(1.0)
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        yield f"turn:127.0.0.1:{port}?transport=udp"
    finally:
        proc.terminate()
        proc.wait(10)


async def connect_pair(a: RTCPeerConnection, b: RTCPeerConnection, limit_s: float = 15) -> str:
    a.createDataChannel("x")
    await a.setLocalDescription(await a.createOffer())
    await b.setRemoteDescription(a.localDescription)
    await b.setLocalDescription(await b.createAnswer())
    await a.setRemoteDescription(b.localDescription)
    for _ in range(int(limit_s * 10)):
        if a.connectionState == b.connectionState == "connected" or "failed" in (
            a.connectionState,
            b.connectionState,
        ):
            break
        await asyncio.sleep(0.1)
    return f"{a.connectionState}/{b.connectionState}"


async def test_media_goes_through_a_turn_relay_with_the_configured_credentials(coturn: str) -> None:
    def relay_only(credential: str) -> RTCConfiguration:
        cfg = ServerConfig(ice_servers=[coturn], ice_username="idol", ice_credential=credential)
        return RTCConfiguration(
            iceServers=ice.rtc_ice_servers(cfg), iceTransportPolicy=RTCIceTransportPolicy.RELAY
        )

    a, b = RTCPeerConnection(relay_only("s3cret")), RTCPeerConnection(relay_only("s3cret"))
    try:
        assert await connect_pair(a, b) == "connected/connected"
        assert " typ relay" in a.localDescription.sdp and " typ host" not in a.localDescription.sdp
    finally:
        await a.close()
        await b.close()
    bad = RTCPeerConnection(relay_only("wrong"))
    try:  # a wrong credential gets no relay allocation: no candidate at all
        bad.createDataChannel("x")
        await bad.setLocalDescription(await bad.createOffer())
        assert " typ relay" not in bad.localDescription.sdp
    finally:
        await bad.close()
