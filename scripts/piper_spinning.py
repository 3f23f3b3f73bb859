"""Piper's ONNX Runtime pool with and without spinning: wall time and CPU time per synthesis.

    python scripts/piper_spinning.py VOICE.onnx [--threads 8] [--repeats 20]

For each of spinning on (ONNX Runtime's default) and off (the engine's), the median wall ms and the
process's CPU ms per synthesis of a short clause, the threads' idle time after it included (CPU time is
read 50 ms after each synthesis returns)."""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from engine.tts.config import TTSConfig
from engine.tts.piper_backend import _session_with_threads, load_piper

TEXT = "Oh, that sounds like so much fun!"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("voice")
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--repeats", type=int, default=20)
    a = p.parse_args()
    tts = load_piper(TTSConfig(voice=a.voice, threads=a.threads), lambda *_: None)
    for spinning in (True, False, True, False):
        tts._voice.session = _session_with_threads(Path(a.voice), a.threads, spinning)
        tts.synthesize_blocking(TEXT)
        walls, cpus = [], []
        for _ in range(a.repeats):
            c0, t0 = time.process_time(), time.perf_counter()
            tts.synthesize_blocking(TEXT)
            walls.append((time.perf_counter() - t0) * 1000)
            time.sleep(0.05)
            cpus.append((time.process_time() - c0) * 1000)
        print(
            f"threads {a.threads} spinning {spinning!s:5}: wall {statistics.median(walls):6.1f} ms, "
            f"CPU {statistics.median(cpus):6.1f} ms per synthesis (median of {a.repeats})",
            flush=True,
        )


if __name__ == "__main__":
    main()
