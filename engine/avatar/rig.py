"""The rig: which parts a character has, where, and which parameters move them.

A rig is data (a YAML/JSON file, or a dict for the built-in character). The
format is documented in ``docs/character-format.md``; :func:`parse_rig` checks
it and raises :class:`RigError` naming the file, the part and the key.

Groups are the moving units, stacked back to front in :data:`GROUPS` order:

* ``static`` never moves (composited once per output profile);
* ``body`` breathes (scales up from its pivot row) and sways (shears about it);
* ``head`` rides on the body: roll about its pivot, yaw/pitch as shifts, with
  face features optionally shifted further for a 2.5D parallax (``parallax_x/_y``,
  off by default: it makes every feature redraw whenever the head turns);
* ``arm`` rides on the body: rotates about its pivot (the elbow) when waving.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from engine.avatar.features import Driver

GROUPS: tuple[str, ...] = ("static", "body", "head", "arm")
PROCEDURAL: tuple[str, ...] = ("eye", "brow", "mouth")
FORMAT = "idolcast-rig/1"
MAX_CANVAS = 8192

# Default motion amplitudes per group (design px / degrees / fractions).
GROUP_DEFAULTS: dict[str, dict[str, float]] = {
    "static": {},
    "body": {"sway": 10.0, "breath": 0.012},
    "head": {"roll_deg": 12.0, "yaw": 18.0, "pitch": 12.0, "parallax_x": 0.0, "parallax_y": 0.0},
    "arm": {"down_deg": 115.0, "up_deg": 10.0, "swing_deg": 20.0},
}


class RigError(ValueError):
    """A rig or its art was refused; the message names the file, the part and what was wrong."""


Rect = tuple[float, float, float, float]  # x0, y0, x1, y1 in design px


@dataclass
class PartSpec:
    """One drawable part. Exactly one of image / draw / variants / procedural gives its pixels."""

    name: str
    group: str
    image: str | None = None  # file (relative to the rig) or PSD layer key; the base image
    at: tuple[float, float] = (0.0, 0.0)  # top-left of the image, design px
    variants: dict[str, str] = field(default_factory=dict)  # driver -> image, blended by weight
    opacity: dict[str, float] = field(default_factory=dict)  # driver -> factor; alpha = clamp(Σ)
    procedural: str | None = None  # eye | brow | mouth
    side: int = 0  # -1 screen-left, +1 screen-right (eyes and brows)
    center: tuple[float, float] = (0.0, 0.0)
    size: float = 1.0
    colors: dict[str, str] = field(default_factory=dict)
    draw: Callable[[float, float, float, int, int], Tensor] | None = None  # code-drawn art
    rect: Rect | None = None  # design rectangle a ``draw`` part covers

    @property
    def dynamic(self) -> bool:
        return bool(self.variants or self.opacity or self.procedural)


@dataclass
class GroupSpec:
    name: str
    pivot: tuple[float, float] | None = None  # design px; None = derived from the parts' extent
    amp: dict[str, float] = field(default_factory=dict)


@dataclass
class Rig:
    name: str
    canvas: tuple[int, int]
    parts: list[PartSpec]
    groups: dict[str, GroupSpec]
    source: str = "<memory>"


def _pair(v: Any, where: str) -> tuple[float, float]:
    if not (isinstance(v, list | tuple) and len(v) == 2 and all(isinstance(c, int | float) for c in v)):
        raise RigError(f"{where}: expected [x, y] numbers, got {v!r}")
    return float(v[0]), float(v[1])


def _check_driver(text: str, where: str) -> None:
    try:
        Driver.parse(text)
    except KeyError as e:
        raise RigError(f"{where}: unknown parameter {e.args[0]!r} (see engine/avatar/params.py)") from None


def parse_rig(data: Mapping[str, Any], source: str = "<memory>") -> Rig:
    """Validate a rig mapping (from YAML/JSON or code)."""
    if not isinstance(data, Mapping):
        raise RigError(f"{source}: the rig must be a mapping")
    fmt = data.get("format", FORMAT)
    if fmt != FORMAT:
        raise RigError(f"{source}: format {fmt!r} is not {FORMAT!r}")
    canvas = data.get("canvas")
    if not (
        isinstance(canvas, list | tuple) and len(canvas) == 2 and all(isinstance(c, int) for c in canvas)
    ):
        raise RigError(f"{source}: 'canvas' must be [width, height] in pixels")
    cw, ch = int(canvas[0]), int(canvas[1])
    if not (16 <= cw <= MAX_CANVAS and 16 <= ch <= MAX_CANVAS):
        raise RigError(f"{source}: canvas {cw}x{ch} is outside 16..{MAX_CANVAS} px")
    groups: dict[str, GroupSpec] = {g: GroupSpec(g, None, dict(GROUP_DEFAULTS[g])) for g in GROUPS}
    for gname, gdata in (data.get("groups") or {}).items():
        where = f"{source}: groups.{gname}"
        if gname not in GROUPS:
            raise RigError(f"{where}: unknown group (expected one of {', '.join(GROUPS)})")
        if not isinstance(gdata, Mapping):
            raise RigError(f"{where}: expected a mapping")
        for k, v in gdata.items():
            if k == "pivot":
                groups[gname].pivot = _pair(v, f"{where}.pivot")
            elif k in GROUP_DEFAULTS[gname] and isinstance(v, int | float):
                groups[gname].amp[k] = float(v)
            else:
                raise RigError(f"{where}.{k}: unknown key or not a number")
    raw_parts = data.get("parts")
    if not isinstance(raw_parts, list) or not raw_parts:
        raise RigError(f"{source}: 'parts' must be a non-empty list")
    parts: list[PartSpec] = []
    seen: set[str] = set()
    for i, raw in enumerate(raw_parts):
        if isinstance(raw, PartSpec):
            parts.append(raw)
            continue
        if not isinstance(raw, Mapping) or not isinstance(raw.get("name"), str):
            raise RigError(f"{source}: parts[{i}] needs a 'name'")
        name = raw["name"]
        where = f"{source}: part {name!r}"
        if name in seen:
            raise RigError(f"{where}: duplicate part name")
        seen.add(name)
        group = raw.get("group", "static")
        if group not in GROUPS:
            raise RigError(f"{where}: group {group!r} is not one of {', '.join(GROUPS)}")
        spec = PartSpec(name=name, group=group)
        if "image" in raw:
            if not isinstance(raw["image"], str):
                raise RigError(f"{where}: 'image' must be a file name")
            spec.image = raw["image"]
        if "at" in raw:
            spec.at = _pair(raw["at"], f"{where}.at")
        for drv, img in (raw.get("variants") or {}).items():
            _check_driver(drv, f"{where}.variants")
            if not isinstance(img, str):
                raise RigError(f"{where}.variants.{drv}: expected an image file name")
            spec.variants[drv] = img
        for drv, k in (raw.get("opacity") or {}).items():
            _check_driver(drv, f"{where}.opacity")
            if not isinstance(k, int | float):
                raise RigError(f"{where}.opacity.{drv}: expected a number")
            spec.opacity[drv] = float(k)
        proc = raw.get("procedural")
        if proc is not None:
            if proc not in PROCEDURAL:
                raise RigError(f"{where}: procedural {proc!r} is not one of {', '.join(PROCEDURAL)}")
            spec.procedural = proc
            spec.center = _pair(raw.get("center"), f"{where}.center")
            side = raw.get("side", "left" if proc != "mouth" else "center")
            if proc != "mouth" and side not in ("left", "right"):
                raise RigError(f"{where}: side must be 'left' or 'right' (as the viewer sees it)")
            spec.side = {"left": -1, "right": 1}.get(side, 0)
            size = raw.get("size", 1.0)
            if not isinstance(size, int | float) or not 0.05 <= size <= 20:
                raise RigError(f"{where}: size must be a number in 0.05..20")
            spec.size = float(size)
            spec.colors = {str(k): str(v) for k, v in (raw.get("colors") or {}).items()}
        elif spec.image is None and not spec.variants:
            raise RigError(f"{where}: needs 'image', 'variants' or 'procedural'")
        if spec.opacity and (spec.variants or spec.procedural or spec.image is None):
            raise RigError(f"{where}: 'opacity' applies to a single 'image' only")
        parts.append(spec)
    return Rig(str(data.get("name", "character")), (cw, ch), parts, groups, source)
