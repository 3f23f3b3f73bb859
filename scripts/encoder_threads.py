"""Many sessions' VP8 encoders in one process, as the engine runs them: aiortc's thread choice against the
engine's policy (engine/transport/encoders.py).

Each of N threads owns an aiortc ``Vp8Encoder`` and encodes a moving 720p I420 picture as fast as it can
for SECONDS; prints per-stream fps (min / median) and the total. Usage:
``python scripts/encoder_threads.py aiortc|policy W H N...``
"""

from __future__ import annotations

import fractions
import sys
import threading
import time

import numpy as np
from aiortc.codecs import vpx
from av import VideoFrame

SECONDS = 4.0


def frames(w: int, h: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    base = (rng.integers(0, 255, (h, w, 3), dtype=np.uint8) // 4 + 96).astype(np.uint8)
    out = []
    for i in range(30):
        img = base.copy()
        x = (i * 17) % (w - 200)
        img[h // 3 : h // 3 + 200, x : x + 200] = (255, 120, 160)
        out.append(VideoFrame.from_ndarray(img, format="rgb24").reformat(format="yuv420p").to_ndarray())
    return out


def run(n: int, pics: list[np.ndarray], start: threading.Barrier, fps: list[float]) -> None:
    enc = vpx.Vp8Encoder()
    start.wait()
    t0, i = time.perf_counter(), 0
    while time.perf_counter() - t0 < SECONDS:
        f = VideoFrame.from_ndarray(pics[i % 30], format="yuv420p")
        f.pts, f.time_base = i * 3000, fractions.Fraction(1, 90000)
        enc.encode(f)
        i += 1
    fps[n] = i / (time.perf_counter() - t0)


def main() -> None:
    mode, w, h = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    if mode == "policy":
        from engine.transport.encoders import install

        install()
    pics = frames(w, h)
    for n in map(int, sys.argv[4:]):
        fps = [0.0] * n
        barrier = threading.Barrier(n)
        threads = [threading.Thread(target=run, args=(k, pics, barrier, fps)) for k in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        r = sorted(fps)
        print(
            f"{mode} vp8 {w}x{h} N={n:3d}: per stream min {r[0]:.1f} median {r[n // 2]:.1f} fps, "
            f"total {sum(r):.0f} frames/s",
            flush=True,
        )


if __name__ == "__main__":
    main()
