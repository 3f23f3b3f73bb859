"""The live video of each session: animator → shared batched renderer → composited frame.

:class:`RenderPool` is shared by all sessions of an engine: requests that arrive
together are rendered together, one batched call per profile, in one render
thread (so several sessions on one GPU share a launch, and the CPU never runs
two renders at once). :class:`SessionVideo` is one session's
:class:`~engine.transport.video_out.FrameSource`.

Nothing per frame runs on the event loop: the animator's pose (``Animator.params_at``, which reads one
immutable snapshot of its state, see engine/avatar/animator.py), the render and the compositing all run
in the render thread; the loop only queues the request and awaits its future.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from av import VideoFrame

from engine.avatar.animator import Animator
from engine.avatar.backends.base import FrameBackend
from engine.avatar.config import AvatarConfig
from engine.avatar.cpu_render import Damage
from engine.avatar.picture import Compositor
from engine.avatar.profiles import profile_size
from engine.progress import Progress

log = logging.getLogger(__name__)

FPS = 30


Region = tuple[int, int, int, int]
# runs in the render thread on one rendered RGBA frame, the region that can change and what did change
Finish = Callable[[np.ndarray, Region, Damage | None], VideoFrame]
# runs in the render thread: the parameter vector of the frame to render
Pose = Callable[[], np.ndarray]


def changing_region(backend: FrameBackend) -> Region:
    """The part of the frame that can change (the rest is static art); the whole frame if unknown."""
    generator = getattr(backend, "generator", None)
    region = getattr(generator, "region", None)
    return tuple(region) if region is not None else (0, 0, backend.width, backend.height)  # type: ignore[return-value]


RendererFactory = Callable[[str, Progress | None], FrameBackend]


def renderer_factory(config: AvatarConfig, max_batch: int = 32) -> RendererFactory:
    """Build the configured character's frame backend for a profile (blocking: seconds; the torch backend
    compiles its face's features here, see ``avatar.cpu_kernels``). ``max_batch``: the most frames one
    batch holds (the engine's sessions: one frame each)."""

    def build(profile: str, progress: Progress | None = None) -> FrameBackend:
        from engine.avatar.backends import select_backend

        return select_backend(
            config.backend,
            profile,
            config.character,
            cpu_kernels=config.cpu_kernels,
            progress=progress,
            max_batch=max_batch,
        )

    return build


@dataclass
class _Job:
    pose: Pose  # runs in the render thread
    finish: Finish  # runs in the render thread on the rendered RGBA frame
    done: asyncio.Future[VideoFrame]
    asker: object | None = None
    result: VideoFrame | None = None
    error: BaseException | None = None  # its own pose or finish failed (the others of its batch go on)


@dataclass
class _Batch:
    jobs: list[_Job] = field(default_factory=list)
    timer: asyncio.TimerHandle | None = None


# A session that has not asked for a frame in this many batches of its profile is no longer waited for
# (its track stopped, or it changed profile): 1 s of frames.
FORGET_AFTER_BATCHES = FPS
STATS_WINDOW = 300  # the render statistics cover the last this many batches


class RenderStats:
    """How the render thread spends its frames: rows a batch, the backend's call, the whole batch (ms)."""

    def __init__(self) -> None:
        self.batches = 0
        self.frames = 0
        self._recent: deque[tuple[int, float, float]] = deque(maxlen=STATS_WINDOW)
        self._lock = threading.Lock()

    def add(self, rows: int, render_s: float, batch_s: float) -> None:
        with self._lock:
            self.batches += 1
            self.frames += rows
            self._recent.append((rows, render_s, batch_s))

    def summary(self) -> dict[str, Any]:
        """What ``/api/capacity`` reports under ``render``."""
        with self._lock:
            recent = list(self._recent)
            batches, frames = self.batches, self.frames
        out: dict[str, Any] = {"batches": batches, "frames": frames}
        if recent:
            rows = np.array([r[0] for r in recent], dtype=np.float64)
            render_ms = np.array([r[1] for r in recent]) * 1000.0
            batch_ms = np.array([r[2] for r in recent]) * 1000.0
            out["frames_per_batch"] = round(float(rows.mean()), 2)
            out["render_ms"] = {
                q: round(float(np.percentile(render_ms, p)), 2) for q, p in (("p50", 50), ("p95", 95))
            }
            out["batch_ms"] = {
                q: round(float(np.percentile(batch_ms, p)), 2) for q, p in (("p50", 50), ("p95", 95))
            }
        return out


class RenderPool:
    """The engine's renderer: one render thread, one backend per profile, the sessions' frames batched.

    A frame's request joins the batch of its profile; the batch goes to the render thread when every
    session that has been asking for frames of that profile has asked (the sessions' frames share one
    grid, see engine/transport/video_out.py), or ``gather_s`` after its first request, whichever is first.
    With ``gather_s = 0`` only the requests made in the same loop tick share a batch.
    """

    def __init__(self, factory: RendererFactory, gather_s: float = 0.0, finish_threads: int = 0) -> None:
        self._factory = factory
        self.gather_s = max(0.0, gather_s)
        # a batch's frames finished side by side (OpenCV and numpy let go of the GIL): None = one by one
        self._finishers = (
            ThreadPoolExecutor(finish_threads, thread_name_prefix="render-finish")
            if finish_threads > 0
            else None
        )
        self._backends: dict[str, FrameBackend] = {}
        self._pending: dict[str, _Batch] = {}
        # who asked for frames of a profile, and in which of its batches they asked last
        self._askers: dict[str, weakref.WeakKeyDictionary[object, int]] = {}
        self._flushed: dict[str, int] = {}
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="render")
        self.stats = RenderStats()

    @property
    def batches(self) -> int:
        return self.stats.batches

    @property
    def frames(self) -> int:
        return self.stats.frames

    def backend(self, profile: str, progress: Progress | None = None) -> FrameBackend:
        """The backend for ``profile`` (built on first use; blocking: call from the render thread)."""
        if profile not in self._backends:
            self._backends[profile] = self._factory(profile, progress)
        return self._backends[profile]

    async def prepare(self, profile: str, progress: Progress | None = None) -> FrameBackend:
        """Build the backend for ``profile`` now, in the render thread (``progress`` must be thread-safe)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, self.backend, profile, progress)

    async def render(
        self, profile: str, pose: Pose, finish: Finish, asker: object | None = None
    ) -> VideoFrame:
        """Pose, render and ``finish`` the frame into a video frame, all off the loop. ``asker`` (the
        session's video source) is counted among those whose requests a batch waits for."""
        loop = asyncio.get_running_loop()
        job = _Job(pose, finish, loop.create_future(), asker)
        batch = self._pending.get(profile)
        if batch is None:
            batch = self._pending[profile] = _Batch()
            if self.gather_s > 0:
                batch.timer = loop.call_later(self.gather_s, self._flush, profile, batch)
            else:
                loop.call_soon(self._flush, profile, batch)
        batch.jobs.append(job)
        if asker is not None:
            self._askers.setdefault(profile, weakref.WeakKeyDictionary())[asker] = self._flushed.get(
                profile, 0
            )
        if self.gather_s > 0 and len(batch.jobs) >= self._expected(profile):
            if batch.timer is not None:
                batch.timer.cancel()
            batch.timer = None
            loop.call_soon(self._flush, profile, batch)
        return await job.done

    def waiting_for(self, profile: str) -> int:
        """How many sessions' requests a batch of ``profile`` waits for (those asking lately)."""
        return self._expected(profile)

    def _expected(self, profile: str) -> int:
        """How many requests a batch of ``profile`` waits for: the sessions asking lately."""
        askers = self._askers.get(profile)
        if not askers:
            return 1
        oldest = self._flushed.get(profile, 0) - FORGET_AFTER_BATCHES
        for gone in [a for a, last in askers.items() if last < oldest]:
            del askers[gone]
        return max(1, len(askers))

    def _flush(self, profile: str, batch: _Batch) -> None:
        if self._pending.get(profile) is not batch:
            return  # flushed already (all asked before the timer)
        del self._pending[profile]
        if batch.timer is not None:
            batch.timer.cancel()
        self._flushed[profile] = self._flushed.get(profile, 0) + 1
        jobs = batch.jobs
        loop = asyncio.get_running_loop()
        fut = loop.run_in_executor(self._thread, self._render_batch, profile, jobs)

        def finished(f: asyncio.Future[None]) -> None:
            exc = f.exception()
            for job in jobs:
                if job.done.done():
                    continue
                if exc is not None:
                    job.done.set_exception(exc)
                elif job.error is not None:
                    job.done.set_exception(job.error)
                elif job.result is not None:
                    job.done.set_result(job.result)

        fut.add_done_callback(finished)

    def _render_batch(self, profile: str, jobs: list[_Job]) -> None:
        """One backend call for the batch. A session's own pose or finish failing fails only its frame;
        the backend failing fails them all (they shared the call)."""
        began = time.perf_counter()
        backend = self.backend(profile)
        posed: list[_Job] = []
        params: list[np.ndarray] = []
        for job in jobs:
            try:
                params.append(job.pose())
            except Exception as e:  # noqa: BLE001 - handed to that session's frame
                job.error = e
            else:
                posed.append(job)
        if not posed:
            return
        rendering = time.perf_counter()
        keyed = getattr(backend, "render_keyed", None)
        frames: Sequence[np.ndarray] | np.ndarray
        if keyed is not None and all(job.asker is not None for job in posed):
            frames = keyed(np.stack(params), [job.asker for job in posed])  # each session in its own buffer
        else:
            frames = backend.render(np.stack(params))
        rendered = time.perf_counter()
        region = changing_region(backend)
        damage: list[Damage] | None = getattr(backend, "damage", None)

        def finish(i: int) -> None:
            job = posed[i]
            try:
                job.result = job.finish(frames[i], region, damage[i] if damage else None)
            except Exception as e:  # noqa: BLE001 - handed to that session's frame
                job.error = e

        if self._finishers is not None and len(posed) > 1:
            list(self._finishers.map(finish, range(len(posed))))  # all done before the buffers are reused
        else:
            for i in range(len(posed)):
                finish(i)
        self.stats.add(len(posed), rendered - rendering, time.perf_counter() - began)

    def close(self) -> None:
        for batch in self._pending.values():
            if batch.timer is not None:
                batch.timer.cancel()
        self._thread.shutdown(wait=False, cancel_futures=True)
        if self._finishers is not None:
            self._finishers.shutdown(wait=False, cancel_futures=True)


PACKED = "packed"  # the variant a viewer asks for: colour | alpha side by side (the OBS page)


class SessionVideo:
    """One session's video: the animator's pose for time ``t``, rendered and composited.

    The frame it returns is the session's own picture (plain over ``avatar.background``, or packed when
    ``avatar.packed_alpha``). While a consumer wants the packed picture and the session's own is plain
    (an OBS Browser Source watching a console session), each frame is also composited packed, from the
    same render, and left in :attr:`extras` for the media tee to hand to that consumer.
    """

    fps = FPS

    def __init__(
        self,
        pool: RenderPool,
        animator: Animator,
        config: AvatarConfig,
        compensation: Callable[[], float] = lambda: 0.0,
    ) -> None:
        self.pool = pool
        self.animator = animator
        self.config = config
        self.compensation = compensation
        self.profile: str = config.profile
        self._compositors: dict[bool, Compositor] = {}
        self._wants: dict[str, int] = {}
        self.extras: dict[str, VideoFrame] = {}  # the variants of the frame returned last

    def set_profile(self, profile: str) -> None:
        """Switch the output size live (models stay loaded; the encoder re-initializes on the new size)."""
        profile_size(profile)  # validates
        self.profile = profile

    def want(self, variant: str, on: bool) -> None:
        """A consumer starts (``on``) or stops wanting ``variant`` of every frame (counted)."""
        if variant != PACKED:
            raise ValueError(f"unknown video variant {variant!r} (expected {PACKED!r})")
        n = self._wants.get(variant, 0) + (1 if on else -1)
        if n > 0:
            self._wants[variant] = n
        else:
            self._wants.pop(variant, None)

    @property
    def pictures(self) -> dict[str, tuple[int, int]]:
        """The pictures composited from the last frame, by name ("own", "packed"), with their sizes."""
        own = self._compositors.get(self.config.packed_alpha)
        out = {"own": (own.out_width, own.height)} if own is not None else {}
        if self.extras and True in self._compositors:
            out[PACKED] = (self._compositors[True].out_width, self._compositors[True].height)
        return out

    def _compositor_for(self, width: int, height: int, packed: bool) -> Compositor:
        c = self._compositors.get(packed)
        if c is None or (c.width, c.height) != (width, height):
            c = self._compositors[packed] = Compositor(width, height, packed, self.config.background)
        return c

    async def frame_at(self, t: float) -> VideoFrame:
        animator, compensation = self.animator, self.compensation
        own = self.config.packed_alpha
        packed_too = not own and PACKED in self._wants
        extras: dict[str, VideoFrame] = {}

        def finish(rgba: np.ndarray, region: Region, damage: Damage | None) -> VideoFrame:
            # Converted here, once per picture, in the render thread, and only what changed (not per encoder).
            w, h = rgba.shape[1], rgba.shape[0]
            i420 = self._compositor_for(w, h, own).compose(rgba, region, damage)
            if packed_too:
                packed = self._compositor_for(w, h, True).compose(rgba, region, damage)
                extras[PACKED] = VideoFrame.from_ndarray(packed, format="yuv420p")
            return VideoFrame.from_ndarray(i420, format="yuv420p")  # a copy: the buffer is updated next frame

        def pose() -> np.ndarray:  # in the render thread: the animator reads one snapshot of its state
            return animator.params_at(t, compensation_s=compensation())

        frame = await self.pool.render(self.profile, pose, finish, asker=self)
        self.extras = extras
        return frame
