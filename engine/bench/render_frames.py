"""Render benchmark: ms per frame for each available backend, output profile and batch size.

``idolcast bench --render`` calls :func:`run_render_bench`. Frames are driven by
a speaking-idle parameter stream (head sway, breathing, blinking, visemes
changing every frame), so caches only help as much as they would live.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Literal

from engine.avatar.backends.base import BackendUnavailable
from engine.avatar.backends.select import select_backend
from engine.avatar.config import KernelMode
from engine.avatar.delivery import measure_delivery, speaking_params
from engine.avatar.profiles import profile_size

log = logging.getLogger(__name__)


CPU_BATCHES = 8  # by default, backends that render on the CPU stop here (batch 64 at 1080p is gigabytes)
ROW_BUDGET_S = 1.5  # a row stops timing after this long (at least MIN_FRAMES frames)
MIN_FRAMES = 3  # calls


def _emit(progress: Callable[[str], None] | None, text: str) -> None:
    if progress is not None:
        progress(text)


def _on_cpu(backend: object) -> bool:
    if getattr(backend, "name", "") == "torch":
        return True
    providers: list[str] = list(getattr(backend, "providers", None) or [])  # ONNX Runtime's, in order
    return bool(providers) and providers[0] == "CPUExecutionProvider"


def run_render_bench(
    backends: list[str],
    profiles: list[str],
    batches: list[int],
    frames: int = 30,
    warmup: int = 3,
    character: str = "builtin:default",
    row_budget_s: float = ROW_BUDGET_S,
    cpu_max_batch: int | None = None,
    progress: Callable[[str], None] | None = None,
    cpu_kernels: KernelMode = "auto",
) -> list[dict[str, Any]]:
    """Rows ``{backend, width, height, batch, frames, ms_per_frame, cpu_ms_per_frame}``; unavailable backends
    are skipped (logged). Each row times up to ``frames`` frames or ``row_budget_s`` seconds; batches above
    ``cpu_max_batch`` are skipped on backends that render on the CPU. ``progress`` gets a line per row.
    ``cpu_kernels``: the torch backend's, as ``avatar.cpu_kernels`` (compiled before the timing)."""
    rows: list[dict[str, Any]] = []
    for name in backends:
        for prof in profiles:
            w, h = profile_size(prof)
            t_build = time.perf_counter()
            try:
                backend = select_backend(name, prof, character, cpu_kernels=cpu_kernels)
            except BackendUnavailable as e:
                log.warning("render bench: %s skipped: %s", name, e)
                _emit(progress, f"{name}: unavailable ({e})")
                break
            _emit(progress, f"{backend.name} {w}x{h}: built in {time.perf_counter() - t_build:.1f} s")
            for batch in batches:
                if cpu_max_batch is not None and batch > cpu_max_batch and _on_cpu(backend):
                    _emit(progress, f"{backend.name} {w}x{h} batch {batch}: skipped (renders on the CPU)")
                    continue
                params = speaking_params(warmup + frames, batch)
                for i in range(warmup if batch == 1 else 1):
                    backend.render(params[i])
                t0, c0 = time.perf_counter(), time.process_time()
                n = 0
                for i in range(warmup, warmup + frames):
                    backend.render(params[i])
                    n += 1
                    if n >= MIN_FRAMES and time.perf_counter() - t0 > row_budget_s:
                        break
                dt, dc = time.perf_counter() - t0, time.process_time() - c0
                row = {
                    "backend": backend.name,
                    "width": w,
                    "height": h,
                    "batch": batch,
                    "frames": n * batch,
                    "ms_per_frame": round(dt * 1000.0 / (n * batch), 3),
                    # CPU seconds this process spent (all threads): on a contended machine wall time
                    # overstates the cost; on an idle one the two agree for 1 thread.
                    "cpu_ms_per_frame": round(dc * 1000.0 / (n * batch), 3),
                }
                rows.append(row)
                _emit(
                    progress,
                    f"{backend.name} {w}x{h} batch {batch}: {row['ms_per_frame']:.2f} ms/frame "
                    f"({row['cpu_ms_per_frame']:.2f} CPU ms), {n * batch} frames",
                )
    return rows


def delivery_cost(
    backend_name: str,
    profile: str,
    frames: int = 60,
    codec: Literal["vp8", "h264"] = "vp8",
    character: str = "builtin:default",
    packed_alpha: bool = False,
    cpu_kernels: KernelMode = "auto",
) -> dict[str, Any]:
    """CPU cost of one session's idol video (:func:`engine.avatar.delivery.measure_delivery`) as a report
    row: per frame stage by stage, and per second of 30 fps video."""
    backend = select_backend(backend_name, profile, character, cpu_kernels=cpu_kernels)
    cost = measure_delivery(backend, frames, codec, packed_alpha)
    return {
        "backend": backend.name,
        "profile": profile,
        "width": backend.width,
        "height": backend.height,
        "codec": codec,
        "frames": frames,
        "render_cpu_ms": round(cost.render_ms, 3),
        "convert_cpu_ms": round(cost.convert_ms, 3),
        "encode_cpu_ms": round(cost.encode_ms, 3),
        "cpu_ms_per_frame": round(cost.cpu_ms_per_frame, 3),
        "cpu_ms_per_s": round(cost.cpu_ms_per_s, 1),  # CPU ms per second of delivered 30 fps video
        "wall_ms_per_frame": round(cost.wall_ms, 3),
    }
