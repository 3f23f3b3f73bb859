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


def summarize_costs(costs: Sequence[dict[str, float | bool]]) -> dict[str, object]:
    """Turns' cost dicts (as the engine's ``final_cost``) pooled: each numeric entry summarized, each
    yes/no entry as the share of turns that said yes."""
    out: dict[str, object] = {"n": len(costs)}
    names = sorted({k for c in costs for k in c})
    for name in names:
        values = [c[name] for c in costs if name in c]
        if all(isinstance(v, bool) for v in values):
            out[name] = round(sum(1 for v in values if v) / len(values), 3)
        else:
            out[name] = summarize([float(v) for v in values])
    return out
