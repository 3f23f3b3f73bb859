"""How long a frame's GPU round trip takes while other work of the same process keeps the GPU busy.

    python scripts/render_beside_load.py --batch 4 --seconds 5

The CUDA-graph avatar backend (engine/avatar/backends/cuda_graph.py) renders a 720p batch and copies it to
the host every 33 ms, as an engine's render thread does for its sessions, while a second thread queues
matrix products on the process's default stream back to back (the stand-in for the LLM's prefill and
decode graphs and the ASR of the same engine: named here, a load, not a model). Two ways: the frames on the
default stream behind that work (the engine before 2026-12-06 evening), and on the backend's own stream at
the highest priority (now). Reported: the round trip's P50 / P95 / max in ms, and the load's products a
second (what the frames cost it). GPU only.
"""

from __future__ import annotations

import argparse
import json
import threading
import time

import numpy as np
import torch

from engine.avatar.backends.cuda_graph import CudaGraphBackend
from engine.avatar.loaders import load_character
from engine.avatar.params import DEFAULTS


def _load(stop: threading.Event, done: list[int], size: int) -> None:
    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    n = 0
    while not stop.is_set():
        for _ in range(4):
            a @ b
        torch.cuda.current_stream().synchronize()  # like a decode step reading its token: a few in flight
        n += 4
    done.append(n)


def run(
    backend: CudaGraphBackend, batch: int, seconds: float, own_stream: bool, load: int
) -> dict[str, float]:
    params = np.repeat(DEFAULTS[None], batch, axis=0)
    own = backend.stream
    if not own_stream:
        backend.stream = torch.cuda.current_stream(
            backend.device
        )  # the frames behind the default stream's work
    stop, done = threading.Event(), []
    worker = None
    if load:
        worker = threading.Thread(target=_load, args=(stop, done, load), daemon=True)
        worker.start()
        time.sleep(0.5)
    trips: list[float] = []
    end = time.monotonic() + seconds
    nxt = time.monotonic()
    while time.monotonic() < end:
        t0 = time.perf_counter()
        backend.render(params)
        trips.append((time.perf_counter() - t0) * 1000)
        nxt += 1 / 30
        time.sleep(max(0.0, nxt - time.monotonic()))
    stop.set()
    if worker is not None:
        worker.join()
    backend.stream = own
    ms = np.array(trips)
    return {
        "p50_ms": round(float(np.percentile(ms, 50)), 3),
        "p95_ms": round(float(np.percentile(ms, 95)), 3),
        "max_ms": round(float(ms.max()), 3),
        "frames": len(trips),
        "load_products_per_s": round(done[0] / seconds, 1) if done else 0.0,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--load", type=int, default=8192, help="the load's square matrices' size (0: no load)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    backend = CudaGraphBackend(load_character("builtin:default"), "720p", max_batch=max(8, args.batch))
    out = {
        "gpu": torch.cuda.get_device_name(),
        "batch": args.batch,
        "alone": run(backend, args.batch, args.seconds, True, 0),
        "default_stream_beside_load": run(backend, args.batch, args.seconds, False, args.load),
        "own_stream_beside_load": run(backend, args.batch, args.seconds, True, args.load),
    }
    print(json.dumps(out, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
