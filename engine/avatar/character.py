"""A character: a rig plus its art, placed into an output frame at a given size.

``engine.avatar.loaders.load_character`` resolves the config's ``character`` string
('builtin:default', a rig folder or file, or a ``.psd``). :meth:`Character.place`
rasterizes every static part at the output scale (premultiplied float RGBA) and
builds the dynamic parts (procedural features, sprite blends, fading images)
that the frame generator evaluates per frame.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from engine.avatar.features import (
    Box,
    Brow,
    Driver,
    Eye,
    Feature,
    Placement,
    SpriteBlend,
    TextureFade,
)
from engine.avatar.mouth import Mouth
from engine.avatar.rig import PartSpec, Rig, RigError


@dataclass
class PlacedPart:
    """A part at output scale: a static image or a per-frame feature, in frame pixels."""

    spec: PartSpec
    box: Box
    image: Tensor | None = None  # [4, h, w] premultiplied
    feature: Feature | None = None


def premultiply(rgba: np.ndarray) -> Tensor:
    """Straight-alpha uint8 ``[h, w, 4]`` → premultiplied float ``[4, h, w]``."""
    t = torch.from_numpy(np.array(rgba, copy=True)).permute(2, 0, 1).float() / 255.0
    return torch.cat([t[:3] * t[3:4], t[3:4]], dim=0).contiguous()


class Character:
    """A rig and its images (straight-alpha uint8 ``[h, w, 4]`` at design scale, keyed by file name)."""

    def __init__(self, rig: Rig, images: Mapping[str, np.ndarray] | None = None) -> None:
        self.rig = rig
        self.images = dict(images or {})
        for part in rig.parts:
            for key in ([part.image] if part.image else []) + list(part.variants.values()):
                if key not in self.images and part.draw is None:
                    raise RigError(f"{rig.source}: part {part.name!r}: image {key!r} was not loaded")

    def placement(self, width: int, height: int) -> Placement:
        """Fit the canvas into the frame: as large as fits, centred horizontally, standing on the bottom edge."""
        cw, ch = self.rig.canvas
        s = min(width / cw, height / ch)
        return Placement(s, (width - cw * s) / 2.0, height - ch * s)

    def place(self, width: int, height: int) -> tuple[Placement, list[PlacedPart]]:
        place = self.placement(width, height)
        head = self.rig.groups["head"].amp
        parallax = (head.get("parallax_x", 0.0), head.get("parallax_y", 0.0))
        out: list[PlacedPart] = []
        for spec in self.rig.parts:
            par = parallax if spec.group == "head" else (0.0, 0.0)
            if spec.procedural:
                feat = self._procedural(spec, place, par)
                out.append(PlacedPart(spec, feat.box, feature=feat))
                continue
            box, image = self._raster(spec, place, spec.image) if spec.image or spec.draw else (None, None)
            if spec.variants:
                rasters = [self._raster(spec, place, key) for key in spec.variants.values()]
                boxes = [b for b, _ in rasters] + ([box] if box else [])
                ubox = _union(boxes)
                stack = torch.stack([_pad_to(img, b, ubox) for b, img in rasters])
                base = _pad_to(image, box, ubox) if image is not None and box is not None else None
                drivers = [Driver.parse(d) for d in spec.variants]
                out.append(PlacedPart(spec, ubox, feature=SpriteBlend(spec.name, ubox, base, stack, drivers)))
            elif spec.opacity:
                assert box is not None and image is not None
                terms = [(Driver.parse(d), k) for d, k in spec.opacity.items()]
                out.append(PlacedPart(spec, box, feature=TextureFade(spec.name, box, image, terms)))
            else:
                assert box is not None and image is not None
                out.append(PlacedPart(spec, box, image=image))
        return place, out

    def _procedural(self, spec: PartSpec, place: Placement, par: tuple[float, float]) -> Feature:
        c = spec.colors
        if spec.procedural == "eye":
            iris = (c.get("iris_dark", "#1d5f86"), c.get("iris_light", "#6fe0e0"))
            return Eye(place, spec.center, spec.side, spec.size, iris, c.get("lash", "#3c2336"), par)
        if spec.procedural == "brow":
            return Brow(place, spec.center, spec.side, spec.size, c.get("color", "#6e2f52"), par)
        return Mouth(place, spec.center, spec.size, c, par)

    def _raster(self, spec: PartSpec, place: Placement, key: str | None) -> tuple[Box, Tensor]:
        if spec.draw is not None:
            assert spec.rect is not None
            box = place.box_around(*spec.rect)
            x0 = (box[0] - place.ox) / place.scale
            y0 = (box[1] - place.oy) / place.scale
            with torch.no_grad():
                return box, spec.draw(place.scale, x0, y0, box[3], box[2])
        assert key is not None
        img = premultiply(self.images[key])
        h, w = img.shape[1:]
        px, py = place.to_px(*spec.at)
        x1, y1 = place.to_px(spec.at[0] + w, spec.at[1] + h)
        bx, by = round(px), round(py)
        bw, bh = max(1, round(x1) - bx), max(1, round(y1) - by)
        if (bw, bh) != (w, h):
            img = (
                F.interpolate(
                    img.unsqueeze(0), size=(bh, bw), mode="bilinear", antialias=True, align_corners=False
                )
                .squeeze(0)
                .clamp(0.0, 1.0)
            )
        return (bx, by, bw, bh), img.contiguous()


def _union(boxes: list[Box]) -> Box:
    x0 = min(b[0] for b in boxes)
    y0 = min(b[1] for b in boxes)
    x1 = max(b[0] + b[2] for b in boxes)
    y1 = max(b[1] + b[3] for b in boxes)
    return x0, y0, x1 - x0, y1 - y0


def _pad_to(img: Tensor, box: Box, ubox: Box) -> Tensor:
    left, top = box[0] - ubox[0], box[1] - ubox[1]
    right = ubox[0] + ubox[2] - box[0] - box[2]
    bottom = ubox[1] + ubox[3] - box[1] - box[3]
    return F.pad(img, (left, right, top, bottom))


def clip_box(box: Box, width: int, height: int) -> Box | None:
    """The part of a box inside the frame, or None."""
    x0, y0 = max(box[0], 0), max(box[1], 0)
    x1, y1 = min(box[0] + box[2], width), min(box[1] + box[3], height)
    if x1 <= x0 or y1 <= y0:
        return None
    return x0, y0, x1 - x0, y1 - y0
