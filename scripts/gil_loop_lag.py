"""How late an asyncio loop wakes while other Python threads hold the GIL, per switch interval.

    .venv/bin/python scripts/gil_loop_lag.py 5 1 --threads 2 8

Each row: the loop sleeps 10 ms 200 times beside N threads running pure Python; the lag is how much
later than asked it woke (what every session's pacing waits on in the engine; docs/PERFORMANCE.md,
"H200: many sessions", fourth run; ``server.gil_switch_ms``).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading


def busy(stop: threading.Event) -> None:
    x = 0
    while not stop.is_set():
        for i in range(1000):
            x += i


async def lags(n: int = 200, sleep_s: float = 0.01) -> list[float]:
    loop = asyncio.get_running_loop()
    out = []
    for _ in range(n):
        start = loop.time()
        await asyncio.sleep(sleep_s)
        out.append(loop.time() - start - sleep_s)
    return sorted(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("intervals_ms", nargs="+", type=float)
    ap.add_argument("--threads", nargs="+", type=int, default=[2, 8])
    args = ap.parse_args()
    for n in args.threads:
        for ms in args.intervals_ms:
            sys.setswitchinterval(ms / 1000.0)
            stop = threading.Event()
            threads = [threading.Thread(target=busy, args=(stop,), daemon=True) for _ in range(n)]
            for t in threads:
                t.start()
            got = asyncio.run(lags())
            stop.set()
            for t in threads:
                t.join()
            k = len(got)
            print(
                f"switch {ms:.1f} ms, {n} busy threads: loop lag p50 {got[k // 2] * 1000:.1f} "
                f"p90 {got[k * 9 // 10] * 1000:.1f} max {got[-1] * 1000:.1f} ms"
            )


if __name__ == "__main__":
    main()
