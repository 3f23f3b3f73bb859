"""The CPU renderer with the eyes drawn as one batch (``draw_features``) against one by one, interleaved.

    .venv/bin/python scripts/render_twins_ab.py [PROFILE]      # default 720p

Two renderers take the same speaking frames, alternating which goes first, so a machine whose speed drifts
from minute to minute slows both alike (docs/PERFORMANCE.md, "2026-12-05 day").
"""

from __future__ import annotations

import sys
import time
from typing import Any

import engine.avatar.cpu_render as cpu_render
from engine.avatar.backends.select import select_backend
from engine.avatar.delivery import speaking_params

FRAMES, WARMUP = 1200, 30


def one_by_one(feats: Any, p: Any) -> list[Any]:
    return [f(p) for f in feats]


def main() -> None:
    profile = sys.argv[1] if len(sys.argv) > 1 else "720p"
    together = select_backend("torch", profile, "builtin:default")
    alone = select_backend("torch", profile, "builtin:default")
    batched = cpu_render.draw_features
    params = speaking_params(FRAMES + WARMUP, 1)
    spent = {"together": 0.0, "one by one": 0.0}
    for i in range(FRAMES + WARMUP):
        order = [("together", together), ("one by one", alone)]
        for name, backend in order if i % 2 else order[::-1]:
            cpu_render.draw_features = batched if name == "together" else one_by_one  # type: ignore[assignment]
            t0 = time.perf_counter()
            backend.render(params[i])
            if i >= WARMUP:
                spent[name] += time.perf_counter() - t0
    cpu_render.draw_features = batched
    print(
        ", ".join(f"{name} {s * 1000 / FRAMES:.2f} ms a frame" for name, s in spent.items()), f"({profile})"
    )


if __name__ == "__main__":
    main()
