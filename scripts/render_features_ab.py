"""Two ways of drawing the face's features in the CPU renderer, interleaved frame by frame.

    .venv/bin/python scripts/render_features_ab.py kernels [PROFILE]   # compiled (avatar.cpu_kernels) vs eager
    .venv/bin/python scripts/render_features_ab.py twins [PROFILE]     # the eyes as one batch vs one by one

Two renderers take the same speaking frames, alternating which goes first, so a machine whose speed drifts
from minute to minute slows both alike (docs/PERFORMANCE.md, "2026-12-05 day" and "2026-12-05 noon").
PROFILE defaults to 720p.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import engine.avatar.kernels as kernels
from engine.avatar.backends.select import select_backend
from engine.avatar.delivery import speaking_params

FRAMES, WARMUP = 1200, 30


def each_alone(feats: Sequence[Any]) -> list[list[int]]:
    return [[i] for i in range(len(feats))]


def main() -> None:
    what = sys.argv[1] if len(sys.argv) > 1 else "kernels"
    profile = sys.argv[2] if len(sys.argv) > 2 else "720p"
    grouped = kernels.twin_groups
    setups: dict[str, Callable[[], None]]
    if what == "kernels":
        a = ("compiled", select_backend("torch", profile, "builtin:default", cpu_kernels="on"))
        b = ("eager", select_backend("torch", profile, "builtin:default"))
        setups = {"compiled": lambda: None, "eager": lambda: None}
    elif what == "twins":
        a = ("together", select_backend("torch", profile, "builtin:default"))
        b = ("one by one", select_backend("torch", profile, "builtin:default"))

        def apart() -> None:
            kernels.twin_groups = each_alone  # type: ignore[assignment]

        def together() -> None:
            kernels.twin_groups = grouped  # type: ignore[assignment]

        setups = {"together": together, "one by one": apart}
    else:
        raise SystemExit(f"usage: {sys.argv[0]} kernels|twins [PROFILE]")
    params = speaking_params(FRAMES + WARMUP, 1)
    spent = {a[0]: 0.0, b[0]: 0.0}
    for i in range(FRAMES + WARMUP):
        for name, backend in (a, b) if i % 2 else (b, a):
            setups[name]()
            t0 = time.perf_counter()
            backend.render(params[i])
            if i >= WARMUP:
                spent[name] += time.perf_counter() - t0
    kernels.twin_groups = grouped
    print(
        ", ".join(f"{name} {s * 1000 / FRAMES:.2f} ms a frame" for name, s in spent.items()), f"({profile})"
    )


if __name__ == "__main__":
    main()
