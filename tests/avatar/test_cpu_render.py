"""The uint8 dirty-box CPU renderer and the I420 compositor, against the float module and FFmpeg."""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np
import pytest
import torch
from PIL import Image

from engine.avatar.backends.torch_cpu import TorchBackend
from engine.avatar.cpu_render import QUANTUM_PX, CpuRenderer, Damage, intersect, subtract
from engine.avatar.delivery import speaking_params
from engine.avatar.features import GAZE_X, twin_groups
from engine.avatar.generator import FrameGenerator, rest_params, to_uint8
from engine.avatar.kernels import FeatureKernels
from engine.avatar.loaders import load_character
from engine.avatar.params import INDEX, NUM_PARAMS
from engine.avatar.picture import Compositor
from tests.avatar.conftest import generator
from tests.avatar.test_golden import CASES, GOLDEN, MAX_DIFF, MEAN_DIFF

pytestmark = pytest.mark.unit


def _reference(gen: FrameGenerator, params: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return to_uint8(gen(torch.from_numpy(params.reshape(-1, NUM_PARAMS)))).numpy()


def _sequence(n: int) -> np.ndarray:
    """Speaking idle, the arm raised and lowered, a held pose (nothing moves) in the middle."""
    p = speaking_params(n, 1)[:, 0].copy()
    up = n // 3
    p[up : up + 8, INDEX["arm_wave"]] = np.linspace(0.0, 1.0, 8)
    p[up + 8 : up + 16, INDEX["arm_wave"]] = np.linspace(1.0, 0.0, 8)
    p[up + 16 : up + 19] = p[up + 16]
    return p


@pytest.mark.parametrize("profile", ["360p", "720p"])
def test_frames_match_the_module(profile: str) -> None:
    """Every frame of a moving sequence within a level or two of the float module (rounding per layer)."""
    gen = generator(profile)
    renderer = CpuRenderer(gen)
    params = _sequence(36)
    for i in range(len(params)):
        got = renderer.render(params[i])
        diff = np.abs(got.astype(int) - _reference(gen, renderer.feature_params(params[i])).astype(int))
        assert diff.max() <= 3 and diff.mean() < 0.02, (i, diff.max(), diff.mean())


def test_gaze_is_drawn_to_a_quarter_pixel() -> None:
    """The iris's drift is drawn in quarter-pixel steps: a change smaller than that redraws nothing, the
    frame differs from the exact module's only inside the eyes, and a larger change is drawn."""
    gen = generator("360p")
    renderer = CpuRenderer(gen)
    eyes = [f for layer in gen.groups for f in layer.feats if f.name in ("eye_l", "eye_r")]
    step = renderer._quanta[INDEX["gaze_x"]]
    assert 0 < step == min(QUANTUM_PX / (GAZE_X * e.scale) for e in eyes)
    p = rest_params(1)
    p[0, INDEX["gaze_x"]] = 0.1 * step  # rounds to 0: what rest draws
    renderer.render(rest_params(1))
    frame = renderer.render(p)[0]
    assert renderer.damage[0].boxes == ()
    p[0, INDEX["gaze_x"]] = 0.3 * step + 0.21  # not on a step: drawn, rounded
    frame = renderer.render(p)[0]
    assert renderer.damage[0].boxes != ()
    diff = np.abs(frame.astype(int) - _reference(gen, p)[0].astype(int)).max(axis=2)
    outside = np.ones_like(diff, dtype=bool)
    for e in eyes:
        x, y, w, h = e.box
        outside[y : y + h, x : x + w] = False
    assert diff[outside].max() <= 3
    # the rounding moves the iris under a quarter pixel: an edge changes by at most ~that share of full scale
    assert 3 < diff.max() <= 255 * QUANTUM_PX


@pytest.mark.parametrize(("name", "overrides", "crop"), CASES, ids=[c[0] for c in CASES])
def test_golden_images_through_the_cpu_backend(
    name: str, overrides: dict[str, float], crop: tuple[int, int, int, int]
) -> None:
    backend = TorchBackend(load_character("builtin:default"), "360p")
    frame = backend.render(rest_params(**overrides))[0]
    x0, y0, x1, y1 = crop
    want = np.asarray(Image.open(Path(GOLDEN) / f"{name}.png").convert("RGBA"))
    diff = np.abs(frame[y0:y1, x0:x1].astype(int) - want.astype(int))
    assert diff.max() <= MAX_DIFF and diff.mean() <= MEAN_DIFF, (name, diff.max(), diff.mean())


def test_damage_is_everything_that_changed() -> None:
    """A consumer copying only the damaged boxes keeps an exact copy of the frame; a held pose damages
    nothing; a mouth-only change damages a box around the mouth, not the head."""
    gen = generator("360p")
    renderer = CpuRenderer(gen)
    params = _sequence(40)
    mirror = renderer.render(params[0])[0].copy()
    last: Damage = renderer.damage[0]
    for i in range(1, len(params)):
        frame = renderer.render(params[i])[0]
        dmg = renderer.damage[0]
        assert (dmg.buffer, dmg.serial) == (last.buffer, last.serial + 1)
        for x, y, w, h in dmg.boxes:
            mirror[y : y + h, x : x + w] = frame[y : y + h, x : x + w]
        assert np.array_equal(mirror, frame), i
        if np.array_equal(params[i], params[i - 1]):
            assert dmg.boxes == (), i
        last = dmg
    still = rest_params(1)
    renderer.render(still)
    talk = still.copy()
    talk[0, INDEX["viseme_sil"]], talk[0, INDEX["viseme_aa"]] = 0.0, 1.0
    renderer.render(talk)
    (box,) = renderer.damage[0].boxes
    mouth = next(f for layer in gen.groups for f in layer.feats if f.name == "mouth").box
    assert box[2] * box[3] <= 2 * (mouth[2] + 4) * (mouth[3] + 4)


def test_batch_slots_keep_their_own_faces() -> None:
    gen = generator("360p")
    renderer = CpuRenderer(gen)
    params = speaking_params(6, 3)
    for i in range(6):
        got = renderer.render(params[i])
        want = _reference(gen, renderer.feature_params(params[i]))
        assert np.abs(got.astype(int) - want.astype(int)).max() <= 3
    single = renderer.render(params[5][1:2])  # another batch size: its own buffers, drawn in full
    want = _reference(gen, renderer.feature_params(params[5][1]))
    assert np.abs(single.astype(int) - want.astype(int)).max() <= 3


def test_a_keyed_slot_follows_its_session_whatever_the_batch() -> None:
    """Two sessions rendered together, alone, and at swapped rows: each key's frames match the module and
    each damage is counted against that key's own previous frame, so a held pose redraws nothing."""

    class Key:
        pass

    gen = generator("360p")
    renderer = CpuRenderer(gen)
    a, b = Key(), Key()
    params = _sequence(36)[:15]
    other = _sequence(36)[::-1][:15].copy()
    mirrors: dict[int, np.ndarray] = {}
    last: dict[int, Damage] = {}
    for i in range(len(params)):
        order = [(a, params[i]), (b, other[i])] if i % 3 == 0 else [(b, other[i]), (a, params[i])]
        if i % 3 == 2:
            order = order[:1]  # one of them alone this time
        frames = renderer.render_keyed(np.stack([p for _, p in order]), [k for k, _ in order])
        for (key, p), frame, dmg in zip(order, frames, renderer.damage, strict=True):
            want = _reference(gen, renderer.feature_params(p))[0]
            assert np.abs(frame.astype(int) - want.astype(int)).max() <= 3, i
            k = id(key)
            if k in last:
                assert (dmg.buffer, dmg.serial) == (last[k].buffer, last[k].serial + 1)
                for x, y, w, h in dmg.boxes:
                    mirrors[k][y : y + h, x : x + w] = frame[y : y + h, x : x + w]
                assert np.array_equal(mirrors[k], frame), i
            else:
                mirrors[k] = frame.copy()
            last[k] = dmg
    first = renderer.render_keyed(params[-1:], [a])[0]
    held = renderer.render_keyed(params[-1:], [a])[0]  # the same pose again: nothing to redraw
    assert renderer.damage[0].boxes == () and held is first, "the key's own buffer, redrawn in place"
    with pytest.raises(ValueError, match="keys"):
        renderer.render_keyed(params[:2], [a])


def test_motion_affine_is_the_module_motion() -> None:
    gen = generator("360p")
    rng = np.random.default_rng(3)
    for _ in range(20):
        p = rest_params(1)
        for name in ("head_yaw", "head_pitch", "head_roll", "body_x", "wave_phase"):
            p[0, INDEX[name]] = rng.uniform(-1, 1)
        for name in ("breath", "arm_wave"):
            p[0, INDEX[name]] = rng.uniform(0, 1)
        for layer in gen.groups:
            want = [float(v[0]) for v in layer.motion.forward(layer.kind, torch.from_numpy(p))]
            got = layer.motion.affine(layer.kind, p[0])
            assert np.allclose(got, want, rtol=1e-5, atol=1e-3), layer.kind


def _swscale(rgb: np.ndarray) -> np.ndarray:
    return (
        av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")
        .reformat(format="yuv420p")
        .to_ndarray()
    )


def test_compositor_i420_from_damage_equals_a_full_conversion() -> None:
    gen = generator("360p")
    renderer = CpuRenderer(gen)
    comp = Compositor(640, 360, packed_alpha=False, background="#00000000")
    params = _sequence(30)
    for i in range(len(params)):
        frame = renderer.render(params[i])[0]
        got = comp.compose(frame, gen.region, renderer.damage[0]).copy()
        full = Compositor(640, 360, False, "#00000000").compose(frame, gen.region)
        assert np.array_equal(got, full), i
    # the levels are FFmpeg's (BT.601, limited range): luma within a level; chroma is a 2×2 mean here
    # and swscale's own filter there, which differ on sharp colour edges only
    diff = np.abs(got.astype(int) - _swscale(frame[..., :3]).astype(int))
    assert diff[:360].max() <= 1 and diff[360:].mean() < 0.2, (diff[:360].max(), diff[360:].mean())
    assert comp.converted_px < 30 * 640 * 360 / 2  # damage, not whole frames


def test_compositor_background_and_packed_alpha() -> None:
    gen = generator("360p")
    frame = CpuRenderer(gen).render(rest_params(1))[0]
    alpha = frame[..., 3:4].astype(np.float64) / 255.0
    green = Compositor(640, 360, False, "#00ff00").compose(frame, gen.region)
    want = frame[..., :3] + np.array([0, 255, 0]) * (1.0 - alpha)
    diff = np.abs(green.astype(int) - _swscale(np.round(want).astype(np.uint8)).astype(int))
    assert diff[:360].max() <= 2 and diff[360:].mean() < 1.0, (diff[:360].max(), diff[360:].mean())
    packed = Compositor(640, 360, True, "#00000000").compose(frame, gen.region)
    assert packed.shape == (540, 1280)
    side = np.concatenate([frame[..., :3], np.repeat(frame[..., 3:4], 3, axis=2)], axis=1)
    diff = np.abs(packed.astype(int) - _swscale(side).astype(int))
    assert diff[:360].max() <= 1 and diff[360:].mean() < 0.2, (diff[:360].max(), diff[360:].mean())


def test_the_two_eyes_are_drawn_as_one_batch_with_the_same_pixels() -> None:
    gen = generator("720p")
    feats = [f for layer in gen.groups for f in layer.feats]
    by_name = {f.name: f for f in feats}
    assert by_name["eye_l"].twin_of(by_name["eye_r"]) and by_name["eye_r"].twin_of(by_name["eye_l"])
    assert not by_name["eye_l"].twin_of(by_name["eye_l"]) and not by_name["eye_l"].twin_of(by_name["mouth"])
    p = speaking_params(12, 1)[11]
    p[0, INDEX["eye_open_l"]], p[0, INDEX["eye_open_r"]] = 0.3, 0.9  # a wink: each eye its own lid
    pt = torch.from_numpy(p)
    eyes = [feats.index(by_name["eye_l"]), feats.index(by_name["eye_r"])]
    assert eyes in twin_groups(feats)
    with torch.no_grad():
        together = FeatureKernels(feats, "off").draw(list(range(len(feats))), pt)
        for feat, got in zip(feats, together, strict=True):
            assert got.shape == (1, 4, feat.box[3], feat.box[2])
            assert torch.equal(got, feat(pt)), feat.name


@pytest.mark.parametrize("hole", [(10, 20, 30, 40), (0, 0, 30, 40), (0, 20, 100, 40), (0, 0, 100, 80), None])
def test_a_box_less_a_hole_is_covered_once(hole: tuple[int, int, int, int] | None) -> None:
    """What the renderer warps straight into the frame (the parts) and lays over (the hole) cover the box
    exactly once between them."""
    box = (0, 0, 100, 80)
    parts = subtract(box, hole)
    covered = np.zeros((80, 100), dtype=int)
    for x, y, w, h in parts + ([hole] if hole else []):
        assert intersect((x, y, w, h), box) == (x, y, w, h)
        covered[y : y + h, x : x + w] += 1
    assert (covered == 1).all()
