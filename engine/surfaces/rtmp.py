"""RTMP egress: push a session's audio and video to an RTMP ingest (Twitch, YouTube) without OBS.

PyAV muxes FLV with libx264 + AAC. Encoding runs in one worker thread per stream, never on the event
loop. Two small pump tasks read the session's media taps and hand frames to the thread through deques
bounded in media time (the oldest go when the encoder falls behind).

The output timeline is the audio's: every 20 ms audio frame advances it, and video frames are emitted
at a constant ``fps`` on that timeline, each one the newest rendered frame not later than its time
(a plain background card until the session has video; packed-alpha frames are composited over
``background``, since RTMP carries no alpha). When the server drops the connection the thread closes
the muxer, waits (``reconnect_min_s`` doubling up to ``reconnect_max_s``) and connects again with a fresh
timeline.
"""

from __future__ import annotations

import asyncio
import fnmatch
import fractions
import logging
import threading
import time
from collections import deque
from typing import Any
from urllib.parse import urlsplit

import av
import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from engine.config import RTMPConfig
from engine.events import RTMPState
from engine.session.session import Session
from engine.tasks import TaskOwner, cancel_and_wait
from engine.transport import encoders
from engine.transport.taps import tap

log = logging.getLogger(__name__)

AUDIO_RATE = 48000
MAX_AUDIO_S = 2.0


def parse_colour(hex_colour: str) -> tuple[int, int, int]:
    h = hex_colour.lstrip("#")
    if len(h) not in (6, 8):
        raise ValueError(f"expected a #RRGGBB colour (got {hex_colour!r})")
    return int(h[0:2], 16), int(h[2:4], 16), int(h[4:6], 16)


def redact(url: str) -> str:
    """The URL without its stream key (for logs and status)."""
    head, _, _ = url.rpartition("/")
    return f"{head}/***" if head else "***"


def target_allowed(url: str, config: RTMPConfig) -> bool:
    """Whether an RTMP URL given by a request may be pushed to: its host is the configured URL's or
    matches ``surfaces.rtmp.allowed_hosts`` (shell patterns, e.g. ``*.contribute.live-video.net``)."""
    host = (urlsplit(url).hostname or "").lower()
    if not host or urlsplit(url).scheme not in ("rtmp", "rtmps"):
        return False
    if config.url and (urlsplit(config.url).hostname or "").lower() == host:
        return True
    return any(fnmatch.fnmatchcase(host, pattern.lower()) for pattern in config.allowed_hosts)


class RTMPStreamer:
    def __init__(self, session: Session, config: RTMPConfig, url: str, packed_alpha: bool = False) -> None:
        if not url.startswith(("rtmp://", "rtmps://")):
            raise ValueError(f"expected an rtmp:// or rtmps:// URL (got {redact(url)!r})")
        self.session = session
        self.config = config
        self.url = url
        self.packed_alpha = packed_alpha
        self.background = np.array(parse_colour(config.background), np.float32)
        self.state = "idle"
        self.connects = 0
        self.last_error = ""
        self.sent_s = 0.0  # media seconds sent on the current connection
        self._audio: deque[av.AudioFrame] = deque(maxlen=int(MAX_AUDIO_S / 0.02))
        self._video: deque[av.VideoFrame] = deque(maxlen=config.fps)
        self._have_audio = threading.Event()
        self._stop = threading.Event()
        self._owner = TaskOwner(f"rtmp-{session.id}")
        self._tracks: list[MediaStreamTrack] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread_task: asyncio.Task[None] | None = None

    # ---- lifecycle (event loop) ------------------------------------------------------------------

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        audio = tap(self.session, "audio", max_ms=1000.0)
        if audio is None:
            raise RuntimeError(f"session {self.session.id} has no audio to stream")
        self._tracks.append(audio)
        self._owner.spawn(self._pump(audio, self._audio), "audio-pump")
        video = tap(self.session, "video")
        if video is not None:
            self._tracks.append(video)
            self._owner.spawn(self._pump(video, self._video), "video-pump")
        self._thread_task = self._owner.spawn(asyncio.to_thread(self._run), "encoder")

    async def stop(self) -> None:
        self._stop.set()
        self._have_audio.set()
        for track in self._tracks:
            track.stop()
        await cancel_and_wait(self._thread_task, grace_s=10.0)  # the thread sees _stop within ~0.1 s
        await self._owner.cancel_all()
        self.state = "stopped"

    def status(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "url": redact(self.url),
            "connects": self.connects,
            "sent_s": round(self.sent_s, 1),
            "last_error": self.last_error,
            "video": len(self._tracks) > 1,
        }

    async def _pump(self, track: MediaStreamTrack, into: deque[Any]) -> None:
        try:
            while True:
                into.append(await track.recv())
                if into is self._audio:
                    self._have_audio.set()
        except MediaStreamError:
            return

    def _set_state(self, state: str, error: str = "") -> None:
        self.state = state
        self.last_error = error or self.last_error
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(
                self.session.bus.publish, RTMPState(t=self.session.clock.now(), state=state, error=error)
            )

    # ---- the encoder thread --------------------------------------------------------------------

    def _run(self) -> None:
        delay = self.config.reconnect_min_s
        while not self._stop.is_set():
            self._set_state("connecting")
            # Wall time, deliberately: how long a connection to the RTMP server lasted decides the reconnect
            # backoff; that is the network's time, in the encoder thread, and no media is timed by it (the
            # stream's timeline is the audio's, from the session clock's pts).
            started = time.monotonic()
            try:
                self._stream_once()
            except Exception as e:  # any muxer/network failure: reconnect
                if self._stop.is_set():
                    break
                log.warning("RTMP to %s failed: %s; reconnecting in %.1fs", redact(self.url), e, delay)
                # the API and the events say only that it failed: the reason (refused, timed out…)
                # would turn the egress into a port scanner; the engine log has it
                self._set_state("reconnecting", "the stream did not go through (the engine log says why)")
            if time.monotonic() - started > 10:  # it had been working (wall time, as above): backoff over
                delay = self.config.reconnect_min_s
            if self._stop.wait(delay):
                break
            delay = min(delay * 2, self.config.reconnect_max_s)
            self._audio.clear()
            self._video.clear()
        self._set_state("stopped")

    def _stream_once(self) -> None:
        cfg = self.config
        container = av.open(
            self.url,
            mode="w",
            format="flv",
            options={"flvflags": "no_duration_filesize"},
        )
        try:
            vs = container.add_stream("libx264", rate=cfg.fps)
            vs.width, vs.height, vs.pix_fmt = cfg.width, cfg.height, "yuv420p"
            vs.bit_rate = cfg.video_bitrate_kbps * 1000
            gop = max(1, round(cfg.keyframe_interval_s * cfg.fps))
            vs.codec_context.gop_size = gop
            policy = encoders.install()  # the same thread policy as the sessions' VP8 encoders
            policy.register(self)
            vs.codec_context.thread_count = policy.threads(cfg.width * cfg.height)
            vs.codec_context.options = {
                "preset": cfg.preset,
                "tune": "zerolatency",
                "profile": cfg.profile,
                "x264-params": f"keyint={gop}:min-keyint={gop}:scenecut=0:bframes=0",
            }
            aus = container.add_stream("aac", rate=AUDIO_RATE, layout="stereo")
            aus.bit_rate = cfg.audio_bitrate_kbps * 1000
            self.connects += 1
            self.sent_s = 0.0
            self._set_state("live")
            log.info("RTMP streaming session %s to %s", self.session.id, redact(self.url))
            self._encode(container, vs, aus)
        finally:
            try:
                container.close()
            except Exception:  # the connection is already gone
                pass

    def _encode(self, container: Any, vs: Any, aus: Any) -> None:
        # Frames from the taps are shared with the other consumers: copy, never mutate them.
        fps = self.config.fps
        image = self._card()  # yuv420p planes of the current picture
        samples = 0  # audio samples sent on this connection
        frames = 0  # video frames sent on this connection
        t0: float | None = None  # session-clock time of the first audio sample
        while not self._stop.is_set():
            if not self._audio:
                self._have_audio.clear()
                self._have_audio.wait(0.1)
                continue
            src = self._audio.popleft()
            if t0 is None:
                t0 = float(src.pts * src.time_base) if src.pts is not None and src.time_base else 0.0
            pcm = src.to_ndarray().reshape(1, -1)
            frame = av.AudioFrame.from_ndarray(pcm, format=src.format.name, layout=src.layout.name)
            frame.sample_rate = src.sample_rate
            frame.pts = samples
            frame.time_base = fractions.Fraction(1, frame.sample_rate)
            for packet in aus.encode(frame):
                container.mux(packet)
            samples += frame.samples
            t_media = samples / frame.sample_rate
            while frames / fps <= t_media:
                picked = self._pick_video(t0 + frames / fps)
                if picked is not None:
                    image = self._prepare(picked)
                out = av.VideoFrame.from_ndarray(image, format="yuv420p")
                out.pts = frames
                out.time_base = fractions.Fraction(1, fps)
                for packet in vs.encode(out):
                    container.mux(packet)
                frames += 1
            self.sent_s = t_media

    def _pick_video(self, t: float) -> av.VideoFrame | None:
        """The newest frame rendered for a time ≤ t (older ones are dropped)."""
        picked = None
        while self._video:
            f = self._video[0]
            ft = float(f.pts * f.time_base) if f.pts is not None and f.time_base else t
            if ft > t:
                break
            picked = self._video.popleft()
        return picked

    def _prepare(self, frame: av.VideoFrame) -> np.ndarray:
        w, h = self.config.width, self.config.height
        if self.packed_alpha:
            rgb = frame.to_ndarray(format="rgb24")
            half = rgb.shape[1] // 2
            alpha = rgb[:, half : 2 * half, :1].astype(np.float32) / 255.0
            out = rgb[:, :half].astype(np.float32) * alpha + self.background * (1.0 - alpha)
            frame = av.VideoFrame.from_ndarray(out.astype(np.uint8), format="rgb24")
        result: np.ndarray = frame.to_ndarray(width=w, height=h, format="yuv420p")
        return result

    def _card(self) -> np.ndarray:
        w, h = self.config.width, self.config.height
        img = np.empty((h, w, 3), np.uint8)
        img[:] = self.background.astype(np.uint8)
        card: np.ndarray = av.VideoFrame.from_ndarray(img, format="rgb24").to_ndarray(format="yuv420p")
        return card
