"""The live video of each session: animator → shared batched renderer → composited frame.

:class:`RenderPool` is shared by all sessions of an engine: requests that arrive
together are rendered together, one batched call per profile, in one render
thread (so several sessions on one GPU share a launch, and the CPU never runs
two renders at once). :class:`SessionVideo` is one session's
:class:`~engine.transport.video_out.FrameSource`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from av import VideoFrame

from engine.avatar.animator import Animator
from engine.avatar.config import AvatarConfig
from engine.avatar.profiles import profile_size

log = logging.getLogger(__name__)

FPS = 30


class Renderer(Protocol):
    """What the pool needs of a backend: premultiplied RGBA uint8 frames, region-updated in place."""

    width: int
    height: int
    region: tuple[int, int, int, int]

    def new_frames(self, batch: int = 1) -> np.ndarray: ...

    def render_into(self, frames: np.ndarray, params: np.ndarray) -> np.ndarray: ...


RendererFactory = Callable[[str], Renderer]


@dataclass
class _Job:
    params: np.ndarray
    frame: np.ndarray  # [1, H, W, 4] uint8, the session's own buffer
    finish: Callable[[np.ndarray], VideoFrame]  # runs in the render thread after the render
    done: asyncio.Future[VideoFrame]
    result: VideoFrame | None = None


class RenderPool:
    def __init__(self, factory: RendererFactory) -> None:
        self._factory = factory
        self._renderers: dict[str, Renderer] = {}
        self._pending: dict[str, list[_Job]] = {}
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="render")
        self.batches = 0
        self.frames = 0

    def renderer(self, profile: str) -> Renderer:
        """The renderer for ``profile`` (built on first use; blocking: call from a worker thread)."""
        if profile not in self._renderers:
            self._renderers[profile] = self._factory(profile)
        return self._renderers[profile]

    async def prepare(self, profile: str) -> Renderer:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, self.renderer, profile)

    async def render(
        self, profile: str, params: np.ndarray, frame: np.ndarray, finish: Callable[[np.ndarray], VideoFrame]
    ) -> VideoFrame:
        """Render ``params`` into ``frame`` and ``finish`` it into a video frame, off the loop.
        Joins whatever other sessions asked for in this tick into one batched call."""
        loop = asyncio.get_running_loop()
        job = _Job(params, frame, finish, loop.create_future())
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
        renderer = self.renderer(profile)
        if len(jobs) == 1:
            renderer.render_into(jobs[0].frame, jobs[0].params[None])
        else:
            frames = np.concatenate([j.frame for j in jobs])
            renderer.render_into(frames, np.stack([j.params for j in jobs]))
            for i, j in enumerate(jobs):
                x, y, w, h = renderer.region
                j.frame[0, y : y + h, x : x + w] = frames[i, y : y + h, x : x + w]
        for j in jobs:
            j.result = j.finish(j.frame)
        self.batches += 1
        self.frames += len(jobs)

    def close(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)


def parse_rgba(hex_colour: str) -> tuple[int, int, int, int]:
    h = hex_colour.lstrip("#")
    if len(h) not in (6, 8) or any(c not in "0123456789abcdefABCDEF" for c in h):
        raise ValueError(f"colour {hex_colour!r}: expected #RRGGBB or #RRGGBBAA")
    vals = [int(h[i : i + 2], 16) for i in range(0, len(h), 2)]
    return (vals[0], vals[1], vals[2], vals[3] if len(vals) == 4 else 255)


class Compositor:
    """Premultiplied RGBA → the sent picture: over a background colour, or packed colour|alpha."""

    def __init__(self, width: int, height: int, packed_alpha: bool, background: str) -> None:
        self.width, self.height, self.packed = width, height, packed_alpha
        r, g, b, a = parse_rgba(background)
        self.bg = np.array([r, g, b], np.uint16) * a // 255  # premultiplied
        self.out = np.zeros((height, width * 2 if packed_alpha else width, 3), np.uint8)
        self._full = True

    def compose(self, rgba: np.ndarray, region: tuple[int, int, int, int]) -> np.ndarray:
        x, y, w, h = (0, 0, self.width, self.height) if self._full else region
        self._full = False
        src = rgba[y : y + h, x : x + w]
        if self.packed:
            self.out[y : y + h, x : x + w] = src[..., :3]
            self.out[y : y + h, self.width + x : self.width + x + w] = src[..., 3:4]
        else:
            inv = 255 - src[..., 3:4].astype(np.uint16)
            self.out[y : y + h, x : x + w] = src[..., :3] + (self.bg * inv // 255).astype(np.uint8)
        return self.out


class SessionVideo:
    """One session's video: the animator's pose for time ``t``, rendered and composited."""

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
        self._frame: np.ndarray | None = None
        self._compositor: Compositor | None = None
        self._renderer: Renderer | None = None

    def set_profile(self, profile: str) -> None:
        """Switch the output size live (models stay loaded; the encoder re-initializes on the new size)."""
        profile_size(profile)  # validates
        self.profile = profile
        self._frame = None

    async def _ensure(self) -> tuple[Renderer, np.ndarray, Compositor]:
        if self._frame is None or self._renderer is None or self._compositor is None:
            renderer = await self.pool.prepare(self.profile)
            self._renderer = renderer
            self._frame = renderer.new_frames(1)
            self._compositor = Compositor(
                renderer.width, renderer.height, self.config.packed_alpha, self.config.background
            )
        return self._renderer, self._frame, self._compositor

    async def frame_at(self, t: float) -> VideoFrame:
        renderer, frame, compositor = await self._ensure()
        params = self.animator.params_at(t, compensation_s=self.compensation())

        def finish(rendered: np.ndarray) -> VideoFrame:
            rgb = compositor.compose(rendered[0], renderer.region)
            # from_ndarray copies the buffer; aiortc converts to yuv420p in its encoder thread.
            return VideoFrame.from_ndarray(rgb, format="rgb24")

        return await self.pool.render(self.profile, params, frame, finish)
