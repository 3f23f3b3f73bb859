"""``idolcast bench --render``: ms per frame for each available frame backend, profile and batch size, and
what one session's idol video costs the CPU (render + convert + encode) per profile."""

from __future__ import annotations

import argparse
import json
import os
import sys

from engine.config import Settings

# cli.py's argparse defaults for --batches: given as is, backends that render on the CPU stop at batch 8
# (every backend × 720p and 1080p × batch 64 on the CPU ran for minutes without a word)
DEFAULT_BATCHES = "1,8,32,64"


def _progress(text: str) -> None:
    print(f"render bench: {text}", file=sys.stderr, flush=True)


def run_render_bench_cli(args: argparse.Namespace, settings: Settings) -> int:
    from engine.avatar.backends import BACKENDS
    from engine.bench.render_frames import CPU_BATCHES, delivery_cost, run_render_bench

    if args.backends:
        backends = args.backends.split(",")
        unknown = [b for b in backends if b not in BACKENDS]
        if unknown:
            raise SystemExit(f"--backends: unknown {', '.join(unknown)} (known: {', '.join(BACKENDS)})")
    else:  # all, but ONNX Runtime only where it has a GPU (on the CPU it is the slow float path: ask for it)
        import onnxruntime

        gpu_ort = "CUDAExecutionProvider" in onnxruntime.get_available_providers()
        backends = [b for b in BACKENDS if b != "onnxruntime" or gpu_ort]
    profiles = args.profiles.split(",")
    batches = [int(b) for b in args.batches.split(",")]
    rows = run_render_bench(
        backends,
        profiles,
        batches,
        frames=args.frames,
        character=settings.avatar.character,
        cpu_max_batch=CPU_BATCHES if args.batches == DEFAULT_BATCHES else None,
        progress=_progress,
        cpu_kernels=settings.avatar.cpu_kernels,
    )
    delivery = []
    for name in dict.fromkeys(r["backend"] for r in rows):
        for prof in profiles:
            row = delivery_cost(
                name,
                prof,
                frames=max(args.frames, 30),
                character=settings.avatar.character,
                cpu_kernels=settings.avatar.cpu_kernels,
            )
            delivery.append(row)
            _progress(
                f"delivery {name} {prof}: {row['cpu_ms_per_s']:.0f} CPU ms per second of video "
                f"(render {row['render_cpu_ms']:.2f} + convert {row['convert_cpu_ms']:.2f} + "
                f"{row['codec']} encode {row['encode_cpu_ms']:.2f} ms a frame)"
            )
    if args.json:
        print(json.dumps({"render": rows, "delivery": delivery, "cpu_count": os.cpu_count()}, indent=2))
        return 0
    print(f"{'backend':<12} {'size':>10} {'batch':>5} {'ms/frame':>9} {'frames/s':>9}")
    for r in rows:
        fps = 1000.0 / r["ms_per_frame"] if r["ms_per_frame"] else float("nan")
        size = f"{r['width']}x{r['height']}"
        print(f"{r['backend']:<12} {size:>10} {r['batch']:>5} {r['ms_per_frame']:>9.2f} {fps:>9.0f}")
    print()
    print(f"{'delivery':<12} {'size':>10} {'render':>7} {'convert':>7} {'encode':>7} {'CPU ms/s':>9}")
    for d in delivery:
        size = f"{d['width']}x{d['height']}"
        print(
            f"{d['backend']:<12} {size:>10} {d['render_cpu_ms']:>7.2f} {d['convert_cpu_ms']:>7.2f} "
            f"{d['encode_cpu_ms']:>7.2f} {d['cpu_ms_per_s']:>9.0f}"
        )
    return 0
