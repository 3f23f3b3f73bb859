"""Visual regression: one frame per expression and per viseme against reviewed golden PNGs.

Goldens are 360p crops (the face for expressions, the mouth for visemes), premultiplied RGBA.
Tolerance: per channel |Δ| <= 12 on every pixel and a mean |Δ| <= 0.5 (uint8 levels): float
reassociation across CPUs moves antialiased edges by a level or two, a changed drawing moves many.
Regenerate after an intended art change with ``IDOLCAST_UPDATE_GOLDEN=1`` and review them by eye.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from engine.avatar.generator import FrameGenerator, rest_params, to_uint8
from engine.avatar.params import EXPRESSIONS, VISEMES

pytestmark = pytest.mark.unit

GOLDEN = Path(__file__).parent / "golden"
FACE = (255, 100, 385, 200)  # x0, y0, x1, y1 at 360p: brows to chin
MOUTH = (300, 166, 340, 194)
MAX_DIFF, MEAN_DIFF = 12, 0.5

CASES = [(f"expr_{e}", {"expr_neutral": 0.0, f"expr_{e}": 1.0}, FACE) for e in EXPRESSIONS] + [
    (f"viseme_{v}", {"viseme_sil": 0.0, f"viseme_{v}": 1.0}, MOUTH) for v in VISEMES
]


@pytest.mark.parametrize(("name", "overrides", "crop"), CASES, ids=[c[0] for c in CASES])
def test_golden(
    gen360: FrameGenerator, name: str, overrides: dict[str, float], crop: tuple[int, int, int, int]
) -> None:
    with torch.no_grad():
        frame = to_uint8(gen360(torch.from_numpy(rest_params(**overrides))))[0].numpy()
    x0, y0, x1, y1 = crop
    got = frame[y0:y1, x0:x1]
    path = GOLDEN / f"{name}.png"
    if os.environ.get("IDOLCAST_UPDATE_GOLDEN") == "1":
        Image.fromarray(got, "RGBA").save(path, optimize=True)
    want = np.asarray(Image.open(path).convert("RGBA"))
    diff = np.abs(got.astype(int) - want.astype(int))
    assert diff.max() <= MAX_DIFF and diff.mean() <= MEAN_DIFF, (name, diff.max(), diff.mean())
