"""What OpenCV's own thread pool costs the sent picture's conversion: sessions converting 720p at 30 fps.

    python scripts/opencv_pool.py --sessions 4 --seconds 3 --threads -1 1

Each session is a thread converting a 1280x720 premultiplied RGBA frame to I420 (``cv2.cvtColor``, as
engine/avatar/picture.py does for a whole frame) every 33 ms. Per OpenCV thread count (-1: OpenCV's default,
a worker per core; 1: in the calling thread): the wall time of one conversion (P50) and the process's CPU
(user, system) per frame, from ``getrusage``. The counts run one after another in fresh processes, since
OpenCV sizes its pool once.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time


def _measure(sessions: int, seconds: float) -> dict[str, float]:
    import cv2
    import numpy as np

    frame = np.random.default_rng(0).integers(0, 255, (720, 1280, 4), dtype=np.uint8)
    walls: list[float] = []
    lock = threading.Lock()

    def session() -> None:
        mine = []
        end = time.monotonic() + seconds
        nxt = time.monotonic()
        while time.monotonic() < end:
            t0 = time.perf_counter()
            cv2.cvtColor(frame, cv2.COLOR_RGBA2YUV_I420)
            mine.append(time.perf_counter() - t0)
            nxt += 1 / 30
            time.sleep(max(0.0, nxt - time.monotonic()))
        with lock:
            walls.extend(mine)

    for _ in range(5):
        cv2.cvtColor(frame, cv2.COLOR_RGBA2YUV_I420)
    before = resource.getrusage(resource.RUSAGE_SELF)
    threads = [threading.Thread(target=session) for _ in range(sessions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    after = resource.getrusage(resource.RUSAGE_SELF)
    walls.sort()
    n = len(walls)
    return {
        "opencv_threads": cv2.getNumThreads(),
        "frames": n,
        "wall_p50_ms": 1e3 * walls[n // 2],
        "user_ms_a_frame": 1e3 * (after.ru_utime - before.ru_utime) / n,
        "system_ms_a_frame": 1e3 * (after.ru_stime - before.ru_stime) / n,
        "cores_busy": (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) / seconds,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--threads", type=int, nargs="+", default=[-1, 1])
    ap.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)  # a child: one count
    args = ap.parse_args()
    if args.one is not None:
        print(json.dumps(_measure(args.sessions, args.seconds)))
        return 0
    for count in args.threads:
        env = {k: v for k, v in os.environ.items() if k != "OPENCV_FOR_THREADS_NUM"}
        if count > 0:
            env["OPENCV_FOR_THREADS_NUM"] = str(count)
        cmd = [sys.executable, __file__, "--one", str(count), "--sessions", str(args.sessions)]
        run = subprocess.run([*cmd, "--seconds", str(args.seconds)], env=env, capture_output=True, text=True)
        if run.returncode:
            print(run.stderr, file=sys.stderr)
            return 1
        r = json.loads(run.stdout)
        print(
            f"OpenCV threads {r['opencv_threads']}, {args.sessions} sessions at 30 fps: conversion P50 "
            f"{r['wall_p50_ms']:.2f} ms, CPU a frame {r['user_ms_a_frame']:.2f} user + "
            f"{r['system_ms_a_frame']:.2f} system ms, {r['cores_busy']:.2f} cores busy"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
