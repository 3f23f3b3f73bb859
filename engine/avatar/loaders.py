"""Loading a streamer's own character: a folder of PNGs + rig file, or a layered PSD.

Images are opened defensively: Pillow's decompression-bomb limit is lowered to
:data:`MAX_PIXELS` (and turned into an error, not a warning), each image must be
a readable PNG no larger than :data:`MAX_SIDE` on a side, and every refusal is a
:class:`~engine.avatar.rig.RigError` naming the file and the part.

PSD layer naming (see docs/character-format.md): a leaf layer named
``<group>.<part>`` is a part's image; ``<group>.<part>@<driver>`` a variant
blended by a parameter (``head.mouth@viseme_aa``, ``head.eye_l@1-eye_open_l``);
``<group>.<part>~<driver>`` an image whose opacity follows a parameter
(``head.blush~blush``). The group may also come from an enclosing layer group
named after it (``head`` › ``mouth@viseme_aa``). Layers whose names start with
``#`` are ignored; other names are refused.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from engine.avatar.character import Character
from engine.avatar.rig import GROUPS, RigError, parse_rig

MAX_SIDE = 8192
MAX_PIXELS = 40_000_000  # per image; Pillow refuses anything larger before decoding
MAX_FILE_BYTES = 256 * 1024 * 1024


def _open_image(path: Path, part: str) -> np.ndarray:
    """A PNG as straight-alpha uint8 ``[h, w, 4]``, or RigError naming the file and part."""
    where = f"{path} (part {part!r})"
    if not path.is_file():
        raise RigError(f"{where}: file not found")
    if path.stat().st_size > MAX_FILE_BYTES:
        raise RigError(f"{where}: file larger than {MAX_FILE_BYTES >> 20} MiB")
    old = Image.MAX_IMAGE_PIXELS
    Image.MAX_IMAGE_PIXELS = MAX_PIXELS
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as im:
                if im.format != "PNG":
                    raise RigError(f"{where}: not a PNG (found {im.format})")
                w, h = im.size
                if not (1 <= w <= MAX_SIDE and 1 <= h <= MAX_SIDE):
                    raise RigError(f"{where}: {w}x{h} px is outside 1..{MAX_SIDE} per side")
                im.load()
                arr = np.asarray(im.convert("RGBA"))
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise RigError(f"{where}: refused as a decompression bomb ({e})") from None
    except RigError:
        raise
    except (OSError, ValueError, SyntaxError) as e:
        raise RigError(f"{where}: unreadable or corrupt image ({e})") from None
    finally:
        Image.MAX_IMAGE_PIXELS = old
    return arr


def _read_rig_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise RigError(f"{path}: cannot read ({e})") from None
    try:
        if path.suffix.lower() == ".json":
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except Exception as e:  # yaml.YAMLError / json.JSONDecodeError
        raise RigError(f"{path}: not valid {path.suffix.lstrip('.').upper() or 'YAML'} ({e})") from None
    if not isinstance(data, dict):
        raise RigError(f"{path}: the rig must be a mapping")
    return data


def load_rig_folder(path: str | Path) -> Character:
    """A rig file (.yaml/.yml/.json) or a folder holding ``rig.yaml``/``rig.yml``/``rig.json``, with its PNGs."""
    p = Path(path)
    if p.is_dir():
        for name in ("rig.yaml", "rig.yml", "rig.json"):
            if (p / name).is_file():
                p = p / name
                break
        else:
            raise RigError(f"{path}: no rig.yaml, rig.yml or rig.json in this folder")
    elif not p.is_file():
        raise RigError(f"{path}: no such rig file or folder")
    rig = parse_rig(_read_rig_file(p), str(p))
    root = p.parent.resolve()
    images: dict[str, np.ndarray] = {}
    for part in rig.parts:
        for key in ([part.image] if part.image else []) + list(part.variants.values()):
            if key in images:
                continue
            file = (root / key).resolve()
            if root not in file.parents:
                raise RigError(f"{p}: part {part.name!r}: image {key!r} lies outside the rig folder")
            images[key] = _open_image(file, part.name)
    return Character(rig, images)


def _psd_entry(name: str, parent: str | None, where: str) -> tuple[str, str, str, str] | None:
    """(group, part, kind, driver) from a layer name; kind is 'image', 'variant' or 'opacity'."""
    if name.startswith("#"):
        return None
    body, kind, driver = name, "image", ""
    for mark, k in (("@", "variant"), ("~", "opacity")):
        if mark in body:
            body, driver = body.split(mark, 1)
            kind = k
    if "." in body:
        group, part = body.split(".", 1)
    elif parent in GROUPS:
        group, part = parent, body
    else:
        raise RigError(
            f"{where}: layer {name!r} does not follow <group>.<part>[@driver|~driver] "
            f"(groups: {', '.join(GROUPS)}); prefix it with '#' to ignore it"
        )
    if group not in GROUPS or not part:
        raise RigError(
            f"{where}: layer {name!r}: unknown group {group!r} (expected one of {', '.join(GROUPS)})"
        )
    return group, part.strip(), kind, driver.strip()


def load_psd(path: str | Path, rig_overrides: dict[str, Any] | None = None) -> Character:
    """A layered PSD named by the convention above; pivots/amplitudes from ``<file>.rig.yaml`` if present."""
    p = Path(path)
    if not p.is_file():
        raise RigError(f"{p}: no such PSD file")
    try:
        from psd_tools import PSDImage

        psd = PSDImage.open(p)
    except Exception as e:
        raise RigError(f"{p}: unreadable or corrupt PSD ({e})") from None
    w, h = psd.width, psd.height
    if not (16 <= w <= MAX_SIDE and 16 <= h <= MAX_SIDE) or w * h > MAX_PIXELS:
        raise RigError(f"{p}: canvas {w}x{h} px is outside the allowed size")
    parts: dict[str, dict[str, Any]] = {}
    images: dict[str, np.ndarray] = {}
    for layer in psd.descendants():
        if layer.is_group():
            continue
        owner: Any = layer.parent
        parent = str(owner.name) if owner is not None and owner is not psd else None
        entry = _psd_entry(layer.name, parent, str(p))
        if entry is None:
            continue
        group, part, kind, driver = entry
        x0, y0, x1, y1 = layer.bbox
        if x1 <= x0 or y1 <= y0:
            continue  # an empty layer
        try:
            pil = layer.topil()
        except Exception as e:
            raise RigError(f"{p}: layer {layer.name!r} (part {part!r}): cannot decode ({e})") from None
        if pil is None:
            continue
        key = f"psd:{layer.name}"
        images[key] = np.asarray(pil.convert("RGBA"))
        spec = parts.setdefault(part, {"name": part, "group": group, "at": [x0, y0]})
        if spec["group"] != group:
            raise RigError(f"{p}: part {part!r} appears in groups {spec['group']!r} and {group!r}")
        if kind == "variant":
            spec.setdefault("variants", {})[driver] = key
            spec["at"] = [min(spec["at"][0], x0), min(spec["at"][1], y0)]
        else:
            spec["image"] = key
            spec["at"] = [x0, y0]
            if kind == "opacity":
                spec.setdefault("opacity", {})[driver] = 1.0
    if not parts:
        raise RigError(f"{p}: no layer follows the <group>.<part> naming convention")
    # Variants share the part's box: pad each to it.
    for spec in parts.values():
        if "variants" in spec:
            _align_variants(spec, images, psd_bboxes={k: k for k in spec["variants"].values()}, psd=psd)
    extra = rig_overrides or {}
    side = p.with_suffix(".rig.yaml")
    if not extra and side.is_file():
        extra = _read_rig_file(side)
    data = {
        "format": "idolcast-rig/1",
        "name": p.stem,
        "canvas": [w, h],
        "parts": list(parts.values()),
        "groups": extra.get("groups", {}),
    }
    return Character(parse_rig(data, str(p)), images)


def _align_variants(
    spec: dict[str, Any], images: dict[str, np.ndarray], psd_bboxes: dict[str, str], psd: Any
) -> None:
    """Pad a part's base and variant images to one common box starting at ``spec['at']``."""
    boxes = {}
    for layer in psd.descendants():
        key = f"psd:{layer.name}"
        if key in images:
            boxes[key] = layer.bbox
    keys = list(spec["variants"].values()) + ([spec["image"]] if "image" in spec else [])
    x0 = min(boxes[k][0] for k in keys)
    y0 = min(boxes[k][1] for k in keys)
    x1 = max(boxes[k][2] for k in keys)
    y1 = max(boxes[k][3] for k in keys)
    for k in keys:
        bx, by = boxes[k][0] - x0, boxes[k][1] - y0
        canvas = np.zeros((y1 - y0, x1 - x0, 4), dtype=np.uint8)
        img = images[k]
        canvas[by : by + img.shape[0], bx : bx + img.shape[1]] = img
        images[k] = canvas
    spec["at"] = [x0, y0]
    del psd_bboxes


def load_character(spec: str) -> Character:
    """'builtin:default', a rig file (.yaml/.yml/.json), a folder holding ``rig.yaml``/``rig.json``, or a .psd."""
    if spec in ("builtin:default", "builtin", "default"):
        from engine.avatar.default_art import default_rig

        return Character(default_rig())
    path = Path(spec)
    if path.suffix.lower() == ".psd":
        return load_psd(path)
    return load_rig_folder(path)
