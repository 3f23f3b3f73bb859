"""Render benchmark: ms per frame for each available backend, output profile and batch size.

``idolcast bench --render`` calls :func:`run_render_bench`. Frames are driven by
a speaking-idle parameter stream (head sway, breathing, blinking, visemes
changing every frame), so caches only help as much as they would live.
"""

from __future__ import annotations

import fractions
import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from engine.avatar.backends.base import BackendUnavailable
from engine.avatar.backends.select import select_backend
from engine.avatar.params import INDEX, VISEMES
from engine.avatar.profiles import profile_size

log = logging.getLogger(__name__)


def speaking_params(n: int, batch: int, seed: int = 0) -> np.ndarray:
    """``[n, batch, P]`` parameters: idle sway, breathing and gaze drift, a blink, visemes cycling every
    frame."""
    from engine.avatar.generator import rest_params

    rng = np.random.default_rng(seed)
    out = np.repeat(rest_params(batch)[None], n, axis=0)
    t = np.arange(n)[:, None] / 30.0 + rng.uniform(0, 10, size=(1, batch))
    out[:, :, INDEX["head_yaw"]] = 0.3 * np.sin(0.7 * t)
    out[:, :, INDEX["head_roll"]] = 0.25 * np.sin(0.5 * t + 1)
    out[:, :, INDEX["head_pitch"]] = 0.2 * np.sin(0.9 * t + 2)
    out[:, :, INDEX["body_x"]] = 0.5 * np.sin(0.3 * t)
    out[:, :, INDEX["breath"]] = 0.5 + 0.5 * np.sin(1.6 * t)
    out[:, :, INDEX["gaze_x"]] = 0.3 * np.sin(1.3 * t + 3)  # the idle gaze drift's size (avatar/motion.py)
    out[:, :, INDEX["gaze_y"]] = 0.15 * np.sin(1.1 * t + 4)
    out[:, :, INDEX["eye_open_l"]] = out[:, :, INDEX["eye_open_r"]] = np.clip(
        np.abs(np.sin(0.8 * t)) * 4, 0, 1
    )
    vis = rng.integers(0, len(VISEMES), size=(n, batch))
    out[:, :, INDEX["viseme_sil"] : INDEX["viseme_sil"] + len(VISEMES)] = 0.0
    for k in range(len(VISEMES)):
        out[:, :, INDEX["viseme_sil"] + k] = (vis == k) * 0.7 + 0.3 * (np.roll(vis, 1, axis=0) == k)
    return out.astype(np.float32)


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
) -> list[dict[str, Any]]:
    """Rows ``{backend, width, height, batch, frames, ms_per_frame, cpu_ms_per_frame}``; unavailable backends
    are skipped (logged). Each row times up to ``frames`` frames or ``row_budget_s`` seconds; batches above
    ``cpu_max_batch`` are skipped on backends that render on the CPU. ``progress`` gets a line per row."""
    rows: list[dict[str, Any]] = []
    for name in backends:
        for prof in profiles:
            w, h = profile_size(prof)
            t_build = time.perf_counter()
            try:
                backend = select_backend(name, prof, character)
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
    codec: str = "vp8",
    character: str = "builtin:default",
    packed_alpha: bool = False,
) -> dict[str, Any]:
    """CPU cost of one session's idol video: render (batch 1), RGBA → I420 and encode (aiortc's own encoder,
    under the engine's thread policy), per frame and per second of 30 fps video. CPU time is this process's
    (all threads: the encoder's own count) stage by stage; ``wall_ms_per_frame`` is the whole frame."""
    from aiortc.codecs import get_encoder
    from aiortc.rtcrtpparameters import RTCRtpCodecParameters
    from av import VideoFrame

    from engine.avatar.live import changing_region
    from engine.avatar.picture import Compositor
    from engine.transport import encoders

    encoders.install()
    backend = select_backend(backend_name, profile, character)
    mime = {"vp8": "video/VP8", "h264": "video/H264"}[codec]
    enc = get_encoder(RTCRtpCodecParameters(mimeType=mime, clockRate=90000))
    comp = Compositor(backend.width, backend.height, packed_alpha, "#00000000")
    region = changing_region(backend)
    warmup = 5
    params = speaking_params(warmup + frames, 1)
    spent = {"render": 0.0, "convert": 0.0, "encode": 0.0}
    t_start = 0.0
    for i in range(warmup + frames):
        if i == warmup:
            spent = dict.fromkeys(spent, 0.0)
            t_start = time.perf_counter()
        c0 = time.process_time()
        rgba = backend.render(params[i])
        damage = getattr(backend, "damage", None)
        c1 = time.process_time()
        frame = VideoFrame.from_ndarray(
            comp.compose(rgba[0], region, damage[0] if damage else None), format="yuv420p"
        )
        frame.pts, frame.time_base = i * 3000, fractions.Fraction(1, 90000)
        c2 = time.process_time()
        enc.encode(frame)
        c3 = time.process_time()
        spent["render"] += c1 - c0
        spent["convert"] += c2 - c1
        spent["encode"] += c3 - c2
    wall = time.perf_counter() - t_start
    per = {k: v * 1000.0 / frames for k, v in spent.items()}
    total = sum(per.values())
    return {
        "backend": backend.name,
        "profile": profile,
        "width": backend.width,
        "height": backend.height,
        "codec": codec,
        "frames": frames,
        "render_cpu_ms": round(per["render"], 3),
        "convert_cpu_ms": round(per["convert"], 3),
        "encode_cpu_ms": round(per["encode"], 3),
        "cpu_ms_per_frame": round(total, 3),
        "cpu_ms_per_s": round(total * 30.0, 1),  # CPU ms per second of delivered 30 fps video
        "wall_ms_per_frame": round(wall * 1000.0 / frames, 3),
    }
