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
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

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


def renderer_factory(config: AvatarConfig) -> RendererFactory:
    """Build the configured character's frame backend for a profile (blocking: seconds; the torch backend
    compiles its face's features here, see ``avatar.cpu_kernels``)."""

    def build(profile: str, progress: Progress | None = None) -> FrameBackend:
        from engine.avatar.backends import select_backend

        return select_backend(
            config.backend, profile, config.character, cpu_kernels=config.cpu_kernels, progress=progress
        )

    return build


@dataclass
class _Job:
    pose: Pose  # runs in the render thread
    finish: Finish  # runs in the render thread on the rendered RGBA frame
    done: asyncio.Future[VideoFrame]
    result: VideoFrame | None = None


class RenderPool:
    def __init__(self, factory: RendererFactory) -> None:
        self._factory = factory
        self._backends: dict[str, FrameBackend] = {}
        self._pending: dict[str, list[_Job]] = {}
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="render")
        self.batches = 0
        self.frames = 0

    def backend(self, profile: str, progress: Progress | None = None) -> FrameBackend:
        """The backend for ``profile`` (built on first use; blocking: call from the render thread)."""
        if profile not in self._backends:
            self._backends[profile] = self._factory(profile, progress)
        return self._backends[profile]

    async def prepare(self, profile: str, progress: Progress | None = None) -> FrameBackend:
        """Build the backend for ``profile`` now, in the render thread (``progress`` must be thread-safe)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, self.backend, profile, progress)

    async def render(self, profile: str, pose: Pose, finish: Finish) -> VideoFrame:
        """Pose, render and ``finish`` the frame into a video frame, all off the loop.
        Requests from all sessions made in the same loop tick share one batched call."""
        loop = asyncio.get_running_loop()
        job = _Job(pose, finish, loop.create_future())
        batch = self._pending.setdefault(profile, [])
        batch.append(job)
        if len(batch) == 1:
            loop.call_soon(self._flush, profile)
        return await job.done

    def _flush(self, profile: str) -> None:
        jobs = self._pending.pop(profile, [])
        if not jobs:
            return
        loop = asyncio.get_running_loop()
        fut = loop.run_in_executor(self._thread, self._render_batch, profile, jobs)

        def finished(f: asyncio.Future[None]) -> None:
            exc = f.exception()
            for job in jobs:
                if job.done.done():
                    continue
                if exc is not None:
                    job.done.set_exception(exc)
                elif job.result is not None:
                    job.done.set_result(job.result)

        fut.add_done_callback(finished)

    def _render_batch(self, profile: str, jobs: list[_Job]) -> None:
        backend = self.backend(profile)
        frames = backend.render(np.stack([j.pose() for j in jobs]))
        region = changing_region(backend)
        damage: list[Damage] | None = getattr(backend, "damage", None)
        for i, job in enumerate(jobs):
            job.result = job.finish(frames[i], region, damage[i] if damage else None)
        self.batches += 1
        self.frames += len(jobs)

    def close(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)


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

        frame = await self.pool.render(self.profile, pose, finish)
        self.extras = extras
        return frame
