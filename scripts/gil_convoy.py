"""What a worker thread's calls cost beside threads that want the GIL (issue 13: many sessions in one engine).

    python scripts/gil_convoy.py [--busy 3] [--repeats 7] [--switch-ms 5] [--out FILE]

Every torch call (and every OpenCV call, and a few numpy ones on big arrays) gives up the GIL while it runs
in C and then waits to take it back. Alone that costs nothing; beside threads that run Python (an engine's
event loop, other sessions' threads) each wait lasts up to the switch interval, once per call. So a stage's
cost there is about its number of such calls times the wait, however little C work each does. This times a
few workloads alone and beside ``--busy`` threads of pure Python (medians, ms):

* 350 small torch ops (about what an eager Whisper-small encoder launches), and the same number of numpy
  ops on a small array (which keep the GIL);
* transformers' Whisper feature extractor on a 10 s window, and :class:`engine.asr.log_mel.LogMel` on it;
* 20 OpenCV colour conversions of a 64x64 tile (a render thread's per-frame calls, roughly).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from engine.bench.gil import busy_threads


def _median_ms(fn: Callable[[], object], repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return round(statistics.median(times), 2)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--busy", type=int, default=3, help="threads of pure Python beside the timed one")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--switch-ms", type=float, default=5.0, help="sys.setswitchinterval (the engine's: 5)")
    ap.add_argument("--torch-threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    import cv2
    import torch
    from transformers import WhisperFeatureExtractor

    from engine.asr.log_mel import LogMel

    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    extractor = WhisperFeatureExtractor(feature_size=80)
    front = LogMel.from_extractor(extractor)
    audio = (0.1 * np.random.default_rng(0).standard_normal(16000 * 10)).astype(np.float32)
    small = torch.randn(64, 64)
    small_np = np.zeros(64)
    tile = np.zeros((64, 64, 4), np.uint8)

    def torch_ops() -> None:
        y = small
        for _ in range(350):
            y = torch.add(y, 1e-6)

    def numpy_ops() -> None:
        y = small_np
        for _ in range(350):
            y = np.add(y, 1e-6)

    def extractor_features() -> None:
        extractor(
            audio, sampling_rate=16000, return_tensors="pt", padding="max_length", max_length=len(audio)
        )

    def log_mel() -> None:
        with torch.no_grad():
            front(torch.from_numpy(audio[None]))

    def opencv() -> None:
        for _ in range(20):
            cv2.cvtColor(tile, cv2.COLOR_RGBA2RGB)

    workloads = {
        "torch_350_small_ops": torch_ops,
        "numpy_350_small_ops": numpy_ops,
        "whisper_feature_extractor_10s": extractor_features,
        "log_mel_10s": log_mel,
        "opencv_20_small_conversions": opencv,
    }
    report: dict[str, object] = {
        "busy_threads": args.busy,
        "switch_ms": args.switch_ms,
        "torch_threads": torch.get_num_threads(),
        "cores": len(os.sched_getaffinity(0)),
    }
    for name, fn in workloads.items():
        with busy_threads(0, args.switch_ms):  # the same switch interval alone
            alone = _median_ms(fn, args.repeats)
        with busy_threads(args.busy, args.switch_ms):
            beside = _median_ms(fn, args.repeats)
        report[name] = {"alone_ms": alone, "beside_busy_ms": beside}
        print(f"{name}: alone {alone} ms, beside {args.busy} busy threads {beside} ms", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
