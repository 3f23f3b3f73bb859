"""What the CUDA-graph avatar backend holds on the GPU, by the rows it captures graphs for and whether
the graphs share one memory pool.

    python scripts/render_memory.py --profile 720p --max-batch 8 32

Each setting is built in a fresh process (a process's CUDA context and caching allocator are its own):
the backend (engine/avatar/backends/cuda_graph.py) with ``max_batch`` rows, the buckets' graphs in one
shared pool (now) or each in its own (before 2026-12-07), then ``torch.cuda.memory_reserved()`` and the
device's used memory as the driver reports it (``torch.cuda.mem_get_info``), less what the process held
before the backend was made. Reported per setting in MiB; one 720p frame is rendered to check it works.
GPU only.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from typing import Any


def measure(profile: str, max_batch: int, share_pool: bool) -> dict[str, Any]:
    import numpy as np
    import torch

    from engine.avatar.backends.cuda_graph import CudaGraphBackend
    from engine.avatar.loaders import load_character
    from engine.avatar.params import DEFAULTS

    torch.cuda.init()
    torch.zeros(1, device="cuda")  # the context, before the backend
    free0, total = torch.cuda.mem_get_info()
    reserved0 = torch.cuda.memory_reserved()
    backend = CudaGraphBackend(
        load_character("builtin:default"), profile, max_batch=max_batch, share_pool=share_pool
    )
    frames = backend.render(np.repeat(DEFAULTS[None], 2, axis=0))
    free1, _ = torch.cuda.mem_get_info()
    mib = 1024 * 1024
    return {
        "profile": profile,
        "max_batch": max_batch,
        "share_pool": share_pool,
        "buckets": sorted(backend._graphs),
        "reserved_mib": round((torch.cuda.memory_reserved() - reserved0) / mib),
        "device_used_mib": round((free0 - free1) / mib),
        "frame": list(frames.shape),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="720p")
    ap.add_argument("--max-batch", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--out", default="", help="write the rows as JSON here too")
    ap.add_argument("--one", nargs=2, metavar=("MAX_BATCH", "SHARE"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:  # the child: one setting
        print(json.dumps(measure(args.profile, int(args.one[0]), args.one[1] == "1")))
        return 0
    rows = []
    for max_batch in args.max_batch:
        for share in (False, True):
            cmd = [
                sys.executable,
                __file__,
                "--profile",
                args.profile,
                "--one",
                str(max_batch),
                "1" if share else "0",
            ]
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                print(
                    f"max_batch {max_batch} share_pool {share}: failed\n{done.stderr[-2000:]}",
                    file=sys.stderr,
                )
                continue
            row = json.loads(done.stdout.strip().splitlines()[-1])
            rows.append(row)
            print(
                f"{row['profile']} max_batch {max_batch:3d} ({', '.join(map(str, row['buckets']))}), "
                f"{'one shared pool' if share else 'a pool a bucket'}: reserved {row['reserved_mib']} MiB, "
                f"device {row['device_used_mib']} MiB"
            )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if rows else 1


if __name__ == "__main__":
    raise SystemExit(main())
