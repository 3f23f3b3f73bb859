"""The voice-to-voice bench: spoken questions in, the reply measured as the client receives it."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
from aiortc import RTCPeerConnection, RTCSessionDescription

from engine.asr.wer import word_error_rate
from engine.bench.peer import QuestionTrack, ReceivedAudio, record_audio, speech_bounds
from engine.bench.stats import summarize, summarize_costs
from engine.bench.video import (
    FrameArrivals,
    ReceivedVideo,
    SenderReports,
    frame_rate,
    receiver_timeline,
    record_video,
)
from engine.clock import MediaClock
from engine.heap import freeze_loaded_heap
from engine.server.capacity import LoopLag
from engine.server.credentials import read_host_token
from engine.tasks import TaskOwner
from engine.transport.mic_in import set_receive_jitter

log = logging.getLogger(__name__)

DEFAULT_QUESTIONS = (
    "What is your favorite color?",
    "How are you feeling today?",
    "Can you tell me a fun fact?",
    "What game should we play next?",
    "Do you like music?",
    "What did you eat for breakfast?",
    "Where would you like to travel?",
    "What is your favorite season?",
    "Can you sing a little song?",
    "What makes you happy?",
    "Tell me a joke about cats.",
    "Which one do you like better, cats or dogs?",
    "Can you recommend a good book to read?",
    "What do you think about pineapple on pizza?",
    "How did you sleep last night?",
    "What was the last movie you watched?",
    "Say hello to everyone in the chat.",
    "What is the best snack for a long stream?",
    "Do you have a favorite animal?",
    "What should I name my new puppy?",
    "Is it going to rain tomorrow?",
    "What is your dream job?",
    "Can you count to five in Japanese?",
    "What hobby should I try this winter?",
    "Do you prefer mornings or evenings?",
    "What is the funniest word you know?",
    "How do you stay so cheerful?",
    "What would you cook for dinner tonight?",
    "Which city has the best food?",
    "What are you going to do this weekend?",
)
BARGE_IN_PROMPT = "Please tell me a long story about a dragon who loves to sing."
BARGE_IN_QUESTION = "Wait, stop for a second."
STOPPED_HOLD_S = 1.0  # quiet this long after an interjection = the reply stopped
# Faster than the engine could possibly hear the interjection (one mic frame + one VAD window):
# the reply went quiet by itself (a gap between its chunks) and the round measures nothing.
MIN_REACTION_MS = 60.0
INTERJECTION_LEAD = 960  # samples (20 ms at 48 kHz) of the interjection's clip played before its words
SPEAK_OVER_LOUD_S = 0.2  # the interjection starts once the reply has been loud this long without a dip


@dataclass
class Question:
    text: str
    pcm: np.ndarray  # int16 mono 48 kHz
    bounds: tuple[int, int] | None = None  # where the speech is (samples), if its level cannot tell


@dataclass
class TurnResult:
    question: str
    transcript: str = ""
    voice_to_voice_ms: float | None = None
    stages_ms: dict[str, float] = field(default_factory=dict)
    timestamps: dict[str, Any] = field(default_factory=dict)
    barge_in_stop_ms: float | None = None
    turn_end: dict[str, Any] | None = None  # the engine's end-of-turn judgement (finished, p, method)
    asr: dict[str, Any] | None = None  # the final transcript's costs (the engine's final_cost)
    unanswered: str = ""  # why no reply came (the engine heard no words, or nothing within the limit)
    reply: str = ""
    reply_window: tuple[float, float] | None = None  # receiver clock: first loud → quiet
    # Same host only (both clocks are time.monotonic()): the client's end of speech → the engine's, and
    # the engine's first reply frame leaving its track → the client's first loud sample.
    uplink_ms: float | None = None
    downlink_ms: float | None = None
    silences_ms: list[float] = field(default_factory=list)  # inside the reply, as the engine's playout saw


class EngineConnection:
    """One bench session against a running engine: peer connection + event socket."""

    def __init__(
        self,
        url: str,
        clock: MediaClock,
        character: str = "builtin:default",
        jitter_frames: int = 4,
        token: str | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        # The host credential (default: $IDOLCAST_TOKEN, else the local engine's var/secrets/host_token).
        self.token = token if token is not None else read_host_token()
        self.same_host = False  # set when the bench started the engine itself
        # engine-clock times of the engine's "interrupted" events, with the turn each cut
        self.interrupts: list[tuple[float, int | None]] = []
        self.engine_origin: float | None = None  # its clock's time.monotonic() at t = 0
        self.jitter_frames = jitter_frames
        self.clock = clock
        self.pc = RTCPeerConnection()
        self.mic = QuestionTrack(clock)
        self.received = ReceivedAudio()
        self.events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._owner = TaskOwner("bench")
        self.video = ReceivedVideo()
        self.sender_reports = SenderReports()
        self.frame_arrivals = FrameArrivals(clock)
        self.character = character
        self.session_id = ""
        self._http: aiohttp.ClientSession | None = None

    async def open(self, with_video: bool = True) -> None:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        self._http = aiohttp.ClientSession(headers=headers)
        self.pc.addTrack(self.mic)
        if with_video:
            self.pc.addTransceiver("video", direction="recvonly")

        @self.pc.on("track")
        def on_track(track: Any) -> None:
            if track.kind == "audio":
                if self.jitter_frames != 4:  # aiortc's own default
                    set_receive_jitter(self.pc, track, self.jitter_frames)
                self._owner.spawn(record_audio(track, self.clock, self.received), "record-audio")
            else:
                self._owner.spawn(record_video(track, self.clock, self.video, self.character), "record-video")

        await self.pc.setLocalDescription(await self.pc.createOffer())
        async with self._http.post(
            f"{self.url}/api/offer", json={"sdp": self.pc.localDescription.sdp, "type": "offer"}
        ) as r:
            body = await r.json()
            if r.status != 200:
                raise RuntimeError(f"offer refused: {r.status} {body}")
        self.session_id = body["session_id"]
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=body["sdp"], type=body["type"]))
        self.sender_reports.attach(self.pc)
        self.frame_arrivals.attach(self.pc)
        self._owner.spawn(self._read_events(), "events")
        for _ in range(200):
            if self.pc.connectionState == "connected":
                return
            await asyncio.sleep(0.05)
        raise RuntimeError(f"WebRTC did not connect (state {self.pc.connectionState})")

    async def _read_events(self) -> None:
        assert self._http is not None
        async with self._http.ws_connect(f"{self.url}/api/sessions/{self.session_id}/events") as ws:
            async for msg in ws:
                if msg.type == aiohttp.WSMsgType.TEXT:
                    event = json.loads(msg.data)
                    if event.get("type") == "interrupted" and isinstance(event.get("t"), float):
                        self.interrupts.append((event["t"], event.get("turn_id")))  # engine clock
                    elif event.get("type") == "turn_completed" and isinstance(
                        event.get("clock_origin"), float
                    ):
                        self.engine_origin = event["clock_origin"]
                    self.events.put_nowait(event)

    def interrupt_after(self, t: float) -> float | None:
        """Our clock's time of the engine's first interrupt after ``t`` (same host only, else None)."""
        return next((ti for ti, _ in self._interrupts_on_our_clock() if ti >= t), None)

    def cut_turn_after(self, t: float, turn_id: object) -> float | None:
        """Our clock's time of the engine's first interrupt of ``turn_id`` after ``t`` (same host only)."""
        return next((ti for ti, cut in self._interrupts_on_our_clock() if ti >= t and cut == turn_id), None)

    def _interrupts_on_our_clock(self) -> list[tuple[float, int | None]]:
        if not self.same_host or self.engine_origin is None:
            return []
        shift = self.engine_origin - self.clock.origin
        return [(ti + shift, cut) for ti, cut in self.interrupts]

    async def wait_event(self, kind: str, limit_s: float, *, or_unanswered: bool = False) -> dict[str, Any]:
        """The next ``kind`` event; with ``or_unanswered`` also the engine's word that it heard speech but
        recognised nothing (an empty ``final`` with ``unanswered``). TimeoutError after ``limit_s``."""
        deadline = self.clock.now() + limit_s
        while True:
            remaining = deadline - self.clock.now()
            if remaining <= 0:
                raise TimeoutError(f"no '{kind}' event within {limit_s:.0f}s")
            try:
                ev = await asyncio.wait_for(self.events.get(), remaining)
            except TimeoutError:
                raise TimeoutError(f"no '{kind}' event within {limit_s:.0f}s") from None
            if ev.get("type") == kind or (
                or_unanswered and ev.get("type") == "final" and ev.get("unanswered")
            ):
                return ev

    async def say(self, text: str) -> None:
        assert self._http is not None
        async with self._http.post(
            f"{self.url}/api/sessions/{self.session_id}/say", json={"text": text}
        ) as r:
            if r.status >= 300:
                raise RuntimeError(f"say refused: {r.status} {await r.text()}")

    async def inbound_rtp(self) -> dict[str, dict[str, int]]:
        """What arrived per kind, by RTP sequence numbers: packets received and lost (aiortc's receiver
        stats; a frame missing here was lost on the way or at this client's socket, not at the engine)."""
        from aiortc.stats import RTCInboundRtpStreamStats

        out: dict[str, dict[str, int]] = {}
        try:
            report = await self.pc.getStats()
        except Exception:  # noqa: BLE001 - a closed or failed peer has none
            return out
        for stat in report.values():
            if isinstance(stat, RTCInboundRtpStreamStats):
                seen = out.setdefault(stat.kind, {"received": 0, "lost": 0})
                seen["received"] += int(stat.packetsReceived)
                seen["lost"] += max(0, int(stat.packetsLost))
        return out

    async def close(self) -> None:
        await self._owner.cancel_all()
        await self.pc.close()
        if self._http is not None:
            await self._http.close()


async def _settle(conn: EngineConnection, quiet_s: float = 0.6, limit_s: float = 30.0) -> None:
    """Wait until the idol has been silent for ``quiet_s``."""
    start = conn.clock.now()
    while conn.clock.now() - start < limit_s:
        t = conn.received.quiet_from(conn.clock.now() - quiet_s - 0.1, hold_s=quiet_s)
        if t is not None:
            return
        await asyncio.sleep(0.1)


def _drain(q: asyncio.Queue[dict[str, Any]]) -> None:
    while not q.empty():
        q.get_nowait()


async def ask(conn: EngineConnection, q: Question, limit_s: float = 60.0) -> TurnResult:
    result = TurnResult(question=q.text)
    _drain(conn.events)
    clip = conn.mic.play(q.pcm, q.bounds)
    await clip.done.wait()
    assert clip.sent_end is not None
    try:
        completed = await conn.wait_event("turn_completed", limit_s, or_unanswered=True)
        while completed.get("continued"):  # cut at a pause in the question: its rest continued it
            completed = await conn.wait_event("turn_completed", limit_s, or_unanswered=True)
    except TimeoutError as e:
        result.unanswered = str(e)
    else:
        if completed["type"] == "final":
            result.unanswered = f"the engine recognised no words ({completed['unanswered']})"
    if result.unanswered:
        log.warning("turn unanswered: %r: %s", q.text, result.unanswered)
        await _settle(conn)
        return result
    timings = completed["timings"]
    result.transcript = timings.get("user_text", "")
    result.reply = completed.get("played_text", "")
    result.stages_ms = timings.get("relative_ms", {})
    result.turn_end = timings.get("turn_end")
    result.asr = timings.get("asr")
    result.silences_ms = list(timings.get("silences_ms") or [])
    result.timestamps = {
        k: timings.get(k)
        for k in (
            "speech_end",
            "end_of_turn",
            "asr_final",
            "llm_first_token",
            "first_chunk_text",
            "tts_first_audio",
            "first_audio_sent",
        )
    }
    heard = conn.received.first_loud_after(clip.sent_end)
    if heard is not None:
        result.voice_to_voice_ms = round((heard - clip.sent_end) * 1000.0, 1)
    engine_origin = completed.get("clock_origin")
    if conn.same_host and isinstance(engine_origin, float):
        shift = engine_origin - conn.clock.origin  # engine clock → ours
        if result.timestamps.get("speech_end") is not None:
            result.uplink_ms = round((result.timestamps["speech_end"] + shift - clip.sent_end) * 1000.0, 1)
        if heard is not None and result.timestamps.get("first_audio_sent") is not None:
            result.downlink_ms = round((heard - result.timestamps["first_audio_sent"] - shift) * 1000.0, 1)
    await _settle(conn)
    if heard is not None:
        end = conn.received.quiet_from(heard, hold_s=0.5)
        if end is not None:
            result.reply_window = (heard, end)
    return result


@dataclass
class BargeIn:
    stop_ms: float  # from the interjection's first word to the reply's silence at the receiver
    cut_ms: float | None  # from the same word to the engine's cut (same host only): hearing it; the rest is
    # the way to the ear (the audio already sent, the fade, the client's jitter buffer)


async def barge_in(
    conn: EngineConnection, prompt: Question, interjection: Question, after_s: float = 1.0
) -> BargeIn | None:
    """Ask for a long reply, speak over it, return how long until the reply audio stopped at the receiver.

    The interjection starts ``after_s`` into the reply, in the middle of its words (loud for
    ``SPEAK_OVER_LOUD_S``, not in a gap between its chunks nor at the tail of a word before a pause),
    and the reply counts as stopped at the start of the first quiet stretch after the interjection's
    onset that lasts ``STOPPED_HOLD_S``: longer than a pause inside the reply, shorter than the
    wait for the interjection's own answer.
    """
    _drain(conn.events)
    clip = conn.mic.play(prompt.pcm)
    await clip.done.wait()
    assert clip.sent_end is not None
    while conn.received.first_loud_after(clip.sent_end) is None:
        await asyncio.sleep(0.02)
        if conn.clock.now() - clip.sent_end > 30:
            return None
    await asyncio.sleep(after_s)
    waited = conn.clock.now()
    while not conn.received.loud_for(conn.clock.now(), SPEAK_OVER_LOUD_S):
        await asyncio.sleep(0.005)
        if conn.clock.now() - waited > 10:
            return None  # the reply ended before we could speak over it
    # its words at once, not after the clip's lead-in (~0.4 s in which the reply often reached a pause, and a
    # quiet stretch from before the onset measured nothing)
    start, end = interjection.bounds or speech_bounds(interjection.pcm)
    skip = max(0, start - INTERJECTION_LEAD)
    over = conn.mic.play(interjection.pcm[skip:], (start - skip, end - skip))
    await over.done.wait()
    assert over.sent_start is not None
    story = await conn.wait_event("turn_completed", 60)
    with contextlib.suppress(TimeoutError):
        await conn.wait_event("turn_completed", 60)  # the interjection's own reply
    await _settle(conn)
    stop = conn.received.quiet_from(over.sent_start, hold_s=STOPPED_HOLD_S)
    cut = conn.interrupt_after(over.sent_start)
    # interrupted: the story's turn says so, or (a reply whose words were all generated, still playing) the
    # engine cut that turn's audio before it went quiet at the receiver (same host: the cut is on our clock;
    # not a cut of the interjection's own reply, when Whisper split it in two)
    story_cut = conn.cut_turn_after(over.sent_start, story.get("turn_id"))
    cut_playing = story_cut is not None and stop is not None and story_cut <= stop
    if stop is None or not (story.get("interrupted") or cut_playing):
        log.info("barge-in round not counted: the reply was not interrupted")
        return None
    ms = round((stop - over.sent_start) * 1000.0, 1)
    if ms < MIN_REACTION_MS:
        log.info("barge-in round not counted: the reply paused by itself %.0f ms after the onset", ms)
        return None
    if cut is not None and not conn.received.loud_between(cut, stop):
        # Same host: the engine's cut is known on our clock. No loud audio arrived after it, so the reply
        # had gone quiet on its own (a gap before its next chunk) and the cut only kept it so.
        log.info("barge-in round not counted: the reply was already quiet when the engine cut it")
        return None
    heard = story_cut if story_cut is not None else cut
    cut_ms = None if heard is None else round((heard - over.sent_start) * 1000.0, 1)
    log.info(
        "barge-in: the reply stopped at the receiver %.0f ms after the onset (engine's cut: %s ms)",
        ms,
        cut_ms,
    )
    return BargeIn(ms, cut_ms)


async def run_voice_bench(
    url: str,
    questions: Sequence[Question],
    barge: tuple[Question, Question] | None,
    barge_rounds: int = 3,
    character: str = "builtin:default",
    client_jitter_frames: int = 2,
    same_host: bool = False,
    start_delay_s: float = 0.0,
) -> dict[str, Any]:
    """One client, start to end: connect, ask ``questions`` (then the barge-in rounds), report.

    Several of these run side by side in ``idolcast bench --sessions N`` (engine/bench/sessions.py),
    each on its own clock and peer; ``start_delay_s`` staggers a client's first question after it connected.
    """
    clock = MediaClock()
    conn = EngineConnection(url, clock, character, jitter_frames=client_jitter_frames)
    conn.same_host = same_host
    turns: list[TurnResult] = []
    stops: list[float] = []
    cuts: list[float] = []
    barge_skipped = 0
    # How late this client's own loop wakes, over the whole run: it reads every packet and answers the
    # engine's ICE consent checks (within 500 ms, or the engine closes the session).
    loop_lag = LoopLag(window_s=float("inf"))
    lag_watch = asyncio.ensure_future(loop_lag.watch())
    if not gc.get_freeze_count():  # the client's imports and questions: its collections skip them too
        freeze_loaded_heap()
    try:
        await conn.open()  # inside: a refused offer still closes the peer and the HTTP client
        await asyncio.sleep(0.5 + start_delay_s)
        for q in questions:
            r = await ask(conn, q)
            turns.append(r)
            log.info("turn: %r -> %r v2v=%s ms", q.text, r.transcript, r.voice_to_voice_ms)
        if barge is not None:
            for _ in range(barge_rounds):
                round_ = await barge_in(conn, *barge)
                if round_ is None:
                    barge_skipped += 1
                    continue
                stops.append(round_.stop_ms)
                if round_.cut_ms is not None:
                    cuts.append(round_.cut_ms)
    finally:
        lag_watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await lag_watch
        rtp = await conn.inbound_rtp()
        await conn.close()
    v2v = [t.voice_to_voice_ms for t in turns if t.voice_to_voice_ms is not None]
    unanswered = [{"question": t.question, "why": t.unanswered} for t in turns if t.unanswered]
    video = video_report(conn, [t.reply_window for t in turns if t.reply_window is not None])
    wer = word_error_rate([q.text for q in questions], [t.transcript for t in turns])
    stage_names = sorted({k for t in turns for k in t.stages_ms})
    return {
        "session_id": conn.session_id,
        "voice_to_voice_ms": summarize(v2v),
        "unanswered": len(unanswered),
        "unanswered_turns": unanswered,
        "barge_in_stop_ms": summarize(stops),
        "barge_in_cut_ms": summarize(cuts),  # the engine's part of it (same host only)
        "barge_in_rounds_not_counted": barge_skipped,
        "client_jitter_frames": client_jitter_frames,
        "wer": round(wer, 4),
        "stages_ms": {s: summarize([t.stages_ms[s] for t in turns if s in t.stages_ms]) for s in stage_names},
        # where the final transcript's time went after the end of the turn (waited, queued, decode, ...)
        "asr_final_ms": summarize_costs([t.asr for t in turns if t.asr]),
        "uplink_ms": summarize([t.uplink_ms for t in turns if t.uplink_ms is not None]),
        "downlink_ms": summarize([t.downlink_ms for t in turns if t.downlink_ms is not None]),
        "client_loop_lag_ms": loop_lag.summary_ms(),
        "rtp_received": rtp,  # per kind: packets received and lost by sequence number
        "silences_in_replies": silences_in_replies(turns),
        **video,
        "turns": [t.__dict__ for t in turns],
    }


def silences_in_replies(turns: Sequence[TurnResult]) -> dict[str, Any]:
    """How many replies had a silence inside (a chunk late at the engine's playout), how many, the longest."""
    gaps = [ms for t in turns for ms in t.silences_ms]
    return {
        "replies": sum(1 for t in turns if t.silences_ms),
        "of": sum(1 for t in turns if not t.unanswered),
        "silences": len(gaps),
        "longest_ms": max(gaps, default=None),
    }


def video_report(conn: EngineConnection, replies: list[tuple[float, float]]) -> dict[str, Any]:
    """Frame rate and lip-sync offset at the receiver (empty figures when no video arrived)."""
    from engine.lipsync.measure import offsets_per_reply
    from engine.lipsync.measure import summarize as summarize_offsets

    v, a = conn.video, conn.received
    # to the end of the last reply: a video track that died mid-run shows as 0 frames a second
    until = max((end for _, end in replies), default=None)
    report: dict[str, Any] = frame_rate(v.arrivals, until=until)
    # The same window counted on the frames' own media times: the frames the engine sent for each second of
    # its clock. Low here, the engine dropped frames; low only above, they arrived (or were read) bunched.
    media = frame_rate(sorted(v.pts))
    report["fps_min_1s_media"] = media["fps_min_1s"]
    # when the lowest windows began, in Unix seconds (the engine's log lines and other sessions' windows
    # can be lined up with them: every clock here is time.monotonic() of one host)
    to_unix = time.time() - time.monotonic()
    at = report.pop("fps_min_1s_at", None)
    report["fps_min_1s_unix"] = round(to_unix + conn.clock.origin + at, 2) if at is not None else None
    at = media.get("fps_min_1s_at")
    origin = conn.engine_origin
    report["fps_min_1s_media_unix"] = (
        round(to_unix + origin + at, 2) if at is not None and origin is not None else None
    )
    # ... and on the arrival of each frame's last packet, before the client's decoder: low only in the first
    # figure, the client (decoding on the same cores as the engine) read them late.
    report["fps_min_1s_network"] = frame_rate(conn.frame_arrivals.times, until=until)["fps_min_1s"]
    report["video_size"] = list(v.size) if v.size else None
    if len(v.arrivals) < 30 or not a.pcm or not replies:
        report["lipsync_offset_ms"] = {"mean": None, "p95": None, "n": 0}
        return report
    cv = receiver_timeline(v.arrivals, v.pts)
    ca = receiver_timeline(a.times, a.pts_s)
    audio = np.concatenate(a.pcm)
    # Each track on its own arrival delay: a player that does not sync audio and video.
    unsynced = offsets_per_reply(np.asarray(v.pts) + cv, v.mouth, audio, a.pts_s[0] + ca, replies, fps=30.0)
    # Video placed where the audio of the same sender time plays (RTCP sender reports): what a browser does.
    off_a, off_v = conn.sender_reports.offset("audio", 48000), conn.sender_reports.offset("video", 90000)
    synced = None
    if off_a is not None and off_v is not None:
        video_t = np.asarray(v.pts) + off_v + (ca - off_a)
        synced = offsets_per_reply(video_t, v.mouth, audio, a.pts_s[0] + ca, replies, fps=30.0)
        # how far syncing moves the video against its own arrival (jitter buffers, encode time)
        report["lipsync_sync_shift_ms"] = round((off_v + ca - off_a - cv) * 1000.0, 1)
    offsets = synced if synced is not None else unsynced
    s = summarize_offsets(offsets)
    report["lipsync_offset_ms"] = {k: (round(x, 1) if isinstance(x, float) else x) for k, x in s.items()}
    report["lipsync_receiver"] = "synced by RTCP sender reports" if synced is not None else "unsynced (no SR)"
    report["lipsync_offset_frames_mean"] = round(s["mean"] * 30 / 1000.0, 2) if s["n"] else None
    report["lipsync_per_reply"] = [
        {"offset_ms": round(o.offset_ms, 1), "confidence": round(o.confidence, 2)} for o in offsets
    ]
    u = summarize_offsets(unsynced)
    report["lipsync_offset_unsynced_ms"] = {
        k: (round(x, 1) if isinstance(x, float) else x) for k, x in u.items()
    }
    return report


def load_questions(paths: Sequence[str]) -> list[tuple[str, Path]]:
    """WAV paths with their sidecar transcripts (same name, .txt)."""
    out = []
    for p in paths:
        wav = Path(p)
        txt = wav.with_suffix(".txt")
        if not wav.exists():
            raise FileNotFoundError(f"{wav}: no such file")
        if not txt.exists():
            raise FileNotFoundError(f"{txt}: missing transcript sidecar for {wav}")
        out.append((txt.read_text(encoding="utf-8").strip(), wav))
    return out
