"""Many sessions on one engine: admission by capacity, isolation of a slow session, nothing left behind.

Real parts throughout: the engine on 127.0.0.1 with the bundled models, the bench's own aiortc clients
(``engine/bench/sessions.py``, the code of ``idolcast bench --sessions N --find-capacity``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import os
import threading
from typing import Any

import aiohttp
import pytest
from aiortc import RTCPeerConnection

from engine.bench.sessions import ServiceLevel, engine_capacity, find_capacity, run_sessions
from engine.bench.voice import Question
from engine.config import CapacityConfig, Settings
from engine.cores import CPU_TIME_KINDS
from engine.models import EngineModels
from engine.tts.base import Synthesis
from tests.engine.conftest import LiveServer, connected, live_server
from tests.engine.test_conversation import next_event, speech_48k

pytestmark = pytest.mark.integration


def small_box(settings: Settings) -> Settings:
    """One core, the idle engine pinned at 0.2 of it and a session at 0.35: room for exactly 2.

    Both costs pinned: the bench's clients run in this same process, so the engine's "idle" samples between
    the steps include their CPU (0.55 and 1.03 cores measured in CI, which then admitted only 1). This test
    checks admission against the estimate; measuring the estimate is tests/engine/test_capacity.py's."""
    s = settings.model_copy(deep=True)
    s.capacity = CapacityConfig(
        cores=1.0, target_utilization=1.0, idle_cpu_cores=0.2, session_cpu_cores=0.35, retry_after_s=7
    )
    return s


async def offer_status(server: LiveServer) -> tuple[int, dict[str, str], dict[str, Any]]:
    """POST one more offer (a real aiortc peer's SDP): status, headers, JSON body."""
    pc = RTCPeerConnection()
    try:
        pc.addTransceiver("audio", direction="sendrecv")
        await pc.setLocalDescription(await pc.createOffer())
        async with (
            aiohttp.ClientSession(headers=server.auth) as http,
            http.post(f"{server.url}/api/offer", json={"sdp": pc.localDescription.sdp, "type": "offer"}) as r,
        ):
            return r.status, dict(r.headers), await r.json()
    finally:
        await pc.close()


async def test_find_capacity_is_what_the_engine_admits_and_the_next_session_is_refused(
    settings: Settings, models: EngineModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    questions = [Question("What is your favorite color?", speech_48k("What is your favorite color?"))]
    async with live_server(small_box(settings), models) as server:
        monkeypatch.setenv("IDOLCAST_TOKEN", server.token)  # what the bench's clients present
        before = await engine_capacity(server.url, server.token)
        assert before is not None and before["bounded_by"] == "cpu" and before["capacity"] == 2
        lag = before["event_loop_lag_ms"]
        for _ in range(20):  # the engine's loop probe wakes ten times a second
            if lag["p90"] is not None:
                break
            await asyncio.sleep(0.1)
            lag = (await engine_capacity(server.url, server.token) or before)["event_loop_lag_ms"]
        assert lag["p90"] is not None and lag["max"] >= lag["p90"] >= 0.0
        # An absolute, lenient latency bound: this checks admission, not the 2-core latency (`idolcast bench`
        # measures that; two overlapping turns share one ASR final worker and one LLM here, and the machine
        # is shared: 1.5x the single-session P95 breaks on its own at times, see docs/PERFORMANCE.md).
        level = ServiceLevel(v2v_p95_ms=15000.0)
        report = await find_capacity(
            server.url, questions, level, max_sessions=4, with_video=False, stagger_s=1.0, token=server.token
        )
        cap = report["capacity"]
        assert cap["largest_n_held"] == 2, [(st["sessions"], st["broken"]) for st in cap["steps"]]
        last = cap["steps"][-1]
        assert last["sessions"] == 3 and not last["held"]
        assert last["pooled"]["refused"] == 1 and "cpu is full" in last["pooled"]["refusals"][0]
        admitted = [s for s in last["per_session"] if not s["refused"]]
        assert len(admitted) == 2
        for s in admitted:  # the admitted ones kept the service level while the third was turned away
            assert s["unanswered"] == 0 and s["voice_to_voice_ms"]["p95"] <= level.v2v_p95_ms
        assert report["sessions"] == 2 and report["pooled"]["unanswered"] == 0

        # The refusal itself, with two sessions open: 503, Retry-After, the resource named.
        async with connected(server, with_video=False), connected(server, with_video=False):
            status, headers, body = await offer_status(server)
            assert status == 503 and headers.get("Retry-After") == "7"
            assert body["resource"] == "cpu" and "cpu is full" in body["error"]
            now = await engine_capacity(server.url, server.token)
            assert now is not None and now["sessions"] == 2
        async with (
            aiohttp.ClientSession(headers=server.auth) as http,
            http.get(f"{server.url}/metrics") as r,
        ):
            text = await r.text()
        assert "idolcast_sessions_capacity 2.0" in text and "idolcast_sessions_active" in text
        assert 'idolcast_resource_utilization{resource="cpu"}' in text


async def test_clients_spread_over_processes_are_measured_like_in_process_ones(
    server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--client-procs``: each worker process runs its clients on the shared schedule and reports back."""
    monkeypatch.setenv("IDOLCAST_TOKEN", server.token)  # inherited by the spawned workers
    questions = [Question("What is your favorite color?", speech_48k("What is your favorite color?"))]
    report = await run_sessions(server.url, questions, 2, stagger_s=1.0, client_procs=2, token=server.token)
    assert report["client_procs"] == 2
    assert [s["index"] for s in report["per_session"]] == [0, 1]
    for s in report["per_session"]:
        assert not s["error"] and s["unanswered"] == 0 and s["voice_to_voice_ms"]["n"] == 1, s
        # what arrived by RTP sequence numbers: her audio, nothing lost on loopback
        audio = s["rtp_received"]["audio"]
        assert audio["received"] > 50 and audio["lost"] == 0, s["rtp_received"]
        [stages] = s["stages_ms"]  # the one turn's stages, from the engine's timings
        assert 0 < stages["end_of_turn"] < stages["first_audio_sent"] < s["voice_to_voice_ms"]["max"], stages
    assert report["pooled"]["voice_to_voice_ms"]["n"] == 2
    assert report["pooled"]["stages_ms"]["first_audio_sent"]["n"] == 2
    [end] = report["engine_capacities_end"]  # the engine read again after the sessions ended
    assert end is not None and end["sessions"] == 0 and end["event_loop_lag_ms"]["worst"] is not None
    host = report["host_cpu"]  # the box's CPU while the sessions ran: engine, clients and all
    assert host is not None and host["busy_cores"] > 0.1, host
    assert abs(sum(v for k, v in host.items() if k in CPU_TIME_KINDS) - 1.0) < 0.01


class _SlowTTS:
    """Fault injection at the TTS boundary, for one session only: the real voice, 6 s late."""

    def __init__(self, real: Any, delay_s: float) -> None:
        self.real, self.delay_s = real, delay_s

    async def synthesize(self, text: str, first: bool = False) -> Synthesis:
        await asyncio.sleep(self.delay_s)
        return await self.real.synthesize(text, first)  # type: ignore[no-any-return]

    def describe(self) -> str:
        return "slow"


async def test_a_slow_stage_in_one_session_does_not_slow_another(server: LiveServer) -> None:
    async with connected(server, with_video=False) as a, connected(server, with_video=False) as b:
        await b.say("Hello!")
        alone = (await next_event(b, "turn_completed"))["timings"]["relative_ms"]["first_audio_sent"]
        session_a = server.engine.sessions[a.session_id]
        session_a.models = dataclasses.replace(session_a.models, tts=_SlowTTS(session_a.models.tts, 6.0))
        await a.say("Tell me about your day.")
        await asyncio.sleep(0.3)  # A is now stuck in its TTS
        await b.say("How are you?")
        done_b = await next_event(b, "turn_completed")
        beside = done_b["timings"]["relative_ms"]["first_audio_sent"]
        assert not done_b["timings"]["error"] and done_b["played_text"]
        # B's reply did not wait for A's 6 s stall (a shared stage queue would have added it all)
        assert beside < alone + 3000.0, (alone, beside)
        done_a = await next_event(a, "turn_completed")
        assert done_a["timings"]["relative_ms"]["tts_first_audio"] >= 6000.0


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


async def test_fifty_sessions_opened_and_closed_leave_nothing_behind(server: LiveServer) -> None:
    async def one_round() -> None:
        async with connected(server, with_video=False) as c:
            await asyncio.sleep(0.2)  # the mic flows: VAD thread and tasks started
            assert c.session_id in server.engine.sessions
            # The connect reaper (engine/server/peer.py) ends when its peer connects (issue 11: it used
            # to sleep out server.connect_timeout_s after the peer had connected and its session closed).
            reaper = f"peers:reap-{c.session_id}"
            for _ in range(50):
                if c.session_id in server.surfaces.peers.connected:
                    break
                await asyncio.sleep(0.1)
            await asyncio.sleep(0)
            assert reaper not in {t.get_name() for t in asyncio.all_tasks()}

    grace_s = 5.0  # closing peers wind down on their own; nothing waits out connect_timeout_s any more

    async def settled(baseline: int | None = None) -> tuple[float, int, int]:
        for _ in range(50):  # closing peers and executor threads wind down on their own
            await asyncio.sleep(0.1)
            if not server.engine.sessions:
                break
        for _ in range(int(grace_s * 2) if baseline is not None else 0):
            if len(asyncio.all_tasks()) <= baseline + 2:  # type: ignore[operator]
                break
            await asyncio.sleep(0.5)
        gc.collect()
        await asyncio.sleep(0.5)
        return _rss_mib(), threading.active_count(), len(asyncio.all_tasks())

    for _ in range(3):  # warm-up: first-use allocations (codecs, VAD, pools) are not a leak
        await one_round()
    rss0, threads0, tasks0 = await settled(baseline=0)
    for _ in range(50):
        await one_round()
    rss1, threads1, tasks1 = await settled(baseline=tasks0)
    assert not server.engine.sessions
    assert threads1 <= threads0 + 2, (threads0, threads1, sorted(t.name for t in threading.enumerate()))
    assert tasks1 <= tasks0 + 2, (tasks0, tasks1, sorted(t.get_name() for t in asyncio.all_tasks()))
    # 50 sessions of a leaked peer or VAD state each would be ≥ 50 MiB; allocator slack stays under 40
    assert rss1 - rss0 < 40.0, (rss0, rss1)
