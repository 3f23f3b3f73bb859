"""Video encoder threads: one policy for every session's encoder, so that they do not fight for the cores.

aiortc's VP8 encoder picks its thread count from the frame size and ``multiprocessing.cpu_count()`` alone
(2 threads at 720p on 3+ cores, 3 above 1280×960 on 6+, 8 at 1080p on 9+), whatever else runs. With many
sessions that oversubscribes the machine: on the H200 host's 16 cores, 16 concurrent VP8 720p encoders
fell from ~1,200 frames/s in total (8 streams) to ~530 (docs/PERFORMANCE.md). And a second thread buys
little even alone: libvpx's VP8 threads split a frame by macroblock rows and wait for each other by
spinning, so on the idol's 720p picture two threads took 2.7-2.8 ms a frame instead of 3.0 but spent
4.3-4.6 CPU ms instead of 3.0 (an idle 2-core Xeon; at 1080p 6.4 ms and 11 CPU ms against 6.0-9.2 and
6.0-9.2). The policy here:

* each encoder gets at most ``server.video_encoder_threads`` threads (1 by default; 0 = aiortc's own
  choice for its frame size);
* the cores are the ones this process may use (``engine/cores.py``: its affinity, capped by a container's
  CPU quota), less ``reserve`` (the render thread, the voice pipeline); each encoder's share is
  ``cores // live encoders``, at least 1, so all of them together never ask for more threads than cores
  (until there are more encoders than cores: then one each).

:func:`install` applies it to aiortc's VP8 encoder (the codec browsers negotiate first): the number is
read when an encoder (re)opens its codec, i.e. at the first frame and on a size or bitrate change, so a
session that joins later makes the next encoders smaller, not the running ones. The RTMP egress's libx264
(``engine/surfaces/rtmp.py``) registers and asks too. aiortc's own H.264 encoder sets no thread count
(libx264 then takes 1.5 × the cores): not covered yet.
"""

from __future__ import annotations

import logging
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from engine.cores import usable_cores

log = logging.getLogger(__name__)


def aiortc_threads(pixels: int, cores: int) -> int:
    """aiortc's own VP8 choice (``aiortc.codecs.vpx.number_of_threads``), restated: the policy's ceiling."""
    if pixels >= 1920 * 1080 and cores > 8:
        return 8
    if pixels > 1280 * 960 and cores >= 6:
        return 3
    if pixels > 640 * 480 and cores >= 3:
        return 2
    return 1


def encoder_threads(pixels: int, encoders: int, cores: int, most: int = 0) -> int:
    """Threads for one of ``encoders`` concurrent encoders of ``pixels``-pixel frames on ``cores`` cores,
    at most ``most`` each (0: aiortc's choice for the size is the only ceiling)."""
    share = max(1, cores // max(1, encoders))
    ceiling = aiortc_threads(pixels, cores) if most <= 0 else most
    return max(1, min(ceiling, share))


DEFAULT_PER_ENCODER = 1  # server.video_encoder_threads' default (see above)


class EncoderPolicy:
    """Counts the live video encoders and answers each one's thread count."""

    def __init__(
        self, cores: int | None = None, reserve: int = 0, per_encoder: int = DEFAULT_PER_ENCODER
    ) -> None:
        self.cores = max(1, (cores if cores is not None else usable_cores()) - reserve)
        self.per_encoder = per_encoder  # the most threads one encoder gets (0: aiortc's choice by size)
        self._live: weakref.WeakSet[Any] = weakref.WeakSet()
        self._lock = threading.Lock()

    def register(self, encoder: Any) -> None:
        with self._lock:
            self._live.add(encoder)

    @property
    def live(self) -> int:
        with self._lock:
            return len(self._live)

    def threads(self, pixels: int) -> int:
        return encoder_threads(pixels, self.live, self.cores, self.per_encoder)


_installed: EncoderPolicy | None = None

# libvpx options set on top of aiortc's (the idol's picture, one thread, `scripts/vp8_options.py`):
# * its temporal denoiser (aiortc asks for noise-sensitivity 4) is made for camera noise; on a rendered picture
#   it only costs CPU and softens the frame: 720p 3.6-4.9 -> 2.3-2.9 CPU ms a frame, PSNR 50.3 -> 52.7 dB;
# * libvpx's fastest real-time speed (aiortc asks for -6): 720p 2.8 -> 2.2 CPU ms a frame, PSNR 52.7 -> 51.8 dB;
#   360p 1.17 -> 0.81 ms at the same 56.1 dB; 1080p 8.2 -> 6.6 ms, 49.0 -> 47.7 dB; the same bitrate
#   (2026-12-05, AMX Xeon). The encoders are the largest CPU cost of many sessions on a GPU box.
VP8_OPTIONS = {"noise-sensitivity": "0", "cpu-used": "-16"}


class _VP8Context:
    """A libvpx encoder context whose ``options``, when aiortc sets them, get :data:`VP8_OPTIONS` merged in."""

    __slots__ = ("_context", "given_options")

    def __init__(self, context: Any) -> None:
        object.__setattr__(self, "_context", context)
        object.__setattr__(self, "given_options", {})  # what the codec was opened with (it consumes them)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "options":
            value = {**value, **VP8_OPTIONS}
            object.__setattr__(self, "given_options", dict(value))
        setattr(self._context, name, value)


class _AvForVP8:
    """Stands in for the ``av`` module inside aiortc's vpx module (its encoder calls
    ``av.CodecContext.create("libvpx", "w")`` there); everything else is the real module."""

    def __init__(self, av: Any) -> None:
        self._av = av

    def __getattr__(self, name: str) -> Any:
        return getattr(self._av, name)

    @property
    def CodecContext(self) -> Any:  # noqa: N802 - the module attribute it stands for
        real = self._av.CodecContext

        class Contexts:
            @staticmethod
            def create(codec: str, mode: str = "r") -> Any:
                context = real.create(codec, mode)
                return _VP8Context(context) if mode == "w" else context

        return Contexts


def install(policy: EncoderPolicy | None = None) -> EncoderPolicy:
    """Make aiortc's VP8 encoders take their thread count from ``policy`` (idempotent; returns the one in
    force) and :data:`VP8_OPTIONS`. Each new ``Vp8Encoder`` registers itself; ``number_of_threads`` answers
    from the policy."""
    global _installed
    from aiortc.codecs import vpx

    if _installed is not None and policy is None:
        return _installed
    active = policy or EncoderPolicy()
    if _installed is None:
        original_init = vpx.Vp8Encoder.__init__

        def init(self: Any) -> None:
            original_init(self)
            if _installed is not None:
                _installed.register(self)

        vpx.Vp8Encoder.__init__ = init  # type: ignore[method-assign]

        def number_of_threads(pixels: int, cpus: int) -> int:
            return _installed.threads(pixels) if _installed is not None else aiortc_threads(pixels, cpus)

        vpx.number_of_threads = number_of_threads
        vpx.av = _AvForVP8(vpx.av)  # type: ignore[assignment]
    _installed = active
    log.info(
        "video encoders: %s thread(s) each, up to %d in total",
        active.per_encoder or "aiortc's choice of",
        active.cores,
    )
    return active


# Jobs one session may have in the loop's default executor at once: aiortc encodes every audio and video
# frame there (``run_in_executor(None, encoder.encode, ...)``), beside the session's own ``to_thread`` calls.
JOBS_PER_SESSION = 4


def executor_workers(max_sessions: int, cores: int | None = None) -> int:
    """Threads for the loop's default executor when ``max_sessions`` may stream at once."""
    return min(512, (cores if cores is not None else usable_cores()) + JOBS_PER_SESSION * max_sessions)


def media_executor(max_sessions: int) -> ThreadPoolExecutor:
    """The engine loop's default executor, sized for its sessions' encoders.

    asyncio's own holds ``min(32, cores + 4)`` threads (20 on the H200 host's 16 cores): with 16 sessions,
    16 video and 16 audio encoders and the sessions' other jobs queued in it, and a reply's audio frames
    waited behind other sessions' video frames. Threads start only when a job finds none idle, so a
    large ceiling costs nothing while few sessions run; the encoders still share the cores by the
    policy above (their libvpx threads), this only keeps a job from waiting for a free worker.
    """
    return ThreadPoolExecutor(max_workers=executor_workers(max_sessions))


__all__ = [
    "EncoderPolicy",
    "aiortc_threads",
    "encoder_threads",
    "executor_workers",
    "install",
    "media_executor",
]
