"""The render pool batches the sessions' frames: requests made within the gather window share one call of
the backend; a session that stops asking is no longer waited for. The real CPU backend renders."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from av import VideoFrame

from engine.avatar.config import AvatarConfig
from engine.avatar.live import FORGET_AFTER_BATCHES, RenderPool, renderer_factory
from engine.avatar.params import DEFAULTS
from engine.clock import MediaClock, ScriptedClock
from engine.transport.video_out import on_grid

pytestmark = pytest.mark.unit

PROFILE = "360p"


@pytest.fixture(scope="module")
def factory():  # type: ignore[no-untyped-def]
    return renderer_factory(AvatarConfig(backend="torch", cpu_kernels="off", profile=PROFILE))


def pose() -> np.ndarray:
    return DEFAULTS.copy()


def finish(rgba: np.ndarray, region: object, damage: object) -> VideoFrame:
    return VideoFrame.from_ndarray(np.ascontiguousarray(rgba[..., :3]), format="rgb24")


async def ask(pool: RenderPool, asker: object, after_s: float = 0.0) -> VideoFrame:
    await asyncio.sleep(after_s)
    return await pool.render(PROFILE, pose, finish, asker=asker)


class Asker:  # stands for a session's video source: the pool only needs something weakly referable
    pass


async def test_requests_within_the_gather_window_share_one_render(factory) -> None:  # type: ignore[no-untyped-def]
    pool = RenderPool(factory, gather_s=0.5)
    try:
        await pool.prepare(PROFILE)
        a, b, c = Asker(), Asker(), Asker()
        # each asks once alone (the pool learns who asks), then all three a few ms apart
        for s in (a, b, c):
            await ask(pool, s)
        assert pool.batches == 3
        frames = await asyncio.gather(ask(pool, a), ask(pool, b, 0.01), ask(pool, c, 0.02))
        assert [f.width for f in frames] == [640] * 3
        assert pool.batches == 4, "the three requests were rendered in one call"
        assert pool.waiting_for(PROFILE) == 3
        summary = pool.stats.summary()
        assert summary["frames"] == 6 and summary["batches"] == 4
        assert summary["frames_per_batch"] == 1.5
        assert summary["render_ms"]["p50"] > 0 and summary["batch_ms"]["p95"] >= summary["render_ms"]["p50"]
    finally:
        pool.close()


async def test_a_session_that_stops_asking_is_forgotten(factory) -> None:  # type: ignore[no-untyped-def]
    pool = RenderPool(factory, gather_s=0.02)
    try:
        await pool.prepare(PROFILE)
        a, b = Asker(), Asker()
        await asyncio.gather(ask(pool, a), ask(pool, b))
        assert pool.waiting_for(PROFILE) == 2
        # b stops: a's batches wait out the window, and after a second of them b is no longer counted
        for _ in range(FORGET_AFTER_BATCHES + 1):
            await ask(pool, a)
        assert pool.waiting_for(PROFILE) == 1
        del b
    finally:
        pool.close()


async def test_without_a_window_only_requests_of_one_loop_tick_share_a_render(factory) -> None:  # type: ignore[no-untyped-def]
    pool = RenderPool(factory, gather_s=0.0)
    try:
        await pool.prepare(PROFILE)
        a, b = Asker(), Asker()
        await asyncio.gather(ask(pool, a), ask(pool, b))
        assert pool.batches == 1
        await asyncio.gather(ask(pool, a), ask(pool, b, 0.01))
        assert pool.batches == 3
    finally:
        pool.close()


async def test_one_sessions_failed_pose_fails_only_its_own_frame(factory) -> None:  # type: ignore[no-untyped-def]
    pool = RenderPool(factory, gather_s=0.5)
    try:
        await pool.prepare(PROFILE)
        a, b = Asker(), Asker()
        await asyncio.gather(ask(pool, a), ask(pool, b))

        def broken() -> np.ndarray:
            raise RuntimeError("pose failed")

        results = await asyncio.gather(
            pool.render(PROFILE, broken, finish, asker=a), ask(pool, b, 0.01), return_exceptions=True
        )
        assert isinstance(results[0], RuntimeError) and isinstance(results[1], VideoFrame)
        assert pool.batches == 2, "b's frame came from the batch a's failed pose was in"
        frames = await asyncio.gather(ask(pool, a), ask(pool, b))
        assert len(frames) == 2
    finally:
        pool.close()


async def test_finish_threads_finish_a_batchs_frames_side_by_side(factory) -> None:  # type: ignore[no-untyped-def]
    """``avatar.finish_threads``: the frames of one batch are finished at the same time in their own threads
    (two meet at a barrier, which one thread finishing them in turn never passes), each session's frame its
    own, and one session's failed finish fails only its frame."""
    import threading

    pool = RenderPool(factory, gather_s=0.5, finish_threads=2)
    try:
        await pool.prepare(PROFILE)
        a, b, c = Asker(), Asker(), Asker()
        for s in (a, b, c):
            await ask(pool, s)
        meet = threading.Barrier(2, timeout=5.0)
        threads: list[str] = []

        def finish_tagged(tag: int) -> object:
            def run(rgba: np.ndarray, region: object, damage: object) -> VideoFrame:
                threads.append(threading.current_thread().name)
                if tag < 2:
                    meet.wait()  # a and b: both in flight at once, or this raises BrokenBarrierError
                if tag == 2:
                    raise RuntimeError("c's conversion failed")
                img = np.full((16, 16, 3), tag, np.uint8)
                return VideoFrame.from_ndarray(img, format="rgb24")

            return run

        results = await asyncio.gather(
            *(pool.render(PROFILE, pose, finish_tagged(i), asker=s) for i, s in enumerate((a, b, c))),  # type: ignore[arg-type]
            return_exceptions=True,
        )
        assert pool.batches == 4, "the three frames came from one render"
        got_a, got_b, got_c = results
        assert isinstance(got_a, VideoFrame) and got_a.to_ndarray(format="rgb24")[0, 0, 0] == 0
        assert isinstance(got_b, VideoFrame) and got_b.to_ndarray(format="rgb24")[0, 0, 0] == 1
        assert isinstance(got_c, RuntimeError)
        assert len(threads) == 3 and all(name.startswith("render-finish") for name in threads)
    finally:
        pool.close()


def test_every_sessions_frames_fall_on_one_grid() -> None:
    fps = 30
    firsts = []
    for origin in (1000.0, 1000.0123, 1000.0291, 1003.5):
        clock = MediaClock(start=origin)
        t0 = on_grid(clock, fps)
        assert clock.now() <= t0 < clock.now() + 1 / fps + 1e-9
        firsts.append((origin + t0) * fps)
    assert all(abs(f - round(f)) < 1e-6 for f in firsts), firsts
    assert on_grid(ScriptedClock(2.5), fps) == 2.5  # a scripted clock is its own grid
