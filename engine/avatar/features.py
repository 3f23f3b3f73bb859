"""Dynamic parts: the pieces of a character redrawn every frame from the parameter vector.

A :class:`Feature` owns a fixed box of output pixels and maps params ``[B, P]`` to
premultiplied RGBA ``[B, 4, h, w]`` for that box. Procedural features (eyes,
brows, the mouth in :mod:`engine.avatar.mouth`) are drawn with signed distances
evaluated per pixel, so they stay sharp at any output size; sprite features
blend a rig's images by driver weights. All ops are elementwise/matmul: ONNX
and TensorRT friendly, no data-dependent control flow.

"Left" and "right" in parameter names (``eye_open_l``, ``brow_r``) are as the
viewer sees the screen.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from engine.avatar import sdf
from engine.avatar.params import INDEX

Box = tuple[int, int, int, int]  # x, y, w, h in output pixels
EXPRESSION_INPUTS = ("expr_happy", "expr_sad", "expr_angry", "expr_surprised")


@dataclass(frozen=True)
class Placement:
    """Where design units land in the output frame: ``px = origin + design * scale``."""

    scale: float
    ox: float
    oy: float

    def to_px(self, x: float, y: float) -> tuple[float, float]:
        return self.ox + x * self.scale, self.oy + y * self.scale

    def box_around(self, x0: float, y0: float, x1: float, y1: float) -> Box:
        """The smallest whole-pixel box covering the design rectangle."""
        import math

        px0, py0 = self.to_px(x0, y0)
        px1, py1 = self.to_px(x1, y1)
        bx, by = math.floor(px0), math.floor(py0)
        return bx, by, max(1, math.ceil(px1) - bx), max(1, math.ceil(py1) - by)


@dataclass(frozen=True)
class Driver:
    """A weight read from the params: ``p[index]`` or ``1 - p[index]``."""

    index: int
    invert: bool = False

    @staticmethod
    def parse(text: str) -> Driver:
        """'viseme_aa' or '1-eye_open_l' (spaces allowed). Raises KeyError for an unknown parameter."""
        t = text.replace(" ", "")
        invert = t.startswith("1-")
        name = t[2:] if invert else t
        if name not in INDEX:
            raise KeyError(name)
        return Driver(INDEX[name], invert)


def col(p: Tensor, name: str) -> Tensor:
    """One parameter as ``[B, 1, 1]``."""
    i = INDEX[name]
    return p[:, i : i + 1].unsqueeze(-1)


class Feature(nn.Module):
    """Base: a dynamic part drawn into a fixed box of output pixels."""

    #: parameter indices the output depends on (lets the CPU path reuse an unchanged feature)
    inputs: tuple[int, ...] = ()

    def __init__(self, name: str, box: Box) -> None:
        super().__init__()
        self.name = name
        self.box = box

    def quanta(self, pixel: float) -> dict[int, float]:
        """Steps of inputs finer than which this feature moves less than ``pixel`` output pixels: the CPU
        path rounds those inputs to them, so a slow drift (gaze) redraws the feature a few times a second,
        not every frame. Empty by default (every change is drawn)."""
        return {}

    def forward(self, p: Tensor) -> Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def twin_of(self, other: Feature) -> bool:
        """Whether ``other`` is drawn by this feature's code with its sizes and colours, only its place and
        side differing, so that both are drawn in one batched call (:func:`twin_groups`). No by default."""
        return False

    @classmethod
    def draw_twins(cls, twins: Sequence[Feature], p: Tensor) -> Tensor:  # pragma: no cover - abstract
        """The outputs of ``twins`` (each the others' :meth:`twin_of`) for one frame ``p`` ``[1, P]``, as
        one batch ``[len(twins), 4, h, w]``."""
        raise NotImplementedError


def twin_groups(feats: Sequence[Feature]) -> list[list[int]]:
    """``feats``' indices, each feature with its twins (:meth:`Feature.twin_of`), in order of first
    appearance: the groups :meth:`Feature.draw_twins` draws in one batched call.

    A procedural feature's cost on the CPU is its ~300 small tensor ops, not its pixels (an eye at 360p
    took 0.86 ms, at 1080p 1.18): two eyes drawn as one batch of two took 1.06 ms at 720p, one by one 1.80.
    The same maths either way (bit-identical outputs).
    """
    grouped: set[int] = set()
    groups: list[list[int]] = []
    for i, feat in enumerate(feats):
        if i in grouped:
            continue
        group = [i] + [j for j in range(i + 1, len(feats)) if j not in grouped and feat.twin_of(feats[j])]
        grouped.update(group)
        groups.append(group)
    return groups


class ProceduralFeature(Feature):
    """A feature drawn from signed distances around a design-space centre."""

    gx: Tensor
    gy: Tensor

    def __init__(
        self,
        name: str,
        place: Placement,
        center: tuple[float, float],
        half: tuple[float, float, float, float],
        size: float,
        parallax: tuple[float, float],
    ) -> None:
        left, top, right, bottom = (v * size for v in half)
        mx, my = abs(parallax[0]), abs(parallax[1])
        cx, cy = center
        box = place.box_around(cx - left - mx, cy - top - my, cx + right + mx, cy + bottom + my)
        super().__init__(name, box)
        x0 = (box[0] - place.ox) / place.scale
        y0 = (box[1] - place.oy) / place.scale
        gx, gy = sdf.pixel_grid(box[3], box[2], x0, y0, place.scale)
        # Local design coordinates normalized to the feature's authored size.
        # Kept 1-D ([1, 1, w] and [1, h, 1]): most lid/lip curves depend on x only; broadcasting does the rest.
        self.register_buffer("gx", ((gx[:1] - cx) / size).unsqueeze(0).contiguous(), persistent=False)
        self.register_buffer("gy", ((gy[:, :1] - cy) / size).unsqueeze(0).contiguous(), persistent=False)
        self.scale = place.scale * size  # pixels per local unit
        self.par = (parallax[0] / size, parallax[1] / size)
        names = list(EXPRESSION_INPUTS) + (["head_yaw", "head_pitch"] if any(parallax) else [])
        self.inputs = tuple(INDEX[n] for n in names)

    def colors_to_buffers(self) -> None:
        """Register every ``c_*`` colour as a buffer so that ``.to(device)`` moves it."""
        for name in [n for n, v in vars(self).items() if n.startswith("c_") and isinstance(v, Tensor)]:
            value = vars(self).pop(name)
            self.register_buffer(name, value, persistent=False)

    def depends_on(self, *names: str) -> None:
        self.inputs = tuple(sorted(set(self.inputs) | {INDEX[n] for n in names}))

    def local(self, p: Tensor) -> tuple[Tensor, Tensor]:
        """Pixel coordinates, shifted by the 2.5D face parallax when enabled (features move more than the head)."""
        if self.par == (0.0, 0.0):
            return self.gx, self.gy
        return self.gx - col(p, "head_yaw") * self.par[0], self.gy + col(p, "head_pitch") * self.par[1]

    def blank(self, p: Tensor) -> Tensor:
        return torch.zeros(p.shape[0], 4, self.box[3], self.box[2], dtype=p.dtype, device=p.device)

    def cov(self, d: Tensor, soft: float = 1.0) -> Tensor:
        return sdf.coverage(d, self.scale, soft)


def _c(color: str, alpha: float = 1.0) -> Tensor:
    return sdf.rgba(color, alpha)


GAZE_X, GAZE_Y = 12.0, 8.0  # the iris's travel in an eye's local units at gaze ±1


class Eye(ProceduralFeature):
    """An anime eye: lids from eye_open and expression, iris from gaze, highlights, lashes."""

    def __init__(
        self,
        place: Placement,
        center: tuple[float, float],
        side: int,
        size: float = 1.0,
        iris: tuple[str, str] = ("#1d5f86", "#6fe0e0"),
        lash: str = "#3c2336",
        parallax: tuple[float, float] = (0.0, 0.0),
    ) -> None:
        super().__init__("eye_l" if side < 0 else "eye_r", place, center, (50, 60, 50, 44), size, parallax)
        self.side = float(side)
        self.open_name = "eye_open_l" if side < 0 else "eye_open_r"
        self.depends_on(self.open_name, "gaze_x", "gaze_y")
        self.c_white, self.c_shadow = _c("#fbfbff"), _c("#c9cbe6")
        self.c_iris0, self.c_iris1 = _c(iris[0]), _c(iris[1])
        self.c_ring, self.c_pupil = _c("#14263d"), _c("#101528")
        self.c_glow, self.c_hi = _c("#bff6ff", 0.55), _c("#ffffff")
        self.c_lash, self.c_lower = _c(lash), _c(lash, 0.75)
        self.colors_to_buffers()

    def quanta(self, pixel: float) -> dict[int, float]:
        # the iris moves GAZE_X / GAZE_Y local units per unit of gaze (see forward)
        return {
            INDEX["gaze_x"]: pixel / (GAZE_X * self.scale),
            INDEX["gaze_y"]: pixel / (GAZE_Y * self.scale),
        }

    def twin_of(self, other: Feature) -> bool:
        if type(other) is not type(self) or other is self:
            return False
        assert isinstance(other, Eye)
        mine, theirs = dict(self.named_buffers()), dict(other.named_buffers())
        return (
            self.box[2:] == other.box[2:]
            and (self.scale, self.par) == (other.scale, other.par)
            and mine.keys() == theirs.keys()
            and all(
                torch.equal(v, theirs[k]) if k.startswith("c_") else v.shape == theirs[k].shape
                for k, v in mine.items()
            )
        )

    @classmethod
    def draw_twins(cls, twins: Sequence[Feature], p: Tensor) -> Tensor:
        eyes = [e for e in twins if isinstance(e, Eye)]
        places = [e.local(p) for e in eyes]
        x, y = torch.cat([xy[0] for xy in places]), torch.cat([xy[1] for xy in places])
        side = torch.tensor([e.side for e in eyes], dtype=p.dtype).view(-1, 1, 1)
        opened = torch.cat([col(p, e.open_name) for e in eyes])
        return eyes[0].draw(p.expand(len(eyes), -1), x, y, side, opened)

    def forward(self, p: Tensor) -> Tensor:
        x, y = self.local(p)
        return self.draw(p, x, y, self.side, col(p, self.open_name))

    def draw(self, p: Tensor, x: Tensor, y: Tensor, side: float | Tensor, opened: Tensor) -> Tensor:
        """The eye at local coordinates ``x``, ``y`` (its own, or a batch of twins'), ``side`` -1 (left)
        or 1, ``opened`` its eye_open ``[B, 1, 1]``."""
        happy, sad = col(p, "expr_happy"), col(p, "expr_sad")
        angry, surpr = col(p, "expr_angry"), col(p, "expr_surprised")
        u = x * side
        w = 40.0
        t = torch.clamp(u / w, -1.0, 1.0)
        q = torch.clamp(1.0 - t * t, min=0.0)
        hq = torch.sqrt(q)
        oe = torch.clamp(opened, 0.0, 1.0) * (1.0 - 0.8 * happy) * (1.0 + 0.15 * surpr)
        yc = 8.0 + (4.0 - 18.0 * happy) * q
        yu = yc - oe * (
            46.0 * hq - angry * 9.0 * (1.0 - t) * 0.5 - sad * 8.0 * (1.0 + t) * 0.5 + surpr * 4.0 * hq
        )
        yl = yc + oe * 24.0 * q * (1.0 - 0.5 * happy)
        d_ap = torch.maximum(torch.maximum(yu - y, y - yl), torch.abs(u) - w)
        ap = self.cov(d_ap)
        out = self.blank(p)
        shade = torch.clamp((y - yu) / 14.0, 0.0, 1.0)
        out = sdf.paint(out, ap, sdf.mix(self.c_shadow, self.c_white, shade))
        icx = col(p, "gaze_x") * GAZE_X
        icy = 4.0 + col(p, "gaze_y") * GAZE_Y
        rx, ry = 23.0 * (1.0 - 0.22 * surpr), 29.0 * (1.0 - 0.2 * surpr)
        d_iris = sdf.ellipse(x, y, icx, icy, rx, ry)  # type: ignore[arg-type]
        grad = torch.clamp((y - icy + ry) / (2.0 * ry), 0.0, 1.0)
        out = sdf.paint(out, self.cov(d_iris) * ap, sdf.mix(self.c_iris0, self.c_iris1, grad))
        out = sdf.paint(out, self.cov(torch.abs(d_iris) - 1.3) * ap, self.c_ring)
        out = sdf.paint(out, self.cov(sdf.ellipse(x, y, icx, icy + 13.0, 14.0, 8.0)) * ap, self.c_glow)  # type: ignore[arg-type]
        pr = 1.0 - 0.35 * surpr
        d_pupil = sdf.ellipse(x, y, icx, icy + 1.0, 9.0 * pr, 12.0 * pr)  # type: ignore[arg-type]
        out = sdf.paint(out, self.cov(d_pupil) * ap, self.c_pupil)
        hi = torch.minimum(
            sdf.ellipse(x, y, icx - 9.0, icy - 11.0, 7.5, 8.5),  # type: ignore[arg-type]
            sdf.circle(x, y, icx + 8.0, icy + 11.0, 3.2),  # type: ignore[arg-type]
        )
        out = sdf.paint(out, self.cov(hi) * ap, self.c_hi)
        # Lid slope, to turn vertical distances into true ones where the lid curves steeply.
        slope = (
            oe * 46.0 * 0.5 * t / (w * torch.sqrt(torch.clamp(q, min=0.03))) * 2.0
            + (4.0 - 18.0 * happy) * 2.0 * t / w
        )
        norm = torch.sqrt(1.0 + slope * slope)
        th = 3.2 + 5.0 * ((t + 1.0) * 0.5) ** 2
        d_lash = torch.maximum(
            (torch.abs(y - (yu - th * 0.35)) - th * 0.5) / norm, torch.abs(u - 1.5) - (w + 2.5)
        )
        out = sdf.paint(out, self.cov(d_lash), self.c_lash)
        d_low = torch.maximum(torch.abs(y - yl - 0.6) - 0.9, torch.maximum(u - w, 0.3 * w - u))
        return sdf.paint(out, self.cov(d_low), self.c_lower)


class Brow(ProceduralFeature):
    """A tapered brow arc: raised by brow_l/brow_r, tilted by expression."""

    def __init__(
        self,
        place: Placement,
        center: tuple[float, float],
        side: int,
        size: float = 1.0,
        color: str = "#6e2f52",
        parallax: tuple[float, float] = (0.0, 0.0),
    ) -> None:
        super().__init__("brow_l" if side < 0 else "brow_r", place, center, (40, 26, 40, 20), size, parallax)
        self.side = float(side)
        self.param = "brow_l" if side < 0 else "brow_r"
        self.depends_on(self.param)
        self.c_brow = _c(color)
        self.colors_to_buffers()

    def forward(self, p: Tensor) -> Tensor:
        x, y = self.local(p)
        happy, sad = col(p, "expr_happy"), col(p, "expr_sad")
        angry, surpr = col(p, "expr_angry"), col(p, "expr_surprised")
        u = x * self.side
        t = torch.clamp(u / 30.0, -1.0, 1.0)
        lift = col(p, self.param) + 0.25 * happy + 0.9 * surpr - 0.25 * angry + 0.1 * sad
        yb = -lift * 8.0 - 5.0 * (1.0 - t * t) - angry * 8.0 * t + sad * 7.0 * t
        th = 5.2 - 2.6 * (t + 1.0) * 0.5
        d = torch.maximum(torch.abs(y - yb) - th * 0.5, torch.abs(u) - 30.0)
        out = self.blank(p)
        return sdf.paint(out, self.cov(d), self.c_brow)


class TextureFade(Feature):
    """A fixed image whose opacity follows weighted drivers (blush, tears, sparkles...)."""

    texture: Tensor
    idx: Tensor
    w: Tensor

    def __init__(self, name: str, box: Box, texture: Tensor, terms: list[tuple[Driver, float]]) -> None:
        super().__init__(name, box)
        self.register_buffer("texture", texture.unsqueeze(0), persistent=False)
        self.inputs = tuple(sorted({d.index for d, _ in terms}))
        idx = torch.zeros(len(terms), dtype=torch.long)
        w = torch.zeros(len(terms))
        off = 0.0
        for i, (drv, k) in enumerate(terms):
            idx[i] = drv.index
            w[i] = -k if drv.invert else k
            off += k if drv.invert else 0.0
        self.register_buffer("idx", idx, persistent=False)
        self.register_buffer("w", w, persistent=False)
        self.off = off

    def forward(self, p: Tensor) -> Tensor:
        a = torch.clamp((p[:, self.idx] * self.w).sum(dim=1) + self.off, 0.0, 1.0)
        return self.texture * a.view(-1, 1, 1, 1)


class SpriteBlend(Feature):
    """Images blended by driver weights: ``base * (1 - Σw) + Σ w_k * image_k`` (Σw capped at 1)."""

    base: Tensor
    images: Tensor
    idx: Tensor
    inv: Tensor

    def __init__(
        self, name: str, box: Box, base: Tensor | None, images: Tensor, drivers: list[Driver]
    ) -> None:
        super().__init__(name, box)
        self.has_base = base is not None
        self.register_buffer(
            "base", (base if base is not None else torch.zeros_like(images[0])).unsqueeze(0), persistent=False
        )
        self.register_buffer("images", images.flatten(1), persistent=False)  # [K, 4*h*w]
        self.register_buffer(
            "idx", torch.tensor([d.index for d in drivers], dtype=torch.long), persistent=False
        )
        self.register_buffer("inv", torch.tensor([float(d.invert) for d in drivers]), persistent=False)
        self.shape4 = tuple(images.shape[1:])
        self.inputs = tuple(sorted({d.index for d in drivers}))

    def forward(self, p: Tensor) -> Tensor:
        v = p[:, self.idx]
        w = torch.clamp(v + self.inv * (1.0 - 2.0 * v), 0.0, 1.0)  # 1 - v where inverted
        total = w.sum(dim=1, keepdim=True)
        w = w / torch.clamp(total, min=1.0)
        out = (w @ self.images).view(-1, *self.shape4)
        if self.has_base:
            out = out + self.base * (1.0 - torch.clamp(total, max=1.0)).view(-1, 1, 1, 1)
        return out
