"""libvpx options on the idol's own picture: CPU per frame, bitrate and PSNR (docs/PERFORMANCE.md).

    .venv/bin/python scripts/vp8_options.py [PROFILE]      # default 720p

Renders 95 frames of a speaking idol with the CPU backend, converts them as a session does, then encodes
them with aiortc's VP8 settings (1.5 Mbit/s, one thread) and with each variant below; the PSNR is of the
decoded frames against the source, after the first five.
"""

from __future__ import annotations

import fractions
import sys
import time

import av
import numpy as np

from engine.avatar.backends.select import select_backend
from engine.avatar.delivery import speaking_params
from engine.avatar.live import changing_region
from engine.avatar.picture import Compositor

AIORTC = {  # aiortc 1.16's Vp8Encoder options at 1.5 Mbit/s
    "bufsize": "1500000",
    "cpu-used": "-6",
    "deadline": "realtime",
    "lag-in-frames": "0",
    "minrate": "1500000",
    "maxrate": "1500000",
    "noise-sensitivity": "4",
    "overshoot-pct": "15",
    "partitions": "0",
    "static-thresh": "1",
    "undershoot-pct": "100",
}
VARIANTS = {
    "aiortc": {},
    "denoiser off": {"noise-sensitivity": "0"},
    "denoiser off, cpu-used -8": {"noise-sensitivity": "0", "cpu-used": "-8"},
    "denoiser off, cpu-used -12": {"noise-sensitivity": "0", "cpu-used": "-12"},
    "denoiser off, cpu-used -16": {"noise-sensitivity": "0", "cpu-used": "-16"},
    "denoiser off, static-thresh 100": {"noise-sensitivity": "0", "static-thresh": "100"},
}


def frames(profile: str, n: int = 95) -> list[av.VideoFrame]:
    backend = select_backend("torch", profile, "builtin:default")
    comp = Compositor(backend.width, backend.height, False, "#00000000")
    region = changing_region(backend)
    params = speaking_params(n, 1)
    out = []
    for i in range(n):
        rgba = backend.render(params[i])
        damage = getattr(backend, "damage", None)
        picture = comp.compose(rgba[0], region, damage[0] if damage else None).copy()
        out.append(av.VideoFrame.from_ndarray(picture, format="yuv420p"))
    return out


def measure(source: list[av.VideoFrame], options: dict[str, str]) -> tuple[float, float, float]:
    enc = av.CodecContext.create("libvpx", "w")
    enc.width, enc.height = source[0].width, source[0].height
    enc.bit_rate, enc.pix_fmt, enc.gop_size, enc.qmin, enc.qmax = 1_500_000, "yuv420p", 3000, 2, 56
    enc.options = {**AIORTC, **options}
    enc.thread_count = 1
    dec = av.CodecContext.create("libvpx", "r")
    size, cpu, errors = 0, 0.0, []
    for i, frame in enumerate(source):
        frame.pts, frame.time_base = i * 3000, fractions.Fraction(1, 90000)
        c0 = time.process_time()
        packets = enc.encode(frame)
        if i >= 5:
            cpu += time.process_time() - c0
        for packet in packets:
            size += packet.size
            for out in dec.decode(packet):
                if i >= 5:
                    a = out.to_ndarray(format="yuv420p").astype(np.float64)
                    errors.append(float(((a - frame.to_ndarray().astype(np.float64)) ** 2).mean()))
    n = len(source) - 5
    return cpu * 1000 / n, size * 8 * 30 / len(source) / 1000, 10 * float(np.log10(255**2 / np.mean(errors)))


def main() -> None:
    profile = sys.argv[1] if len(sys.argv) > 1 else "720p"
    source = frames(profile)
    for name, options in VARIANTS.items():
        ms, kbps, psnr = measure(source, options)
        print(f"{profile} {name:28} {ms:5.2f} CPU ms a frame  {kbps:5.0f} kbit/s  PSNR {psnr:.2f} dB")


if __name__ == "__main__":
    main()
