"""The sent picture: premultiplied RGBA frames → the I420 (yuv420p) buffer the video encoders take.

aiortc's VP8 and H.264 encoders take ``yuv420p`` frames as they are (anything else they convert
themselves, in each encoder's thread). A :class:`Compositor` keeps one I420 buffer per output and, per
frame, converts only the boxes that changed (the renderer's :class:`~engine.avatar.cpu_render.Damage`),
with OpenCV's BT.601 limited-range conversion (the same levels as FFmpeg's swscale, within 1 LSB).
The result is converted once per frame and shared by every consumer of the track (the host's peer, WHEP
viewers, RTMP: each tap (``engine/transport/taps.py``) copies the I420 frame, never converts it again).

Two pictures:

* plain: the idol over ``avatar.background`` (premultiplied RGBA over a colour; fully transparent
  black by default, which is simply the premultiplied colour);
* packed alpha: colour | alpha side by side (twice as wide), the alpha as grey levels, for viewers that
  recombine them (the OBS page's WebGL shader, ``web/shared/packed.js``).
"""

from __future__ import annotations

import cv2
import numpy as np

from engine.avatar.cpu_render import Damage

Region = tuple[int, int, int, int]


def parse_rgba(hex_colour: str) -> tuple[int, int, int, int]:
    h = hex_colour.lstrip("#")
    if len(h) not in (6, 8) or any(c not in "0123456789abcdefABCDEF" for c in h):
        raise ValueError(f"colour {hex_colour!r}: expected #RRGGBB or #RRGGBBAA")
    vals = [int(h[i : i + 2], 16) for i in range(0, len(h), 2)]
    return (vals[0], vals[1], vals[2], vals[3] if len(vals) == 4 else 255)


def _grey_to_luma() -> np.ndarray:
    """Y of the grey level (a, a, a) for each a, as the RGB → I420 conversion gives it."""
    grey = np.repeat(np.repeat(np.arange(256, dtype=np.uint8), 2)[None, :, None], 3, axis=2)  # [1, 512, 3]
    y = cv2.cvtColor(np.ascontiguousarray(np.repeat(grey, 2, axis=0)), cv2.COLOR_RGB2YUV_I420)
    return np.ascontiguousarray(y[0, ::2])


_LUMA_OF_GREY = _grey_to_luma()


def even_box(box: Region, width: int, height: int) -> Region | None:
    """``box`` grown to even edges (4:2:0 chroma covers 2×2 pixels) and clipped to the frame."""
    x0, y0 = max(box[0], 0) & ~1, max(box[1], 0) & ~1
    x1 = min((box[0] + box[2] + 1) & ~1, width)
    y1 = min((box[1] + box[3] + 1) & ~1, height)
    if x1 <= x0 or y1 <= y0:
        return None
    return x0, y0, x1 - x0, y1 - y0


class Compositor:
    """RGBA frames of one size → one I420 picture (plain over the background, or packed colour|alpha),
    converting only what changed since the frame it saw last."""

    def __init__(self, width: int, height: int, packed_alpha: bool, background: str) -> None:
        if width % 2 or height % 2:
            raise ValueError(f"output size {width}x{height}: I420 needs even dimensions")
        self.width, self.height, self.packed = width, height, packed_alpha
        r, g, b, a = parse_rgba(background)
        self.bg = (r * a // 255, g * a // 255, b * a // 255)  # premultiplied
        out_w = width * 2 if packed_alpha else width
        self.out_width = out_w
        self.i420 = np.empty((height * 3 // 2, out_w), np.uint8)
        flat = self.i420.reshape(-1)
        n, c = height * out_w, (height // 2) * (out_w // 2)
        self.y = flat[:n].reshape(height, out_w)
        self.u = flat[n : n + c].reshape(height // 2, out_w // 2)
        self.v = flat[n + c : n + 2 * c].reshape(height // 2, out_w // 2)
        if packed_alpha:  # the alpha half is grey: neutral chroma, set once
            self.u[:, width // 2 :] = 128
            self.v[:, width // 2 :] = 128
        self._seen: tuple[int, int] | None = None
        self._full = True
        self.converted_px = 0  # pixels converted so far (what the damage saved shows here)

    def compose(self, rgba: np.ndarray, region: Region, damage: Damage | None = None) -> np.ndarray:
        """Update the I420 buffer from ``rgba`` (uint8 ``[H, W, 4]`` premultiplied) and return it.

        ``region`` bounds everything that can ever differ from the static art; ``damage``, when it follows
        the frame this compositor saw last, bounds what changed since.
        """
        boxes: tuple[Region, ...]
        if self._full:
            boxes = ((0, 0, self.width, self.height),)
            self._full = False
        elif damage is not None and self._seen == (damage.buffer, damage.serial - 1):
            boxes = damage.boxes
        else:
            boxes = (region,)
        self._seen = (damage.buffer, damage.serial) if damage is not None else None
        for box in boxes:
            even = even_box(box, self.width, self.height)
            if even is not None:
                self._convert(rgba, even)
        return self.i420

    def _convert(self, rgba: np.ndarray, box: Region) -> None:
        x, y, w, h = box
        src = rgba[y : y + h, x : x + w]
        if self.packed or self.bg == (0, 0, 0):
            tile = cv2.cvtColor(src, cv2.COLOR_RGBA2YUV_I420)  # over black: the premultiplied colour itself
        else:
            inv = cv2.bitwise_not(np.ascontiguousarray(src[..., 3]))
            bg = np.empty((h, w, 3), np.uint8)
            bg[:] = self.bg
            under = cv2.multiply(cv2.merge((inv, inv, inv)), bg, scale=1.0 / 255.0)
            tile = cv2.cvtColor(cv2.add(cv2.cvtColor(src, cv2.COLOR_RGBA2RGB), under), cv2.COLOR_RGB2YUV_I420)
        flat = tile.reshape(-1)
        n, c = h * w, (h // 2) * (w // 2)
        self.y[y : y + h, x : x + w] = flat[:n].reshape(h, w)
        self.u[y // 2 : (y + h) // 2, x // 2 : (x + w) // 2] = flat[n : n + c].reshape(h // 2, w // 2)
        self.v[y // 2 : (y + h) // 2, x // 2 : (x + w) // 2] = flat[n + c : n + 2 * c].reshape(h // 2, w // 2)
        if self.packed:
            alpha = np.ascontiguousarray(src[..., 3])
            self.y[y : y + h, self.width + x : self.width + x + w] = cv2.LUT(alpha, _LUMA_OF_GREY).reshape(
                h, w
            )
        self.converted_px += w * h


__all__ = ["Compositor", "even_box", "parse_rgba"]
