"""Small statistics for bench reports."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def summarize(values: Sequence[float]) -> dict[str, float | int | None]:
    if not values:
        return {"p50": None, "p95": None, "mean": None, "min": None, "max": None, "n": 0}
    a = np.asarray(values, dtype=np.float64)
    return {
        "p50": round(float(np.percentile(a, 50)), 1),
        "p95": round(float(np.percentile(a, 95)), 1),
        "mean": round(float(a.mean()), 1),
        "min": round(float(a.min()), 1),
        "max": round(float(a.max()), 1),
        "n": int(len(a)),
    }
