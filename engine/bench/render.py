"""``idolcast bench --render``: ms per frame for each available frame backend, profile and batch size."""

from __future__ import annotations

import argparse
import json
import os

from engine.config import Settings


def run_render_bench_cli(args: argparse.Namespace, settings: Settings) -> int:
    from engine.avatar.backends import BACKENDS
    from engine.avatar.bench_render import run_render_bench

    backends = args.backends.split(",") if args.backends else list(BACKENDS)
    profiles = args.profiles.split(",")
    batches = [int(b) for b in args.batches.split(",")]
    rows = run_render_bench(
        backends, profiles, batches, frames=args.frames, character=settings.avatar.character
    )
    if args.json:
        print(json.dumps({"render": rows, "cpu_count": os.cpu_count()}, indent=2))
        return 0
    print(f"{'backend':<12} {'size':>10} {'batch':>5} {'ms/frame':>9} {'frames/s':>9}")
    for r in rows:
        fps = 1000.0 / r["ms_per_frame"] if r["ms_per_frame"] else float("nan")
        size = f"{r['width']}x{r['height']}"
        print(f"{r['backend']:<12} {size:>10} {r['batch']:>5} {r['ms_per_frame']:>9.2f} {fps:>9.0f}")
    return 0
