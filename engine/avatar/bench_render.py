"""Render benchmark: ms per frame for each available backend, output profile and batch size.

``idolcast bench --render`` calls :func:`run_render_bench`. Frames are driven by
a speaking-idle parameter stream (head sway, breathing, blinking, visemes
changing every frame), so caches only help as much as they would live.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from engine.avatar.backends.base import BackendUnavailable, select_backend
from engine.avatar.params import INDEX, VISEMES
from engine.avatar.profiles import profile_size

log = logging.getLogger(__name__)


def speaking_params(n: int, batch: int, seed: int = 0) -> np.ndarray:
    """``[n, batch, P]`` parameters: idle sway and breathing, a blink, visemes cycling every frame."""
    from engine.avatar.generator import rest_params

    rng = np.random.default_rng(seed)
    out = np.repeat(rest_params(batch)[None], n, axis=0)
    t = np.arange(n)[:, None] / 30.0 + rng.uniform(0, 10, size=(1, batch))
    out[:, :, INDEX["head_yaw"]] = 0.3 * np.sin(0.7 * t)
    out[:, :, INDEX["head_roll"]] = 0.25 * np.sin(0.5 * t + 1)
    out[:, :, INDEX["head_pitch"]] = 0.2 * np.sin(0.9 * t + 2)
    out[:, :, INDEX["body_x"]] = 0.5 * np.sin(0.3 * t)
    out[:, :, INDEX["breath"]] = 0.5 + 0.5 * np.sin(1.6 * t)
    out[:, :, INDEX["eye_open_l"]] = out[:, :, INDEX["eye_open_r"]] = np.clip(
        np.abs(np.sin(0.8 * t)) * 4, 0, 1
    )
    vis = rng.integers(0, len(VISEMES), size=(n, batch))
    out[:, :, INDEX["viseme_sil"] : INDEX["viseme_sil"] + len(VISEMES)] = 0.0
    for k in range(len(VISEMES)):
        out[:, :, INDEX["viseme_sil"] + k] = (vis == k) * 0.7 + 0.3 * (np.roll(vis, 1, axis=0) == k)
    return out.astype(np.float32)


def run_render_bench(
    backends: list[str],
    profiles: list[str],
    batches: list[int],
    frames: int = 30,
    warmup: int = 3,
    character: str = "builtin:default",
) -> list[dict[str, Any]]:
    """Rows ``{backend, width, height, batch, ms_per_frame, cpu_ms_per_frame}``; unavailable backends are
    skipped (logged)."""
    rows: list[dict[str, Any]] = []
    for name in backends:
        for prof in profiles:
            w, h = profile_size(prof)
            try:
                backend = select_backend(name, prof, character)
            except BackendUnavailable as e:
                log.warning("render bench: %s skipped: %s", name, e)
                break
            for batch in batches:
                params = speaking_params(warmup + frames, batch)
                for i in range(warmup):
                    backend.render(params[i])
                t0, c0 = time.perf_counter(), time.process_time()
                for i in range(warmup, warmup + frames):
                    backend.render(params[i])
                dt, dc = time.perf_counter() - t0, time.process_time() - c0
                rows.append(
                    {
                        "backend": backend.name,
                        "width": w,
                        "height": h,
                        "batch": batch,
                        "ms_per_frame": round(dt * 1000.0 / (frames * batch), 3),
                        # CPU seconds this process spent (all threads): on a contended machine wall time
                        # overstates the cost; on an idle one the two agree for 1 thread.
                        "cpu_ms_per_frame": round(dc * 1000.0 / (frames * batch), 3),
                    }
                )
    return rows
