"""Character loaders: a PNG folder + rig file, a layered PSD, and refusal of bad input naming file and part."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from engine.avatar.generator import FrameGenerator, rest_params
from engine.avatar.loaders import load_character
from engine.avatar.rig import RigError

pytestmark = pytest.mark.unit


def _png(path: Path, size: tuple[int, int], color: tuple[int, int, int, int]) -> None:
    Image.new("RGBA", size, color).save(path)


def _rig_folder(root: Path) -> Path:
    _png(root / "body.png", (120, 60), (40, 60, 160, 255))
    _png(root / "face.png", (60, 60), (250, 220, 200, 255))
    _png(root / "mouth_closed.png", (20, 6), (120, 40, 60, 255))
    _png(root / "mouth_open.png", (20, 14), (90, 20, 40, 255))
    _png(root / "blush.png", (40, 8), (255, 120, 150, 160))
    rig = {
        "format": "idolcast-rig/1",
        "name": "Box Idol",
        "canvas": [160, 160],
        "groups": {"head": {"pivot": [80, 100]}},
        "parts": [
            {"name": "body", "group": "body", "image": "body.png", "at": [20, 100]},
            {"name": "face", "group": "head", "image": "face.png", "at": [50, 40]},
            {
                "name": "blush",
                "group": "head",
                "image": "blush.png",
                "at": [60, 75],
                "opacity": {"blush": 1.0},
            },
            {
                "name": "mouth",
                "group": "head",
                "image": "mouth_closed.png",
                "at": [70, 85],
                "variants": {"viseme_aa": "mouth_open.png", "mouth_open": "mouth_open.png"},
            },
            {
                "name": "eye_l",
                "group": "head",
                "procedural": "eye",
                "side": "left",
                "center": [68, 62],
                "size": 0.3,
            },
        ],
    }
    (root / "rig.yaml").write_text(yaml.safe_dump(rig))
    return root


def test_png_folder_loads_and_animates(tmp_path: Path) -> None:
    gen = FrameGenerator(load_character(str(_rig_folder(tmp_path))), (160, 160))
    with torch.no_grad():
        rest = gen(torch.from_numpy(rest_params()))
        talking = gen(torch.from_numpy(rest_params(viseme_aa=1.0, viseme_sil=0.0)))
        blushing = gen(torch.from_numpy(rest_params(blush=1.0)))
    assert rest.shape == (1, 4, 160, 160)
    assert float(rest[0, 3].sum()) > 100
    assert float((talking - rest).abs().max()) > 0.3  # the open-mouth sprite blends in
    assert float((blushing - rest).abs().max()) > 0.2


def test_missing_part_image_named(tmp_path: Path) -> None:
    root = _rig_folder(tmp_path)
    (root / "face.png").unlink()
    with pytest.raises(RigError, match=r"face\.png.*part 'face'.*not found"):
        load_character(str(root))


def test_corrupt_png_named(tmp_path: Path) -> None:
    root = _rig_folder(tmp_path)
    data = (root / "mouth_open.png").read_bytes()
    (root / "mouth_open.png").write_bytes(data[:40] + b"\x00garbage" * 8)
    with pytest.raises(RigError, match=r"mouth_open\.png.*part 'mouth'.*corrupt"):
        load_character(str(root))


def test_decompression_bomb_refused(tmp_path: Path) -> None:
    root = _rig_folder(tmp_path)
    Image.new("1", (9000, 9000)).save(root / "body.png")  # ~81 Mpx that compresses to a few kB
    assert (root / "body.png").stat().st_size < 200_000
    with pytest.raises(RigError, match=r"body\.png.*part 'body'.*decompression bomb"):
        load_character(str(root))


def test_absurd_dimensions_refused(tmp_path: Path) -> None:
    root = _rig_folder(tmp_path)
    Image.new("RGBA", (9000, 2)).save(root / "face.png")
    with pytest.raises(RigError, match=r"face\.png.*part 'face'.*9000x2"):
        load_character(str(root))
    rig = yaml.safe_load((root / "rig.yaml").read_text())
    rig["canvas"] = [100000, 100]
    (root / "rig.yaml").write_text(yaml.safe_dump(rig))
    with pytest.raises(RigError, match="canvas 100000x100"):
        load_character(str(root))


def test_rig_errors_name_the_part(tmp_path: Path) -> None:
    root = _rig_folder(tmp_path)
    rig = yaml.safe_load((root / "rig.yaml").read_text())
    rig["parts"][3]["variants"] = {"viseme_zz": "mouth_open.png"}
    (root / "rig.yaml").write_text(yaml.safe_dump(rig))
    with pytest.raises(RigError, match=r"part 'mouth'.*unknown parameter 'viseme_zz'"):
        load_character(str(root))
    rig["parts"][3]["variants"] = {"viseme_aa": "../../etc/passwd"}
    (root / "rig.yaml").write_text(yaml.safe_dump(rig))
    with pytest.raises(RigError, match="outside the rig folder"):
        load_character(str(root))


def test_psd_loader(tmp_path: Path) -> None:
    from psd_tools import PSDImage
    from psd_tools.api.layers import PixelLayer

    psd = PSDImage.new("RGBA", (128, 128))
    layers = [
        ("body.torso", (100, 40), (40, 60, 160, 255), 14, 88),
        ("head.face", (50, 50), (250, 220, 200, 255), 39, 30),
        ("head.mouth", (16, 4), (120, 40, 60, 255), 56, 66),
        ("head.mouth@viseme_aa", (16, 12), (90, 20, 40, 255), 56, 64),
        ("head.blush~blush", (30, 6), (255, 120, 150, 200), 49, 58),
        ("#notes", (10, 10), (0, 0, 0, 255), 0, 0),
    ]
    for name, size, color, left, top in layers:
        psd.append(PixelLayer.frompil(Image.new("RGBA", size, color), psd, name, top, left))
    path = tmp_path / "idol.psd"
    psd.save(path)
    char = load_character(str(path))
    assert {p.name for p in char.rig.parts} == {"torso", "face", "mouth", "blush"}
    gen = FrameGenerator(char, (128, 128))
    with torch.no_grad():
        rest = gen(torch.from_numpy(rest_params()))
        talking = gen(torch.from_numpy(rest_params(viseme_aa=1.0, viseme_sil=0.0)))
    assert float(rest[0, 3].sum()) > 100
    diff = (talking - rest).abs().amax(dim=(0, 1))
    ys, xs = np.nonzero(diff.numpy() > 0.2)
    assert len(ys) and ys.min() >= 60 and ys.max() <= 80 and xs.min() >= 50  # only around the mouth


def test_psd_bad_layer_name_and_corrupt_file(tmp_path: Path) -> None:
    from psd_tools import PSDImage
    from psd_tools.api.layers import PixelLayer

    psd = PSDImage.new("RGBA", (64, 64))
    psd.append(PixelLayer.frompil(Image.new("RGBA", (8, 8), (1, 2, 3, 255)), psd, "Layer 1", 0, 0))
    psd.save(tmp_path / "bad.psd")
    with pytest.raises(RigError, match=r"bad\.psd.*'Layer 1'.*<group>\.<part>"):
        load_character(str(tmp_path / "bad.psd"))
    (tmp_path / "broken.psd").write_bytes(b"8BPS" + b"\x00" * 10)
    with pytest.raises(RigError, match=r"broken\.psd.*corrupt"):
        load_character(str(tmp_path / "broken.psd"))
