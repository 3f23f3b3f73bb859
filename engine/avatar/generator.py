"""The frame generator: a batched ``torch.nn.Module`` from parameters ``[B, P]`` to RGBA ``[B, 4, H, W]``.

Output is **premultiplied alpha**, float32 in 0..1 (colour already multiplied by
alpha; a transparent pixel is all zeros). Backends turn it into uint8 HWC with
:func:`to_uint8` (``floor(x * 255 + 0.5)``), still premultiplied.

How a frame is made (and why it is cheap):

* Static parts are composited once per profile into ``static`` (the full frame).
* Each moving group (body, head, arm) has a fixed destination box covering its
  whole range of motion; their union is the *region*. Everything outside the
  region never changes.
* Per frame: the region starts from the static frame, each group's canvas gets
  its dynamic features redrawn in their small boxes, is warped with one
  ``grid_sample`` into its box, and is laid over the region.
* :meth:`forward` pastes the region into the static frame (Slice + Concat when
  exported, so the ONNX graph has no ScatterND). :meth:`render_into` writes only
  the region into a caller's uint8 frame, skipping groups that are invisible in
  that frame (the lowered arm); pixels are identical to ``forward``.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor, nn

from engine.avatar import sdf
from engine.avatar.character import Character, clip_box
from engine.avatar.features import Box
from engine.avatar.groups import GroupLayer, Motion, exporting, owned, paste
from engine.avatar.loaders import load_character
from engine.avatar.params import DEFAULTS, INDEX, NUM_PARAMS
from engine.avatar.profiles import profile_size
from engine.avatar.rig import GROUPS


class FrameGenerator(nn.Module):
    """params ``[B, NUM_PARAMS]`` float32 → premultiplied RGBA ``[B, 4, H, W]`` float32."""

    static: Tensor
    underlay: Tensor

    def __init__(self, character: Character, profile: str | tuple[int, int] = "720p") -> None:
        super().__init__()
        self.width, self.height = profile_size(profile)
        W, H = self.width, self.height
        place, placed = character.place(W, H)
        rig = character.rig
        by_group = {g: [pp for pp in placed if pp.spec.group == g] for g in GROUPS}
        pivots: dict[str, tuple[float, float]] = {}
        body_top = min((pp.box[1] for pp in by_group["body"]), default=0)
        for g in ("body", "head", "arm"):
            spec = rig.groups[g]
            if spec.pivot is not None:
                pivots[g] = spec.pivot
            else:  # bottom centre of the group's art, in design units
                boxes = [pp.box for pp in by_group[g]] or [(0, 0, W, H)]
                x0 = min(b[0] for b in boxes)
                x1 = max(b[0] + b[2] for b in boxes)
                y1 = max(b[1] + b[3] for b in boxes)
                pivots[g] = ((0.5 * (x0 + x1) - place.ox) / place.scale, (y1 - place.oy) / place.scale)
        motion = Motion(place, pivots, {g: rig.groups[g].amp for g in GROUPS}, float(body_top))
        static = torch.zeros(4, H, W)
        for pp in by_group["static"]:
            if pp.feature is not None:
                raise ValueError(
                    f"{rig.source}: part {pp.spec.name!r}: the static group cannot hold moving parts"
                )
            vis = clip_box(pp.box, W, H)
            if vis is None:
                continue
            x, y, w, h = vis
            src = pp.image[:, y - pp.box[1] : y - pp.box[1] + h, x - pp.box[0] : x - pp.box[0] + w]  # type: ignore[index]
            static[:, y : y + h, x : x + w] = sdf.over(src, static[:, y : y + h, x : x + w])
        self.groups: list[GroupLayer] = [
            GroupLayer(g, by_group[g], motion, W, H) for g in ("body", "head", "arm") if by_group[g]
        ]
        self.layers = nn.ModuleList(self.groups)
        if self.groups:
            boxes = [layer.dbox for layer in self.groups]
            x0, y0 = min(b[0] for b in boxes), min(b[1] for b in boxes)
            x1, y1 = max(b[0] + b[2] for b in boxes), max(b[1] + b[3] for b in boxes)
            self.region = (x0, y0, x1 - x0, y1 - y0)
        else:
            self.region = (0, 0, 1, 1)
        rx, ry, rw, rh = self.region
        self.register_buffer("static", static.unsqueeze(0).contiguous(), persistent=False)
        self.register_buffer(
            "underlay", static[:, ry : ry + rh, rx : rx + rw].unsqueeze(0).contiguous(), persistent=False
        )
        self.name = rig.name
        self._arm_dirty: set[int] = set()  # frame buffers whose arm box still shows a raised arm

    @classmethod
    def builtin(cls, profile: str | tuple[int, int] = "720p") -> FrameGenerator:
        return cls(load_character("builtin:default"), profile)

    def render_region(self, p: Tensor, fast: bool = False, rect: Box | None = None) -> Tensor:
        """The changing region ``[B, 4, rh, rw]`` (or its sub-rectangle ``rect``, region-relative).

        ``fast`` (eager CPU path) skips groups invisible in every frame of the batch and warps each group
        only where its canvas can land for these params; the pixels are the same.
        """
        rx, ry = self.region[0], self.region[1]
        ox, oy = (rect[0], rect[1]) if rect is not None else (0, 0)
        base = self.underlay
        if rect is not None:
            base = base[:, :, oy : oy + rect[3], ox : ox + rect[2]]
        region = owned(base, p.shape[0])  # NCHW like the layers' output: compositing stays one straight pass
        for layer in self.groups:
            sub: Box | None = None
            if fast:
                if layer.kind == "arm" and not bool((layer.visible(p) > 0).any()):
                    continue
                sub = layer.reach_now(p)
                if sub is None:
                    continue
            x, y, w, h = layer.dbox
            x, y = x - rx - ox, y - ry - oy
            if sub is not None:
                x, y, w, h = x + sub[0], y + sub[1], sub[2], sub[3]
            if rect is not None:  # the fast path keeps every drawn group inside rect (see render_into)
                assert x >= 0 and y >= 0 and x + w <= rect[2] and y + h <= rect[3]
            below = region[:, :, y : y + h, x : x + w]
            top = layer(p, sub, memo=fast)
            if exporting():
                region = paste(region, sdf.over(top, below), x, y)
            else:  # source-over in place: below = top + below * (1 - alpha)
                below.mul_(1.0 - top[:, 3:4]).add_(top)
        return region

    def forward(self, params: Tensor) -> Tensor:
        region = self.render_region(params)
        return paste(owned(self.static, params.shape[0]), region, self.region[0], self.region[1])

    # ------------------------------------------------------------------ CPU fast path

    def new_frames(self, batch: int = 1) -> np.ndarray:
        """uint8 ``[batch, H, W, 4]`` frames holding the static art: the buffers :meth:`render_into` fills."""
        static = to_uint8(self.static)[0].cpu().numpy()
        return np.repeat(static[None], batch, axis=0)

    @torch.inference_mode()
    def render_into(self, frames: np.ndarray, params: np.ndarray) -> np.ndarray:
        """Render ``params [B, P]`` into ``frames`` (uint8 ``[B, H, W, 4]`` from :meth:`new_frames` or an
        earlier call): only what can change is written. Returns ``frames``."""
        p = torch.from_numpy(np.ascontiguousarray(params, dtype=np.float32)).reshape(-1, NUM_PARAMS)
        p = p.to(self.static.device)
        rx, ry, rw, rh = self.region
        rect: Box = (0, 0, rw, rh)
        arm = [lay for lay in self.groups if lay.kind == "arm"]
        key = frames.__array_interface__["data"][0]
        if arm and not bool((arm[0].visible(p) > 0).any()) and key not in self._arm_dirty:
            boxes = [lay.dbox for lay in self.groups if lay.kind != "arm"]
            if boxes:
                x0, y0 = min(b[0] for b in boxes), min(b[1] for b in boxes)
                x1, y1 = max(b[0] + b[2] for b in boxes), max(b[1] + b[3] for b in boxes)
                rect = (x0 - rx, y0 - ry, x1 - x0, y1 - y0)
        elif arm:
            # The arm is (or was, in this buffer) up: repaint its box until it has been cleared once.
            if bool((arm[0].visible(p) > 0).any()):
                self._arm_dirty.add(key)
            else:
                self._arm_dirty.discard(key)
        region = self.render_region(p, fast=True, rect=rect)
        x, y = rx + rect[0], ry + rect[1]
        dst = torch.from_numpy(frames)[:, y : y + rect[3], x : x + rect[2], :]
        # scaled in place while contiguous, then one strided copy into the HWC uint8 frame (truncating: +0.5
        # rounds half up, as to_uint8)
        dst.copy_(region.mul_(255.0).add_(0.5).permute(0, 2, 3, 1))
        return frames


def to_uint8(frames: Tensor) -> Tensor:
    """Premultiplied float ``[B, 4, H, W]`` → uint8 ``[B, H, W, 4]`` (round half up)."""
    return frames.permute(0, 2, 3, 1).mul(255.0).add(0.5).clamp(0.0, 255.0).to(torch.uint8)


def rest_params(batch: int = 1, **overrides: float) -> np.ndarray:
    """The rest pose ``[batch, P]`` with named parameters overridden (e.g. ``expr_happy=1``)."""
    p = np.repeat(DEFAULTS[None], batch, axis=0).copy()
    for k, v in overrides.items():
        p[:, INDEX[k]] = v
    return p
