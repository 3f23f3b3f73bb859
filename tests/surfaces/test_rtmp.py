"""RTMP egress into a real local listener (``ffmpeg -listen 1``), checked with ffprobe; then a restart."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from engine.bench.voice import EngineConnection
from engine.clock import MediaClock
from engine.models import EngineModels
from tests.surfaces.harness import base_settings, free_port, live_server, wait_for

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("ffmpeg") is None or shutil.which("ffprobe") is None,
        reason="ffmpeg/ffprobe are not installed",
    ),
]


async def listener(port: int, out: Path) -> asyncio.subprocess.Process:
    proc = await asyncio.create_subprocess_exec(
        "ffmpeg",
        "-nostdin",
        "-loglevel",
        "error",
        "-listen",
        "1",
        "-i",
        f"rtmp://127.0.0.1:{port}/live/x",
        "-c",
        "copy",
        "-f",
        "flv",
        str(out),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    await asyncio.sleep(0.5)  # let it bind (probing the port would take its one connection)
    return proc


async def stop(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.send_signal(signal.SIGINT)  # ffmpeg closes the file cleanly, the publisher sees the drop
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            proc.kill()
            await proc.wait()


def probe(path: Path) -> dict[str, Any]:
    out = subprocess.run(
        ["ffprobe", "-v", "error", "-show_streams", "-show_format", "-of", "json", str(path)],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    info: dict[str, Any] = json.loads(out.stdout)
    decode = subprocess.run(
        ["ffmpeg", "-v", "error", "-i", str(path), "-f", "null", "-"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    info["decode_errors"] = decode.returncode != 0 or bool(decode.stderr.strip())
    return info


async def test_rtmp_push_is_decodable_and_resumes_after_the_server_restarts(
    surface_models: EngineModels, tmp_path: Path
) -> None:
    settings = base_settings()
    rtmp = settings.surfaces.rtmp
    rtmp.width, rtmp.height, rtmp.fps = 320, 180, 15
    rtmp.preset, rtmp.profile, rtmp.keyframe_interval_s = "ultrafast", "baseline", 1.0
    rtmp.video_bitrate_kbps, rtmp.reconnect_min_s, rtmp.reconnect_max_s = 300, 0.3, 2.0
    rtmp.allowed_hosts = ["127.0.0.1"]  # the test's own ingest
    port = free_port()
    url = f"rtmp://127.0.0.1:{port}/live/x"
    async with live_server(settings, surface_models) as server:
        host = EngineConnection(server.url, MediaClock(), token=server.token)
        await host.open()
        first = await listener(port, tmp_path / "first.flv")
        try:
            async with aiohttp.ClientSession(headers=server.auth) as http:
                async with http.post(
                    f"{server.url}/api/sessions/{host.session_id}/rtmp", json={"url": url}
                ) as r:
                    assert r.status == 201, await r.text()
                    assert "live/***" in (await r.json())["url"], "the stream key is never echoed"
            streamer = server.surfaces.rtmp[host.session_id]
            await host.say("Hello stream!")
            await wait_for(lambda: streamer.sent_s >= 11.0, 40, "11 s streamed")
            await stop(first)
            second = await listener(port, tmp_path / "second.flv")
            await wait_for(
                lambda: streamer.connects >= 2 and streamer.sent_s >= 3.0, 30, "the stream to resume"
            )
            await stop(second)
            async with aiohttp.ClientSession(headers=server.auth) as http:
                async with http.delete(f"{server.url}/api/sessions/{host.session_id}/rtmp") as r:
                    assert r.status == 200
        finally:
            await stop(first)
            await host.close()
    for name, at_least in (("first.flv", 10.0), ("second.flv", 2.0)):
        info = probe(tmp_path / name)
        codecs = {s["codec_type"]: s["codec_name"] for s in info["streams"]}
        assert codecs == {"video": "h264", "audio": "aac"}, (name, codecs)
        assert float(info["format"]["duration"]) >= at_least, (name, info["format"]["duration"])
        assert not info["decode_errors"], name


async def test_rtmp_targets_are_allow_listed_and_failures_tell_nothing(surface_models: EngineModels) -> None:
    settings = base_settings()
    settings.surfaces.rtmp.allowed_hosts = ["127.0.0.1"]
    async with live_server(settings, surface_models) as server:
        host = EngineConnection(server.url, MediaClock(), token=server.token)
        await host.open(with_video=False)
        try:
            rtmp_url = f"{server.url}/api/sessions/{host.session_id}/rtmp"
            async with aiohttp.ClientSession(headers=server.auth) as http:
                for url in (
                    "rtmp://attacker.example/live/k",
                    "rtmp://127.0.0.2:1935/live/k",
                    "http://127.0.0.1/x",
                ):
                    async with http.post(rtmp_url, json={"url": url}) as r:
                        assert r.status == 403, (url, await r.text())
                assert not server.surfaces.rtmp
                closed = free_port()  # allowed, but nothing listens: a port probe must learn nothing
                async with http.post(rtmp_url, json={"url": f"rtmp://127.0.0.1:{closed}/live/k"}) as r:
                    assert r.status == 201
                streamer = server.surfaces.rtmp[host.session_id]
                await wait_for(lambda: streamer.state == "reconnecting", 10, "the failed connection")
                async with http.get(rtmp_url) as r:
                    status = await r.json()
                assert status["last_error"] and "refused" not in status["last_error"].lower()
                assert "errno" not in status["last_error"].lower() and str(closed) not in status["last_error"]
                async with http.delete(rtmp_url) as r:
                    assert r.status == 200
        finally:
            await host.close()
