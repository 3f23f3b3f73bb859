"""What one session's idol video costs the CPU: render, RGBA → I420 and encode, per frame.

:func:`measure_delivery` drives a backend with a speaking-idle parameter stream (:func:`speaking_params`)
through the same steps a live session's frame takes (the backend's render at batch 1, the compositor's
damage-aware conversion, aiortc's own encoder under the engine's thread policy) and reads this process's
CPU time around each step. ``idolcast bench --render`` reports it per profile; ``avatar.profile = "auto"``
(:func:`resolve_profile`, below) measures 720p with it on small CPU machines before choosing.
"""

from __future__ import annotations

import fractions
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np

from engine.avatar.backends.base import FrameBackend
from engine.avatar.config import KernelMode
from engine.avatar.params import INDEX, VISEMES

log = logging.getLogger(__name__)

FPS = 30.0


def speaking_params(n: int, batch: int, seed: int = 0) -> np.ndarray:
    """``[n, batch, P]`` parameters: idle sway, breathing and gaze drift, a blink, visemes cycling every
    frame."""
    from engine.avatar.generator import rest_params

    rng = np.random.default_rng(seed)
    out = np.repeat(rest_params(batch)[None], n, axis=0)
    t = np.arange(n)[:, None] / FPS + rng.uniform(0, 10, size=(1, batch))
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


@dataclass(frozen=True)
class DeliveryCost:
    """CPU ms a frame, stage by stage (this process's CPU time: the encoder's own threads count)."""

    render_ms: float
    convert_ms: float
    encode_ms: float
    wall_ms: float  # the whole frame, wall clock
    frames: int

    @property
    def cpu_ms_per_frame(self) -> float:
        return self.render_ms + self.convert_ms + self.encode_ms

    @property
    def cpu_ms_per_s(self) -> float:
        """CPU ms per second of delivered 30 fps video."""
        return self.cpu_ms_per_frame * FPS


def measure_delivery(
    backend: FrameBackend,
    frames: int = 60,
    codec: Literal["vp8", "h264"] = "vp8",
    packed_alpha: bool = False,
    warmup: int = 5,
) -> DeliveryCost:
    """Time ``frames`` frames of a speaking idol through render (batch 1), convert and encode."""
    from aiortc.codecs import get_encoder
    from aiortc.rtcrtpparameters import RTCRtpCodecParameters
    from av import VideoFrame

    from engine.avatar.live import changing_region
    from engine.avatar.picture import Compositor
    from engine.transport import encoders

    encoders.install()
    mime = {"vp8": "video/VP8", "h264": "video/H264"}[codec]
    enc = get_encoder(RTCRtpCodecParameters(mimeType=mime, clockRate=90000))
    comp = Compositor(backend.width, backend.height, packed_alpha, "#00000000")
    region = changing_region(backend)
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
    return DeliveryCost(
        render_ms=spent["render"] * 1000.0 / frames,
        convert_ms=spent["convert"] * 1000.0 / frames,
        encode_ms=spent["encode"] * 1000.0 / frames,
        wall_ms=wall * 1000.0 / frames,
        frames=frames,
    )


# ---- avatar.profile = "auto" ---------------------------------------------------------------------------

AUTO_CPU_CORES = 8  # this many cores (or a CUDA GPU): 720p without measuring
AUTO_720P_SHARE = 0.25  # below that, 720p when its video costs at most this share of the machine's cores
AUTO_PROBE_FRAMES = 30


def choose_auto_profile(cores: int, gpu: bool, measure_720p: Callable[[], DeliveryCost]) -> tuple[str, str]:
    """``(profile, why)`` for ``avatar.profile = "auto"``. A CUDA GPU or :data:`AUTO_CPU_CORES` cores take
    720p at once. A smaller CPU machine measures one 720p stream (``measure_720p``) and takes 720p when
    it costs at most :data:`AUTO_720P_SHARE` of its cores, so the voice pipeline keeps the rest: on the
    2-core development machines 720p costs 0.2-0.4 of a core (docs/PERFORMANCE.md); a machine two or three
    times slower per core, or a single core, gets 360p."""
    if gpu:
        return "720p", "a CUDA GPU renders"
    if cores >= AUTO_CPU_CORES:
        return "720p", f"{cores} cores"
    if cores < 2:
        return "360p", "1 core: 720p would leave too little for the voice"
    cost = measure_720p()
    budget = AUTO_720P_SHARE * cores * 1000.0
    why = (
        f"720p video measured at {cost.cpu_ms_per_s:.0f} CPU ms a second (render {cost.render_ms:.1f} + "
        f"convert {cost.convert_ms:.1f} + encode {cost.encode_ms:.1f} ms a frame) against {budget:.0f} "
        f"({AUTO_720P_SHARE:.0%} of {cores} cores)"
    )
    return ("720p" if cost.cpu_ms_per_s <= budget else "360p"), why


_auto: dict[str, tuple[str, str]] = {}


def resolve_profile(profile: str, character: str = "builtin:default", cpu_kernels: KernelMode = "off") -> str:
    """A concrete profile for ``avatar.profile``; 'auto' is decided by :func:`choose_auto_profile` once per
    process and character (measuring costs ~1 s on a small machine, more where ``cpu_kernels``, the renderer's
    as ``avatar.cpu_kernels``, must first be compiled: call it off the event loop)."""
    if profile != "auto":
        return profile
    if character not in _auto:
        import torch

        from engine.avatar.backends.select import select_backend
        from engine.cores import usable_cores

        def measure() -> DeliveryCost:
            backend = select_backend("torch", "720p", character, cpu_kernels=cpu_kernels)
            return measure_delivery(backend, AUTO_PROBE_FRAMES)

        _auto[character] = choose_auto_profile(usable_cores(), torch.cuda.is_available(), measure)
        log.info("avatar.profile auto: %s (%s)", *_auto[character])
    return _auto[character][0]
