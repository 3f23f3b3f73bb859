"""The built-in character, "Aiko": an original idol bust drawn in code with signed distances.

Every static layer is a function ``draw(scale, x0, y0, h, w) -> [4, h, w]`` that
rasterizes design units (a 900 × 1080 canvas) at whatever scale the output
profile needs, 2× supersampled, so the art is sharp at 360p and at 4K alike.
The moving face features are the procedural eyes, brows and mouth of
:mod:`engine.avatar.features` / :mod:`engine.avatar.mouth`; :func:`default_rig`
wires everything into an ordinary :class:`~engine.avatar.rig.Rig`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from engine.avatar import sdf
from engine.avatar.rig import PartSpec, Rig, parse_rig

CW, CH, CX = 900, 1080, 450.0
SEAM = 790.0  # rows above move with the body (breathing, sway); rows below are static
HEAD_PIVOT = (450.0, 585.0)
ELBOW = (772.0, 1010.0)

SKIN, SKIN_SH, SKIN_LINE = sdf.rgba("#ffe7dc"), sdf.rgba("#f6c4b8"), sdf.rgba("#b86b66")
HAIR, HAIR_SH, HAIR_HI, HAIR_LINE = (
    sdf.rgba("#f59ec6"),
    sdf.rgba("#cc6c9f"),
    sdf.rgba("#ffd9ea"),
    sdf.rgba("#7c355f"),
)
WHITE, WHITE_SH, CLOTH_LINE = sdf.rgba("#fbfaff"), sdf.rgba("#d9d6ee"), sdf.rgba("#4a3f6b")
NAVY, RIBBON, RIBBON_SH = sdf.rgba("#34407a"), sdf.rgba("#ee4d7e"), sdf.rgba("#b8305d")
STAR, STAR_LINE = sdf.rgba("#ffd45c"), sdf.rgba("#c9862b")

Draw = Callable[[Tensor, Tensor, float], Tensor]


def _raster(
    fn: Draw, clip: tuple[float, float] | None = None
) -> Callable[[float, float, float, int, int], Tensor]:
    """Rasterize a drawing (analytic antialiasing); ``clip`` keeps pixel centres with clip[0] <= y < clip[1]."""

    def draw(scale: float, x0: float, y0: float, h: int, w: int) -> Tensor:
        x, y = sdf.pixel_grid(h, w, x0, y0, scale)
        img = fn(x, y, scale)
        if clip is not None:
            _, yc = sdf.pixel_grid(h, w, x0, y0, scale)
            img = img * ((yc >= clip[0]) & (yc < clip[1])).to(img.dtype)
        return img.contiguous()

    return draw


def _blank(x: Tensor) -> Tensor:
    return torch.zeros(4, *x.shape)


def _ink(canvas: Tensor, d: Tensor, s: float, fill: Tensor, line: Tensor, lw: float = 2.2) -> Tensor:
    """Fill a shape and outline it (outline centred slightly inside the edge)."""
    canvas = sdf.paint(canvas, sdf.coverage(d, s), fill)
    return sdf.paint(canvas, sdf.coverage(torch.abs(d + lw * 0.4) - lw * 0.5, s), line)


def _cel(d: Tensor, base: Tensor, shade: Tensor, width: float) -> Tensor:
    """Colour that darkens toward a shape's edge: a cheap cel-shaded rim."""
    return sdf.mix(shade, base, torch.clamp(-d / width, 0.0, 1.0))


# ---------------------------------------------------------------- body (neck, blouse, collar, bow)


def _torso(x: Tensor, y: Tensor, s: float) -> Tensor:
    c = _blank(x)
    neck = sdf.rounded_box(x, y, CX, 610.0, 36.0, 90.0, 20.0)
    c = _ink(c, neck, s, SKIN, SKIN_LINE, 2.0)
    chin_shadow = torch.maximum(sdf.ellipse(x, y, CX, 575.0, 60.0, 38.0), neck)
    c = sdf.paint(c, sdf.coverage(chin_shadow, s, 3.0), SKIN_SH)
    left = sdf.path(
        (CX, 652.0),
        ((420.0, 650.0), (410.0, 646.0), (402.0, 642.0)),
        ((350.0, 662.0), (292.0, 672.0), (240.0, 697.0)),
        ((182.0, 722.0), (158.0, 768.0), (150.0, 840.0)),
        ((142.0, 920.0), (138.0, 1000.0), (134.0, 1090.0)),
    )
    body = sdf.polygon(x, y, left + sdf.mirror(left, CX))
    c = _ink(c, body, s, _cel(body, WHITE, WHITE_SH, 26.0), CLOTH_LINE, 2.6)
    vneck = sdf.polygon(x, y, [(408.0, 640.0), (492.0, 640.0), (CX, 735.0)])
    c = sdf.paint(c, sdf.coverage(torch.maximum(vneck, body), s), SKIN)
    flap = sdf.path(
        (404.0, 641.0),
        ((340.0, 660.0), (270.0, 675.0), (222.0, 703.0)),
        ((232.0, 742.0), (262.0, 775.0), (320.0, 800.0)),
        ((380.0, 822.0), (420.0, 838.0), (CX, 856.0)),
        ((436.0, 800.0), (420.0, 720.0), (410.0, 652.0)),
    )
    collar = torch.minimum(sdf.polygon(x, y, flap), sdf.polygon(x, y, sdf.mirror(flap, CX)))
    collar = torch.maximum(collar, body)
    c = _ink(c, collar, s, NAVY, CLOTH_LINE, 2.4)
    stripe = torch.maximum(torch.abs(collar + 12.0) - 2.6, collar)
    c = sdf.paint(c, sdf.coverage(stripe, s), WHITE)
    # Ribbon bow: two loops, two tails, a knot.
    loops = torch.minimum(
        sdf.ellipse(x, y, 404.0, 806.0, 44.0, 25.0), sdf.ellipse(x, y, 496.0, 806.0, 44.0, 25.0)
    )
    tails = torch.minimum(
        sdf.polygon(x, y, [(440.0, 812.0), (392.0, 900.0), (410.0, 912.0), (424.0, 896.0), (456.0, 818.0)]),
        sdf.polygon(x, y, [(460.0, 812.0), (508.0, 900.0), (490.0, 912.0), (476.0, 896.0), (444.0, 818.0)]),
    )
    c = _ink(c, tails, s, RIBBON_SH, CLOTH_LINE, 2.0)
    c = _ink(c, loops, s, _cel(loops, RIBBON, RIBBON_SH, 12.0), CLOTH_LINE, 2.2)
    inner = torch.minimum(
        sdf.ellipse(x, y, 412.0, 808.0, 20.0, 9.0), sdf.ellipse(x, y, 488.0, 808.0, 20.0, 9.0)
    )
    c = sdf.paint(c, sdf.coverage(inner, s, 2.0), RIBBON_SH)
    knot = sdf.rounded_box(x, y, CX, 808.0, 14.0, 17.0, 6.0)
    return _ink(c, knot, s, RIBBON, CLOTH_LINE, 2.0)


# ---------------------------------------------------------------- head


def _strand(
    rl: float, rr: float, ry: float, tip: tuple[float, float], bulge: float = 10.0
) -> list[sdf.Point]:
    length = tip[1] - ry
    w = rr - rl
    left = sdf.path(
        (rl, ry), ((rl - bulge, ry + 0.45 * length), (tip[0] - w * 0.18, tip[1] - 0.3 * length), tip)
    )
    right = sdf.path(
        tip, ((tip[0] + w * 0.18, tip[1] - 0.3 * length), (rr + bulge, ry + 0.45 * length), (rr, ry))
    )
    return left + right[1:]


BANGS = [
    _strand(262.0, 352.0, 300.0, (300.0, 500.0), 14.0),
    _strand(322.0, 418.0, 290.0, (366.0, 418.0)),
    _strand(384.0, 474.0, 285.0, (424.0, 436.0)),
    _strand(446.0, 530.0, 285.0, (482.0, 414.0)),
    _strand(500.0, 588.0, 290.0, (546.0, 430.0)),
    _strand(556.0, 640.0, 295.0, (598.0, 405.0)),
    _strand(548.0, 640.0, 300.0, (604.0, 498.0), 14.0),
]
SIDE_LOCKS = [
    _strand(244.0, 330.0, 296.0, (270.0, 705.0), 16.0),
    _strand(570.0, 656.0, 296.0, (632.0, 700.0), 16.0),
]


def _face_sdf(x: Tensor, y: Tensor) -> Tensor:
    half = sdf.path(
        (CX, 270.0),
        ((380.0, 270.0), (316.0, 310.0), (308.0, 400.0)),
        ((302.0, 472.0), (330.0, 530.0), (386.0, 562.0)),
        ((416.0, 580.0), (436.0, 587.0), (CX, 588.0)),
    )
    return sdf.polygon(x, y, half + sdf.mirror(half, CX)[1:-1])


def _hair_back(x: Tensor, y: Tensor, s: float) -> Tensor:
    c = _blank(x)
    mass = torch.minimum(
        sdf.circle(x, y, CX, 372.0, 226.0), sdf.rounded_box(x, y, CX, 500.0, 232.0, 120.0, 70.0)
    )
    hem = y - (612.0 + 10.0 * torch.cos((x - CX) / 14.0))
    mass = torch.maximum(mass, hem)
    mass = torch.maximum(mass, -sdf.rounded_box(x, y, CX, 660.0, 120.0, 110.0, 40.0))
    return _ink(c, mass, s, _cel(mass, HAIR_SH, sdf.rgba("#a85484"), 14.0), HAIR_LINE, 2.4)


def _face(x: Tensor, y: Tensor, s: float) -> Tensor:
    c = _blank(x)
    face = _face_sdf(x, y)
    c = _ink(c, face, s, SKIN, SKIN_LINE, 2.0)
    bangs = _bangs_sdf(x, y)
    shadow = torch.maximum(face, bangs - 14.0 - 6.0 * torch.sin(x / 9.0).abs())
    c = sdf.paint(c, sdf.coverage(shadow, s, 2.0), sdf.rgba("#f3bcb2", 0.85))
    nose = sdf.segment(x, y, (452.0, 494.0), (447.0, 503.0)) - 1.1
    return sdf.paint(c, sdf.coverage(nose, s), sdf.rgba("#c98378", 0.8))


def _bangs_sdf(x: Tensor, y: Tensor) -> Tensor:
    cap = torch.maximum(sdf.circle(x, y, CX, 372.0, 226.0), y - 318.0)
    d = cap
    for strand in BANGS + SIDE_LOCKS:
        d = torch.minimum(d, sdf.polygon(x, y, strand))
    return d


def _hair_front(x: Tensor, y: Tensor, s: float) -> Tensor:
    c = _blank(x)
    curl = sdf.path((448.0, 175.0), ((458.0, 110.0), (500.0, 88.0), (534.0, 110.0)), n=12)
    ahoge = sdf.polyline(x, y, curl) - 3.0 - 5.0 * torch.clamp((y - 100.0) / 75.0, 0.0, 1.0)
    c = _ink(c, ahoge, s, HAIR, HAIR_LINE, 2.0)
    hair = _bangs_sdf(x, y)
    c = _ink(c, hair, s, _cel(hair, HAIR, HAIR_SH, 9.0), HAIR_LINE, 2.4)
    for strand in BANGS + SIDE_LOCKS:  # a soft crease line down each strand
        half = len(strand) // 2 + 1
        pairs = zip(strand[:half], strand[::-1][:half], strict=True)
        mid = [(0.5 * (a[0] + b[0]), 0.5 * (a[1] + b[1])) for a, b in pairs]
        crease = torch.maximum(sdf.polyline(x, y, mid) - 1.2, hair + 4.0)
        c = sdf.paint(c, sdf.coverage(crease, s), sdf.rgba("#c2639a", 0.7))
    r = torch.sqrt((x - CX) ** 2 + (y - 420.0) ** 2)
    wave = 6.0 * torch.clamp(torch.cos((x - CX) / 11.0) * 0.6 + 0.5, 0.0, 1.0)
    ring = torch.maximum(torch.maximum(torch.abs(r - 196.0) - wave, hair + 3.0), torch.abs(x - CX) - 150.0)
    c = sdf.paint(c, sdf.coverage(ring, s, 1.5), HAIR_HI)
    star = sdf.polygon(x, y, sdf.star(598.0, 292.0, 30.0, 13.0))
    c = _ink(c, star - 2.0, s, STAR, STAR_LINE, 2.2)
    return sdf.paint(c, sdf.coverage(sdf.circle(x, y, 592.0, 284.0, 4.5), s), sdf.rgba("#ffffff", 0.9))


def _blush(x: Tensor, y: Tensor, s: float) -> Tensor:
    c = _blank(x)
    for side in (-1.0, 1.0):
        cx = CX + side * 98.0
        c = sdf.paint(
            c, sdf.coverage(sdf.ellipse(x, y, cx, 512.0, 34.0, 14.0), s, 10.0), sdf.rgba("#ff7fa0", 0.5)
        )
        for k in (-1.0, 0.0, 1.0):
            hx = cx + k * 13.0
            hatch = sdf.segment(x, y, (hx + 4.0, 504.0), (hx - 4.0, 518.0)) - 1.1
            c = sdf.paint(c, sdf.coverage(hatch, s), sdf.rgba("#ea5a83", 0.75))
    return c


# ---------------------------------------------------------------- arm (upright pose, elbow at ELBOW)


def _arm(x: Tensor, y: Tensor, s: float) -> Tensor:
    c = _blank(x)
    ex, ey = ELBOW
    fore = sdf.polygon(
        x, y, [(ex - 24.0, ey), (ex - 19.0, ey - 210.0), (ex + 19.0, ey - 210.0), (ex + 24.0, ey)]
    )
    c = _ink(c, fore, s, _cel(fore, SKIN, SKIN_SH, 8.0), SKIN_LINE, 2.0)
    palm = sdf.rounded_box(x, y, ex, ey - 250.0, 30.0, 34.0, 16.0)
    fingers = palm
    for dx, length, tilt in ((-19.0, 44.0, -6.0), (-6.0, 52.0, -2.0), (7.0, 50.0, 2.0), (20.0, 40.0, 7.0)):
        top = (ex + dx + tilt, ey - 278.0 - length)
        fingers = torch.minimum(fingers, sdf.segment(x, y, (ex + dx, ey - 270.0), top) - 7.0)
    thumb = sdf.segment(x, y, (ex - 24.0, ey - 238.0), (ex - 54.0, ey - 272.0)) - 8.0
    hand = sdf.smin(fingers, thumb, 4.0)
    c = _ink(c, hand, s, _cel(hand, SKIN, SKIN_SH, 6.0), SKIN_LINE, 2.0)
    cuff = sdf.rounded_box(x, y, ex, ey + 10.0, 40.0, 32.0, 18.0)
    c = _ink(c, cuff, s, _cel(cuff, WHITE, WHITE_SH, 14.0), CLOTH_LINE, 2.4)
    band = torch.maximum(torch.abs(y - (ey - 10.0)) - 4.0, cuff + 2.0)
    return sdf.paint(c, sdf.coverage(band, s), NAVY)


def _part(
    name: str,
    group: str,
    fn: Draw,
    rect: tuple[float, float, float, float],
    clip: tuple[float, float] | None = None,
    **extra: object,
) -> PartSpec:
    return PartSpec(name=name, group=group, draw=_raster(fn, clip), rect=rect, **extra)  # type: ignore[arg-type]


def default_rig() -> Rig:
    """Aiko's rig: static lower torso, breathing upper body, head with procedural features, waving arm."""
    head_rect = (210.0, 80.0, 690.0, 720.0)
    parts = [
        _part("torso_lower", "static", _torso, (100.0, SEAM - 2.0, 800.0, 1080.0), clip=(SEAM, 1e9)),
        _part("torso_upper", "body", _torso, (100.0, 510.0, 800.0, SEAM + 2.0), clip=(-1e9, SEAM)),
        _part("hair_back", "head", _hair_back, head_rect),
        _part("face", "head", _face, (290.0, 250.0, 610.0, 600.0)),
        _part(
            "blush",
            "head",
            _blush,
            (330.0, 490.0, 570.0, 535.0),
            opacity={"blush": 1.0, "expr_happy": 0.45, "expr_surprised": 0.25, "expr_angry": 0.2},
        ),
        {"name": "eye_l", "group": "head", "procedural": "eye", "side": "left", "center": [382, 458]},
        {"name": "eye_r", "group": "head", "procedural": "eye", "side": "right", "center": [518, 458]},
        {"name": "mouth", "group": "head", "procedural": "mouth", "center": [450, 538]},
        _part("hair_front", "head", _hair_front, (200.0, 80.0, 700.0, 720.0)),
        {"name": "brow_l", "group": "head", "procedural": "brow", "side": "left", "center": [380, 388]},
        {"name": "brow_r", "group": "head", "procedural": "brow", "side": "right", "center": [520, 388]},
        _part("arm", "arm", _arm, (ELBOW[0] - 70.0, ELBOW[1] - 345.0, ELBOW[0] + 50.0, ELBOW[1] + 45.0)),
    ]
    data = {
        "format": "idolcast-rig/1",
        "name": "Aiko (built-in)",
        "canvas": [CW, CH],
        "groups": {
            "body": {"pivot": [CX, SEAM]},
            "head": {"pivot": list(HEAD_PIVOT), "roll_deg": 10.0},
            "arm": {"pivot": list(ELBOW)},
        },
        "parts": parts,
    }
    return parse_rig(data, "builtin:default")
