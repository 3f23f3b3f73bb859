"""The procedural mouth: drawn every frame from continuous shape parameters.

The 15 viseme weights in the parameter vector are blended into one shape
vector (jaw opening, width, roundness, teeth, tongue, corner lift) as a weighted
mean of per-viseme targets (:data:`VISEME_SHAPES`); expressions and the direct
``mouth_open``/``mouth_smile`` parameters add on top. The mouth outline, the
dark interior, the upper teeth and the tongue are then drawn from that shape
with signed distances, so any mix of visemes gives an in-between mouth: there
are no sprites to swap.
"""

from __future__ import annotations

import torch
from torch import Tensor

from engine.avatar import sdf
from engine.avatar.features import Placement, ProceduralFeature, col
from engine.avatar.params import VISEME_SLICE, VISEMES

SHAPE_KEYS: tuple[str, ...] = ("open", "width", "round", "teeth", "tongue", "smile")

# Per-viseme shape targets, one row per entry of params.VISEMES.
VISEME_SHAPES: dict[str, tuple[float, float, float, float, float, float]] = {
    #      open  width round teeth tongue smile
    "sil": (0.00, 1.00, 0.00, 0.00, 0.00, 0.00),
    "PP": (0.00, 0.88, 0.10, 0.00, 0.00, -0.10),  # lips pressed
    "FF": (0.14, 1.00, 0.00, 1.00, 0.00, 0.05),  # upper teeth on the lower lip
    "TH": (0.24, 1.00, 0.05, 0.70, 1.00, 0.00),  # tongue between the teeth
    "DD": (0.32, 1.02, 0.10, 0.60, 0.50, 0.00),
    "kk": (0.38, 1.00, 0.15, 0.40, 0.30, 0.00),
    "CH": (0.30, 0.82, 0.55, 0.90, 0.10, 0.00),
    "SS": (0.16, 1.12, 0.00, 1.00, 0.00, 0.10),
    "nn": (0.22, 1.00, 0.10, 0.40, 0.70, 0.00),
    "RR": (0.32, 0.80, 0.60, 0.40, 0.25, 0.00),
    "aa": (0.95, 1.08, 0.25, 0.35, 0.35, 0.05),
    "E": (0.58, 1.22, 0.00, 0.50, 0.20, 0.15),
    "I": (0.36, 1.30, 0.00, 0.70, 0.10, 0.25),
    "O": (0.72, 0.74, 0.90, 0.10, 0.20, 0.00),
    "U": (0.42, 0.58, 1.00, 0.00, 0.10, 0.00),
}
assert tuple(VISEME_SHAPES) == VISEMES


def viseme_shape_matrix() -> Tensor:
    return torch.tensor([VISEME_SHAPES[v] for v in VISEMES], dtype=torch.float32)


class Mouth(ProceduralFeature):
    """An anime mouth: a line when closed, an outlined opening with teeth and tongue when open."""

    shapes: Tensor
    sil_eps: Tensor

    def __init__(
        self,
        place: Placement,
        center: tuple[float, float],
        size: float = 1.0,
        colors: dict[str, str] | None = None,
        parallax: tuple[float, float] = (0.0, 0.0),
    ) -> None:
        super().__init__("mouth", place, center, (46, 26, 46, 46), size, parallax)
        c = {"line": "#7a3042", "inside": "#6e1f35", "tongue": "#ef7f90", "teeth": "#fffafa"}
        c.update(colors or {})
        self.c_line, self.c_in = sdf.rgba(c["line"]), sdf.rgba(c["inside"])
        self.c_tongue, self.c_teeth = sdf.rgba(c["tongue"]), sdf.rgba(c["teeth"])
        self.colors_to_buffers()
        sil = torch.zeros(len(VISEMES))
        sil[0] = 1e-3
        self.register_buffer("shapes", viseme_shape_matrix(), persistent=False)
        self.register_buffer("sil_eps", sil.view(1, -1), persistent=False)
        self.depends_on("mouth_open", "mouth_smile", *(f"viseme_{v}" for v in VISEMES))

    def shape(self, p: Tensor) -> list[Tensor]:
        """The blended shape parameters, each ``[B, 1, 1]``, in :data:`SHAPE_KEYS` order."""
        w = torch.clamp(p[:, VISEME_SLICE], min=0.0) + self.sil_eps
        s = (w @ self.shapes) / w.sum(dim=1, keepdim=True)
        s = s.unsqueeze(-1)
        happy, sad = col(p, "expr_happy"), col(p, "expr_sad")
        angry, surpr = col(p, "expr_angry"), col(p, "expr_surprised")
        opn = torch.clamp(s[:, 0:1] + 0.8 * col(p, "mouth_open") + 0.22 * surpr + 0.12 * happy, 0.0, 1.0)
        width = s[:, 1:2] * (1.0 + 0.12 * happy - 0.1 * sad - 0.08 * angry - 0.12 * surpr)
        rnd = torch.clamp(s[:, 2:3] + 0.5 * surpr, 0.0, 1.0)
        smile = torch.clamp(
            s[:, 5:6] + col(p, "mouth_smile") + 0.85 * happy - 0.7 * sad - 0.55 * angry, -1.0, 1.0
        )
        return [opn, width, rnd, s[:, 3:4], s[:, 4:5], smile]

    def forward(self, p: Tensor) -> Tensor:
        x, y = self.local(p)
        opn, width, rnd, teeth, tongue, smile = self.shape(p)
        hw = 22.0 * width * (1.0 - 0.2 * rnd) + 3.0 * opn
        t = torch.clamp(x / hw, -1.0, 1.0)
        q = torch.clamp(1.0 - t * t, min=0.0)
        e = q + (torch.sqrt(q) - q) * (0.35 + 0.65 * rnd)  # flat (q) .. elliptic (sqrt q) edges
        ym = smile * (2.5 - 8.0 * t * t)
        h = 36.0 * opn
        yt = ym - h * (0.16 + 0.26 * rnd) * e + smile * opn * 3.0 * q
        yb = ym + h * (0.84 - 0.26 * rnd) * e
        d = torch.maximum(torch.maximum(yt - y, y - yb), torch.abs(x) - hw)
        inside = self.cov(d)
        out = self.blank(p)
        out = sdf.paint(out, inside, self.c_in)
        ty = ym + h * (0.95 - 0.45 * tongue)
        d_tongue = sdf.ellipse(x, y, 0.0, ty, hw * 0.62, h * 0.45 + 3.0)  # type: ignore[arg-type]
        out = sdf.paint(out, self.cov(d_tongue) * inside * torch.clamp(0.4 + tongue, 0.0, 1.0), self.c_tongue)
        teeth_edge = yt + 1.0 + teeth * (2.0 + h * 0.22)
        d_teeth = torch.maximum(y - teeth_edge, torch.abs(x) - hw * 0.8)
        out = sdf.paint(out, self.cov(d_teeth) * inside * torch.clamp(teeth * 3.0, 0.0, 1.0), self.c_teeth)
        lw = 1.4 * (1.0 - 0.45 * t**4) + 0.5 * (1.0 - opn)
        return sdf.paint(out, self.cov(torch.abs(d) - lw), self.c_line)
