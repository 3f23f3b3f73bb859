"""Signed-distance drawing in torch: the pen the built-in character is drawn with.

Shapes are signed distances in *design units* (negative inside). ``coverage``
turns a distance into antialiased pixel coverage for a raster whose pixels are
``1 / scale`` design units wide. Colours are premultiplied RGBA ``[4, H, W]``
(or ``[B, 4, H, W]``) in 0..1; :func:`paint` lays a colour over a canvas.

Everything here is plain elementwise torch, so the procedural face features
(eyes, brows, mouth) that use it per frame export to ONNX and TensorRT.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

Point = tuple[float, float]
CULL = 48.0  # design units: beyond this from a shape's box, distances are only bounds


def pixel_grid(h: int, w: int, x0: float, y0: float, scale: float) -> tuple[Tensor, Tensor]:
    """Design coordinates of pixel centres of an ``h × w`` raster whose top-left corner is design (x0, y0)."""
    xs = x0 + (torch.arange(w, dtype=torch.float32) + 0.5) / scale
    ys = y0 + (torch.arange(h, dtype=torch.float32) + 0.5) / scale
    return xs.view(1, w).expand(h, w).contiguous(), ys.view(h, 1).expand(h, w).contiguous()


def coverage(d: Tensor, scale: float, soft: float = 1.0) -> Tensor:
    """Antialiased coverage of ``d < 0`` (one pixel ramp, widened by ``soft``)."""
    return torch.clamp(0.5 - d * (scale / soft), 0.0, 1.0)


def circle(x: Tensor, y: Tensor, cx: float, cy: float, r: float) -> Tensor:
    return torch.sqrt((x - cx) ** 2 + (y - cy) ** 2) - r


def ellipse(x: Tensor, y: Tensor, cx: float, cy: float, rx: float, ry: float) -> Tensor:
    """Inigo Quilez's cheap ellipse distance bound (exact on the axes, good near the outline)."""
    px, py = (x - cx) / rx, (y - cy) / ry
    k0 = torch.sqrt(px * px + py * py)
    k1 = torch.sqrt((px / rx) ** 2 + (py / ry) ** 2) + 1e-6
    return k0 * (k0 - 1.0) / k1


def rounded_box(x: Tensor, y: Tensor, cx: float, cy: float, hw: float, hh: float, r: float = 0.0) -> Tensor:
    qx = torch.abs(x - cx) - hw + r
    qy = torch.abs(y - cy) - hh + r
    outside = torch.sqrt(torch.clamp(qx, min=0.0) ** 2 + torch.clamp(qy, min=0.0) ** 2)
    return outside + torch.clamp(torch.maximum(qx, qy), max=0.0) - r


def segment(x: Tensor, y: Tensor, a: Point, b: Point) -> Tensor:
    """Unsigned distance to the segment a–b."""
    bax, bay = b[0] - a[0], b[1] - a[1]
    pax, pay = x - a[0], y - a[1]
    h = torch.clamp((pax * bax + pay * bay) / (bax * bax + bay * bay + 1e-9), 0.0, 1.0)
    return torch.sqrt((pax - bax * h) ** 2 + (pay - bay * h) ** 2)


def _windowed(
    x: Tensor, y: Tensor, pts: Sequence[Point], exact: Callable[[Tensor, Tensor], Tensor]
) -> Tensor:
    """Evaluate ``exact`` only near the points' bounding box; farther pixels get the box distance.

    Drawing at load time works on 2-D pixel grids (x varying along columns): a
    distance farther than :data:`CULL` from a shape only ever means "outside", so
    the exact, per-edge distance is computed in a window around the shape.
    """
    xs_, ys_ = [q[0] for q in pts], [q[1] for q in pts]
    bx0, bx1, by0, by1 = min(xs_), max(xs_), min(ys_), max(ys_)
    if x.dim() != 2 or x.shape[0] < 2 or x.shape[1] < 2:
        return exact(x, y)
    col_x, row_y = x[0].contiguous(), y[:, 0].contiguous()
    c0 = int(torch.searchsorted(col_x, torch.tensor(bx0 - CULL)))
    c1 = int(torch.searchsorted(col_x, torch.tensor(bx1 + CULL)))
    r0 = int(torch.searchsorted(row_y, torch.tensor(by0 - CULL)))
    r1 = int(torch.searchsorted(row_y, torch.tensor(by1 + CULL)))
    out = rounded_box(x, y, (bx0 + bx1) / 2, (by0 + by1) / 2, (bx1 - bx0) / 2, (by1 - by0) / 2)
    out = torch.clamp(out, min=CULL * 0.5)
    if c1 > c0 and r1 > r0:
        out[r0:r1, c0:c1] = exact(x[r0:r1, c0:c1], y[r0:r1, c0:c1])
    return out


def polyline(x: Tensor, y: Tensor, pts: Sequence[Point]) -> Tensor:
    """Unsigned distance to an open polyline."""

    def exact(x: Tensor, y: Tensor) -> Tensor:
        d = segment(x, y, pts[0], pts[1])
        for a, b in zip(pts[1:-1], pts[2:], strict=True):
            d = torch.minimum(d, segment(x, y, a, b))
        return d

    return _windowed(x, y, pts, exact)


def polygon(x: Tensor, y: Tensor, pts: Sequence[Point]) -> Tensor:
    """Signed distance to a closed polygon (even-odd inside test)."""

    def exact(x: Tensor, y: Tensor) -> Tensor:
        n = len(pts)
        d = torch.full_like(x, float("inf"))
        inside = torch.zeros_like(x, dtype=torch.bool)
        for i in range(n):
            a, b = pts[i], pts[(i + 1) % n]
            d = torch.minimum(d, segment(x, y, a, b))
            cond = (y >= a[1]) != (y >= b[1])
            xcross = a[0] + (y - a[1]) * (b[0] - a[0]) / (b[1] - a[1] + 1e-12)
            inside = inside ^ (cond & (x < xcross))
        return torch.where(inside, -d, d)

    return _windowed(x, y, pts, exact)


def bezier(p0: Point, p1: Point, p2: Point, p3: Point, n: int = 6) -> list[Point]:
    """Points along a cubic Bézier curve (p0 included, p3 included)."""
    out = []
    for i in range(n + 1):
        t = i / n
        u = 1 - t
        out.append(
            (
                u**3 * p0[0] + 3 * u * u * t * p1[0] + 3 * u * t * t * p2[0] + t**3 * p3[0],
                u**3 * p0[1] + 3 * u * u * t * p1[1] + 3 * u * t * t * p2[1] + t**3 * p3[1],
            )
        )
    return out


def path(start: Point, *curves: tuple[Point, Point, Point], n: int = 6) -> list[Point]:
    """A polyline through consecutive cubic Béziers given as (control1, control2, end)."""
    pts = [start]
    cur = start
    for c1, c2, end in curves:
        pts.extend(bezier(cur, c1, c2, end, n)[1:])
        cur = end
    return pts


def mirror(pts: Sequence[Point], cx: float) -> list[Point]:
    """The path mirrored about x = cx, reversed so that start + mirror closes a symmetric outline."""
    return [(2 * cx - px, py) for px, py in reversed(pts)]


def star(cx: float, cy: float, r_out: float, r_in: float, points: int = 5, rot: float = -90.0) -> list[Point]:
    out = []
    for i in range(points * 2):
        r = r_out if i % 2 == 0 else r_in
        a = math.radians(rot + i * 180.0 / points)
        out.append((cx + r * math.cos(a), cy + r * math.sin(a)))
    return out


def smin(a: Tensor, b: Tensor, k: float) -> Tensor:
    """Smooth union with blend radius k."""
    h = torch.clamp(0.5 + 0.5 * (b - a) / k, 0.0, 1.0)
    return b + (a - b) * h - k * h * (1.0 - h)


def rgba(hex_or_rgb: str | Sequence[float], alpha: float = 1.0) -> Tensor:
    """A premultiplied colour ``[4, 1, 1]`` from '#rrggbb' or 0..255 RGB."""
    if isinstance(hex_or_rgb, str):
        h = hex_or_rgb.lstrip("#")
        rgb = [int(h[i : i + 2], 16) / 255.0 for i in (0, 2, 4)]
    else:
        rgb = [float(c) / 255.0 for c in hex_or_rgb]
    return torch.tensor([c * alpha for c in rgb] + [alpha], dtype=torch.float32).view(4, 1, 1)


def mix(c0: Tensor, c1: Tensor, t: Tensor) -> Tensor:
    """Per-pixel blend of two colours by t (``[..., H, W]``, broadcast over channels)."""
    return c0 + (c1 - c0) * t.unsqueeze(-3)


def paint(canvas: Tensor, cov: Tensor, color: Tensor) -> Tensor:
    """``color`` (premultiplied, broadcastable to canvas) over ``canvas`` with coverage ``cov``."""
    c = cov.unsqueeze(-3)
    return color * c + canvas * (1.0 - color[..., 3:4, :, :] * c)


def over(top: Tensor, bottom: Tensor) -> Tensor:
    """Premultiplied source-over."""
    return top + bottom * (1.0 - top[..., 3:4, :, :])
