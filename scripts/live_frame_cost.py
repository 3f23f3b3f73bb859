"""What one session's idle idol costs the render thread: ms per frame of ``SessionVideo.frame_at``.

The animator's own idle motion (breathing, head sway, gaze drift, blinks), rendered, composited into
the I420 picture and wrapped as the encoder's frame, 300 frames after 30 of warm-up, on the CPU
backend. ``idolcast bench --render`` times the backend on a speaking parameter stream; this times the
whole frame as a listening session makes it.

    .venv/bin/python scripts/live_frame_cost.py 360p 720p
"""

from __future__ import annotations

import asyncio
import sys
import time

from engine.avatar.animator import Animator
from engine.avatar.live import RenderPool, SessionVideo, renderer_factory
from engine.config import Settings

FRAMES, WARMUP = 300, 30


async def frame_cost(profile: str) -> float:
    config = Settings().avatar.model_copy(update={"profile": profile, "backend": "torch"})
    pool = RenderPool(renderer_factory(config))
    try:
        await pool.prepare(profile)
        video = SessionVideo(pool, Animator.from_config(config, seed=0), config)
        for i in range(WARMUP):
            await video.frame_at(i / 30)
        start = time.perf_counter()
        for i in range(WARMUP, WARMUP + FRAMES):
            await video.frame_at(i / 30)
        return (time.perf_counter() - start) / FRAMES * 1000
    finally:
        pool.close()


def main(profiles: list[str]) -> None:
    for profile in profiles or ["360p", "720p"]:
        print(f"{profile}: {asyncio.run(frame_cost(profile)):.2f} ms a frame (idle motion, render thread)")


if __name__ == "__main__":
    main(sys.argv[1:])
