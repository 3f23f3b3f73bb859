"""The CPU frame path: uint8 all the way, and only what moved is redrawn.

The :class:`~engine.avatar.generator.FrameGenerator` module (the same groups, features and
parameters the GPU backends run) supplies the art; this renderer draws it differently:

* the static frame and each group's canvas (body, head, arm) are converted to uint8 RGBA
  (premultiplied) once;
* a group's feature patch (the face box: eyes, brows, mouth, blush) is recomposed by the module's own
  torch features, in float, only when a parameter it depends on changed, and written into that
  session's uint8 copy of the canvas; inputs that drift slowly by sub-pixel amounts (the gaze: the
  iris travels under 2 px at 720p) are first rounded to a quarter pixel of the feature's motion
  (``Feature.quanta``), so the idle gaze drift redraws the eyes a few times a second, not every frame;
* each frame, the *dirty boxes* are found: for a group whose motion changed, where it was and where it
  is now; for a group that only had a patch redrawn, where that patch lands; nothing else;
* each dirty box is redrawn from the static frame, then every group that reaches into it is warped
  there with OpenCV's fixed-point bilinear ``warpAffine`` (the same sampling as ``grid_sample`` with
  ``align_corners=False`` and zero padding, to 1/32 px) and laid over in uint8.

No full-frame float pass: a frame where the head sways costs the head's and the body's boxes; a frame
where only the mouth moves costs the mouth's box. :attr:`CpuRenderer.damage` tells the caller which
boxes changed, so the conversion to I420 (``engine/avatar/live.py``) touches only those too.

Every batch slot keeps its own canvases and feature cache (sessions share one renderer but not a face).
The pixels differ from the float module's by rounding at each layer (a level or two on antialiased
edges): within the golden images' tolerance (``tests/avatar/test_cpu_render.py``).
"""

from __future__ import annotations

import functools
import itertools
import math
import weakref
from dataclasses import dataclass, field

import cv2
import numpy as np
import torch
from torch import Tensor

from engine.avatar import sdf
from engine.avatar.character import clip_box
from engine.avatar.config import KernelMode
from engine.avatar.features import Box
from engine.avatar.generator import FrameGenerator, to_uint8
from engine.avatar.groups import GroupLayer
from engine.avatar.kernels import FeatureKernels
from engine.avatar.params import INDEX, NUM_PARAMS, default_params
from engine.progress import Progress

Affine = tuple[float, float, float, float, float, float]  # m00, m01, m10, m11, t0, t1: frame = M·canvas + t


@dataclass(frozen=True)
class Damage:
    """What one render changed in one batch slot's frame buffer.

    ``buffer`` names the buffer, ``serial`` counts the frames it has held; ``boxes`` (x, y, w, h) is
    everything that differs from the frame with ``serial - 1`` in the same buffer. A consumer that saw
    that frame updates only ``boxes``; any other consumer redraws everything.
    """

    buffer: int
    serial: int
    boxes: tuple[Box, ...]


def _u8(t: Tensor) -> np.ndarray:
    """Premultiplied float ``[4, h, w]`` → uint8 ``[h, w, 4]`` (round half up, like ``to_uint8``)."""
    return np.ascontiguousarray(to_uint8(t.unsqueeze(0))[0].numpy())


def over(dst: np.ndarray, src: np.ndarray) -> None:
    """Premultiplied source-over in uint8, in place: ``dst = src + dst · (255 − αsrc) / 255``."""
    inv = cv2.bitwise_not(np.ascontiguousarray(src[..., 3]))
    cv2.multiply(dst, cv2.merge((inv, inv, inv, inv)), dst=dst, scale=1.0 / 255.0)
    cv2.add(dst, src, dst=dst)


def union(a: Box, b: Box) -> Box:
    x0, y0 = min(a[0], b[0]), min(a[1], b[1])
    x1, y1 = max(a[0] + a[2], b[0] + b[2]), max(a[1] + a[3], b[1] + b[3])
    return x0, y0, x1 - x0, y1 - y0


def intersect(a: Box, b: Box) -> Box | None:
    x0, y0 = max(a[0], b[0]), max(a[1], b[1])
    x1, y1 = min(a[0] + a[2], b[0] + b[2]), min(a[1] + a[3], b[1] + b[3])
    if x1 <= x0 or y1 <= y0:
        return None
    return x0, y0, x1 - x0, y1 - y0


def subtract(box: Box, hole: Box | None) -> list[Box]:
    """``box`` less ``hole`` (inside it) as up to four boxes: the rows above and below the hole, then the
    columns left and right of it; ``[box]`` without a hole."""
    if hole is None:
        return [box]
    x, y, w, h = box
    hx, hy, hw, hh = hole
    parts = [
        (x, y, w, hy - y),
        (x, hy + hh, w, y + h - hy - hh),
        (x, hy, hx - x, hh),
        (hx + hw, hy, x + w - hx - hw, hh),
    ]
    return [p for p in parts if p[2] > 0 and p[3] > 0]


def merge_boxes(boxes: list[Box]) -> list[Box]:
    """Union overlapping boxes until none overlap (a frame has a handful)."""
    out = list(boxes)
    merged = True
    while merged:
        merged = False
        for i, j in itertools.combinations(range(len(out)), 2):
            if intersect(out[i], out[j]) is not None:
                out[i] = union(out[i], out[j])
                del out[j]
                merged = True
                break
    return out


def mapped_box(m: Affine, box: Box, width: int, height: int) -> Box | None:
    """The frame pixels a canvas box (absolute, pre-warp coordinates) can touch under ``m``."""
    m00, m01, m10, m11, t0, t1 = m
    x0, y0, w, h = box
    corners = ((x0, y0), (x0 + w, y0), (x0, y0 + h), (x0 + w, y0 + h))
    xs = [m00 * cx + m01 * cy + t0 for cx, cy in corners]
    ys = [m10 * cx + m11 * cy + t1 for cx, cy in corners]
    bx, by = math.floor(min(xs)) - 1, math.floor(min(ys)) - 1
    return clip_box((bx, by, math.ceil(max(xs)) + 1 - bx, math.ceil(max(ys)) + 1 - by), width, height)


@dataclass
class _GroupState:
    canvas: np.ndarray  # this slot's uint8 canvas [ch, cw, 4] (shared with the base until a patch is drawn)
    own: bool = False
    patch_keys: list[bytes | None] = field(default_factory=list)
    feats: dict[int, tuple[bytes, Tensor]] = field(default_factory=dict)
    motion: Affine | None = None
    visible: float = -1.0
    reach: Box | None = None


@dataclass
class _Slot:
    frame: np.ndarray  # a view of the batch buffer [H, W, 4]
    groups: list[_GroupState]
    serial: int = 0


class _Group:
    """One group's uint8 art and the geometry the renderer needs, built once from its GroupLayer."""

    def __init__(self, layer: GroupLayer, kernels: KernelMode) -> None:
        self.layer = layer
        self.kind = layer.kind
        self.kernels = FeatureKernels(layer.feats, kernels)
        self.canvas = _u8(layer.canvas[0])
        self.cbox = layer.cbox
        self.feat_inputs = [list(f.inputs) for f in layer.feats]
        self.inputs = [
            sorted({i for item in recipe if isinstance(item, int) for i in layer.feats[item].inputs})
            for _, recipe in layer.patches
        ]

    def affine(self, pc: np.ndarray) -> Affine:
        return self.layer.motion.affine(self.kind, pc)

    def visible(self, pc: np.ndarray) -> float:
        """``GroupLayer.visible`` for one frame: the arm fades in as it rises."""
        if self.kind != "arm":
            return 1.0
        return min(max(float(pc[INDEX["arm_wave"]]) * 3.0, 0.0), 1.0)

    def warp(self, canvas: np.ndarray, m: Affine, to: Box, dst: np.ndarray | None = None) -> np.ndarray:
        """The canvas under ``m`` for the frame pixels ``to`` (uint8 premultiplied ``[h, w, 4]``).

        grid_sample's convention, in continuous coordinates (pixel i's centre at i + 0.5):
        frame = M · canvas + t. cv2's inverse map works on pixel indices:
        src_index = A · dst_index + b with A = M⁻¹ and b = A · (to_origin + ½ − t) − (cbox_origin + ½).
        """
        m00, m01, m10, m11, t0, t1 = m
        det = m00 * m11 - m01 * m10
        a00, a01, a10, a11 = m11 / det, -m01 / det, -m10 / det, m00 / det
        ox, oy = to[0] + 0.5 - t0, to[1] + 0.5 - t1
        b0 = a00 * ox + a01 * oy - (self.cbox[0] + 0.5)
        b1 = a10 * ox + a11 * oy - (self.cbox[1] + 0.5)
        inv = np.array([[a00, a01, b0], [a10, a11, b1]], dtype=np.float64)
        return cv2.warpAffine(
            canvas,
            inv,
            (to[2], to[3]),
            dst=dst,
            flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
            borderMode=cv2.BORDER_CONSTANT,
            borderValue=(0, 0, 0, 0),
        )


QUANTUM_PX = 0.25  # a feature input's change that moves its feature less than this is not drawn


def _input_quanta(groups: list[_Group]) -> tuple[np.ndarray, np.ndarray]:
    """Per parameter, the finest step any feature asks for (``Feature.quanta``), and the parameters that
    have one."""
    steps = np.zeros(NUM_PARAMS, dtype=np.float32)
    for g in groups:
        for feat in g.layer.feats:
            for i, step in feat.quanta(QUANTUM_PX).items():
                steps[i] = step if steps[i] == 0 else min(steps[i], step)
    return steps, np.flatnonzero(steps > 0)


class CpuRenderer:
    """Renders params ``[B, P]`` into uint8 premultiplied RGBA frames ``[B, H, W, 4]``, redrawing only the
    boxes that changed since each buffer's previous frame (see :attr:`damage`)."""

    def __init__(self, generator: FrameGenerator, threads: int = 1, kernels: KernelMode = "off") -> None:
        cv2.setNumThreads(threads)  # process-wide (1 unless asked: engine/native.py, OpenCV)
        self.generator = generator
        self.width, self.height = generator.width, generator.height
        self.static = _u8(generator.static[0])
        # summed-area table of "static art here": a box of it empty is drawn into directly, not laid over
        self._static_sat = cv2.integral((self.static[..., 3] > 0).astype(np.uint8))
        self.groups = [_Group(layer, kernels) for layer in generator.groups]
        self._quanta, self._quantized = _input_quanta(self.groups)
        self._buffers: dict[int, np.ndarray] = {}
        self._slots: dict[int, list[_Slot]] = {}
        self._ids = itertools.count()
        self._buffer_ids: dict[tuple[int, int], int] = {}
        # a slot of its own for each caller's key (a session): see render_keyed
        self._keyed: weakref.WeakKeyDictionary[object, tuple[_Slot, int]] = weakref.WeakKeyDictionary()
        self.damage: list[Damage] = []

    def compile_features(self, progress: Progress | None = None) -> int:
        """Compile the features' kernels (``kernels`` "auto" or "on": engine/avatar/kernels.py); blocking,
        seconds. How many feature groups run compiled."""
        with torch.inference_mode():  # the renderer calls them on inference tensors: the same guards
            example = torch.from_numpy(default_params()).view(1, NUM_PARAMS)
            for g in self.groups:
                g.kernels.build(example, progress)
        return sum(g.kernels.compiled for g in self.groups)

    def _slots_for(self, batch: int) -> list[_Slot]:
        if batch not in self._slots:
            frames = np.repeat(self.static[None], batch, axis=0)
            self._buffers[batch] = frames
            self._slots[batch] = [
                _Slot(
                    frames[i], [_GroupState(g.canvas, patch_keys=[None] * len(g.inputs)) for g in self.groups]
                )
                for i in range(batch)
            ]
            for i in range(batch):
                self._buffer_ids[(batch, i)] = next(self._ids)
        return self._slots[batch]

    def _slot_for_key(self, key: object) -> tuple[_Slot, int]:
        slot = self._keyed.get(key)
        if slot is None:
            frame = self.static.copy()
            slot = self._keyed[key] = (
                _Slot(frame, [_GroupState(g.canvas, patch_keys=[None] * len(g.inputs)) for g in self.groups]),
                next(self._ids),
            )
        return slot

    def render(self, params: np.ndarray) -> np.ndarray:
        params = np.ascontiguousarray(params, dtype=np.float32).reshape(-1, NUM_PARAMS)
        b = params.shape[0]
        slots = self._slots_for(b)
        self._render_slots(params, [(slot, self._buffer_ids[(b, i)]) for i, slot in enumerate(slots)])
        return self._buffers[b]

    def render_keyed(self, params: np.ndarray, keys: list[object]) -> list[np.ndarray]:
        """Row ``i`` into the slot of ``keys[i]`` (weakly held: a session's own, whatever batch it comes in
        and at whichever row), so that each frame redraws only what moved since that key's previous frame.
        :meth:`render` keeps a slot per batch size and row, which a session only stays in while it is
        always rendered alone or at the same row."""
        params = np.ascontiguousarray(params, dtype=np.float32).reshape(-1, NUM_PARAMS)
        if len(keys) != params.shape[0]:
            raise ValueError(f"{params.shape[0]} rows and {len(keys)} keys")
        slots = [self._slot_for_key(k) for k in keys]
        self._render_slots(params, slots)
        return [slot.frame for slot, _ in slots]

    @torch.inference_mode()
    def _render_slots(self, params: np.ndarray, slots: list[tuple[_Slot, int]]) -> None:
        damage = []
        # The features' tensors are a few thousand elements: torch's OpenMP threads cost more than they
        # give (some ops, sqrt among them, go parallel above 2,048 elements, and on 2 busy cores each
        # parallel region waits for a descheduled thread: 11 ms a call measured). One thread while
        # rendering, the caller's setting back afterwards.
        threads = torch.get_num_threads()
        if threads != 1:
            torch.set_num_threads(1)
        try:
            for i, (slot, buffer) in enumerate(slots):
                boxes = self._render_slot(slot, params[i])
                slot.serial += 1
                damage.append(Damage(buffer, slot.serial, tuple(boxes)))
        finally:
            if threads != 1:
                torch.set_num_threads(threads)
        self.damage = damage

    def feature_params(self, pc: np.ndarray) -> np.ndarray:
        """What the features are drawn from: ``pc`` with the inputs that have a quantum (``Feature.quanta``)
        rounded to it (a quarter pixel of the feature's motion); the groups' motion stays exact."""
        q = self._quantized
        out = np.array(pc, dtype=np.float32, copy=True)
        out[..., q] = np.round(out[..., q] / self._quanta[q]) * self._quanta[q]
        return out

    def _render_slot(self, slot: _Slot, pc: np.ndarray) -> list[Box]:
        pq = self.feature_params(pc)
        p = torch.from_numpy(pq).view(1, NUM_PARAMS)
        W, H = self.width, self.height
        dirty: list[Box] = []
        for g, st in zip(self.groups, slot.groups, strict=True):
            redrawn = self._update_canvas(g, st, p, pq)
            m = g.affine(pc)
            vis = g.visible(pc)
            reach = mapped_box(m, g.cbox, W, H) if vis > 0.0 else None
            if st.motion is None or st.motion != m or st.visible != vis:
                dirty += [r for r in (reach, st.reach) if r is not None]
            elif reach is not None:
                for box in redrawn:
                    hit = mapped_box(m, box, W, H)
                    if hit is not None:
                        dirty.append(hit)
            st.motion, st.visible, st.reach = m, vis, reach
        boxes = merge_boxes(dirty)
        for box in boxes:
            self._redraw(slot, box)
        return boxes

    def _update_canvas(self, g: _Group, st: _GroupState, p: Tensor, pc: np.ndarray) -> list[Box]:
        """Redraw, in the slot's canvas, the features whose inputs changed (only their own boxes, with the
        static art and the other features around them recomposed there); their absolute boxes."""
        layer = g.layer
        redrawn: list[Box] = []
        stale = self._draw_stale_features(g, st, p, pc)
        for n, (mbox, recipe) in enumerate(layer.patches):
            key = pc[g.inputs[n]].tobytes()
            if key == st.patch_keys[n]:
                continue
            boxes = [layer.feats[item].box for item in recipe if isinstance(item, int) and item in stale]
            rects = [mbox] if st.patch_keys[n] is None else merge_boxes(boxes)
            if not st.own:
                st.canvas, st.own = st.canvas.copy(), True
            for rect in rects:
                acc = self._compose(g, st, p, pc, recipe, mbox, rect)
                x, y = rect[0] - g.cbox[0], rect[1] - g.cbox[1]
                st.canvas[y : y + rect[3], x : x + rect[2]] = _u8(acc[0])
                redrawn.append(rect)
            st.patch_keys[n] = key
        return redrawn

    @staticmethod
    def _draw_stale_features(g: _Group, st: _GroupState, p: Tensor, pc: np.ndarray) -> list[int]:
        """The features of changed patches whose inputs changed (their indices). Two or more are drawn here,
        into the slot's feature cache, twins (the two eyes) in one batched call (``FeatureKernels.draw``), where
        ``_compose`` finds them; a single one ``_compose`` draws as it goes."""
        layer = g.layer
        stale: list[int] = []
        for n, (_, recipe) in enumerate(layer.patches):
            if pc[g.inputs[n]].tobytes() == st.patch_keys[n]:
                continue
            for item in recipe:
                if isinstance(item, int) and item not in stale:
                    hit = st.feats.get(item)
                    if hit is None or hit[0] != pc[g.feat_inputs[item]].tobytes():
                        stale.append(item)
        if len(stale) >= 2:
            for item, out in zip(stale, g.kernels.draw(stale, p), strict=True):
                st.feats[item] = (pc[g.feat_inputs[item]].tobytes(), out)
        return stale

    @staticmethod
    def _compose(
        g: _Group, st: _GroupState, p: Tensor, pc: np.ndarray, recipe: list[str | int], mbox: Box, rect: Box
    ) -> Tensor:
        """The merged patch ``mbox`` (its recipe of static runs and features, back to front) inside ``rect``:
        ``GroupLayer._compose`` cut to one rectangle. Features outside it are neither drawn nor run."""
        layer = g.layer
        rx, ry, rw, rh = rect
        acc = torch.zeros(1, 4, rh, rw)
        for item in recipe:
            if isinstance(item, str):
                buf: Tensor = getattr(layer, item)
                y0, x0 = ry - mbox[1], rx - mbox[0]
                acc = sdf.over(buf[:, :, y0 : y0 + rh, x0 : x0 + rw], acc)
                continue
            feat = layer.feats[item]
            hit = intersect(feat.box, rect)
            if hit is None:
                continue
            k = pc[g.feat_inputs[item]].tobytes()
            cached = st.feats.get(item)
            if cached is None or cached[0] != k:
                cached = (k, g.kernels.draw([item], p)[0])
                st.feats[item] = cached
            hx, hy, hw, hh = hit
            fx, fy = hx - feat.box[0], hy - feat.box[1]
            ax, ay = hx - rx, hy - ry
            below = acc[:, :, ay : ay + hh, ax : ax + hw]
            acc[:, :, ay : ay + hh, ax : ax + hw] = sdf.over(
                cached[1][:, :, fy : fy + hh, fx : fx + hw], below
            )
        return acc

    def _static_empty(self, box: Box) -> bool:
        x, y, w, h = box
        sat = self._static_sat
        return int(sat[y + h, x + w] - sat[y, x + w] - sat[y + h, x] + sat[y, x]) == 0

    def _redraw(self, slot: _Slot, box: Box) -> None:
        x, y, w, h = box
        tile = slot.frame[y : y + h, x : x + w]
        tile[:] = self.static[y : y + h, x : x + w]
        drawn: list[Box] = []  # what groups cover in this tile so far
        for g, st in zip(self.groups, slot.groups, strict=True):
            if st.reach is None or st.motion is None:
                continue
            sub = intersect(st.reach, box)
            if sub is None:
                continue
            if st.visible >= 1.0:
                # where no group is drawn yet and the static art is empty, nothing is under it: warp straight
                # into the frame; lay it over only where something is (the head over the body: its neck)
                under = [hit for d in drawn if (hit := intersect(d, sub)) is not None]
                core = functools.reduce(union, under) if under else None
                for part in ([core] if core is not None else []) + subtract(sub, core):
                    dst = tile[part[1] - y : part[1] - y + part[3], part[0] - x : part[0] - x + part[2]]
                    if part is not core and self._static_empty(part):
                        g.warp(st.canvas, st.motion, part, dst)
                    else:
                        over(dst, g.warp(st.canvas, st.motion, part))
            else:  # fading in (the arm): laid over at its opacity
                dst = tile[sub[1] - y : sub[1] - y + sub[3], sub[0] - x : sub[0] - x + sub[2]]
                over(dst, cv2.convertScaleAbs(g.warp(st.canvas, st.motion, sub), alpha=st.visible))
            drawn.append(sub)


__all__ = ["CpuRenderer", "Damage", "intersect", "merge_boxes", "over", "subtract", "union"]
